"""Nothing is lost: resume after SIGKILL gives the same result, signals checkpoint, bad states are refused."""
import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from conftest import run_cli

SMALL = ["--set", "data.train_size=3000", "--set", "train.epochs=3", "--set", "train.save_every=4",
         "--set", "train.log_every=2", "--quiet"]


def start(*args):
    return subprocess.Popen([sys.executable, "-m", "taskformer", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(run_dir, min_step, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        steps = sorted((run_dir / "checkpoints").glob("step-*")) if (run_dir / "checkpoints").exists() else []
        if steps and int(steps[-1].name.split("-")[1]) >= min_step:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    result = run_cli("run", "copy", "--out", str(out), *SMALL)
    assert result.returncode == 0, result.stderr
    return out


def test_run_killed_mid_epoch_resumes_to_the_same_weights_and_metrics(reference, tmp_path):
    out = tmp_path / "run"
    proc = start("run", "copy", "--out", str(out), *SMALL)
    wait_for_checkpoint(out, 30, proc)  # epoch 1 has about 45 steps: this is mid-epoch 1 or later
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "result.json").exists()
    resumed = run_cli("run", "--resume", str(out), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    ra, rb = (json.loads((d / "result.json").read_text()) for d in (reference, out))
    assert ra["metrics"] == rb["metrics"]
    assert ra["info"]["steps"] == rb["info"]["steps"]
    evals = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [e["step"] for e in evals if e["event"] == "eval"]
    assert steps == sorted(set(steps))  # no duplicated history from the killed process


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_checkpoints_and_explains_how_to_resume(tmp_path, sig):
    out = tmp_path / "run"
    proc = start("run", "copy", "--out", str(out), *SMALL)
    wait_for_checkpoint(out, 4, proc)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert f"taskformer run --resume {out}" in err and "Traceback" not in err
    assert list((out / "checkpoints").glob("step-*"))
    if sig == signal.SIGTERM:  # a resume that completes says so: why the first attempt stopped is not kept
        assert run_cli("run", "--resume", str(out), "--quiet").returncode == 0
        stopped = json.loads((out / "result.json").read_text())["info"]["stopped"]
        assert stopped == "completed all epochs" and "interrupted" not in (out / "report.txt").read_text()


def test_resume_of_a_directory_without_checkpoints_is_an_error(tmp_path, cli):
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"task": "copy", "config": {}}))
    result = cli("run", "--resume", str(out))
    assert result.exit_code == 2 and "Traceback" not in result.output


def test_diverging_loss_stops_with_a_message(cli, tmp_path):
    result = cli("run", "copy", "--out", str(tmp_path / "r"), "--set", "train.lr=1e30", "--set", "train.warmup=0",
                 "--set", "train.clip=0", "--quiet")
    assert result.exit_code == 2
    assert "training loss became" in result.stderr


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "run"
    result = run_cli("run", "copy", "--out", str(out), "--set", "data.train_size=500", "--set", "train.epochs=1",
                     "--quiet")
    assert result.returncode == 0, result.stderr
    return out


def widen_model(config_json):
    """The run's config now asks for a wider model than the saved weights hold."""
    saved = json.loads(config_json.read_text())
    saved["config"]["model"]["d_model"] *= 2
    config_json.write_text(json.dumps(saved))


def damaged_copy(src, dst, edit):
    shutil.copytree(src, dst)
    edit(dst)
    return dst


