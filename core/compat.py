"""Run directories written by earlier versions of taskformer: what changed since, and how they still load.

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
  [tests/test_compat.py::test_a_checkpoint_from_before_the_cooldown_resumes]
- Before 2026-11-25, the weights' stamp had no ``model_sha256`` (the architecture and labels they were
  trained with): :func:`architecture_unchecked` lets them load without that check.
  [tests/test_compat.py::test_weights_stamped_before_the_architecture_hash_still_load]
- Before 2026-11-25, ``config.json`` had no ``precision`` record: :func:`unrecorded_precision`, a
  resumed run probes the hardware again. [tests/test_compat.py::test_a_run_without_a_precision_record_resumes]
- Before 2026-11-26, a checkpoint folder ``checkpoints/step-N`` had no mark of its own:
  :func:`unmarked_checkpoint` knows one by holding exactly the three files taskformer wrote.
  [tests/test_compat.py::test_a_checkpoint_from_before_the_mark_resumes_and_is_pruned]
"""
from __future__ import annotations

import warnings
from pathlib import Path

from taskformer.core.decoding import Label


def label_from_line(output: str) -> Label:
    """A classifier's prediction stored as the line ``LABEL<TAB>PROBABILITY``."""
    label, _, probability = output.partition("\t")
    return Label(label, float(probability or "nan"))


def unbound_run(run_dir: Path) -> dict[str, str] | None:
    """A run without a binding record loads unchecked (``None``: no stamp to check), and says so."""
    warnings.warn(f"{run_dir} was written before taskformer recorded which task, tokenizer and weights "
                  "belong together; they are loaded without that check", stacklevel=2)
    return None


def checkpoint_state(state: dict) -> dict:
    """A checkpoint's trainer state with the keys added since it was written."""
    old = state.pop("cooldown", [])  # [first step, updates(, share, step it began)]: a decay by a count of updates
    began = old[3] if isinstance(old, list) and len(old) == 4 else old[0] if isinstance(old, list) and old else None
    state.setdefault("decay", [began, state.get("elapsed", 0.0)] if began else [])  # goes on from where it began
    state.setdefault("clock", {})  # the time kept back is the run's first estimate
    return state


def architecture_unchecked(stamp: dict) -> bool:
    """Weights stamped without the hash of their architecture and labels: nothing to check them against."""
    return "model_sha256" not in stamp


def unrecorded_precision(saved: dict) -> bool:
    """A run's config.json without the precision decision it started with: the resume decides anew."""
    return "precision" not in saved


CHECKPOINT_FILES = {"model.safetensors", "optimizer.safetensors", "state.json"}  # an unmarked checkpoint's


def unmarked_checkpoint(folder: Path) -> bool:
    """A checkpoint folder written before checkpoints carried a mark: exactly its three regular files."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    return {e.name for e in entries} == CHECKPOINT_FILES and all(e.is_file() and not e.is_symlink() for e in entries)
