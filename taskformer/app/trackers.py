"""The run's events for tracker plugins (``taskformer_track``): its start, every record of
metrics.jsonl as it is appended, and its result. TensorBoard, MLflow or W&B are plugins of that hook
(the built-in TensorBoard one: ``plugins/builtin/tensorboard.py``), never core code."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from taskformer.app.rundir import MetricsLog
from taskformer.core.config import RunConfig
from taskformer.core.errors import TaskformerError
from taskformer.plugins.hookspecs import Task
from taskformer.plugins.manager import plugins


def track(task: Task, run_dir: Path, event: dict[str, Any]) -> None:
    """Hand ``event`` to every tracker plugin that hears ``task`` (a failing one is named)."""
    for _ in plugins().answers("taskformer_track", task, run_dir=run_dir, event=event):
        pass


def started(task: Task, run_dir: Path, config: RunConfig, resumed: bool, step: int = 0) -> None:
    track(task, run_dir, {"event": "start", "task": task.name, "config": config.to_dict(), "resumed": resumed,
                          "step": step})


@dataclass
class TrackedLog(MetricsLog):
    """metrics.jsonl, each record handed to the trackers once it is written."""

    task: Task | None = None

    def append(self, event: dict) -> None:
        super().append(event)
        if self.task is not None:
            track(self.task, self.run_dir, event)


def check_installed(config: RunConfig) -> None:
    """Refuse ``train.tensorboard=true`` before any work where its package is missing."""
    if not config.train.tensorboard:
        return
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise TaskformerError("train.tensorboard=true needs the tensorboard package: pip install "
                              "taskformer[tensorboard]") from None
