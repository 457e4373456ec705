"""The time limit's clock: a fake time source drives slow and fast stretches through the engine (the
cool-down follows the time left, and a resumed run decays as an uninterrupted one), the estimates
(a median pace, the reserve that follows the validations), and what a run says about its limit (the
minimum for a limit too short is in tests/test_budget.py), a busy start (its figures kept at what they
take with all the cores: neither refused nor stopped by them), and how the final evaluation is timed."""
import json
import math
import os
import re
import shutil
import threading
from dataclasses import dataclass
from types import SimpleNamespace
from typing import NamedTuple

import pytest
import torch

from taskformer.app import decodetime
from taskformer.core import clock
from taskformer.core.clock import Clock
from taskformer.core.data import Encoded
from taskformer.core.decode_config import DecodeConfig
from taskformer.core.engine import Trainer
from taskformer.core.model import BOS, EOS, Transformer
from taskformer.core.model_config import ModelConfig
from taskformer.core.train_config import TrainConfig

LIMIT = 100.0  # fake seconds of the whole limit
FINAL = 10.0  # fake seconds the final evaluation is estimated at


@pytest.fixture(autouse=True)
def one_thread():
    """A tiny model on a shared machine: one thread does not wait on the others' spinning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class FakeTime:
    """A time source that moves only when told: update ``step`` takes ``per_update(step)`` fake seconds."""

    def __init__(self, per_update):
        self.t, self.per_update = 0.0, per_update

    def __call__(self) -> float:
        return self.t

    def tick(self, step: int) -> None:
        self.t += self.per_update(step)


def trainer(run_dir, time, limit=LIMIT, **cfg):
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=25, d_model=16, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32,
                                    dropout=0.0))
    data = Encoded(src=[[5, 6, 7, EOS]] * 8, tgt=[[BOS, 5, 6, 7, EOS]] * 8)
    options = dict(epochs=0, max_tokens=10, warmup=4, cooldown=0.5, log_every=1, patience=0, eval_every=10)
    lrs: dict[int, float] = {}  # after each update, the rate the next one uses

    def on_event(e):
        if e["event"] == "train":
            lrs[e["step"]] = e["lr"]

    run_dir.mkdir(exist_ok=True)
    limit_clock = Clock(limit, started=time(), now=time)
    limit_clock.keep(FINAL)
    t = Trainer(model, TrainConfig(**{**options, **cfg}), data, lambda: {"score": 1.0}, ("score", True), run_dir,
                torch.device("cpu"), on_event=on_event)
    model.register_forward_pre_hook(lambda module, args: time.tick(t.state.step + 1))  # an update takes its time
    return t, limit_clock, lrs


def budget_end():
    return LIMIT - clock.reserve_for(FINAL)  # the training time a run with no start overhead has


@pytest.mark.parametrize("first, then", [(2.0, 0.5), (0.5, 2.0)], ids=["busy-then-idle", "idle-then-busy"])
def test_the_rate_reaches_zero_as_the_training_time_runs_out_whatever_the_pace(tmp_path, first, then):
    """The pace changes a third of the way in, before the decay begins at half the training time, and
    again inside it: the decay begins at half the time (not earlier), the rate only falls from there,
    and it reaches zero at the end of the time, not before."""
    def per_update(step):
        return first if time.t < budget_end() / 3 or 0.7 * budget_end() < time.t < 0.8 * budget_end() else then
    time = FakeTime(per_update)
    t, limit, lrs = trainer(tmp_path / "run", time)
    state = t.fit(limit)
    slowest = max(first, then)
    assert budget_end() - slowest <= state["elapsed"] <= budget_end() + slowest
    assert state["stopped"].startswith("time limit")
    start, began = state["decay"]
    assert budget_end() / 2 - slowest <= began <= budget_end() / 2 + slowest
    falling = [lr for step, lr in sorted(lrs.items()) if step >= start - 1]
    assert all(a >= b for a, b in zip(falling, falling[1:]))  # it only ever falls
    assert falling[-1] == 0.0 and falling[-2] > 0.0  # zero for an update that the time no longer has, not before
    assert falling[-2] <= slowest / (budget_end() / 2) * falling[0] * 1.05  # about one update's worth (no time grid)


def test_a_run_that_turns_fast_uses_its_budget_instead_of_ending_its_decay_early(tmp_path):
    """The case a decay fixed from the pace so far got wrong: slow until the decay begins, then four
    times faster. Its updates are those the time buys, not those the slow pace promised."""
    time = FakeTime(lambda step: 2.0 if time.t < budget_end() / 2 else 0.5)
    t, limit, _ = trainer(tmp_path / "run", time)
    state = t.fit(limit)
    slow_updates = int(budget_end() / 2 / 2.0)
    assert state["step"] > slow_updates + budget_end() / 2 / 0.5 * 0.9  # most of the fast updates were made
    assert state["elapsed"] >= budget_end() - 0.5


def test_the_reserve_follows_each_validation(tmp_path):
    """A validation that shows the final evaluation will take longer keeps more back at once: training
    stops that much earlier, and the decay still ends there."""
    time = FakeTime(lambda step: 1.0)
    t, limit, lrs = trainer(tmp_path / "run", time)

    def evaluate():
        limit.keep(30.0)  # measured: three times the probe's estimate
        return {"score": 1.0}
    t.evaluate = evaluate
    state = t.fit(limit)
    assert limit.reserve() == clock.reserve_for(30.0)
    assert LIMIT - clock.reserve_for(30.0) - 1.0 <= state["elapsed"] <= LIMIT - clock.reserve_for(30.0) + 1.0
    assert lrs[state["step"]] == 0.0


def test_an_estimate_timed_on_a_busy_machine_shrinks_when_the_updates_speed_up(tmp_path):
    """The final evaluation was timed while an update took 2 s (a busy start); the updates then take
    0.5 s, so it will take a quarter of that: the run trains into the time the busy estimate kept."""
    time = FakeTime(lambda step: 0.5)
    t, limit, _ = trainer(tmp_path / "run", time)
    limit.keep(40.0, per_update=2.0)
    state = t.fit(limit)
    assert limit.kept["final evaluation"] == pytest.approx(10.0)
    assert state["elapsed"] >= LIMIT - clock.reserve_for(10.0) - 0.5


@pytest.mark.parametrize("warmup_share", [0.0, 0.1], ids=["counted-warm-up", "warm-up-share"])
def test_a_resumed_run_decays_as_an_uninterrupted_one_at_the_same_pace(tmp_path, warmup_share):
    def per_update(step):
        return 1.0 if step < 30 or step > 60 else 0.25  # a change of pace after the checkpoint it resumes from
    full_time = FakeTime(per_update)
    full, full_clock, full_lrs = trainer(tmp_path / "full", full_time, 1.5 * LIMIT, save_every=5, keep_last=100,
                                         warmup_share=warmup_share)
    full.evaluate = lambda: (full_clock.keep(FINAL + full.state.step / 20), {"score": 1.0})[1]
    whole = full.fit(full_clock)
    start = whole["decay"][0]
    crashed = tmp_path / "crashed"
    shutil.copytree(tmp_path / "full", crashed)
    states = sorted((crashed / "checkpoints").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    inside = [s for s in states if start < int(s.name.split("-")[1]) < whole["step"] - 5]
    assert inside, "no checkpoint inside the decay to resume from"
    for later in states[states.index(inside[0]) + 1:]:
        shutil.rmtree(later)
    resumed_time = FakeTime(per_update)
    again, again_clock, again_lrs = trainer(crashed, resumed_time, 1.5 * LIMIT, save_every=5, keep_last=100,
                                            warmup_share=warmup_share)
    again.evaluate = lambda: (again_clock.keep(FINAL + again.state.step / 20), {"score": 1.0})[1]
    assert again.resume()
    resumed = again.fit(again_clock)
    assert again_lrs == {s: lr for s, lr in full_lrs.items() if s >= min(again_lrs)}  # the same rates, bit for bit
    assert [resumed[k] for k in ("step", "decay", "stopped", "elapsed", "clock")] == \
        [whole[k] for k in ("step", "decay", "stopped", "elapsed", "clock")]


def test_the_pace_is_the_median_of_its_samples_and_followed_over_the_run():
    """One busy update among five does not decide the pace; over the run it follows the last updates."""
    assert clock.median_pace([100] * 5, [1.0, 1.0, 10.0, 1.0, 1.0]) == 100.0
    limit = Clock(100.0, now=lambda: 0.0)
    for _ in range(50):
        limit.observe(2.0)
    assert limit.per_update == pytest.approx(2.0)
    limit.observe(20.0)  # one slow update moves it a little
    assert 2.0 < limit.per_update < 4.0


def test_the_decay_share_is_linear_over_the_last_part_of_the_time():
    assert [clock.decay_share(left, 10.0) for left in (20.0, 10.0, 5.0, 0.0, -1.0)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    now = FakeTime(lambda step: 0.0)
    limit = Clock(100.0, now=now)
    now.t = 80.0
    assert limit.decay(trained=80.0, fraction=0.5) == pytest.approx(20.0 / 50.0)  # 20 s left of a 50-s decay
    assert limit.decay(trained=80.0, fraction=0.5, begun=60.0) == pytest.approx(20.0 / 40.0)  # one begun at 60 s


def test_a_clock_says_what_it_keeps_back_and_why():
    now = FakeTime(lambda step: 0.0)
    limit = Clock.minutes(2, now=now)
    limit.keep(40.0)
    now.t = 30.0
    margin = clock.reserve_for(40.0) - 40.0  # on the estimate, and the report written after it
    assert margin > clock.REPORT_SECONDS and limit.kept == {
        "final evaluation": 40.0, "margin": pytest.approx(margin - clock.REPORT_SECONDS), "the report": clock.REPORT_SECONDS}
    assert (limit.left(), limit.for_training()) == (90.0, pytest.approx(90.0 - 40.0 - margin))
    # 30 used + what is kept + 100 of training, rounded up to the half minute
    assert limit.minimum(100.0) == math.ceil((130.0 + 40.0 + margin) / 30) / 2
    assert Clock(None).for_training() is None
    saved, again = limit.state(), Clock(120.0)
    again.restore(saved)
    assert again.kept == limit.kept


def test_a_run_that_used_little_of_its_limit_says_why_and_that_the_machine_was_busy():
    now = FakeTime(lambda step: 0.0)
    limit = Clock(300.0, now=now)
    limit.keep(50.0)
    limit.start_pace, limit.start_share = 3_000.0, 0.4  # probed while the machine was busy
    now.t = 200.0
    record = limit.account(tokens=1_500_000, trained=120.0, stopped="patience", final=5.0)
    assert record["start_pace"] == 3_000 and record["run_pace"] == 12_500 and record["used"] == pytest.approx(0.667)
    assert record["start_share"] == 0.4 and limit.busy()
    assert (record["final_estimate"], record["final_seconds"]) == (50.0, 5.0)
    why = record["short_of_limit"]
    kept = f"took 5 s of the {clock.reserve_for(50.0):.0f} s kept"
    assert "patience" in why and kept in why and "busier when the pace was probed" in why
    now.t = 290.0
    assert "short_of_limit" not in limit.account(1_500_000, 120.0, "time limit", 40.0)
    now.t = 360.0  # the final evaluation took longer than was kept for it
    over = limit.account(1_500_000, 120.0, "time limit", 110.0)
    assert "short_of_limit" not in over and "took 110 s of the" in over["over_limit"]


def test_an_estimate_measured_again_is_kept_at_the_pace_now_and_follows_the_pace_from_there():
    """A validation's time, or the final evaluation timed again, replaces its estimate: kept at what it took
    at the pace now, then scaled as the pace changes, as the probe's figures are."""
    limit = Clock(300.0, now=FakeTime(lambda step: 0.0))
    limit.keep(40.0, 2.0, per_update=1.0)
    limit.per_update = 0.5  # the updates sped up: what is kept back halves
    limit.measured("last validation", 3.0)
    assert limit.kept["last validation"] == pytest.approx(3.0) and limit.kept["final evaluation"] == 20.0
    limit.measured("final evaluation", 25.0)
    assert limit.kept["final evaluation"] == pytest.approx(25.0)
    limit.per_update = 2.0  # a busy stretch: neither grows past what it takes at the pace they were timed at
    assert limit.kept["last validation"] == pytest.approx(6.0) and limit.kept["final evaluation"] == pytest.approx(50.0)


