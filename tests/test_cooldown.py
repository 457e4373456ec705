"""`train.cooldown`: the learning rate falls linearly to zero over the last part of the budget (and, with DDP,
the averaging of `train.average_last` too: one two-process run checks both)."""
import json
import shutil

import pytest
from safetensors.torch import load_file

from conftest import run_cli
from taskformer.core import checkpoint as ckpt

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

SMALL = ["--quiet", "--set", "data.train_size=600", "--set", "data.val_size=20", "--set", "data.test_size=20",
         "--set", "train.log_every=1", "--set", "train.warmup=5"]


def events(run_dir, kind):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def rates(run_dir):
    return {e["step"]: e["lr"] for e in events(run_dir, "train")}


def test_a_step_budget_cools_down_over_its_last_quarter(tmp_path, cli):
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), *SMALL, "--set", "train.max_steps=40", "--set", "train.epochs=100",
                 "--set", "train.cooldown=0.25", "--set", "train.schedule=inverse_sqrt")
    assert result.exit_code == 0, result.output
    [start] = events(out, "cooldown")
    # decided after update 31 (three quarters of 40 and one): the rate of update 32 is the first to fall,
    # over the 9 updates to the last
    assert (start["step"], start["after"], start["updates"]) == (31, 32, 9)
    lr = rates(out)  # the rate logged after update s is the one update s + 1 uses
    assert lr[30] == pytest.approx(lr[29] * (30 / 31) ** 0.5)  # the paper's decay until then
    falling = [lr[s] for s in range(31, 41)]
    assert falling[0] == start["lr"] == pytest.approx(lr[30] * (31 / 32) ** 0.5 * 9 / 10)
    assert all(a > b for a, b in zip(falling, falling[1:])) and falling[-1] == 0.0
    diffs = [a - b for a, b in zip(falling, falling[1:])]
    assert max(diffs) == pytest.approx(min(diffs))  # linear
    assert json.loads((out / "result.json").read_text())["info"]["steps"] == 40


def test_a_time_limit_decays_over_the_last_share_of_its_training_time(tmp_path, cli):
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), *SMALL, "--time-limit", "0.25", "--set", "train.epochs=1000",
                 "--set", "train.cooldown=0.5", "--set", "train.patience=0")  # only the clock or the decay may end it
    assert result.exit_code == 0, result.output
    [start] = events(out, "cooldown")
    assert start["seconds"] > 0
    after = [lr for step, lr in sorted(rates(out).items()) if step >= start["after"]]
    # it falls to the end of the time (a validation that shrinks the time kept back may lift it a little)
    assert after and after[-1] < start["lr"] / 2 and sum(a > b for a, b in zip(after, after[1:])) >= len(after) // 2
    info = json.loads((out / "result.json").read_text())["info"]
    # the decay follows the time left (tests/test_clock.py drives it with a fake clock): it ends with the time
    assert info["stopped"].startswith("time limit")


def test_resume_inside_the_cooldown_is_exact(tmp_path):
    full = tmp_path / "full"
    options = [*SMALL, "--set", "train.epochs=3", "--set", "train.cooldown=0.5", "--set", "train.save_every=4",
               "--set", "train.keep_last=50", "--set", "train.average_last=2"]
    assert run_cli("run", "copy", "--out", str(full), *options).returncode == 0
    [start] = events(full, "cooldown")
    crashed = tmp_path / "crashed"
    shutil.copytree(full, crashed)
    states = sorted((crashed / "checkpoints").glob("step-*"))
    inside = [s for s in states if start["after"] < int(s.name.split("-")[1]) < start["after"] + start["updates"]]
    assert inside, "no checkpoint inside the cool-down to resume from"
    for later in states[states.index(inside[0]) + 1:]:
        shutil.rmtree(later)
    (crashed / "result.json").unlink()
    resumed = run_cli("run", "--resume", str(crashed), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert rates(crashed) == rates(full)
    assert events(crashed, "eval") == events(full, "eval")
    assert events(crashed, "cooldown") == [start]


def test_a_cooldown_that_is_not_a_fraction_is_a_one_line_error(cli, tmp_path):
    result = cli("run", "copy", "--out", str(tmp_path / "r"), "--quiet", "--set", "train.cooldown=1")
    assert result.exit_code == 2
    assert "train.cooldown must be a fraction in [0, 1)" in result.stderr and len(result.stderr.splitlines()) == 1


def test_two_processes_average_and_cool_down_like_one(tmp_path):
    """One DDP run checks both features that keep state across ranks (it is the slowest kind of test)."""
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    two, one = tmp_path / "two", tmp_path / "one"
    # One thread in every process: the same kernels on both sides, so the sums round alike.
    options = [*SMALL, "--set", "train.epochs=3", "--set", "train.average_last=2", "--set", "train.cooldown=0.5",
               "--set", "train.threads=1"]
    ddp = run_cli("run", "copy", "--nproc", "2", "--out", str(two), *options, env=cpu)
    assert ddp.returncode == 0, ddp.stderr
    single = run_cli("run", "copy", "--set", "train.accumulate=2", "--out", str(one), *options, env=cpu)
    assert single.returncode == 0, single.stderr
    assert events(two, "cooldown") == events(one, "cooldown") and len(events(one, "cooldown")) == 1
    assert rates(two) == pytest.approx(rates(one))
    averaged = [e.get("averaged") for e in events(one, "eval")]
    assert [e.get("averaged") for e in events(two, "eval")] == averaged and any(averaged)
    assert list(ckpt.evaluated_weights(two)) == list(ckpt.evaluated_weights(one))
    # The training weights after the last average was evaluated are those of training, as with one process.
    a, b = (load_file(sorted((d / "checkpoints").glob("step-*"))[-1] / "model.safetensors") for d in (two, one))
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4
    assert "kept_weights" in json.loads((two / "result.json").read_text())["info"]
