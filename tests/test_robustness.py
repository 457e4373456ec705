"""Nothing is lost: resume after SIGKILL gives the same result, signals checkpoint, bad states are refused."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

from conftest import run_cli, run_here

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

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
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
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
    if sig == signal.SIGTERM:  # a resume that completes says so; why the first attempt stopped is kept apart
        assert run_cli("run", "--resume", str(out), "--quiet").returncode == 0
        info = json.loads((out / "result.json").read_text())["info"]
        assert info["stopped"] == "completed all epochs" and info["resumed"][0]["after"] == "interrupted by SIGTERM"


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
    result = run_here("run", "copy", "--out", str(out), "--set", "data.train_size=500", "--set", "train.epochs=1",
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
    # each of these ran to NaN and advised a lower learning rate
    "negative step counts": (lambda t: t.update({k: -t[k] - 3 for k in t if k.endswith(".step")}), None,
                             ".step is -"),
    "a negative mean of squares": (lambda t: t.update({k: -t[k] - 1 for k in t if k.endswith(".exp_avg_sq")}), None,
                                   "holds negative values, but it averages squares"),
    "a moment of NaN": (lambda t: t.update({first_moment(t): t[first_moment(t)] * float("nan")}), None,
                        "holds NaN or infinity"),
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
        result = run_here("run", task, "--out", str(out), *args, *TINY_MODEL)
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


# Fuzzing (issue 35): config files, --set, run-directory files and the server's bodies. Each property:
# exit 0 or 2 (the server: 200 or a 4xx JSON error naming the field), at most one `Error:` line that names
# the file, key or option, never a traceback or an internal error, and no file of the user's removed.

SECTIONS = ["model", "train", "decode", "data", "zz"]
KEYS = ["d_model", "n_heads", "lr", "epochs", "max_steps", "beam", "strategy", "vocab", "length", "bf16", "x y"]
SCALARS = (st.integers(-2, 10**6) | st.integers() | st.floats() | st.booleans() | st.none()
           | st.text(max_size=12) | st.sampled_from(["greedy", "beam", "auto", "1e400", "-0"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


def one_error_line(result, *names) -> str:
    """The refusal's single `Error:` line, checked to name one of ``names`` (a file, a key, an option)."""
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    assert any(name in errors[0] for name in names), errors[0]
    return errors[0]


def toml_value(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value if v is not None) + "]"
    return json.dumps(str(value))


