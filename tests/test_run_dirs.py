"""Run directories nobody can clobber, and training results that are never silently wrong."""
import datetime as dt
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from conftest import TINY, run_cli

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's


def test_runs_never_share_a_default_directory(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    now = dt.datetime.now()
    taken = [tmp_path / "runs" / "copy" / (now + dt.timedelta(seconds=s)).strftime("%Y%m%d-%H%M%S")
             for s in range(-1, 120)]  # every name this run could pick by the clock alone is someone else's
    for d in taken:
        d.mkdir(parents=True)
        (d / "mine.txt").write_text("keep")
    result = cli("run", "copy", *TINY)
    assert result.exit_code == 0, result.output
    runs = [d for d in (tmp_path / "runs" / "copy").iterdir() if (d / "result.json").exists()]
    assert len(runs) == 1 and runs[0] not in taken and re.fullmatch(r"\d{8}-\d{6}-2", runs[0].name)
    assert all(sorted(p.name for p in d.iterdir()) == ["mine.txt"] for d in taken)


def wait_for(path, proc, timeout=300):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_run_directory_has_one_writer(tmp_path):
    out = tmp_path / "run"
    slow = ["--set", "data.train_size=20000", "--set", "train.epochs=50", "--quiet"]
    first = subprocess.Popen([sys.executable, "-m", "taskformer", "run", "copy", "--out", str(out), *slow],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(out / "config.json", first)
        again = run_cli("run", "copy", "--out", str(out), *TINY)
        resumed = run_cli("run", "--resume", str(out), "--quiet")
        for second in (again, resumed):
            assert second.returncode == 2, second.stderr
            assert "is being written by another taskformer process" in second.stderr
            assert len(second.stderr.strip().splitlines()) == 1
        assert first.poll() is None  # the first run goes on, alone
    finally:
        first.kill()
        first.communicate()
    assert json.loads((out / "config.json").read_text())["config"]["data"]["train_size"] == 20000


def test_out_refuses_a_folder_that_is_not_a_run(cli, tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.txt").write_text("my notes")
    result = cli("run", "copy", "--out", str(mine), *TINY)
    assert result.exit_code == 2
    assert "not empty and holds no taskformer run" in result.stderr
    assert sorted(p.name for p in mine.iterdir()) == ["report.txt"]
    assert (mine / "report.txt").read_text() == "my notes"


def test_an_empty_out_folder_is_used(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    result = cli("run", "copy", "--out", str(tmp_path / "empty"), *TINY)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "empty" / "result.json").is_file()


def test_resume_of_a_finished_run_is_refused_and_changes_nothing(finished, cli):
    before = (finished / "result.json").read_bytes()
    result = cli("run", "--resume", str(finished))
    assert result.exit_code == 2 and "has finished" in result.stderr
    assert (finished / "result.json").read_bytes() == before


@pytest.mark.parametrize("extra", [["copy"], ["--time-limit", "5"], ["--set", "train.epochs=9"], ["--seed", "3"],
                                   ["--out", "elsewhere"]])
def test_options_given_with_resume_are_refused_not_ignored(finished, cli, extra):
    result = cli("run", "--resume", str(finished), *extra)
    assert result.exit_code == 2
    assert "cannot be given with it" in result.stderr


def test_weights_that_diverge_are_never_kept_and_the_run_can_start_again(cli, tmp_path):
    # One huge update leaves finite but useless weights whose validation loss is NaN.
    out = tmp_path / "r"
    result = cli("run", "copy", "--out", str(out), *TINY, "--set", "train.lr=1e30", "--set", "train.warmup=0",
                 "--set", "train.clip=0")
    assert result.exit_code == 2
    assert "not kept" in result.stderr or "training loss became" in result.stderr
    assert "the best checkpoint so far is kept" in result.stderr  # every way it stops says what is left
    assert not out.exists()  # it failed before its first checkpoint: nothing to resume, nothing left
    again = cli("run", "copy", "--out", str(out), *TINY)
    assert again.exit_code == 0, again.output


def test_the_time_limit_stops_training_and_the_report_says_what_it_covered(cli, tmp_path):
    out = tmp_path / "r"
    # no patience and no epoch cap: only the clock ends it (a minute for the whole command, its start included:
    # room for a slow start on a busy machine)
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--quiet", "--set", "train.pace=1000",
                 "--set", "train.patience=0", "--set", "train.schedule=inverse_sqrt", "--set", "data.train_size=400",
                 "--set", "data.val_size=4", "--set", "data.test_size=4")
    assert result.exit_code == 0, result.output
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["steps"] >= 1 and info["time_limit_seconds"] == 60
    assert info["stopped"].startswith("time limit: after") and "kept for the last validation, the final " \
        "evaluation and the report" in info["stopped"]
    report = (out / "report.txt").read_text()
    assert "training and validation" in report and "of the 1 min time limit" in report
    weights = load_file(out / "model.safetensors")
    assert all(math.isfinite(float(v.abs().max())) for v in weights.values())


def test_the_first_interrupt_drops_a_long_validation_and_leaves_the_checkpoints_whole(tmp_path):
    out = tmp_path / "run"
    # Epochs of one logged update, then a long validation: once update 2 is logged, it is validating.
    proc = subprocess.Popen([sys.executable, "-m", "taskformer", "run", "copy", "--out", str(out), "--quiet", "--set",
                             "data.train_size=50", "--set", "data.val_size=10000", "--set", "train.epochs=50",
                             "--set", "train.log_every=1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(out / "metrics.jsonl", proc)
    while '"step": 2}' not in (out / "metrics.jsonl").read_text():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # stops the validation where it is
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err
    assert "during validation" in err.strip().splitlines()[-1] and "--resume" in err
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert not [e for e in events if e.get("event") == "eval" and e["step"] == 2]  # it did not wait for the end
    assert list((out / "checkpoints").glob("step-*")) and not list((out / "checkpoints").glob(".tmp-*"))
    assert load_file(sorted((out / "checkpoints").glob("step-*"))[-1] / "model.safetensors")


def tree(folder):
    """Every path under ``folder`` with its bytes (None for a folder): to show that nothing changed."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


SOMEONE_ELSES = {
    "a Hugging Face model folder": {"config.json": '{"model_type": "bert"}', "tokenizer.json": '{"version": "1.0"}',
                                    "model.safetensors": "weights"},
    "another tool's config.json": {"config.json": '{"task": "copy", "config": {"model": {}}}'},
    "a lone metrics.jsonl": {"metrics.jsonl": '{"loss": 1.0}\n'},
    "a user's checkpoints tree": {"checkpoints/epoch-1/weights.safetensors": "w", "checkpoints/notes.txt": "mine"},
    "the files of a run, without taskformer's marker": {"config.json": "{}", "tokenizer.json": "{}",
                                                        "metrics.jsonl": "", "checkpoints/.keep": ""},
}


@pytest.mark.parametrize("files", SOMEONE_ELSES.values(), ids=SOMEONE_ELSES)
def test_out_never_clears_a_folder_taskformer_did_not_mark(cli, tmp_path, files):
    folder = tmp_path / "theirs"
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = tree(folder)
    result = cli("run", "copy", "--out", str(folder), *TINY)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error:") and len(result.stderr.strip().splitlines()) == 1
    assert "nothing in it was changed" in result.stderr
    assert tree(folder) == before


STARTED = (".taskformer-run", "config.json", "tokenizer.json", "metrics.jsonl")  # before the first checkpoint


def test_a_run_is_marked_before_anything_else_and_only_a_marked_one_starts_afresh(finished, cli, tmp_path):
    run_id = json.loads((finished / ".taskformer-run").read_text())["taskformer_run"]
    assert json.loads((finished / "config.json").read_text())["binding"]["run"] == run_id
    marked, unmarked = tmp_path / "marked", tmp_path / "unmarked"
    for out in (marked, unmarked):  # what a run killed before its first checkpoint leaves (kill -9: no clean-up)
        out.mkdir()
        for name in STARTED:
            shutil.copy(finished / name, out / name)
    (unmarked / ".taskformer-run").unlink()  # the same files, unmarked (as a run of an older version): never cleared
    before = tree(unmarked)
    again = cli("run", "copy", "--out", str(unmarked), *TINY)
    assert again.exit_code == 2 and "already holds a run" in again.stderr and tree(unmarked) == before
    afresh = cli("run", "copy", "--out", str(marked), *TINY)
    assert afresh.exit_code == 0, afresh.output
    assert json.loads((marked / ".taskformer-run").read_text())["taskformer_run"] != run_id


@pytest.mark.parametrize("out", [None, "new/deep", "empty"])
def test_a_run_that_fails_before_its_first_checkpoint_leaves_nothing(cli, tmp_path, monkeypatch, out):
    """Bad data fails the run after its directory was made: the directory and the folders the run
    made go again; a folder of the user's (an empty --out that was there) stays, empty."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text('"1","a title","some text"\n"9","bad","class"\n')
    (tmp_path / "data" / "test.csv").write_text('"1","a title","some text"\n')
    (tmp_path / "empty").mkdir()
    result = cli("run", "agnews", "--data-dir", "data", *(["--out", out] if out else []), "--quiet")
    assert result.exit_code == 2 and "train.csv:2:" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "empty"] and not any((tmp_path / "empty").iterdir())


def test_a_run_written_before_the_marker_still_loads_and_is_never_cleared(finished, cli, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(finished, old)
    (old / ".taskformer-run").unlink()
    before = tree(old)
    predicted = cli("predict", str(old), "1 2 3")
    assert predicted.exit_code == 0 and predicted.stdout.count("\n") == 1, predicted.output
    again = cli("run", "copy", "--out", str(old), *TINY)
    assert again.exit_code == 2 and "already holds a run" in again.stderr
    assert tree(old) == before


def test_a_config_json_swapped_in_from_another_run_is_named_as_such(finished, cli, tmp_path):
    import shutil

    other = tmp_path / "other"
    assert cli("run", "copy", "--out", str(other), *TINY).exit_code == 0
    mixed = tmp_path / "mixed"
    shutil.copytree(finished, mixed)
    shutil.copy(other / "config.json", mixed / "config.json")
    result = cli("predict", str(mixed), "1 2")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"{mixed / 'config.json'}: the config of another run" in result.stderr  # not blamed on tokenizer.json


def test_a_dry_run_refuses_the_out_that_the_run_would_refuse(tmp_path, cli):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    dry = cli("run", "copy", "--out", str(out), "--dry-run", "--quiet")
    real = cli("run", "copy", "--out", str(out), "--quiet")
    assert dry.exit_code == real.exit_code == 2
    assert dry.stderr == real.stderr and "is not empty and holds no taskformer run" in dry.stderr
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_a_run_refused_by_its_data_leaves_no_run_directory(tmp_path, cli):
    out = tmp_path / "run"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("run", "translate-de-en", "--data-dir", str(empty), "--out", str(out), "--quiet")
    assert result.exit_code == 2 and "Error:" in result.stderr
    assert not out.exists()
