"""The run configuration: one nested dict with sections ``model``, ``train``, ``decode`` and ``data``.

Layers, later ones winning: the core's dataclass defaults, the task's declared defaults, a
``--config`` file (TOML or JSON), then ``--set section.key=value`` overrides. Every key is checked
against what exists (with a did-you-mean hint) and every value against the type of its default,
so a typo fails before any work starts instead of being silently ignored.
"""
from __future__ import annotations

import copy
import difflib
import json
import tomllib
from dataclasses import asdict
from pathlib import Path

from .decoding import DecodeConfig
from .engine import TrainConfig
from .errors import TaskformerError
from .model import ModelConfig

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "decode": DecodeConfig}


OPEN_SECTIONS = ("data", "decode")  # a task may declare keys of its own here (e.g. a constrained search switch)


def base_config(task_defaults: dict, variant: str) -> dict:
    """Core defaults overlaid with a task's declared defaults.

    The task's ``data`` section defines the data keys; its ``decode`` section may add keys for its
    own decoder. Everything else must already exist in the core's dataclasses.
    """
    cfg = {name: asdict(cls()) for name, cls in SECTIONS.items()}
    cfg["model"]["variant"] = variant
    cfg["data"] = {}
    for section in OPEN_SECTIONS:
        extra = {k: v for k, v in task_defaults.get(section, {}).items() if k not in cfg[section]}
        cfg[section].update(copy.deepcopy(extra))
    merge(cfg, task_defaults, "task defaults")
    return cfg


def _coerce(value, default, key: str):
    """Convert ``value`` (a string from --set, or a parsed TOML/JSON value) to the type of ``default``."""
    kind = type(default)
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        try:
            if kind is bool:
                if text in ("true", "1", "yes", "on"):
                    return True
                if text in ("false", "0", "no", "off"):
                    return False
                raise ValueError
            return kind(value)
        except ValueError:
            raise TaskformerError(f"config: {key} expects {kind.__name__}, got {value!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, bool):  # train.bf16 = true in a TOML/JSON file; its validate() checks it
        return str(value).lower()
    if default is not None and not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TaskformerError(f"config: {key} expects {kind.__name__}, got {value!r}")
    return value


def merge(cfg: dict, updates: dict, source: str) -> dict:
    """Lay ``updates`` (nested) over ``cfg`` in place, refusing unknown sections and keys."""
    for section, values in updates.items():
        if section not in cfg:
            hint = difflib.get_close_matches(section, cfg, n=1)
            raise TaskformerError(f"{source}: unknown config section {section!r}"
                                  + (f" (did you mean {hint[0]!r}?)" if hint else f"; sections: {', '.join(cfg)}"))
        if not isinstance(values, dict):
            raise TaskformerError(f"{source}: section {section!r} must be a table of key = value")
        for key, value in values.items():
            name = f"{section}.{key}"
            if key not in cfg[section]:
                hint = difflib.get_close_matches(key, cfg[section], n=1)
                raise TaskformerError(f"{source}: unknown config key {name!r}"
                                      + (f" (did you mean '{section}.{hint[0]}'?)" if hint else ""))
            cfg[section][key] = _coerce(value, cfg[section][key], name)
    return cfg


def parse_overrides(items: list[str]) -> dict:
    """``["train.lr=3e-4", "data.max_train=1000"]`` -> ``{"train": {"lr": "3e-4"}, ...}``."""
    out: dict = {}
    for item in items:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not section or not name:
            raise TaskformerError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. train.lr=3e-4")
        out.setdefault(section, {})[name] = value
    return out


def read_config_file(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise TaskformerError(f"{path}: config file not found") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskformerError(f"{path}: not a valid {'JSON' if path.suffix == '.json' else 'TOML'} file ({e})") from None


def validate(cfg: dict) -> None:
    """Check values that are wrong whatever their type (negative sizes, d_model not divisible by heads)."""
    for name, cls in SECTIONS.items():
        try:
            cls.from_dict(cfg[name]).validate()
        except ValueError as e:
            raise TaskformerError(f"config: {e}") from None


def model_config(cfg: dict) -> ModelConfig:
    return ModelConfig.from_dict(cfg["model"])


def train_config(cfg: dict) -> TrainConfig:
    return TrainConfig.from_dict(cfg["train"])


def decode_config(cfg: dict) -> DecodeConfig:
    """The core's search settings; task-declared decode keys stay in ``cfg["decode"]`` for the task."""
    return DecodeConfig.from_dict(cfg["decode"])
