"""Run directories written by taskformer before 2026-11-24: what changed since, and how they still load.

Each entry is a format a run directory once had, the date it changed, and the test that loads one.
Nothing else in taskformer knows these formats; delete an entry with its test once no such runs
need to be read.

- Before 2026-11-22 (commit f010611), ``outputs-*.jsonl`` held a classifier's prediction as the
  line ``LABEL<TAB>PROBABILITY`` instead of ``{"label", "probability"}``: :func:`label_from_line`.
  [tests/test_agnews.py::test_report_reads_runs_that_saved_predictions_as_text]
- Before 2026-11-22 (commit fb1f10c), ``config.json`` had no ``binding`` record of which task,
  tokenizer and weights belong together: :func:`unbound_run` loads such a run unchecked, with a
  warning. [tests/test_binding.py]
- Before 2026-11-23 (commit cbcbf36), a checkpoint's ``state.json`` had no ``cooldown``:
  :func:`checkpoint_state` gives it the value of a run without one.
  [tests/test_compat.py]
"""
from __future__ import annotations

import warnings
from pathlib import Path

from taskformer.core.decoding import Label


def label_from_line(output: str) -> Label:
    """A classifier's prediction stored as the line ``LABEL<TAB>PROBABILITY``."""
    label, _, probability = output.partition("\t")
    return Label(label, float(probability or "nan"))


def unbound_run(run_dir: Path) -> None:
    """A run without a binding record loads unchecked (``None``: no stamp to check), and says so."""
    warnings.warn(f"{run_dir} was written before taskformer recorded which task, tokenizer and weights "
                  "belong together; they are loaded without that check")
    return None


def checkpoint_state(state: dict) -> dict:
    """A checkpoint's trainer state with the keys added since it was written."""
    state.setdefault("cooldown", [])  # no cool-down was scheduled
    return state