@pytest.mark.parametrize("edit, expected", [
    (lambda d: (d / "evil.pkl").write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR."), "pickle"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64), "corrupt"),
    (lambda d: (d / "config.json").write_text("{not json"), "not valid JSON"),
    (lambda d: widen_model(d / "config.json"), "do not match"),
    (lambda d: (d / "config.json").write_text(
        (d / "config.json").read_text().replace('"task": "copy"', '"task": "agnews"')), "encoder"),
])
def test_damaged_or_foreign_run_directories_are_refused(small_run, tmp_path, cli, edit, expected):
    bad = damaged_copy(small_run, tmp_path / "bad", edit)
    result = cli("predict", str(bad), "1 2 3")
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and "Traceback" not in result.output


def unfinished_copy(small_run, dst):
    """A copy of the finished run made unfinished again (result.json removed), and its last checkpoint."""
    run = damaged_copy(small_run, dst, lambda d: (d / "result.json").unlink())
    return run, sorted((run / "checkpoints").glob("step-*"))[-1]


def test_optimizer_state_with_code_is_refused_on_resume(small_run, tmp_path, cli):
    import pickle

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    bad, step = unfinished_copy(small_run, tmp_path / "bad")
    (step / "optimizer.safetensors").unlink()  # as an earlier version wrote it: a torch pickle
    (step / "optimizer.pt").write_bytes(pickle.dumps(Evil()))
    result = cli("run", "--resume", str(bad), "--quiet")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"{step / 'optimizer.pt'}: optimizer state in torch's pickle format" in result.stderr
    assert "loads no pickle" in result.stderr and "pwned" not in result.stdout


def rewrite_optimizer_state(step, change_tensors=lambda t: None, change_meta=lambda m: None):
    from safetensors import safe_open
    from safetensors.torch import save_file

    path = step / "optimizer.safetensors"
    with safe_open(path, "pt") as f:
        tensors, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    change_tensors(tensors)
    change_meta(meta)
    save_file(tensors, path, metadata=meta)


def first_moment(tensors):
    return next(k for k in tensors if k.endswith(".exp_avg"))


def set_lr(meta, value):
    groups = json.loads(meta["param_groups"])
    groups[0]["lr"] = value
    meta["param_groups"] = json.dumps(groups)


DAMAGED_OPTIMIZER = {  # each would reach fused AdamW's kernel (out-of-bounds writes) or the schedule unchecked
    "a moment of the wrong shape": (lambda t: t.update({first_moment(t): t[first_moment(t)][:1].clone()}), None,
                                    ".exp_avg is ["),
    "a moment of the wrong dtype": (lambda t: t.update({first_moment(t): t[first_moment(t)].double()}), None,
                                    "torch.float64, but its parameter needs"),
    "a moment missing": (lambda t: t.pop(first_moment(t)), None, "lacks ['exp_avg']"),
    "a tensor of no parameter": (lambda t: t.update({"state.99999.exp_avg": torch_zeros()}), None, "unexpected tensor"),
    "a learning rate as text": (None, lambda m: set_lr(m, "0.1"), "parameter groups do not match"),
    "a learning rate of NaN": (None, lambda m: set_lr(m, float("nan")), "parameter groups do not match"),
    "a damaged schedule": (None, lambda m: m.update(scheduler='{"last_epoch": "x"}'), "schedule state is damaged"),
}


def torch_zeros():
    import torch

    return torch.zeros(3)


@pytest.mark.parametrize("tensors, meta, expected", DAMAGED_OPTIMIZER.values(), ids=DAMAGED_OPTIMIZER)
def test_damaged_optimizer_state_is_refused_before_the_first_step(small_run, tmp_path, tensors, meta, expected):
    bad, step = unfinished_copy(small_run, tmp_path / "bad")
    rewrite_optimizer_state(step, tensors or (lambda t: None), meta or (lambda m: None))
    result = run_cli("run", "--resume", str(bad), "--quiet")  # a subprocess: a heap corruption must not hit pytest
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"Error: {step / 'optimizer.safetensors'}: ") and expected in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_truncated_optimizer_state_is_named(small_run, tmp_path, cli):
    bad, step = unfinished_copy(small_run, tmp_path / "bad")
    path = step / "optimizer.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    result = cli("run", "--resume", str(bad))
    assert result.exit_code == 2 and f"{path}: corrupt optimizer state" in result.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=300), min_size=1, max_size=5))
def test_predict_survives_any_unicode(small_run, cli, lines):
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    result = cli("predict", str(small_run), input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split("\n")) - 1 == len(lines)


TINY_MODEL = ["--set", "model.d_model=16", "--set", "model.n_heads=2", "--set", "model.enc_layers=1",
              "--set", "model.dec_layers=1", "--set", "model.d_ff=32", "--set", "train.epochs=1", "--quiet"]
TASK_RUNS = {
    "translate-de-en": ["--data-dir", "multi30k", "--set", "data.vocab_size=200"],
    "agnews": ["--data-dir", "ag_news", "--set", "data.vocab_size=300", "--set", "model.members=2"],
    "couplet": ["--data-dir", "couplets", "--set", "data.val_size=6"],
    "translate-en-zh": ["--data-dir", "en-cn", "--set", "data.vocab_size=200"],
}


@pytest.fixture(scope="module")
def task_runs(tmp_path_factory):
    """A tiny trained run of every built-in task on the fixture data."""
    from conftest import DATA
    runs = {}
    for task, extra in TASK_RUNS.items():
        out = tmp_path_factory.mktemp("tasks") / task
        args = [str(DATA / a) if a in ("multi30k", "ag_news", "couplets", "en-cn") else a for a in extra]
        result = run_cli("run", task, "--out", str(out), *args, *TINY_MODEL)
        assert result.returncode == 0, (task, result.stderr)
        runs[task] = out
    return runs


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(max_size=400), min_size=1, max_size=4))
def test_every_task_predicts_on_any_unicode(task_runs, cli, lines):
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    for task, run_dir in task_runs.items():
        result = cli("predict", str(run_dir), input="\n".join(lines) + "\n")
        assert result.exit_code == 0, (task, result.output)
        outputs = result.stdout.split("\n")[:-1]
        assert len(outputs) == len(lines), task
        for line, out in zip(lines, outputs):
            if not line.strip():
                assert out == "", task


@pytest.mark.parametrize("damage, expected", [
    (lambda p: p.write_bytes(p.read_bytes().replace(b"\n", b"\n\xff\xfe", 1)), "val.de:2: not valid UTF-8"),
    (lambda p: p.write_bytes(b""), "val.de: file is empty"),
])
def test_undecodable_or_empty_data_files_are_one_line_errors(cli, tmp_path, damage, expected):
    from conftest import DATA
    data = tmp_path / "multi30k"
    shutil.copytree(DATA / "multi30k", data)
    damage(data / "val.de")
    result = cli("run", "translate-de-en", "--data-dir", str(data), "--out", str(tmp_path / "r"), *TINY_MODEL)
    assert result.exit_code == 2
    assert expected in result.stderr and len(result.stderr.strip().splitlines()) == 1