@pytest.mark.slow
def test_each_validation_times_the_final_evaluation_again_and_the_run_keeps_that(cli, tmp_path, monkeypatch):
    """The probe timed the final evaluation at 10 ms an example and its validation at a ten-thousandth
    of that; the validations take longer than the latter, and are not scaled to the final evaluation:
    each times the final evaluation again (here at 20 ms an example), and that is what is kept."""
    from taskformer.app import prepare, training
    monkeypatch.setattr(prepare, "decode_seconds", lambda run, data: decodetime.DecodeTiming(1e-2, 1e-6, 0.0))
    again = []
    monkeypatch.setattr(training, "decode_seconds",
                        lambda run, data, validation: again.append(validation) or decodetime.DecodeTiming(2e-2, 0, 0))
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--set", "train.pace=100", "--set",
                 "train.max_steps=4", "--set", "train.eval_every=2", "--set", "train.threads=1", *COPY)
    assert result.exit_code == 0, result.output
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["recipe"]["final_seconds"] == 0.4  # 40 examples at 10 ms
    assert again == [False, False] and info["clock"]["final_estimate"] == 0.8  # timed again after each validation


@pytest.mark.slow
def test_the_final_evaluation_is_timed_again_where_the_cool_down_begins(cli, tmp_path, monkeypatch):
    """A short run may reach its end before its first validation: the final evaluation is also timed again
    where the cool-down begins, the last stretch, on the machine the end will find."""
    from taskformer.app import prepare, training
    monkeypatch.setattr(prepare, "decode_seconds", lambda run, data: decodetime.DecodeTiming(1e-2, 1e-6, 0.0))
    again = []
    monkeypatch.setattr(training, "decode_seconds", lambda run, data, validation: again.append(
        run.model.eval()) or decodetime.DecodeTiming(2e-2, 0, 0))
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--set", "train.pace=100", "--set",
                 "train.max_steps=6", "--set", "train.eval_every=100", "--set", "train.cooldown=0.5", "--set",
                 "train.threads=1", *COPY)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    cooldown = [e for e in events if e["event"] == "cooldown"]
    assert cooldown and len(again) == 2  # where the cool-down began, and after the one validation, at the end
    assert json.loads((out / "result.json").read_text())["info"]["clock"]["final_estimate"] == 0.8


