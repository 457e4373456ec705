"""The end-of-run report and the training progress display, both with ``rich``.

Every section of the report comes through the ``taskformer_report_sections`` hook: the standard
ones from the built-in plugin :mod:`taskformer.plugins.builtin.report_sections`, then the task's.
"""
from __future__ import annotations

import base64
import io
import math
import os
import stat
import warnings
from dataclasses import replace
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.segment import Segment, Segments
from rich.table import Table
from rich.text import Text

from taskformer.app import report_html, rundir
from taskformer.core.checkpoint import WriteFailed
from taskformer.core.data import is_pair
from taskformer.core.decoding import Label
from taskformer.core.errors import TaskformerError
from taskformer.plugins.hookspecs import Output
from taskformer.plugins.manager import PluginError, plugins
from taskformer.plugins.sections import fmt, save_figure, save_file, simple_table, visible


def sections(run) -> list[tuple[str, RenderableType]]:
    out = []
    for plugin, part in plugins().answers("taskformer_report_sections", run.task, run=run):
        if not isinstance(part, list) or not all(isinstance(p, tuple) and len(p) == 2 for p in part):
            raise PluginError(f"plugin {plugin!r}: taskformer_report_sections for task {run.task.name!r} must "
                              f"return a list of (title, renderable) pairs, got {part!r:.80}")
        out.extend(part)
    return out


def plotted(run) -> list[dict]:
    """The log's train events and evaluations with a loss: what the training plot draws, each checked
    for the numbers it reads, so that a damaged line is named in metrics.jsonl, not by matplotlib."""
    events = [e for e in run.history if e.get("event") == "train" or (e.get("event") == "eval" and "loss" in e)]
    for e in events:
        for key in ("step", "loss", "lr") if e["event"] == "train" else ("step", "loss"):
            value = e.get(key)
            if not (type(value) is int and 0 <= value < 1 << 63 if key == "step" else type(value) in (int, float)):
                wanted = "a whole-number step" if key == "step" else "a number"
                raise TaskformerError(f"{rundir.metrics_path(run.dir)}: {key!r} of a {e['event']} event is "
                                      f"{value!r:.40}, not {wanted}; the log is damaged")
    return events


def plot_training(run) -> Path | None:
    """Training and validation loss, and the learning rate, over steps -> training.png.

    A curve needs two points: a run too short for that gets no plot, and the learning rate is
    drawn only beside a training curve (a lone dot or an empty frame says nothing)."""
    events = plotted(run)
    train = [e for e in events if e["event"] == "train"]
    evals = [e for e in events if e["event"] == "eval" and "averaged" not in e]
    averages = [e for e in events if e["event"] == "eval" and "averaged" in e]
    if len(train) < 2 and len(evals) < 2:
        return None
    train = train if len(train) >= 2 else []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if train else 1, figsize=(10 if train else 5.5, 3.6), squeeze=False)
    ax_loss = axes[0][0]
    if train:
        ax_loss.plot([e["step"] for e in train], [e["loss"] for e in train], label="train (smoothed labels)")
    if evals:
        ax_loss.plot([e["step"] for e in evals], [e["loss"] for e in evals], "o-", label="validation")
    if averages:
        ax_loss.plot([e["step"] for e in averages], [e["loss"] for e in averages], "s--",
                     label="validation, average of the last checkpoints")
    ax_loss.set(xlabel="step", ylabel="loss per token", title="Loss", yscale="log")
    ax_loss.legend()
    if train:
        axes[0][1].plot([e["step"] for e in train], [e["lr"] for e in train])
        axes[0][1].set(xlabel="step", ylabel="learning rate", title="Learning rate")
    path = run.dir / "training.png"
    try:  # numbers of the right type can still be beyond what an axis can tick (an lr of 1e308)
        fig.tight_layout()
        save_figure(fig, path, dpi=90)
    except (ValueError, OverflowError) as e:
        raise TaskformerError(f"{rundir.metrics_path(run.dir)}: its steps, losses or learning rates cannot be "
                              f"plotted ({e}); the log is damaged") from None
    finally:
        plt.close(fig)
    return path


def shown(run):
    """The run as the report shows it: every text that comes from data or a run's files (sources,
    outputs, references, labels, result.json's info, config.json's settings) with its control
    characters visible. Report sections, the task's included, read this copy."""
    def row(r):
        source, prediction, reference = r
        prediction = (Label(visible(prediction.label), prediction.probability) if isinstance(prediction, Label)
                      else visible(prediction))
        source = tuple(map(visible, source)) if is_pair(source) else visible(source)
        return Output(source, prediction, visible(reference), getattr(r, "fields", None))

    def texts(value):  # result.json's info, at any depth (a distillation's teacher, the data's notes)
        if isinstance(value, dict):
            return {visible(k): texts(v) for k, v in value.items()}
        if isinstance(value, list):
            return [texts(v) for v in value]
        return visible(value) if isinstance(value, str) else value

    config = replace(run.config, **{name: replace(section, **{k: visible(v) for k, v in vars(section).items()
                                                             if isinstance(v, str)})
                                    for name, section in vars(run.config).items()})
    return replace(run, outputs={split: [row(r) for r in rows] for split, rows in run.outputs.items()},
                   labels=[visible(label) for label in run.labels] if run.labels else run.labels,
                   info=texts(run.info), config=config)


