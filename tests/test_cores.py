"""torch's threads on a busy machine (core/cores.py): a fake machine drives a busy stretch, then an idle
one, through the engine and through ``taskformer run``; the threads go down and back up, and the run's
record says so. The machine's figures are read from /proc/stat's text, here a fixture."""
import json
import os

import pytest
import torch

from taskformer.core import cores
from taskformer.core.clock import Clock
from taskformer.core.cores import Threads, Usage
from taskformer.core.data import Encoded
from taskformer.core.engine import Trainer
from taskformer.core.model import BOS, EOS, Transformer
from taskformer.core.model_config import ModelConfig
from taskformer.core.train_config import TrainConfig

STAT = """cpu  4743007 48634 264640 1756154 8657 0 2136 2353 100 0
cpu0 2026091 25463 100012 1256555 1529 0 376 1130 50 0
cpu1 2716916 23170 164627 499599 7128 0 1760 1222 50 0
intr 1 2 3
ctxt 123
"""


@pytest.fixture(autouse=True)
def keep_threads():
    """Each test sets the threads it starts with; the process gets its own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


class FakeMachine:
    """A machine of ``cores`` cores whose other processes use ``load(t)`` of them at fake time ``t``, while
    this process uses what is left of its threads (its counters, as /proc/stat and os.times give them)."""

    def __init__(self, time, load, cores=2):
        self.time, self.load, self.cores = time, load, cores
        self.at, self.busy, self.own = time(), 0.0, 0.0

    def __call__(self) -> Usage:
        t = self.time()
        others = self.load(self.at)
        mine = min(torch.get_num_threads(), self.cores - others)
        self.busy += (others + mine) * (t - self.at)
        self.own += mine * (t - self.at)
        self.at = t
        return Usage(t, self.busy, self.own)


def test_the_threads_drop_while_others_hold_the_cores_and_come_back_when_they_stop(tmp_path):
    """Two cores; other processes use 1.5 of them from 20 s to 50 s of an 80 s limit (an update takes 2 s):
    training goes on one thread from the first look in the busy stretch, back on two after it, and the
    state records both."""
    t = [0.0]
    machine = FakeMachine(lambda: t[0], lambda at: 1.5 if 20 <= at < 50 else 0.05)
    torch.set_num_threads(2)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=25, d_model=16, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32,
                                    dropout=0.0))
    data = Encoded(src=[[5, 6, 7, EOS]] * 8, tgt=[[BOS, 5, 6, 7, EOS]] * 8)
    cfg = TrainConfig(epochs=0, max_tokens=10, warmup=4, cooldown=0.5, patience=0, eval_every=0, log_every=1000)
    said: list[dict] = []
    threads_at: dict[float, int] = {}  # the threads each update ran on, by the fake time it began

    def one_update(module, args):
        threads_at[t[0]] = torch.get_num_threads()
        t[0] += 2.0
    model.register_forward_pre_hook(one_update)
    limit = Clock(80.0, started=0.0, now=lambda: t[0])
    trainer = Trainer(model, cfg, data, lambda: {"score": 1.0}, ("score", True), tmp_path, torch.device("cpu"),
                      on_event=lambda e: said.append(e) if e["event"] == "threads" else None,
                      threads=Threads(2, machine))
    state = trainer.fit(limit)
    down, up = state["threads"]
    assert (down["from"], down["to"], up["from"], up["to"]) == (2, 1, 1, 2)
    assert 20 <= down["seconds"] <= 20 + 2 * cores.EVERY and down["others"] == pytest.approx(1.5, abs=0.3)
    assert 50 <= up["seconds"] <= 50 + 2 * cores.EVERY and up["others"] < cores.FREED
    assert [{k: v for k, v in e.items() if k != "event"} for e in said] == state["threads"]
    assert {n for at, n in threads_at.items() if down["seconds"] < at < up["seconds"]} == {1}
    assert {n for at, n in threads_at.items() if at < 20 or at > up["seconds"]} == {2}
    assert torch.get_num_threads() == 2  # what follows training has the threads it started with


@pytest.mark.parametrize("threads, others, to", [
    (2, 0.4, 2),  # under half a core: not taken
    (2, 0.6, 1),  # over half: taken
    (1, 0.4, 1),  # at one thread, 0.4 is not free enough to come back (no flapping near the line)
    (1, 0.2, 2),  # freed
    (1, 1.9, 1),  # never fewer than one
    (2, 0.0, 2),  # never more than the start
    (16, 3.2, 13), (16, 3.6, 12), (12, 3.9, 12), (12, 2.8, 13), (12, 1.1, 15),  # 16 cores: a thread a core
])
def test_a_thread_goes_for_each_core_others_take_and_comes_back_for_each_they_free(threads, others, to):
    cores_, most = (16, 16) if threads > 2 else (2, 2)
    assert cores.wanted(threads, most, cores_, others) == to


def test_the_machines_figures_are_read_from_proc_stat(tmp_path):
    assert cores.parse_stat(STAT) == (2, 4743007 + 48634 + 264640 + 1756154 + 8657 + 0 + 2136 + 2353, 1756154 + 8657)
    assert cores.parse_stat("intr 1 2\n") is None and cores.parse_stat("cpu  a b c d e\ncpu0 1\n") is None
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    usage = cores.machine_usage(stat)
    tick = os.sysconf("SC_CLK_TCK")
    assert usage is not None and usage.seconds == pytest.approx(6_825_581 / 2 / tick)
    assert usage.busy == pytest.approx((6_825_581 - 1_764_811) / tick)
    assert cores.machine_usage(tmp_path / "missing") is None
    later = Usage(usage.seconds + 10, usage.busy + 15, usage.own + 5)
    assert later.others(usage) == pytest.approx(1.0)  # 15 core-seconds in 10 s, 5 of them this process's


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity here")
def test_figures_that_are_not_this_processs_cores_are_not_followed(tmp_path):
    """/proc/stat counts the machine's cores: where this process may use fewer (its affinity mask, a cgroup
    quota), the others' load is not what it competes with, and nothing is followed."""
    mine = len(os.sched_getaffinity(0))
    stat, quota = tmp_path / "stat", tmp_path / "cpu.max"
    stat.write_text("cpu  10 0 10 80 0 0 0 0 0 0\n" + "".join(f"cpu{i} 5 0 5 40 0 0 0 0 0 0\n" for i in range(mine)))
    assert cores.cores_here(stat, quota) == mine  # no quota file: none
    quota.write_text("max 100000\n")
    assert cores.cores_here(stat, quota) == mine
    quota.write_text(f"{50_000 * mine} 100000\n")  # half of the cores' time
    assert cores.cores_here(stat, quota) is None
    stat.write_text(stat.read_text() + f"cpu{mine} 5 0 5 40 0 0 0 0 0 0\n")  # a core this process may not use
    assert cores.cores_here(stat, tmp_path / "none") is None
    assert cores.cores_here(tmp_path / "missing", quota) is None