def test_the_final_evaluation_timed_beside_another_process_is_not_kept(monkeypatch):
    """Timed again while other processes took the cores, the figure is a busy machine's, not the end's:
    the estimate stays as it was."""
    from taskformer.app import training
    from taskformer.core import cores
    readings = iter([cores.Usage(0.0, 0.0, 0.0), cores.Usage(10.0, 20.0, 5.0)])  # others: 1.5 of 2 cores
    monkeypatch.setattr(cores, "machine_usage", lambda: next(readings))
    monkeypatch.setattr(training, "decode_seconds", lambda *args, **kwargs: decodetime.DecodeTiming(1.0, 0, 0))
    data = SimpleNamespace(splits={"val": [("a", "b")] * 10, "test": [("c", "d")] * 10})
    limit = Clock(300.0, now=FakeTime(lambda step: 0.0))
    limit.keep(5.0)
    threads = cores.Threads(2, usage=lambda: None, most=torch.get_num_threads())
    training.retime_final(SimpleNamespace(model=torch.nn.Identity()), data, limit, threads)
    assert limit.kept["final evaluation"] == 5.0
    readings = iter([cores.Usage(0.0, 0.0, 0.0), cores.Usage(10.0, 6.0, 5.0)])  # others: 0.1 of 2 cores
    training.retime_final(SimpleNamespace(model=torch.nn.Identity()), data, limit, threads)
    assert limit.kept["final evaluation"] == 20.0


