"""The built-in tracker: TensorBoard event files in the run directory, with ``--set train.tensorboard=true``.

A plugin of ``taskformer_track`` like any other (MLflow or W&B would be one too). Every number of
a logged record becomes a scalar named ``SPLIT/NAME`` (``val/loss``, ``train/lr``) at its step; the
configuration is written once as text. ``tensorboard --logdir RUN_DIR/tensorboard`` shows them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from taskformer import hookimpl

FOLDER = "tensorboard"
_writers: dict[Path, Any] = {}  # run directory -> its open SummaryWriter


@hookimpl
def taskformer_track(run_dir: Path, event: dict[str, Any]) -> None:
    kind = event.get("event")
    if kind == "start":
        if not event["config"].get("train", {}).get("tensorboard"):
            return
        import json

        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        # A resumed run logs again what followed its checkpoint: TensorBoard drops the earlier copies.
        purge = event["step"] + 1 if event["resumed"] else None
        started = _writers[run_dir] = SummaryWriter(str(run_dir / FOLDER), purge_step=purge)
        started.add_text("config", "```\n" + json.dumps(event["config"], indent=2) + "\n```", event["step"])
        return
    writer = _writers.get(run_dir)
    if writer is None:
        return
    if kind == "result":
        for split, metrics in event["metrics"].items():
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    writer.add_scalar(f"result/{split}/{name}", value, 0)
        writer.close()
        del _writers[run_dir]
        return
    section = event.get("split", kind)
    for name, value in event.items():
        if name != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
            writer.add_scalar(f"{section}/{name}", value, event.get("step", 0))
    writer.flush()
