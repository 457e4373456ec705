"""Config options that describe themselves: a dataclass field with its help text and allowed range.

Every option of the ``model``, ``train``, ``decode`` and ``data`` sections is made by
:func:`option`, so the text of ``taskformer config``, the CLI's help and ``docs/config.md`` and the
range checks that refuse a bad value all come from one place: the field's metadata.

    @dataclass
    class Options:
        length: int = option(8, "Digits per sequence.", at_least=1, aliases=("digits",))
        tokenizer: str = option("bpe", "Tokenizer kind.", choices=("bpe", "wordpiece"))
        RETIRED = {"max_digits": "data.length", "cased": ""}  # not options: what took each one's place

An option keeps working under a name it had before (``aliases``), and a retired one is named in
``RETIRED`` with what replaced it ("" for nothing): a run saved with the old config still loads
(:func:`taskformer.core.config.merge` renames or drops the key, with a note).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import Field, field, fields
from typing import Any


def option(default: Any, help: str, *, at_least: float | None = None, above: float | None = None,
           below: float | None = None, at_most: float | None = None, choices: tuple | None = None,
           variants: tuple[str, ...] | None = None, aliases: tuple[str, ...] = ()) -> Any:
    """A dataclass field with a default, its ``help`` and the values it accepts.

    ``at_least``/``above`` bound it from below (inclusive/exclusive), ``at_most``/``below`` from above;
    ``choices`` lists the accepted values. ``variants`` names the model variants the option applies
    to (``None``: all): ``taskformer config`` leaves the others out. ``aliases`` are its earlier
    names, still accepted (saved runs, ``--set``) with a note.
    """
    meta = {"help": help, "at_least": at_least, "above": above, "below": below, "at_most": at_most,
            "choices": choices, "variants": variants, "aliases": aliases or None}
    return field(default=default, metadata={k: v for k, v in meta.items() if v is not None})


def renamed(kind: type, name: str) -> str | None:
    """The option of the dataclass ``kind`` that was once called ``name`` (one of its ``aliases``), if any."""
    return next((f.name for f in fields(kind) if name in f.metadata.get("aliases", ())), None)


def retired(kind: type, name: str) -> str | None:
    """What replaced the retired option ``name`` of ``kind`` (its entry in ``kind.RETIRED``; "" for
    nothing), or ``None`` where ``name`` was never retired."""
    return getattr(kind, "RETIRED", {}).get(name)


def applies(kind: type, name: str, variant: str) -> bool:
    """Whether option ``name`` of the dataclass ``kind`` applies to models of ``variant`` (a tagger
    has no beam size); options that do not name their variants apply to all."""
    return unused(kind, name, variant) is None


def unused(kind: type, name: str, variant: str) -> str | None:
    """Why option ``name`` of the dataclass ``kind``, if set, would change nothing for a model of
    ``variant`` (a classifier's beam size); ``None`` where it applies, or ``kind`` has no such option."""
    meta: Mapping[str, Any] = next((f.metadata for f in fields(kind) if f.name == name), {})
    if variant in meta.get("variants", (variant,)):
        return None
    return f"{variant} models do not use it (it applies to {' and '.join(meta['variants'])} models)"


def _either(values) -> str:
    words = [str(v) for v in values]
    return ", ".join(words[:-1]) + " or " + words[-1] if len(words) > 1 else words[0]


def allowed(f: Field) -> str:
    """The values ``f`` accepts, in words: ``at least 1``, ``[0, 1)``, ``beam or greedy``; ``""`` if any."""
    m = f.metadata
    if "choices" in m:
        return _either(m["choices"])
    low = ("[", f"{m['at_least']:g}") if "at_least" in m else ("(", f"{m['above']:g}") if "above" in m else None
    high = ("]", f"{m['at_most']:g}") if "at_most" in m else (")", f"{m['below']:g}") if "below" in m else None
    if low and high:
        return f"{low[0]}{low[1]}, {high[1]}{high[0]}"
    if low:
        return f"{'at least' if low[0] == '[' else 'above'} {low[1]}"
    if high:
        return f"{'at most' if high[0] == ']' else 'below'} {high[1]}"
    return ""


def _refusal(f: Field, value) -> str | None:
    """Why ``value`` is not allowed for ``f`` (``None``: it is)."""
    m = f.metadata
    if "choices" in m:
        return None if value in m["choices"] else f"must be {_either(m['choices'])}, not {value!r}"
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    inside = (m.get("at_least", value) <= value and m.get("at_most", value) >= value
              and ("above" not in m or value > m["above"]) and ("below" not in m or value < m["below"]))
    if inside:
        return None
    if "at_least" in m and not any(k in m for k in ("at_most", "below")):
        bound = m["at_least"]
        return f"must not be negative, got {value}" if bound == 0 else f"must be at least {bound:g}, got {value}"
    if m.get("above") == 0 and not any(k in m for k in ("at_most", "below")):
        return f"must be {'positive' if isinstance(value, int) else 'a positive number'}, got {value}"
    span = allowed(f)
    return f"must be {'a fraction in ' if span in ('[0, 1)', '(0, 1)') else 'in '}{span}, got {value}"


def check(section: str, options) -> None:
    """Refuse (``ValueError``) any field of the dataclass ``options`` outside its declared range."""
    for f in fields(options):
        if why := _refusal(f, getattr(options, f.name)):
            raise ValueError(f"{section}.{f.name} {why}")


def describe(section: str, kind: type, values: dict, defaults: dict, variant: str | None = None) -> list[dict]:
    """One entry per option of the dataclass ``kind``: key, type, default, value, allowed range, help.

    ``values`` and ``defaults`` map field names to the current and the default value (a task's
    defaults differ from the dataclass's). Options whose ``variants`` exclude ``variant`` are left out.
    """
    rows = []
    for f in fields(kind):
        if variant and not applies(kind, f.name, variant):
            continue
        type_name = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append({"key": f"{section}.{f.name}", "type": type_name, "default": defaults.get(f.name),
                     "value": values.get(f.name), "allowed": allowed(f), "help": f.metadata.get("help", "")})
    return rows
