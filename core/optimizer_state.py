"""The optimizer's state in a checkpoint, as safetensors like the weights: loading it runs no code.

``optimizer.safetensors`` holds one tensor per optimizer state entry, ``state.<i>.<name>`` for the
``i``-th parameter (Adam's ``step``, ``exp_avg``, ``exp_avg_sq``), and the torch RNG state as
``torch_rng``. Its metadata holds, as JSON, what is not a tensor: the parameter groups'
hyperparameters (learning rate, betas, ...) and the learning-rate schedule's state.

A damaged file must not reach the optimizer: fused AdamW trusts every moment to have its
parameter's shape and writes out of bounds when one does not (a heap corruption, not an error).
So every tensor's name, shape and dtype, and every hyperparameter's type, is checked against the
optimizer before anything is loaded, and a mismatch is one error naming the file.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from taskformer.core.errors import TaskformerError

FILE = "optimizer.safetensors"
LEGACY = "optimizer.pt"  # torch's pickle format, written before 2026-11-25: never loaded
MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's per-parameter state besides its step count


def save(path: Path, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Write the optimizer, schedule and RNG state to ``path`` (a file in a fresh checkpoint folder)."""
    saved = optimizer.state_dict()
    tensors = {f"state.{i}.{name}": value.detach().to("cpu").contiguous()
               for i, entry in saved["state"].items() for name, value in entry.items()}
    tensors["torch_rng"] = torch.get_rng_state()
    save_file(tensors, path, metadata={"param_groups": json.dumps(saved["param_groups"]),
                                       "scheduler": json.dumps(scheduler.state_dict())})


def _like(saved, current) -> bool:
    """Whether a JSON value has the structure and types of the live one (tuples come back as lists)."""
    if isinstance(current, dict):
        return isinstance(saved, dict) and saved.keys() == current.keys() and all(
            _like(saved[k], current[k]) for k in current)
    if isinstance(current, (list, tuple)):
        return isinstance(saved, list) and len(saved) == len(current) and all(map(_like, saved, current))
    if isinstance(current, float):
        return type(saved) is float and math.isfinite(saved)
    return type(saved) is type(current)


def _as_live(saved, current):
    """``saved`` with lists turned back into tuples where the live value is a tuple (Adam's betas)."""
    if isinstance(current, dict):
        return {k: _as_live(saved[k], current[k]) for k in current}
    if isinstance(current, (list, tuple)):
        return type(current)(_as_live(s, c) for s, c in zip(saved, current))
    return saved


def _impossible(key: str, tensor: torch.Tensor) -> str | None:
    """Why a value of Adam's state cannot be one it wrote: its step count is a whole number of at least
    0 and the moments are finite, the second (of squares) not negative. Anything else turns the
    bias correction or the square root into NaN at the first update."""
    if not torch.isfinite(tensor).all():
        return "holds NaN or infinity"
    if key == "step" and (tensor < 0 or tensor != tensor.round()):
        return f"is {tensor.item():g}, not a count of updates"
    if key == "exp_avg_sq" and (tensor < 0).any():
        return "holds negative values, but it averages squares"
    return None


def load(path: Path, optimizer: torch.optim.Optimizer, scheduler) -> None:
    """Restore the optimizer, schedule and RNG state from ``path`` after checking all of it."""
    path = Path(path)
    if not path.is_file():
        if (path.parent / LEGACY).exists():
            raise TaskformerError(f"{path.parent / LEGACY}: optimizer state in torch's pickle format, written by an "
                                  "earlier taskformer; this version loads no pickle, so the run cannot be resumed "
                                  "(resume it with the version that wrote it, or start it again)")
        raise TaskformerError(f"{path}: not found; the checkpoint is damaged")
    try:
        with safe_open(path, "pt") as f:
            meta = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        groups, schedule = json.loads(meta["param_groups"]), json.loads(meta["scheduler"])
    except (SafetensorError, OSError, KeyError, ValueError) as e:
        raise TaskformerError(f"{path}: corrupt optimizer state ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                              "the checkpoint is damaged") from None
    live = optimizer.state_dict()
    if not _like(groups, live["param_groups"]) or [g["params"] for g in groups] != [
            g["params"] for g in live["param_groups"]]:
        raise TaskformerError(f"{path}: its parameter groups do not match the model's optimizer; the checkpoint is "
                              "damaged or from another model")
    if not _like(schedule, scheduler.state_dict()):
        raise TaskformerError(f"{path}: its learning-rate schedule state is damaged")
    rng = tensors.pop("torch_rng", None)
    if rng is None or rng.dtype != torch.uint8 or rng.shape != torch.get_rng_state().shape:
        raise TaskformerError(f"{path}: torch_rng is missing or not a random number generator state")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors.items():
        _, index, key = (name.split(".") + ["", ""])[:3]
        i = int(index) if index.isdigit() else -1
        if not name.startswith("state.") or not 0 <= i < len(params) or key not in ("step", *MOMENTS):
            raise TaskformerError(f"{path}: unexpected tensor {name!r}; the checkpoint is damaged")
        shape, dtype = ((), torch.float32) if key == "step" else (params[i].shape, params[i].dtype)
        if tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise TaskformerError(f"{path}: {name} is {list(tensor.shape)} {tensor.dtype}, but its parameter needs "
                                  f"{list(shape)} {dtype}; the checkpoint is damaged")
        if why := _impossible(key, tensor):
            raise TaskformerError(f"{path}: {name} {why}; the checkpoint is damaged")
        state.setdefault(i, {})[key] = tensor
    incomplete = next((i for i, entry in state.items() if len(entry) != 1 + len(MOMENTS)), None)
    if incomplete is not None:
        raise TaskformerError(f"{path}: the state of parameter {incomplete} lacks "
                              f"{sorted({'step', *MOMENTS} - state[incomplete].keys())}; the checkpoint is damaged")
    optimizer.load_state_dict({"state": state, "param_groups": _as_live(groups, live["param_groups"])})
    scheduler.load_state_dict(schedule)
    torch.set_rng_state(rng)