@pytest.mark.slow
def test_a_plan_too_small_to_learn_says_so_before_training_and_in_the_report(cli, tmp_path):
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--set", "train.pace=100",
                 "--set", "train.max_steps=2", "--set", "data.train_size=200", "--set", "data.val_size=8",
                 "--set", "data.test_size=8")
    assert result.exit_code == 0, result.output
    console = result.output + result.stderr
    assert "updates are too few to learn the task" in console and "would buy 100" in console
    info = json.loads((out / "result.json").read_text())["info"]
    assert "too few to learn" in info["recipe"]["few"]
    assert set(info["clock"]) >= {"start_pace", "run_pace", "used", "short_of_limit", "final_estimate", "final_seconds"}
    assert info["clock"]["start_pace"] == 100 and "reached train.max_steps=2" in info["clock"]["short_of_limit"]
    report = (out / "report.txt").read_text()
    assert "too few to learn" in report and "time limit used" in report and "why not all of it" in report


@pytest.mark.slow
def test_the_final_evaluation_is_timed_on_the_engine_that_decodes_it_outside_the_cache(cli, tmp_path, monkeypatch):
    """``decode.engine=auto`` decodes the copy task's final evaluation with CTranslate2, so the probe
    times CTranslate2 (converting its throwaway model three times: first untimed, paying what a process
    pays once, then timed for a validation and for the final evaluation, as a validation converts its
    weights and the end the trained ones), and leaves nothing in the engine cache."""
    from taskformer.app import engines
    cache, converted, convert = tmp_path / "cache", [], engines.convert
    monkeypatch.setenv("TASKFORMER_CACHE", str(cache))
    monkeypatch.setattr(engines, "convert", lambda choice, *rest: (converted.append(choice.engine), convert(choice, *rest)))
    result = cli("run", "copy", "--dry-run", "--time-limit", "1", "--set", "train.pace=10000",
                 "--set", "data.train_size=200", "--set", "data.val_size=20", "--set", "data.test_size=20")
    assert result.exit_code == 0, result.output
    assert converted == ["ctranslate2"] * 3 and "final evaluation: about" in result.stdout
    assert not list((cache / "engines").glob("*")) and os.environ["TASKFORMER_CACHE"] == str(cache)


def rates_by_update(run_dir, time, per_update=None, **cfg):
    """The rate each update's successor uses, by update, and the final state; ``per_update``: the seconds
    an update took when the estimates were timed, with all the cores (the probe's)."""
    t, limit, lrs = trainer(run_dir, time, **cfg)
    limit.keep(FINAL, per_update=per_update)
    state = t.fit(limit)
    return lrs, state


def test_with_a_warm_up_share_the_schedule_follows_the_updates_the_budget_buys(tmp_path):
    """A busy start (four times slower for the first third) and a warm-up count a slow probe would plan
    (one update): the warm-up still spans a tenth of the updates the run makes, as at an even pace, and
    the inverse-square-root decay after it counts updates, so the slow updates are not spent at a rate
    that the seconds they took have already decayed (a tenth of the *time* would be its first four
    updates). Counting train.warmup instead, the rate falls from the first update on."""
    def busy_start():
        time = FakeTime(lambda step: 2.0 if time.t < budget_end() / 3 else 0.5)
        return time
    for run, time in (("even", FakeTime(lambda step: 0.5)), ("busy", busy_start())):
        lrs, state = rates_by_update(tmp_path / run, time, 0.5, warmup=1, warmup_share=0.1, cooldown=0.3)
        assert state["elapsed"] >= budget_end() - 2.0  # the busy run used its time too
        peak = max(lrs, key=lambda step: lrs[step]) + 1  # the update that used the highest rate
        assert abs(peak - 0.1 * state["step"]) <= 2, (run, peak, state["step"])
        before_decay = [step for step in lrs if peak <= step < state["decay"][0] - 1]
        assert all(lrs[s] == pytest.approx(lrs[peak - 1] * (peak / (s + 1)) ** 0.5, rel=0.1) for s in before_decay)
    counted, _ = rates_by_update(tmp_path / "counted", busy_start(), 0.5, warmup=1, warmup_share=0.0, cooldown=0.3)
    assert all(counted[s] < lrs[s] for s in before_decay if s in counted)