@pytest.mark.slow
def test_a_run_says_when_its_threads_follow_a_busy_machine_and_records_it(cli, tmp_path, monkeypatch):
    """``taskformer run`` under a time limit: the machine is busy at the first two looks, then free."""
    looks = iter([0.0, 1.5, 1.5] + [0.0] * 100)  # the cores others use at each look

    class Machine:
        def __init__(self):
            self.usage = Usage(0.0, 0.0, 0.0)

        def __call__(self) -> Usage:
            u = self.usage
            self.usage = Usage(u.seconds + 3, u.busy + 3 * (next(looks) + 0.5), u.own + 1.5)
            return self.usage
    monkeypatch.setattr(cores, "cores_here", lambda: 2)
    monkeypatch.setattr(cores, "machine_usage", Machine())
    monkeypatch.setattr(cores, "EVERY", 0.0)
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--time-limit", "1", "--set", "train.pace=10000",
                 "--set", "train.threads=2", "--set", "train.max_steps=4", "--set", "data.train_size=200",
                 "--set", "data.val_size=8", "--set", "data.test_size=8")
    assert result.exit_code == 0, result.output
    console = result.stderr
    assert "the machine is busy (other processes used 1.5 of the 2 cores): training on 1 thread instead of 2 " \
           "from step 1" in console
    assert "the cores came free (other processes used 0.0 of the 2 cores): training on 2 threads again from " \
           "step 3" in console
    info = json.loads((out / "result.json").read_text())["info"]
    assert [(c["step"], c["from"], c["to"], c["others"]) for c in info["clock"]["threads"]] == \
        [(1, 2, 1, 1.5), (3, 1, 2, 0.0)]
    assert info["threads"] == 2
    assert "2 to 1 at step 1 (other processes used 1.50 of 2 cores)" in (out / "report.txt").read_text()
