"""The run configuration: sections ``model``, ``train``, ``decode`` and ``data``, each a dataclass.

Layers, later ones winning: the dataclasses' defaults, the task's declared defaults, a ``--config``
file (TOML or JSON), then ``--set section.key=value`` overrides. The layers are merged as nested
dicts, and :func:`merge` is the one place that checks them: every key against what exists (with a
did-you-mean hint), every value against the type of its default. :func:`build` then turns the
result into a :class:`RunConfig` of dataclasses, once per run, and each section's ``validate()``
refuses values that are wrong whatever their type -- so a typo fails before any work starts.
"""
from __future__ import annotations

import difflib
import json
import math
import os
import stat
import tomllib
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from taskformer.core.decode_config import DecodeConfig
from taskformer.core.errors import TaskformerError
from taskformer.core.model_config import ModelConfig
from taskformer.core.options import check, describe, option, renamed, retired
from taskformer.core.train_config import TrainConfig


@dataclass
class NoOptions:
    """The ``data`` section of a task that declares no options."""


@dataclass
class RunConfig:
    """A run's configuration: what the hooks receive as ``config``.

    ``data`` is an instance of the task's ``data_options``.
    """

    model: ModelConfig
    train: TrainConfig
    decode: DecodeConfig
    data: Any = field(default_factory=NoOptions)

    def to_dict(self) -> dict:
        return asdict(self)

    def __getitem__(self, section: str):
        """Refused with the new spelling: the earlier plugin API gave hooks ``config`` as a dict."""
        raise TypeError(f"config is a RunConfig, not a dict: read config.{section}.KEY, not config[{section!r}][KEY] "
                        "(its sections and options are attributes; config.to_dict() gives the dict)")


@dataclass
class DistillConfig:
    """What a student of ``taskformer distill`` learns from: the teacher's outputs for the train
    sources (sequence-level knowledge distillation, Kim & Rush 2016; a classifier's are its label
    distributions, soft targets), alone or beside the references. Given as ``--set
    distill.KEY=VALUE`` to that command only, and recorded in the student's config.json; the
    teacher's search is its own ``decode`` section, changed with ``--teacher-set
    decode.KEY=VALUE`` (e.g. its beam and length penalty)."""

    mix: bool = option(True, "Train on the references too: every train source twice, once with the teacher's "
                       "output and once with its reference (chosen on val: docs/results.md); false: on the "
                       "teacher's outputs alone.")
    temperature: float = option(1.0, "A classifier teacher's probabilities, softened to softmax(log p / T) before the "
                                "student learns them (Hinton et al., 2015): above 1, the labels the teacher finds "
                                "less likely weigh more; 1 keeps them as they are.", above=0.0, at_most=100.0,
                                variants=("encoder-only",))


def section_types(task) -> dict[str, type]:
    """The dataclass of every section for ``task`` (a :class:`taskformer.Task`)."""
    return {"model": ModelConfig, "train": TrainConfig,
            "decode": task.decode_options or DecodeConfig, "data": task.data_options or NoOptions}


def defaults(task) -> dict:
    """The dataclasses' defaults overlaid with the task's declared ``defaults``, as a nested dict."""
    try:
        cfg = {name: asdict(kind()) for name, kind in section_types(task).items()}
    except TypeError as e:  # a field without a default
        raise TaskformerError(f"plugin {task.plugin!r}: the options of task {task.name!r} need a default "
                              f"for every field ({e})") from None
    cfg["model"]["variant"], cfg["model"]["pairs"] = task.variant, task.pairs
    if task.data_options is None and isinstance(task.defaults.get("data"), dict) and task.defaults["data"]:
        names = list(map(str, task.defaults["data"]))  # both changes are named: the declaration and the reading
        raise TaskformerError(  # the plugin API before data_options took the data section as free-form defaults
            f"plugin {task.plugin!r}: task {task.name!r} gives its data options as defaults={{'data': {{...}}}} "
            f"({', '.join(names)}), as the earlier plugin API did; a task now declares them as a dataclass, "
            "Task(..., data_options=Options), each field made with option(default, help, range), and its hooks "
            f"read them as config.data.{names[0]}, not config['data'][{names[0]!r}] (docs/plugins.md, 'Declare the task')")
    return merge(cfg, task.defaults, f"task {task.name!r} defaults", kinds=section_types(task))