def test_a_slow_stretch_does_not_multiply_what_is_kept_back():
    """The first update carries one-time costs (and a busy machine's): the pace followed starts from the
    one the estimates were timed at, and a slower pace keeps no more back (a busy stretch had stopped
    runs after their first updates); a faster one that lasts shrinks it."""
    now = FakeTime(lambda step: 0.0)
    limit = Clock(300.0, now=now)
    limit.keep(40.0, per_update=2.0)
    limit.observe(20.0)
    assert limit.per_update == pytest.approx(0.1 * 20.0 + 0.9 * 2.0)
    assert limit.for_training() == pytest.approx(300.0 - clock.reserve_for(40.0))  # a slower pace keeps no more back
    for _ in range(100):  # a faster pace that lasts is followed, and shrinks what is kept back
        limit.observe(0.5)
    assert limit.scale() == pytest.approx(0.25, rel=0.01)


def test_a_slower_pace_in_the_last_stretch_keeps_more_back():
    """Where the training time left is under what is kept back, the end will find the machine as it is
    now: a pace twice as slow keeps twice the final evaluation back (the run stops earlier and ends in
    time), where in the middle of the run it kept no more."""
    now = FakeTime(lambda step: 0.0)
    limit = Clock(300.0, now=now)
    limit.keep(40.0, per_update=1.0)
    for _ in range(100):
        limit.observe(2.0)
    assert not limit.last_stretch() and limit.reserve() == pytest.approx(clock.reserve_for(40.0))
    now.t = 300.0 - 1.9 * clock.reserve_for(40.0)  # the time left under twice what is kept back
    assert limit.last_stretch() and limit.scale() == pytest.approx(2.0, rel=0.01)
    assert limit.reserve() == pytest.approx(clock.reserve_for(80.0), rel=0.01)
    assert limit.for_training() < 0  # training stops now, for an evaluation twice as slow as timed


def test_a_busy_start_keeps_back_what_the_final_evaluation_takes_with_all_the_cores(tmp_path):
    """The probe ran while other processes held three quarters of the cores: the final evaluation it
    timed (four times what it takes idle) is kept at what it takes with all of them. The run trains
    through its busy start instead of stopping after its first update, and the pace's speed-up once the
    machine frees up (eight times: a busy machine slows training's updates far more than its share) does
    not shrink the figure further, until it is measured again: then it follows the pace from there."""
    time = FakeTime(lambda step: 2.0 if time.t < LIMIT / 3 else 0.25)  # busy, then idle
    t, limit, _ = trainer(tmp_path / "run", time)
    limit.keep(4 * FINAL, per_update=2.0, share=0.25)
    assert limit.kept["final evaluation"] == FINAL
    state = t.fit(limit)
    assert limit.kept["final evaluation"] == FINAL  # not an eighth of it
    assert LIMIT - clock.reserve_for(FINAL) - 0.25 <= state["elapsed"] <= LIMIT - clock.reserve_for(FINAL) + 0.25
    assert state["stopped"].startswith("time limit")
    limit.measured("final evaluation", 2 * FINAL)  # timed again at 0.25 s an update
    limit.per_update = 0.125
    assert limit.kept["final evaluation"] == pytest.approx(FINAL)
    busy = Clock(LIMIT, started=0.0, now=lambda: 0.0)
    busy.keep(8 * FINAL, per_update=2.0)  # the same figures taken as an idle machine's leave no time to train
    assert busy.for_training() <= 0


def busy_probe(monkeypatch, per_example: float, share: float = 0.2) -> None:
    """The probe measures a busy machine: this process had ``share`` of its cores' time, and the final
    evaluation took ``per_example`` seconds an example (the validation a quarter of that)."""
    from taskformer.app import prepare
    from taskformer.core import budget
    monkeypatch.setattr(budget, "measure_pace", lambda *args: (1_000.0, share))
    monkeypatch.setattr(prepare, "decode_seconds",
                        lambda run, data: decodetime.DecodeTiming(per_example, per_example / 4, 0.0))


COPY = ("--set", "data.train_size=200", "--set", "data.val_size=20", "--set", "data.test_size=20")


def test_a_busy_start_is_not_refused_and_says_so(cli, monkeypatch):
    """Timed on the busy machine the final evaluation (40 examples at 2 s) would take 80 s of the 60;
    with all the cores, a fifth of that: the run is planned, and says that the machine was busy."""
    busy_probe(monkeypatch, 2.0)
    result = cli("run", "copy", "--dry-run", "--time-limit", "1", *COPY)
    assert result.exit_code == 0, result.output + result.stderr
    assert "final evaluation: about 16 s" in result.stdout
    [busy] = [line for line in result.stdout.splitlines() if "the machine was busy" in line]
    assert "had 20% of its cores' time" in busy and "80 s timed here are kept at 16 s" in busy


