"""Test helpers for plugin authors: run a task for a few updates in seconds, check a config without
training, and use the command line in-process.

A plugin's own tests need nothing else from taskformer::

    from taskformer.testing import cli, dry_run, run_task

    def test_my_task_trains_and_predicts(tmp_path):
        trained = run_task("my-task", tmp_path / "run", data_dir="tests/data", steps=30)
        assert trained.metrics["test"]["accuracy"] >= 0.0
        assert trained.model.predict(["an input"])

    def test_an_option_is_accepted():
        assert dry_run("my-task", settings={"data.length": 9})["data"]["train"] > 0

A plugin that is not installed (a module in the test folder) is registered for the length of a
``with plugin(module):`` block.
"""
from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from rich.console import Console

from taskformer.api import Model, load
from taskformer.app import plan, report, runner
from taskformer.app.cli import main
from taskformer.plugins.manager import plugins

QUICK = {"train.threads": 1, "train.eval_every": 0, "train.patience": 0, "train.average_last": 0,
         "decode.workers": 1}  # one thread and one evaluation: fast, and the same on any machine


@dataclass
class Trained:
    """What :func:`run_task` gives back: the loaded model, its val and test metrics, its run directory
    and the text of its report."""

    model: Model
    metrics: dict[str, dict[str, float]]
    dir: Path
    report: str


def _overrides(steps: int | None, settings: dict[str, Any] | None) -> list[str]:
    chosen = {**QUICK, **({"train.max_steps": steps} if steps else {}), **(settings or {})}
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in chosen.items()]


def run_task(task: str, out: str | Path, data_dir: str | Path | None = None, steps: int = 20,
             settings: dict[str, Any] | None = None) -> Trained:
    """Train ``task`` for ``steps`` updates on one thread (the data hook reads ``data_dir``), then
    evaluate, report and load it, as ``taskformer run`` does; ``out`` is the run directory to create.

    ``settings`` overrides config keys, e.g. ``{"data.train_size": 500, "model.d_model": 32}``. A few
    updates give a poor model: test that the task runs end to end and what its outputs look like, not
    its scores. Errors are raised as :class:`taskformer.TaskformerError`.
    """
    run = runner.train_task(task, data_dir=str(data_dir) if data_dir else None, out=str(out),
                       overrides=tuple(_overrides(steps, settings)))
    report.render(run, Console(file=io.StringIO()))  # writes report.txt and report.html, prints nothing
    return Trained(load(out), run.metrics, Path(out), (Path(out) / "report.txt").read_text(encoding="utf-8"))


def dry_run(task: str, data_dir: str | Path | None = None, settings: dict[str, Any] | None = None) -> dict:
    """Check ``task``'s config (with ``settings``), data, model and memory as ``taskformer run
    --dry-run`` does, training nothing; returns what would run (task, model, parameters, data sizes,
    budget). A refused setting raises :class:`taskformer.TaskformerError` with the CLI's message."""
    return plan.dry_run(task, str(data_dir) if data_dir else None,
                        overrides=tuple(f"{key}={value}" for key, value in (settings or {}).items()))


def cli(*args: str, input: str | None = None) -> Result:
    """Run ``taskformer ARGS...`` in this process: a click ``Result`` with ``exit_code``, ``stdout``
    and ``stderr`` (an error is its one ``Error:`` line on stderr and exit code 2, as in a shell)."""
    return CliRunner().invoke(main, [str(a) for a in args], input=input, catch_exceptions=False)


@contextlib.contextmanager
def plugin(module: object, name: str | None = None) -> Iterator[object]:
    """Register ``module`` (a plugin not installed through an entry point) for the block's length."""
    name = name or getattr(module, "__name__", type(module).__name__)
    manager = plugins()
    manager.pm.register(module, name=name)
    manager.refresh()
    try:
        yield module
    finally:
        manager.pm.unregister(name=name)
        manager.refresh()
