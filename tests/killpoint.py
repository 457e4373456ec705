"""Run the ``taskformer`` command and kill it with SIGKILL at a chosen point of training.

A seam for the crash tests and ``bench/faults/crash.py`` only: taskformer never imports it, so training
pays nothing for it. It wraps the trainer's four moments a kill may land in, each by the function
that does it:

    update       Trainer._step                    forward, backward and the optimizer's step
    evaluation   Trainer._evaluate                validation and the save of the best weights
    averaging    Trainer._evaluate_average        keeping the evaluated weights, evaluating their mean
    checkpoint   checkpoint.save_training_state   the write of checkpoints/step-N and the pruning

Inside the moment a profiler (``sys.setprofile``) sees every call and return of a function, Python
or C; those events are the same in every run of the same command, so a point in them is a
deterministic kill moment. The innermost moment owns an event (averaging happens inside an
evaluation)::

    python tests/killpoint.py --count counts.json run copy ...         # events of each occurrence
    python tests/killpoint.py --kill checkpoint:2:100 run copy ...     # the 100th event of the 2nd write
    python tests/killpoint.py --kill checkpoint:2:os.replace run ...   # the 2nd write's os.replace
    python tests/killpoint.py --kill checkpoint:7:os.unlink#2 run ...  # its 2nd call of os.unlink

A point that an occurrence does not reach (fewer events this time) kills as the occurrence ends.
Before the kill one line on stderr says where it lands (``killpoint: checkpoint 2 (step 8), event 100
(c_call replace)``).
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import signal
import sys
from pathlib import Path

from taskformer.app.cli import main
from taskformer.core import checkpoint, engine

MOMENTS = {"update": (engine.Trainer, "_step"), "evaluation": (engine.Trainer, "_evaluate"),
           "averaging": (engine.Trainer, "_evaluate_average"), "checkpoint": (checkpoint, "save_training_state")}


def resolve(name: str):
    """``os.replace`` -> the function object, to be recognised by identity in the profiler's events."""
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class Points:
    """Counts each moment's occurrences and their events; kills at ``target`` = (moment, n, at)."""

    def __init__(self, target: tuple[str, int, int | object, int] | None):
        self.target = target  # moment, occurrence, event number or function, which call of the function
        self.seen = {moment: 0 for moment in MOMENTS}
        self.events: dict[str, list] = {moment: [] for moment in MOMENTS}  # events of each finished occurrence
        self.stack: list[list] = []  # [moment, occurrence, step, events, calls of the target] of those entered

    def kill(self, where: str) -> None:
        moment, n, step, events, _ = self.stack[-1]
        print(f"killpoint: {moment} {n} (step {step}), event {events} ({where})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

    def aimed(self) -> bool:
        moment, n = self.stack[-1][:2]
        return self.target is not None and self.target[:2] == (moment, n)

    def profile(self, frame, event, arg) -> None:
        top = self.stack[-1]
        top[3] += 1
        if self.target is None or not self.aimed():
            return
        at, call = self.target[2:]
        if (event == "c_call" and arg is at) or (event == "call" and frame.f_code is getattr(at, "__code__", None)):
            top[4] += 1
        if top[3] == at if not call else top[4] == call:
            where = getattr(arg, "__qualname__", "") if event.startswith("c_") else frame.f_code.co_qualname
            self.kill(f"{event} {where}")

    def wrap(self, moment: str, function):
        def wrapped(*args, **kwargs):
            self.seen[moment] += 1
            step = args[1] if moment == "checkpoint" else args[0].state.step  # save_training_state(root, step, ...)
            self.stack.append([moment, self.seen[moment], step, 0, 0])
            self.listen()
            try:
                return function(*args, **kwargs)
            finally:
                sys.setprofile(None)
                if self.aimed():
                    self.kill("the end of the moment")
                self.events[moment].append(self.stack.pop()[3])
                self.listen()
        return wrapped

    def listen(self) -> None:
        """Profile the innermost moment if its events are counted or it holds the kill; else run at full speed."""
        sys.setprofile(self.profile if self.stack and (self.target is None or self.aimed()) else None)


def parse_target(spec: str) -> tuple[str, int, int | object, int]:
    moment, n, at = spec.split(":")
    if moment not in MOMENTS:
        raise argparse.ArgumentTypeError(f"{moment!r} is not one of {', '.join(MOMENTS)}")
    if at.isdigit():
        return moment, int(n), int(at), 0
    function, _, call = at.partition("#")
    return moment, int(n), resolve(function), int(call or 1)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--kill", metavar="MOMENT:N:AT", type=parse_target, help="where to kill (see above)")
    how.add_argument("--count", metavar="FILE", help="kill nothing; write each moment's events per occurrence")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the taskformer command")
    options = parser.parse_args()
    points = Points(options.kill)
    for moment, (owner, name) in MOMENTS.items():
        setattr(owner, name, points.wrap(moment, getattr(owner, name)))
    if options.count:
        atexit.register(lambda: Path(options.count).write_text(json.dumps(points.events)))
    main(options.args, prog_name="taskformer")


if __name__ == "__main__":
    run()