MAX_PLOT = 32 << 20  # bytes; a plot the report embeds is far smaller
PNG = b"\x89PNG\r\n\x1a\n"


def _pngs(run_dir: Path) -> dict[str, tuple]:
    """Each ``*.png`` of the run directory with what identifies its contents (inode, size, mtime)."""
    found = {}
    for path in run_dir.glob("*.png"):
        try:
            info = os.lstat(path)
        except OSError:
            continue
        found[path.name] = (info.st_ino, info.st_size, info.st_mtime_ns)
    return found


def _plot(path: Path) -> bytes | None:
    """A plot's bytes, or None unless it is a regular file (a link is not followed), a PNG and at
    most :data:`MAX_PLOT` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = f.read(MAX_PLOT + 1)
    return data if len(data) <= MAX_PLOT and data.startswith(PNG) else None


def _figures(run_dir: Path, names: list[str]) -> list[tuple[str, str]]:
    """The plots ``names`` of the run directory as ``(name, base64 PNG)``, to embed (the HTML stays one
    self-contained file)."""
    found = []
    for name in names:
        data = _plot(run_dir / name)
        if data is None:
            warnings.warn(f"{run_dir / name}: not embedded in report.html (not a regular PNG file of at most "
                          f"{MAX_PLOT >> 20} MB)", stacklevel=2)
            continue
        found.append((name, base64.b64encode(data).decode("ascii")))
    return found


def render(run, console: Console | None = None) -> None:
    """Print the report and save it as report.txt and a self-contained report.html (with figures).

    Text from data is shown with its control characters visible (:func:`shown`) and never read as
    rich markup. The HTML embeds the plots written while the report is made (the training plot and
    those the report sections write), by name, never a file that was there before or a link. A run
    directory that cannot be written (read-only, full) is one error that says how to write it later.
    """
    try:
        _render(run, console)
    except WriteFailed as e:
        raise TaskformerError(f"{e}; once it can be written, make the report again: taskformer report {run.dir}") \
            from None


def _render(run, console: Console | None) -> None:
    before = _pngs(run.dir)
    plot_training(run)
    # every path a report shows is absolute, as given (links not resolved), as a distilled student's teacher is
    title, where = f"{run.task.name}: {run.task.description}", f"run directory: {visible(run.dir.absolute())}"
    parts = sections(shown(run))
    body: list[RenderableType] = [Text(title, style="bold"), Text(where)]
    for name, renderable in parts:
        body += [Text(""), Text(name, style="bold cyan"), renderable]
    after = _pngs(run.dir)
    plots = sorted((n for n in after if after[n] != before.get(n)), key=lambda n: (n != "training.png", n))
    panel = Panel(Group(*body), title="taskformer report", border_style="cyan")
    console = console or Console(markup=False, emoji=False)
    console.print(guarded(console, panel), markup=False)
    record = Console(record=True, width=110, file=io.StringIO(), markup=False, emoji=False)
    record.print(guarded(record, panel))
    save_file(run.dir / "report.txt", record.export_text(clear=False))
    save_file(run.dir / "report.html", report_html.page(title, where, parts, _figures(run.dir, plots)))


def guarded(console: Console, renderable: RenderableType) -> Segments:
    """``renderable`` as ``console`` draws it, every text in it with its control characters visible:
    the last guard for what a section made from a model or a file itself (a task's samples), which
    :func:`shown` did not see; such text may then overrun its column."""
    return Segments([segment if segment.control else Segment(visible(segment.text), segment.style)
                     for segment in console.render(renderable)])


def list_runs(runs: list[dict], root: Path) -> Table:
    """The runs of :func:`~taskformer.app.rundir.find_runs` as a table."""
    table = simple_table("task", "status", "date", "wall time", "main metric (test)", "path",
                         title=f"runs under {root}")
    table.columns[-1].overflow = "fold"  # a narrow terminal wraps a long path instead of cutting it
    for run in runs:
        metric = run["metric"]
        table.add_row(Text(visible(run["task"])), run["status"], Text(visible(run["date"].replace("T", " ")[:16])),
                      f"{run['wall_seconds'] or 0:,.0f} s" if run["status"] == "finished" else "-",
                      Text(visible(f"{metric} {fmt(run['metrics']['test'].get(metric))}")) if metric else "-",
                      Text(visible(run["path"])))  # names from files and folders: never markup, nor escapes
    return table


def finite(value):
    """``value`` with every NaN or infinity made ``None``: JSON has no such numbers (``runs --json``)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