def test_a_limit_that_even_an_idle_machine_cannot_use_is_refused_with_the_minimum(cli, monkeypatch):
    """The final evaluation takes 800 s timed busy, 160 s with all the cores: a minute is too short
    either way, and the minimum said is the idle machine's (the time kept back for 160 s, and more)."""
    busy_probe(monkeypatch, 20.0)
    result = cli("run", "copy", "--dry-run", "--time-limit", "1", *COPY)
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()[-1:]
    minimum = re.search(r"needs about 160 s here; give at least ([0-9.]+) minutes", line)
    assert minimum, line
    idle_reserve = clock.reserve_for(160 + 20 * 5 * 0.2)  # the final evaluation and the last validation
    assert idle_reserve / 60 < float(minimum[1]) < clock.reserve_for(800) / 60


class WordTokenizer:
    """Tokens are words: a stand-in with the two calls the timing sample makes."""

    class Encoding(NamedTuple):
        ids: list[int]

    def encode(self, text: str):
        return self.Encoding(list(range(len(text.split()))))

    def encode_batch(self, texts):
        return [self.encode(text) for text in texts]


@dataclass
class Config:
    decode: DecodeConfig


def timed_run(batch_size: int = 8, workers: int = 2):
    decode = SimpleNamespace(batch_size=batch_size, workers=workers)
    return SimpleNamespace(config=SimpleNamespace(decode=decode), device=torch.device("cpu"),
                           tokenizer=WordTokenizer(), task=SimpleNamespace(variant="encoder-decoder"))


def test_the_decode_is_timed_on_lengths_spread_as_val_and_side_by_side_as_it_decodes(monkeypatch):
    """The final evaluation's estimate is timed on whole groups of one source length at the middle of
    equal slices of val sorted by length (not one every few distinct lengths, which weighs a long tail
    of a few rows as much as the many short ones), decoded side by side as the decoder's workers do,
    each group written to its longest reference and its end."""
    short, middle = [("a b", "x y z")] * 60, [("a b c d", "x")] * 30
    tail = [(" ".join(["w"] * n), "x") for n in range(10, 20)]  # ten long rows, each of a length of its own
    data = SimpleNamespace(splits={"val": short + middle + tail})
    run = timed_run()
    sample = decodetime.timing_sample(run, data)
    assert [sorted({len(row[0].split()) for row in group}) for group in sample] == [[2], [4]]
    assert [len(group) for group in sample] == [8, 8]  # cut to a decoding batch
    together = threading.Barrier(2, timeout=10)  # each group waits for the other: side by side, or it fails
    decoded = []

    def evaluate(run, group, config, name):
        together.wait()
        decoded.append((len(group[0][0].split()), config.decode.max_len_b))
    monkeypatch.setattr(decodetime, "evaluate_split", evaluate)
    config = Config(DecodeConfig(workers=2))
    assert decodetime.seconds_per_example(run, sample, config) >= 0
    assert sorted(decoded) == [(2, 4), (4, 2)]  # three words and the end; one word and the end
    # and the final evaluation of val and test is those seconds an example for each, and the conversion once
    timing = decodetime.DecodeTiming(final=0.5, validation=0.25, fixed=3.0)
    both = SimpleNamespace(splits={"val": [("a", "b")] * 10, "test": [("c", "d")] * 20})
    assert decodetime.final_seconds(both, timing) == (3.0 + 0.5 * 30, 0.25 * 10)


def test_the_estimate_counts_the_lengths_a_trained_model_writes():
    """A runtime drops each row as it ends, so the timing's groups, each written to its longest
    reference, are scaled to their references' own lengths; a validation whose outputs ran longer
    than its references (a model early in training, on to the length limit) is scaled to theirs, so
    neither keeps back what the trained model's final evaluation will not take."""
    run = timed_run()
    long_outputs = [("a", "x " * 15, "x y z")] * 4  # 16 tokens written where the references hold 4
    assert decodetime.length_share(run, long_outputs) == pytest.approx(4 / 16)
    assert decodetime.length_share(run, [("a", "x y z", "x y z")]) == 1.0
    # a batch (sources of one length) runs until its longest output ends: one long row holds up the rest
    held_up = [("a", "x y z", "x y z")] * 3 + [("a", "x " * 7, "x y z")]
    assert decodetime.length_share(run, held_up) == pytest.approx(4 * 4 / (4 * 8))
    apart = [("a", "x y z", "x y z"), ("a b", "x " * 7, "x y z")]  # two source lengths: two batches
    assert decodetime.length_share(run, apart) == pytest.approx((4 + 4) / (4 + 8))
    classifier = SimpleNamespace(**{**vars(run), "task": SimpleNamespace(variant="encoder-only")})
    assert decodetime.length_share(classifier, long_outputs) == 1.0



