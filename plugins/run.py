"""A run in memory: everything known about it, what report sections and commands read."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tokenizers import Tokenizer

from taskformer.core.config import RunConfig
from taskformer.core.decoding import Label
from taskformer.core.model import Ensemble, Transformer
from taskformer.plugins.hookspecs import Task

SPLITS = ("train", "val", "test")
Prediction = str | Label  # what a decode hook returns per row


def spread(items: list, n: int = 5) -> list:
    """``n`` items evenly spaced over the list (report samples that are not all from the start)."""
    return items[:: max(1, len(items) // n)][:n]


@dataclass
class Run:
    """Everything known about one run; report sections and commands read from it."""

    dir: Path
    task: Task
    config: RunConfig
    tokenizer: Tokenizer
    labels: list[str] | None
    model: Transformer | Ensemble
    metrics: dict[str, dict] = field(default_factory=dict)  # split -> metric -> value
    # split -> every (source, prediction, reference) of the split
    outputs: dict[str, list[tuple[str, Prediction, str]]] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # data sizes, wall time, throughput, notes
    # reads the run's logged events when asked: the application, which owns the run directory, gives it
    # (a run made in memory has logged none)
    read_history: Callable[[], list[dict]] = field(default_factory=lambda: list, repr=False)

    @property
    def samples(self) -> dict[str, list[tuple[str, Prediction, str]]]:
        """A few outputs of each split, evenly spread: what the report shows as samples."""
        return {split: spread(rows) for split, rows in self.outputs.items()}

    @property
    def history(self) -> list[dict]:
        """Every event the run logged (training steps, evaluations), oldest first."""
        return self.read_history()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device
