"""What report sections are made of: the report's table style, number formatting, and the
cross-attention heatmap section that translation tasks add.

Task plugins and the built-in report sections build their sections from these, and the
application's report (``taskformer.app.report``) renders them; so they sit here, below both.
"""
from __future__ import annotations

import io
import re
import warnings
from pathlib import Path

from rich import box
from rich.table import Table
from rich.text import Text

from taskformer.core.tokenize import CJK

HEATMAP = "attention.png"


def save_file(path: Path, data: str | bytes) -> None:
    """``atomic_write`` for the report's files: a read-only or full run directory is named as such
    (:class:`WriteFailed`), never as a failure of the plugin whose section wrote."""
    from taskformer.core.checkpoint import WriteFailed, atomic_write  # here: a task's declaration imports this module

    try:
        atomic_write(path, data)
    except OSError as e:
        raise WriteFailed(f"cannot write {path.parent} ({e.strerror or e})") from None


def save_figure(fig, path: str | Path, **savefig) -> None:
    """Save a matplotlib figure as a PNG by atomic rename: never half-written, and a link at
    ``path`` is replaced, not written through."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **savefig)
    save_file(Path(path), buffer.getvalue())


def simple_table(*columns: str, **kw) -> Table:
    """A table with these column headers, in the style of every report table."""
    t = Table(box=box.SIMPLE_HEAVY, **kw)
    for c in columns:
        t.add_column(c)
    return t


def fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1 else f"{v:,.2f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # C0/C1 but tab and newline; bidi


def visible(text, as_json: bool = False) -> str:
    """``text`` with its control characters shown as escapes (ESC as ``\\x1b``, or ``\\u001b`` in
    JSON, which stays valid): text from data, a model, a run's files or a client must not clear the
    screen, set the terminal's title or reorder what is around it. Tab and newline stay: where a
    line break is not meant, the caller says so."""
    if as_json:
        return CONTROL.sub(lambda m: f"\\u{ord(m.group()):04x}", str(text))
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def count(n: int, noun: str, nouns: str = "") -> str:
    """``n`` with its noun: "1 update", "3 updates" (``nouns`` where the plural is not ``noun + "s"``)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def metric_list(metrics: dict[str, dict], main: str = "", groups: dict[str, list[str]] | None = None) -> Table:
    """Metrics as a list, one metric per row and one column per split, never cut however many there are.

    The task's ``main`` metric comes first; then each of ``groups`` (``Task.metric_groups``: a title
    and its metrics, in order) under its title; then the rest, in the order the hooks returned them.
    """
    names = list(dict.fromkeys(name for values in metrics.values() for name in values))
    placed = [main] if main in names else []
    blocks = [("", list(placed))]
    for title, members in (groups or {}).items():
        blocks.append((title, [n for n in members if n in names and n not in placed]))
        placed += blocks[-1][1]
    blocks.append(("other" if groups else "", [n for n in names if n not in placed]))
    table = simple_table("metric", *metrics)
    table.columns[0].overflow = "fold"  # a long name wraps, it is not cut
    for title, members in blocks:
        if title and members:
            table.add_row(Text(title, style="bold"), *("" for _ in metrics))
        for name in members:
            table.add_row(("  " if title else "") + name, *(fmt(values.get(name, "")) for values in metrics.values()))
    return table


def cross_attention(run, source_language: str, target_language: str) -> list[tuple[str, object]]:
    """The report section of a translation task: where the model looked while writing a test sample.

    The heatmap, ``attention.png`` in the run directory, shows the last decoder layer's
    cross-attention (mean over heads) for the first non-empty test sample the report shows.
    """
    shown = [row for row in run.samples.get("test", []) if row[1].strip()]
    if not shown:
        return [("Cross-attention", Text("no non-empty test output to plot"))]
    source, output, _ = shown[0]
    rendered = _plot_attention(run, source, output, source_language, target_language)
    note = f"{HEATMAP} in the run directory: last decoder layer, mean over heads, for\n  {source}\n  -> {output}"
    if not rendered:
        note += "\n  (no CJK font installed, so its Chinese labels show as boxes: e.g. Debian's fonts-noto-cjk has them)"
    return [("Cross-attention", Text(note))]


SUBWORD_MARKS = re.compile(r"^(\u2581|\u0120|##)")  # a word start (SentencePiece, byte-level BPE), a continuation (WordPiece)


def readable(token: str) -> str:
    """A token as a reader writes it: without the marks subword tokenizers put in (``▁dog`` is ``dog``)."""
    return SUBWORD_MARKS.sub("", token) or token


def _cjk_fonts() -> list[str]:
    """Installed font families with CJK glyphs, which matplotlib's default font lacks (matched by name)."""
    from matplotlib import font_manager

    hints = ("CJK", "WenQuanYi", "Source Han", "Droid Sans Fallback", "AR PL", "Noto Sans SC")
    return sorted({f.name for f in font_manager.fontManager.ttflist if any(h in f.name for h in hints)})


def _plot_attention(run, source: str, output: str, source_language: str, target_language: str) -> bool:
    """Plot the heatmap; False when some token labels are CJK characters that no installed font can draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported here: only reports need it
    from matplotlib.figure import Figure

    from taskformer.core.decoding import cross_attention_map

    xlabels, ylabels, weights = cross_attention_map(run.model, run.tokenizer, source, output)  # (T, S) rows
    xlabels, ylabels = [readable(t) for t in xlabels], [readable(t) for t in ylabels]
    needs_cjk = any(re.search(CJK, t) for t in xlabels + ylabels)
    cjk = _cjk_fonts() if needs_cjk else []
    families = ["DejaVu Sans", *cjk]  # matplotlib falls back along the list, glyph by glyph
    fig = Figure(figsize=(min(2.0 + 0.35 * len(xlabels), 20), min(1.5 + 0.3 * len(ylabels), 20)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(weights, cmap="Blues", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(xlabels)), xlabels, rotation=90, fontsize=8, fontfamily=families)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=8, fontfamily=families)
    ax.set_xlabel(f"source ({source_language})")
    ax.set_ylabel(f"output ({target_language})")
    with warnings.catch_warnings():  # a missing glyph is said once, in the report, not per character
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.tight_layout()
        save_figure(fig, run.dir / HEATMAP, dpi=100)
    return bool(cjk) or not needs_cjk
