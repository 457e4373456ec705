"""Live progress of a command: rich bars on a terminal, plain log lines otherwise, nothing with ``--quiet``.

It receives the trainer's events and the stages announced through :mod:`taskformer.core.progress`
(reading files, training the tokenizer, the pace probe, decoding), so every long wait has a bar.
Training shows from its first update: updates, tokens/s, time used and left, the latest val score.
"""
from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from taskformer.core import checkpoint
from taskformer.plugins.sections import count, fmt, visible

REDRAW = 0.25  # seconds between redraws of the training bar: an update can take a millisecond


class ProgressDisplay:
    """Takes every event of a run (``display(event)``); see the module's docstring."""

    def __init__(self, quiet: bool = False):
        self.console = Console(stderr=True, log_path=False)
        self.live = not quiet and self.console.is_terminal
        self.quiet = quiet
        self.stages: list[TaskID] = []
        self.train_bar: TaskID | None = None
        self.last_val, self.drawn = "", 0.0
        self.begun: tuple[float, float] | None = None  # (monotonic, seconds since the command began)
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=self.console)

    def __enter__(self):
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.progress.stop()

    def _say(self, line: str) -> None:
        line = visible(line)  # it may name a file or a run directory: neither markup nor control characters
        if self.live:
            self.console.log(Text(line))
        elif not self.quiet:
            print(line, file=sys.stderr, flush=True)

    def __call__(self, e: dict) -> None:
        kind = e.get("event")
        if kind == "stage":
            if self.live:  # a stage of unknown size gets a pulsing bar
                self.stages.append(self.progress.add_task(escape(visible(e["name"])), total=e["total"], info=""))
            else:
                self._say(e["name"] + " ...")
        elif kind == "advance" and self.live and self.stages:
            self.progress.advance(self.stages[-1], e["n"])
        elif kind == "stage-done":
            if self.live and self.stages:
                self.progress.remove_task(self.stages.pop())
            self._say(f"{e['name']}: done in {e['seconds']:.1f} s")
        elif kind == "begun":
            self._say(f"run directory: {e['run_dir']}")
            self.begun = (time.monotonic(), e["since_start"])
        elif kind == "update":
            self._update(e)
        elif kind == "train" and not self.live:
            epoch = f"epoch {e['epoch'] + 1}" + (f"/{e['epochs']}" if e["epochs"] else "")  # 0: no epoch cap
            self._say(f"step {e['step']} {epoch} loss {e['loss']:.3f}  lr {e['lr']:.2e}  "
                      f"{e['tokens_per_s']:,.0f} tok/s")
        elif kind == "recipe":
            self._say(f"recipe: {e['why']}")
            if e.get("validating"):
                self._say(f"validating: {e['validating']}")
            for warning in (e.get("busy"), e.get("short"), e.get("few")):
                if warning:
                    self._say(f"warning: {warning}")
        elif kind == "resumed":
            self._say(f"resuming after update {e['step']:,} (epoch {e['epoch'] + 1}, {e['batch']:,} of its updates "
                      f"done); the run had stopped: {e['after']}")
        elif kind == "cooldown":
            over = count(e["updates"], "update") if "updates" in e else f"the last {e['seconds']:,.0f} s of training"
            self._say(f"cool-down: from step {e['after']:,} the learning rate ({e['lr']:.2e}) falls linearly "
                      f"to zero over {over}")
        elif kind == "threads":
            used = f"other processes used {e['others']:.1f} of the {e['cores']} cores"
            if e["to"] < e["from"]:
                self._say(f"the machine is busy ({used}): training on {count(e['to'], 'thread')} instead of "
                          f"{e['from']} from step {e['step']:,} (threads that wait for each other lose more than "
                          "their share of busy cores)")
            else:
                self._say(f"the cores came free ({used}): training on {count(e['to'], 'thread')} again from "
                          f"step {e['step']:,}")
        elif kind == "eval":
            keys = [k for k in e if k not in ("event", "split", "step", "epoch", "epochs", "improved", "averaged")]
            which = f" ({checkpoint.weights_name(e['averaged'])})" if "averaged" in e else ""
            line = f"eval step {e['step']}{which}: " + "  ".join(f"{k} {fmt(e[k])}" for k in keys)
            self._say(line + ("  (best so far)" if e.get("improved") else ""))
            metric = next((k for k in keys if k != "loss"), "loss")
            self.last_val = f"val {metric} {fmt(e[metric])}"

    def _update(self, e: dict) -> None:
        """The training bar after an update: against the time budget, else the planned updates."""
        step, elapsed = e["step"], e["elapsed"]
        if not self.live:
            if step == 1 and self.begun:
                since = time.monotonic() - self.begun[0] + self.begun[1]
                self._say(f"training: first update done {since:.1f} s after the command started")
            return
        now = time.monotonic()
        if self.train_bar is not None and now - self.drawn < REDRAW:
            return
        self.drawn = now
        rate = e["tokens"] / max(elapsed, 1e-9)
        info = f"step {step:,}  {rate:,.0f} tok/s  {elapsed:,.0f} s used"
        if e.get("budget"):
            info += f", {max(e['budget'] - elapsed, 0):,.0f} s left"
            total, done = e["budget"], min(elapsed, e["budget"])
        else:
            total, done = e.get("planned") or None, step
        info += f"  {self.last_val}" if self.last_val else ""
        epoch = f"training, epoch {e['epoch'] + 1}" + (f"/{e['epochs']}" if e["epochs"] else "")  # 0: no epoch cap
        if self.train_bar is None:
            self.train_bar = self.progress.add_task(epoch, total=total, completed=done, info=info)
        else:
            self.progress.update(self.train_bar, description=epoch, total=total, completed=done, info=info)