def test_the_final_evaluation_is_timed_on_groups_of_the_split_it_decodes_most_of(monkeypatch):
    """A small val's groups of one source length are a few rows each, where a large test's are whole
    batches, decoded at a fraction of the time an example: the final evaluation is timed on groups of
    the larger split, a validation on val's."""
    val = [(" ".join(["w"] * n), "x") for n in range(2, 10)]  # eight rows, each of a length of its own
    test = [("a b c", "x")] * 40
    data = SimpleNamespace(splits={"val": val, "test": test})
    timed = []
    monkeypatch.setattr(decodetime, "seconds_per_example", lambda run, groups, config: timed.append(
        (config.decode.strategy, [len(group) for group in groups])) or 1.0)
    monkeypatch.setattr(decodetime, "engine_choice", lambda *args: SimpleNamespace(engine="torch"))
    run = timed_run()
    run.model = torch.nn.Identity()
    run.config = SimpleNamespace(decode=DecodeConfig(strategy="beam", eval_strategy="greedy", batch_size=8,
                                                     workers=2))
    monkeypatch.setattr(decodetime, "validation_config", lambda config, engine="torch": SimpleNamespace(
        decode=DecodeConfig(strategy="greedy", batch_size=8, engine=engine)))
    decodetime.decode_seconds(run, data)
    assert timed[1] == ("greedy", [1, 1]) and timed[-1] == ("beam", [8])  # val's lone rows; test's whole batch


def test_a_runtime_is_timed_one_group_at_a_time(monkeypatch):
    """A runtime splits a lone call across its own workers and keeps a call made beside another whole on
    one worker: two groups at once would leave a worker idle while the second decodes, and the estimate
    would be half as long again as the final evaluation's stream of batches. So its groups are timed
    one after another (our decoder's, side by side: the test above)."""
    data = SimpleNamespace(splits={"val": [("a b", "x y")] * 8 + [("a b c d", "x")] * 8,
                                   "test": [("a b", "x y")] * 8 + [("a b c d", "x")] * 8})
    alone, overlapped, timed = threading.Lock(), [], []

    def evaluate(run, group, config, name):
        if not alone.acquire(blocking=False):  # another group is being decoded now
            overlapped.append(len(group))
        else:
            try:
                timed.append(len(group))
                threading.Event().wait(0.05)  # room for a group started beside it to arrive
            finally:
                alone.release()
        return {}, [(row[0], row[1], row[1]) for row in group]
    monkeypatch.setattr(decodetime, "evaluate_split", evaluate)
    monkeypatch.setattr(decodetime, "engine_choice", lambda *args: SimpleNamespace(engine="ctranslate2"))
    run = timed_run()
    run.model = torch.nn.Linear(1, 1, bias=False)
    run.config = Config(DecodeConfig(strategy="greedy", engine="ctranslate2", batch_size=8, workers=2))
    decodetime.decode_seconds(run, data, validation=False)
    assert timed.count(8) == 4 and not overlapped  # both groups, converting and again, one at a time


@pytest.mark.parametrize("runtime, expected", [(0.2, "ctranslate2"), (2.0, "torch")], ids=["faster", "slower"])
def test_validations_decode_on_the_runtime_where_the_probe_timed_it_faster(monkeypatch, runtime, expected):
    """A validation is timed on our decoder and on the final evaluation's runtime, its conversion of new
    weights included (each validation's weights are new): the faster is where the run validates."""
    data = SimpleNamespace(splits={"val": [("a b c", "x")] * 40, "test": [("a b", "x")] * 40})
    converting = []

    def per_example(run, groups, config, outputs=None, side_by_side=True):  # a first decode of new weights converts
        if config.decode.engine == "torch":
            return 1.0
        first = bool(converting) and converting[-1] != [p._version for p in run.model.parameters()]
        converting.append([p._version for p in run.model.parameters()])
        return runtime + (1.0 / 8 if first else 0.0)  # a conversion of 1 s over the group's 8 rows
    monkeypatch.setattr(decodetime, "seconds_per_example", per_example)
    monkeypatch.setattr(decodetime, "engine_choice", lambda task, model, config: SimpleNamespace(
        engine="torch" if config.decode.engine == "torch" else "ctranslate2"))
    run = timed_run()
    run.model = torch.nn.Linear(1, 1, bias=False)
    run.config = Config(DecodeConfig(strategy="beam", eval_strategy="greedy", engine="auto", batch_size=8))
    timing = decodetime.decode_seconds(run, data)
    assert timing.validation_engine == expected
    if expected == "torch":
        assert timing.validation == 1.0
    else:  # the runtime's seconds an example, and its conversion spread over val's 40 rows
        assert timing.validation == pytest.approx(0.2 + 1.0 / 40) and timing.validation_torch == 1.0
    assert decodetime.validation_config(run.config, timing.validation_engine).decode.engine == expected