def reference(task, config: RunConfig | None = None) -> list[dict]:
    """Every option of ``task``'s config (key, type, the task's default, the value in ``config``,
    allowed range, help), from the dataclasses' field metadata. Options that do not apply to the
    task's variant (a tagger's beam size) are left out."""
    base = defaults(task)
    values = config.to_dict() if config else base
    return [row for name, kind in section_types(task).items()
            for row in describe(name, kind, values[name], base[name], task.variant)]


def toml_value(value) -> str:
    """``value`` as TOML writes it (strings quoted, booleans lower-case)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, (str, bool)) else repr(value)


def as_toml(rows: list[dict]) -> str:
    """The rows of :func:`reference` as a commented TOML file that ``--config`` reads back: each key
    with its help, type, allowed range and default above it."""
    lines, section = [], None
    for row in rows:
        name, key = row["key"].split(".", 1)
        if name != section:
            lines += ([""] if section else []) + [f"[{name}]"]
            section = name
        facts = ", ".join(x for x in (row["type"], row["allowed"], f"default {toml_value(row['default'])}") if x)
        lines += [f"# {row['help']} ({facts})" if row["help"] else f"# ({facts})", f"{key} = {toml_value(row['value'])}"]
    return "\n".join(lines) + "\n"


def build(task, cfg: dict) -> RunConfig:
    """Turn a merged config dict into dataclasses and validate every section."""
    try:
        config = RunConfig(**{name: kind(**cfg[name]) for name, kind in section_types(task).items()})
    except ValueError as e:
        raise TaskformerError(f"config: {e}") from None
    validate(config)
    if config.model.variant != task.variant:
        raise TaskformerError(f"config: model.variant is set by the task: {task.name!r} is {task.variant}, "
                              f"not {config.model.variant}")
    if config.model.pairs != task.pairs:
        raise TaskformerError(f"config: model.pairs is set by the task: {task.name!r} reads "
                              f"{'pairs of texts' if task.pairs else 'one text per input'}")
    return config


def validate(config: RunConfig) -> None:
    """Refuse a value outside its range in any section, as built or as changed since by hand
    (``model.config.decode.quantize = ...`` through the Python API)."""
    try:
        for name in ("model", "train", "decode", "data"):
            section = getattr(config, name)
            check(name, section)  # each field's range, from its metadata
            if hasattr(section, "validate"):  # what no single field can say
                section.validate()
    except ValueError as e:
        raise TaskformerError(f"config: {e}") from None


MAX_TEXT = 4096  # characters of a text setting (a path's limit on Linux)


def _coerce(value, default, key: str):
    """Convert ``value`` (a string from --set, or a parsed TOML/JSON value) to the type of ``default``."""
    if isinstance(value, str) and len(value) > MAX_TEXT:  # no setting is a text that long; nor is an error line
        raise TaskformerError(f"config: {key} is a text of {len(value):,} characters; a setting has at most "
                              f"{MAX_TEXT:,}")
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
            return _coerce(kind(value), default, key)
        except ValueError:
            raise TaskformerError(f"config: {key} expects {kind.__name__}, got {value!r}") from None
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is str and isinstance(value, bool):  # train.bf16 = true in a TOML/JSON file; its validate() checks it
        return str(value).lower()
    if default is not None and not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TaskformerError(f"config: {key} expects {kind.__name__}, got {value!r}")
    if kind is int and not -2**63 <= value < 2**63:  # beyond what torch and the OS take anywhere
        raise TaskformerError(f"config: {key} is out of range, got {value}")
    if kind is float and not math.isfinite(value):  # no setting means anything with NaN or infinity
        raise TaskformerError(f"config: {key} must be a finite number, got {value}")
    return value


# Keys the run fills in from its data, whatever a layer sets (0: not set); a run's own config.json records them.
FILLED_IN = {"model.vocab_size": "the task's tokenizer", "model.num_classes": "the task's labels"}


def merge(cfg: dict, updates: dict, source: str, saved: bool = False, kinds: dict[str, type] | None = None) -> dict:
    """Lay ``updates`` (nested) over ``cfg`` in place, refusing unknown sections and keys, and a value
    for a key the data fills in unless ``updates`` is a run's saved config (it would be replaced).
    With the sections' dataclasses (``kinds``, :func:`section_types`) an option's earlier name is
    read as its new one and a retired option is dropped from a saved config, each with a note, and
    refused anywhere else (:func:`current_name`)."""
    for section, values in updates.items():
        if section not in cfg:
            hint = difflib.get_close_matches(section, cfg, n=1)
            raise TaskformerError(f"{source}: unknown config section {section!r}"
                                  + (f" (did you mean {hint[0]!r}?)" if hint else f"; sections: {', '.join(cfg)}"))
        if not isinstance(values, dict):
            raise TaskformerError(f"{source}: section {section!r} must be a table of key = value")
        for key, value in values.items():
            if key not in cfg[section] and kinds and section in kinds:
                key = current_name(kinds[section], section, key, source, saved)
                if key is None:
                    continue
            name = f"{section}.{key}"
            if key not in cfg[section]:
                hint = difflib.get_close_matches(key, cfg[section], n=1)
                raise TaskformerError(f"{source}: unknown config key {name!r}"
                                      + (f" (did you mean '{section}.{hint[0]}'?)" if hint else "")
                                      + f"; the {section} keys: {', '.join(cfg[section])}")
            cfg[section][key] = _coerce(value, cfg[section][key], name)
            if name in FILLED_IN and cfg[section][key] and not saved:
                raise TaskformerError(f"{source}: {name} is not a setting: the run takes it from {FILLED_IN[name]}; "
                                      "leave it out")
    return cfg


def current_name(kind: type, section: str, key: str, source: str, saved: bool) -> str | None:
    """The name option ``key`` of the dataclass ``kind`` goes by now: its new name where it was renamed
    (an alias), with a note; ``None`` where it was retired and ``saved`` (a run's own config: the value
    is dropped, with a note); a retired option given anew is refused, naming what replaced it.
    Otherwise ``key`` itself (an unknown key: :func:`merge` refuses it)."""
    if new := renamed(kind, key):
        warnings.warn(f"{source}: {section}.{key} is now called {section}.{new}", stacklevel=2)
        return new
    replaced = retired(kind, key)
    if replaced is None:
        return key
    instead = f"replaced by {replaced}" if replaced else "nothing replaced it"
    if not saved:
        raise TaskformerError(f"{source}: {section}.{key} was retired ({instead}); leave it out")
    warnings.warn(f"{source}: {section}.{key} was retired ({instead}); its saved value is ignored", stacklevel=2)
    return None


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
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the read, /dev/zero never end it
            raise TaskformerError(f"{path}: not a regular file; --config expects a TOML or JSON file")
        text = path.read_text(encoding="utf-8-sig")
        loaded = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except FileNotFoundError:
        raise TaskformerError(f"{path}: config file not found") from None
    except OSError as e:
        raise TaskformerError(f"{path}: cannot read the config file ({e.strerror})") from None
    except ValueError as e:  # a syntax error, bad UTF-8, or a number past Python's 4,300-digit limit
        raise TaskformerError(f"{path}: not a valid {'JSON' if path.suffix == '.json' else 'TOML'} file ({e})") from None
    except RecursionError:
        raise TaskformerError(f"{path}: nested too deeply to be a config file") from None
    if not isinstance(loaded, dict):
        raise TaskformerError(f"{path}: expected sections (an object such as {{\"train\": {{\"lr\": 0.001}}}}), "
                              f"got a JSON {type(loaded).__name__}")
    return loaded
