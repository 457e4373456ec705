"""Tracker plugins (``taskformer_track``): every event a run logs reaches them, and the built-in
TensorBoard tracker writes its event files into the run directory when asked."""
from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from taskformer import hookimpl

TINY = ["--quiet", "--set", "data.train_size=40", "--set", "data.val_size=4", "--set", "data.test_size=4",
        "--set", "train.max_steps=4", "--set", "train.log_every=1", "--set", "train.eval_every=2"]


class Recorder:
    """A tracker that keeps what it hears."""

    def __init__(self):
        self.events = []

    @hookimpl
    def taskformer_track(self, run_dir, event):
        self.events.append((run_dir, json.loads(json.dumps(event))))  # JSON-ready, as the hook promises


def test_a_tracker_hears_the_start_every_logged_record_and_the_result(cli, register, tmp_path):
    recorder = register(Recorder(), "recorder")
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), *TINY)
    assert result.exit_code == 0, result.stderr
    assert {run_dir for run_dir, _ in recorder.events} == {out}
    events = [e for _, e in recorder.events]
    start, *logged, end = events
    assert start["event"] == "start" and start["task"] == "copy" and start["resumed"] is False
    assert start["config"] == json.loads((out / "config.json").read_text())["config"]
    assert logged == [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {e["event"] for e in logged} >= {"train", "eval"}
    saved = json.loads((out / "result.json").read_text())
    assert end == {"event": "result", "metrics": saved["metrics"], "info": saved["info"]}
    assert not (out / "tensorboard").exists()  # the built-in tracker is off by default


def test_a_failing_tracker_is_named_in_one_error_line(cli, register, tmp_path):
    class Broken:
        @hookimpl
        def taskformer_track(self, event):
            if event["event"] == "eval":
                raise RuntimeError("the tracking server is down")

    register(Broken(), "broken-tracker")
    result = cli("run", "copy", "--out", str(tmp_path / "run"), *TINY)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: plugin 'broken-tracker' failed in taskformer_track for task 'copy': RuntimeError: the tracking "
        "server is down"]


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason="tensorboard is not installed (pip install taskformer[tensorboard])")
def test_tensorboard_writes_the_runs_scalars_into_the_run_directory(cli, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), *TINY, "--set", "train.tensorboard=true")
    assert result.exit_code == 0, result.stderr
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))
    board = EventAccumulator(str(out / "tensorboard"))
    board.Reload()
    tags = set(board.Tags()["scalars"])
    assert {"train/loss", "val/loss", "result/test/loss"} <= tags
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [(e["step"], e["loss"]) for e in logged if e["event"] == "eval"]
    assert [(s.step, pytest.approx(s.value)) for s in board.Scalars("val/loss")] == val


def test_tensorboard_asked_for_but_not_installed_is_refused_before_training(cli, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now raises ImportError
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), *TINY, "--set", "train.tensorboard=true")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: train.tensorboard=true needs the tensorboard package: pip install taskformer[tensorboard]"]
    assert not out.exists()