CONFIGS = st.dictionaries(st.sampled_from(SECTIONS), st.dictionaries(st.sampled_from(KEYS), JSON_VALUES, max_size=3),
                          max_size=3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(CONFIGS, st.sampled_from(["json", "toml", "bytes"]), st.binary(max_size=40),
       st.lists(st.tuples(st.sampled_from([f"{s}.{k}" for s in SECTIONS for k in KEYS]), SCALARS), max_size=2))
def test_any_config_file_and_set_is_read_or_refused_in_one_line(cli, tmp_path_factory, config, kind, raw, sets):
    path = tmp_path_factory.mktemp("config") / f"c.{'json' if kind == 'json' else 'toml'}"
    if kind == "json":
        path.write_text(json.dumps(config))
    elif kind == "toml":  # a table per section; None has no TOML spelling, dicts become inline tables
        path.write_text("".join(f"[{s}]\n" + "".join(f'"{k}" = {toml_value(v) if not isinstance(v, dict) else "{}"}\n'
                                                      for k, v in keys.items() if v is not None)
                                for s, keys in config.items()))
    else:
        path.write_bytes(raw)
    overrides = [a for key, value in sets for a in ("--set", f"{key}={value}")]
    result = cli("config", "copy", "--config", str(path), *overrides)
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        one_error_line(result, str(path), "config", "--set", *(key for key, _ in sets))


RUN_FILES = ["config.json", "result.json", "metrics.jsonl", "tokenizer.json", "outputs-test.jsonl", "state.json"]


def json_paths(value, prefix=()):
    """Every place inside a JSON value, as key paths."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value[:2]) if isinstance(value, list) else []
    for key, inner in items:
        yield from json_paths(inner, prefix + (key,))


def replaced(value, path, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(RUN_FILES), st.sampled_from(["value", "json", "bytes"]), st.data(),
       st.sampled_from(["runs", "report", "eval", "predict", "resume"]))
def test_a_run_with_any_file_damaged_is_served_or_refused_in_one_line(finished, cli, tmp_path_factory, name, how,
                                                                       data, command):
    run = tmp_path_factory.mktemp("damaged") / "run"
    shutil.copytree(finished, run)
    if command == "resume":
        (run / "result.json").unlink()
    path = sorted((run / "checkpoints").glob("step-*"))[-1] / name if name == "state.json" else run / name
    if path.exists():
        text = path.read_text()
        lines = text.splitlines() if path.suffix == ".jsonl" else [text]
        at = data.draw(st.integers(0, len(lines) - 1))
        if how == "value":  # one value inside the file replaced: the shape is right, a type or a size is not
            original = json.loads(lines[at])
            where = data.draw(st.sampled_from(list(json_paths(original))))
            lines[at] = json.dumps(replaced(original, where, data.draw(JSON_VALUES)))
        elif how == "json":
            lines[at] = json.dumps(data.draw(JSON_VALUES))
        else:
            lines[at] = data.draw(st.binary(max_size=60)).decode("latin-1")
        path.write_text("\n".join(lines) + "\n")
    before = {p.relative_to(run) for p in run.rglob("*")}
    args = {"runs": ["runs", str(run.parent)], "report": ["report", str(run)], "eval": ["eval", str(run)],
            "predict": ["predict", str(run), "1 2 3"], "resume": ["run", "--resume", str(run), "--quiet"]}[command]
    result = cli(*args)
    assert result.exit_code in (0, 2), result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    if command == "runs":  # a damaged run is skipped with a warning naming its file, never the whole listing
        assert result.exit_code == 0, result.output
    if result.exit_code == 2:
        # resume names a damaged config.json value by its key alone (its reader is training.py's)
        one_error_line(result, str(run), *(["config: "] if command == "resume" else []))
        assert before <= {p.relative_to(run) for p in run.rglob("*")}  # a refusal removes nothing


@pytest.fixture(scope="module")
def app_client(finished):
    """taskformer serve's app for the finished tiny run, in process (FastAPI's test client)."""
    from fastapi.testclient import TestClient

    from taskformer.app import runner
    from taskformer.app.server import Limits, create_app

    with TestClient(create_app({"copy": runner.load(finished)}, Limits(max_inputs=4, max_chars=50))) as client:
        yield client


FIELDS = st.sampled_from(["inputs", "beam", "return_attention", "q", "source", "target", "format", "api_key", "x"])


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["/v1/models/copy/predict", "/v1/models/copy/predict/stream", "/translate",
                        "/v1/models/nope/predict"]),
       st.dictionaries(FIELDS, JSON_VALUES | st.lists(st.text(max_size=60), max_size=6), max_size=4) | JSON_VALUES)
def test_any_json_body_gets_an_answer_or_a_4xx_naming_the_field(app_client, path, body):
    response = app_client.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})  # NaN too
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
    if response.status_code != 200:
        refusal = response.json()
        assert refusal["error"] and (refusal["field"] or response.status_code == 503), refusal
    assert app_client.get("/health").json()["status"] == "ok"
    assert app_client.post("/v1/models/copy/predict", json={"inputs": ["3"]}).status_code == 200


def unprivileged(*args: str) -> list[str]:
    """The CLI as a process that file modes bind: root ignores them unless it drops CAP_DAC_OVERRIDE
    (and CAP_DAC_READ_SEARCH), which ``setpriv`` does for the command it starts."""
    command = [sys.executable, "-m", "taskformer", *args]
    if os.geteuid() != 0:
        return command
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if not shutil.which("setpriv") or subprocess.run([*drop, "true"]).returncode:
        pytest.skip("root here cannot drop CAP_DAC_OVERRIDE (no setpriv, or no CAP_SETPCAP), so a mode does not "
                    "stop its writes")
    return [*drop, *command]


@pytest.mark.parametrize("command, hint", [
    ("report", "once it can be written, make the report again: taskformer report {run}"),
    ("resume", "once it can be written, then resume with: taskformer run --resume {run}"),
])
def test_a_read_only_run_directory_is_one_error_with_the_next_step(finished, tmp_path, command, hint):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    if command == "resume":
        (run / "result.json").unlink()
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for path in [run, *run.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)
    try:
        args = ["report", str(run)] if command == "report" else ["run", "--resume", str(run), "--quiet"]
        result = subprocess.run(unprivileged(*args), capture_output=True, text=True,
                                env={**os.environ, "COLUMNS": "200"})
    finally:
        for path in [run, *run.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"Error: cannot write {run} (Permission denied); "
                                                  + hint.format(run=run)]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def set_in(path, *keys_and_value):
    """Set one value of a JSON file (``set_in(p, "info", "notes", 5)``)."""
    *keys, value = keys_and_value
    saved = json.loads(path.read_text())
    inner = saved
    for key in keys[:-1]:
        inner = inner[key]
    inner[keys[-1]] = value
    path.write_text(json.dumps(saved))


def append_line(path, row):
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


TRAIN_EVENT = {"event": "train", "step": 1, "epoch": 0, "epochs": 1, "loss": 4.0, "lr": 1e-4}
DAMAGED_FOR_REPORT = {  # each was "plugin 'taskformer.plugins.builtin.report_sections' failed ..." or internal
    "metrics not a table": ("result.json", lambda d: set_in(d / "result.json", "metrics", "x"), "metrics is not"),
    "a split not a table": ("result.json", lambda d: set_in(d / "result.json", "metrics", "val", 5), "metrics is not"),
    "info not a table": ("result.json", lambda d: set_in(d / "result.json", "info", []), "info is not"),
    "notes not a table": ("result.json", lambda d: set_in(d / "result.json", "info", "notes", 1), "info.notes is not"),
    "train time as text": ("result.json", lambda d: set_in(d / "result.json", "info", "train_seconds", "x"),
                           "info.train_seconds is not"),
    "a train event without loss": ("metrics.jsonl", lambda d: append_line(
        d / "metrics.jsonl", {k: v for k, v in TRAIN_EVENT.items() if k != "loss"}), "'loss' of a train event"),
    "a step beyond plotting": ("metrics.jsonl", lambda d: append_line(d / "metrics.jsonl",
                                                                      {**TRAIN_EVENT, "step": 1e308}),
                               "'step' of a train event"),
    "an lr beyond plotting": ("metrics.jsonl", lambda d: [append_line(d / "metrics.jsonl", {**TRAIN_EVENT, "step": s,
                                                                                            "lr": 1e308}) for s in (1, 2)],
                              "cannot be plotted"),  # two points: a run too short for a curve gets no plot
    "labels not a list": ("config.json", lambda d: set_in(d / "config.json", "labels", 5), "'labels'"),
    "a size as a list": ("config.json", lambda d: set_in(d / "config.json", "config", "model", "d_model", []),
                         "model.d_model expects int"),
}


@pytest.mark.parametrize("name, damage, says", DAMAGED_FOR_REPORT.values(), ids=DAMAGED_FOR_REPORT)
def test_report_names_the_damaged_file_and_key_not_the_plugin(finished, tmp_path, cli, name, damage, says):
    run = damaged_copy(finished, tmp_path / "run", damage)
    result = cli("report", str(run))
    assert result.exit_code == 2, result.output
    line = one_error_line(result, f"{run / name}: ")
    assert says in line and "plugin" not in line