@pytest.mark.slow
def test_a_run_validates_where_its_plan_says_outside_the_cache_and_says_so(cli, tmp_path, monkeypatch):
    """The plan's validation engine decodes every validation (each converting that validation's
    weights into a temporary folder, not the user's engine cache); the console, result.json and the
    report say where the validations ran and what the probe timed."""
    from taskformer.app import engines, prepare, training
    cache, converted, convert = tmp_path / "cache", [], engines.convert
    monkeypatch.setenv("TASKFORMER_CACHE", str(cache))
    monkeypatch.setattr(engines, "convert", lambda choice, *rest: (
        converted.append(os.environ["TASKFORMER_CACHE"]), convert(choice, *rest)))
    monkeypatch.setattr(prepare, "decode_seconds", lambda run, data: decodetime.DecodeTiming(
        1e-2, 1e-3, 0.0, "ctranslate2", 1e-2))
    monkeypatch.setattr(training, "decode_seconds", lambda run, data, validation: decodetime.DecodeTiming(1e-2, 0, 0))
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--set", "train.pace=100", "--set",
                 "train.max_steps=4", "--set", "train.eval_every=2", "--set", "train.threads=1", *COPY)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    validations = [e for e in events if e["event"] == "eval" and e.get("split") == "val"]
    assert len(validations) == 2 and converted[:2] == ["off", "off"]  # each validation's, uncached
    assert converted[2:] and all(c == str(cache) for c in converted[2:])  # the final evaluation's, cached
    recipe = json.loads((out / "result.json").read_text())["info"]["recipe"]
    assert recipe["validation_engine"] == "ctranslate2"
    said = "validations decode on ctranslate2, its conversion of the weights included: about 0.0 s each against 0.2 s"
    assert said in recipe["validating"] and said in result.output
    assert "validations" in (out / "report.txt").read_text()



@pytest.mark.slow
def test_the_last_validation_kept_counts_the_averaged_weights_validation_too(cli, tmp_path, monkeypatch):
    """With ``train.average_last`` a validation decodes twice, the weights' and their average's: the last
    validation that may follow the last update is kept at both, not at the second alone."""
    from taskformer.app import prepare, training
    monkeypatch.setattr(prepare, "decode_seconds", lambda run, data: decodetime.DecodeTiming(1e-2, 1e-6, 0.0))
    monkeypatch.setattr(training, "decode_seconds", lambda run, data, validation: decodetime.DecodeTiming(1e-2, 0, 0))
    monkeypatch.setattr(training, "length_share", lambda *args: 1.0)
    kept, measured = [], Clock.measured
    monkeypatch.setattr(Clock, "measured", lambda self, why, seconds: (
        kept.append(seconds) if why == "last validation" else None, measured(self, why, seconds)))
    fake, evaluate_split = [0.0], training.evaluate_split

    def five_seconds(*args, **kwargs):  # each validation's decode takes 5 s of a clock that moves only then
        fake[0] += 5.0
        return evaluate_split(*args, **kwargs)
    monkeypatch.setattr(training, "evaluate_split", five_seconds)
    begin = Clock.__post_init__
    monkeypatch.setattr(Clock, "__post_init__", lambda self: (setattr(self, "now", lambda: fake[0]), begin(self))[1])
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--set", "train.pace=100", "--set",
                 "train.max_steps=4", "--set", "train.eval_every=2", "--set", "train.average_last=2",
                 "--set", "train.threads=1", *COPY)
    assert result.exit_code == 0, result.output
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [e.get("averaged") for e in events if e["event"] == "eval"] == [None, None, [2, 4]]
    # step 2: one validation; step 4: the weights', then their average's, kept as the two together
    assert kept == [5.0, 5.0, 10.0]


@pytest.mark.parametrize("device, model, share", [("cpu", "untrained", (2 + 4 + 8) / (3 * 8)),
                                                   ("cpu", "trained", 1.0), ("cuda", "untrained", 1.0)])
def test_a_runtime_is_timed_at_each_references_length_on_a_cpu_and_the_longest_on_a_gpu(monkeypatch, device, model,
                                                                                          share):
    """A runtime drops each row as it ends: on a CPU its time follows the tokens it writes, so the timing
    is scaled from what it wrote (an untrained model: each group's longest reference; a trained one: each
    row about its own) to each row's reference; a GPU's follows the steps, the batch's longest output,
    whatever rows are left."""
    group = [("a", "x"), ("a", "x y z"), ("a", "x y z w v u t")]  # 2, 4 and 8 tokens with the end
    data = SimpleNamespace(splits={"val": group, "test": group})

    def per_example(run, groups, config, outputs=None, side_by_side=True):
        for rows in groups:
            longest = max(rows, key=lambda row: len(row[1]))[1]
            (outputs if outputs is not None else []).extend(
                (source, longest if model == "untrained" else reference, reference) for source, reference in rows)
        return 1.0
    monkeypatch.setattr(decodetime, "seconds_per_example", per_example)
    monkeypatch.setattr(decodetime, "engine_choice", lambda task, model, config: SimpleNamespace(engine="ctranslate2"))
    run = timed_run()
    run.device, run.model = torch.device(device), torch.nn.Linear(1, 1, bias=False)
    run.config = Config(DecodeConfig(strategy="beam", eval_strategy="greedy", engine="auto", batch_size=8))
    assert decodetime.decode_seconds(run, data, validation=False).final == pytest.approx(share)

