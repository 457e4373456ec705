"""``agnews``: AG_News topic classification (World, Sports, Business, Sci/Tech) with the encoder-only model.

Data: the official CSV release (``train.csv`` and ``test.csv``, plain or gzipped: class index 1-4, title,
description) under ``--data-dir``, or the Hugging Face hub copy when no folder is given. The input text is
title + description. Validation rows are carved from train with a seeded shuffle, so the test set is read
only for the final evaluation. Predictions are the core's ``Label`` values (``predict`` prints
``LABEL<TAB>PROBABILITY``).
"""
from __future__ import annotations

import csv
import html
import math
import random
import re
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table
from rich.text import Text

from taskformer import DataError, Task, TaskData, find_file, hookimpl, option, read_lines, save_figure
from taskformer.tasks.classify import DEFAULTS, RECIPES, TextOptions, noisy_copies, scores, text_tokenizer

LABELS = ["World", "Sports", "Business", "Sci/Tech"]  # class indices 1..4 of the release


@dataclass
class Options(TextOptions):
    """The ``data`` options: classify's tokenizer and word-drop augmentation, the validation share carved
    from train, and the hub copy read when no ``--data-dir`` is given."""

    val_fraction: float = option(0.05, "Share of train carved out (seeded) as the validation split.",
                                 above=0.0, below=1.0)
    hub: str = option("fancyzhx/ag_news", "Hugging Face dataset read when no --data-dir is given.")

TASK = Task(
    name="agnews",
    description="AG_News 4-class news topic classification (encoder-only)",
    variant="encoder-only",
    metric="accuracy",
    examples=("Stocks fall as oil climbs to a record high", "Red Sox beat the Yankees in extra innings",
              "New chip promises longer battery life for laptops", "UN envoy meets rebel leaders for peace talks"),
    higher_is_better=True,
    # classify's model and recipe table, validated here (docs/results.md): the two cannot drift apart
    defaults=DEFAULTS,
    data_options=Options,
    recipes=RECIPES,
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def clean(title: str, description: str = "") -> str:
    """Title + description as one line of the text a reader would see: the release writes newlines as
    a literal backslash-n, and many HTML entities lost their ``&`` to a space (``Valve #39;s``)."""
    text = f"{title} {description}".replace("\\n", " ")
    text = html.unescape(re.sub(r" (#\d+|quot|amp|lt|gt);", r"&\1;", text))
    return " ".join(text.split())


def read_csv(data_dir: str | Path, name: str) -> list[tuple[str, str]]:
    """``(text, label name)`` rows of one release file; a malformed row is a DataError naming file and line."""
    path = find_file(data_dir, name)
    reader = csv.reader(read_lines(path), strict=True)
    rows = []
    try:
        for row in reader:
            if len(row) != 3:
                raise DataError(f"{path}:{reader.line_num}: expected 3 fields (class, title, description), "
                                f"got {len(row)}")
            if row[0].strip() not in ("1", "2", "3", "4"):
                raise DataError(f"{path}:{reader.line_num}: class index must be 1, 2, 3 or 4, got {row[0]!r}")
            rows.append((clean(row[1], row[2]), LABELS[int(row[0]) - 1]))
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: malformed CSV ({e})") from None
    return rows


def read_hub(name: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Train and test rows of the hub copy (``text`` is title and description already joined, ``label`` 0-3)."""
    try:
        from datasets import load_dataset
        ds = load_dataset(name)
        train, test = ([(clean(t), LABELS[y]) for t, y in zip(ds[s]["text"], ds[s]["label"])]
                       for s in ("train", "test"))
        return train, test
    except Exception as e:  # offline, unknown name, changed schema: all fixed the same way
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load {name!r} from the Hugging Face hub ({first}); "
                        "pass --data-dir DIR with train.csv and test.csv") from None


def split_val(rows: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, val): a seeded shuffle decides which ``fraction`` of the rows is held out (at least one)."""
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    n_val = min(len(rows) - 1, max(1, math.ceil(fraction * len(rows))))
    held = set(order[:n_val])
    return [r for i, r in enumerate(rows) if i not in held], [rows[i] for i in sorted(held)]


@hookimpl
def taskformer_data(config, data_dir):
    opts = config.data
    if data_dir is not None:
        train, test = read_csv(data_dir, "train.csv"), read_csv(data_dir, "test.csv")
    else:
        train, test = read_hub(opts.hub)
    train, val = split_val(train, opts.val_fraction, config.train.seed)
    tokenizer = text_tokenizer((s for s, _ in train), opts)
    extra = list(noisy_copies(train, opts.augment, opts.word_drop, config.train.seed))
    notes = {"data source": str(data_dir) if data_dir is not None else f"hub {opts.hub}"}
    if extra:
        notes["augmented train rows"] = f"{len(extra):,} (word drop {opts.word_drop:g})"
    return TaskData(tokenizer=tokenizer, splits={"train": train + extra, "val": val, "test": test},
                    labels=list(LABELS), notes=notes)


@hookimpl
def taskformer_normalize(text):
    """Predict inputs get the cleaning the data files got (entities, literal backslash-n, spaces)."""
    return clean(text)


@hookimpl
def taskformer_metrics(hypotheses, references):
    return scores(hypotheses, references)


def confusion(outputs) -> list[list[int]]:
    """Counts[true][predicted] over LABELS."""
    index = {name: i for i, name in enumerate(LABELS)}
    counts = [[0] * len(LABELS) for _ in LABELS]
    for _, hyp, ref in outputs:
        if hyp.label in index and ref in index:
            counts[index[ref]][index[hyp.label]] += 1
    return counts


def save_confusion_png(counts: list[list[int]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")  # no display on servers; pyplot must come after this
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 4.4))
    ax.imshow(counts, cmap="Blues")
    ax.set_xticks(range(len(LABELS)), LABELS)
    ax.set_yticks(range(len(LABELS)), LABELS)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    top = max(max(row) for row in counts) or 1
    for i, row in enumerate(counts):
        for j, n in enumerate(row):
            ax.text(j, i, str(n), ha="center", va="center", color="white" if n > top / 2 else "black")
    ax.set_title("AG_News test confusion matrix")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


@hookimpl
def taskformer_report_sections(run):
    if not run.outputs.get("test"):
        return None
    outputs = run.outputs["test"]
    counts = confusion(outputs)
    image = Path(run.dir) / "confusion_matrix.png"
    save_confusion_png(counts, image)
    table = Table(title=f"rows: true label, columns: predicted (image: {image.name})")
    table.add_column("true \\ predicted")
    for name in LABELS:
        table.add_column(name, justify="right")
    for i, name in enumerate(LABELS):
        table.add_row(name, *(Text(str(n), style="bold green" if i == j else "") for j, n in enumerate(counts[i])))

    wrong = [(h, s, r) for s, h, r in outputs if h.label != r]
    wrong.sort(key=lambda w: -w[0].probability if not math.isnan(w[0].probability) else 0.0)  # most confident first
    mistakes = Table(show_lines=True)
    for col in ("text", "predicted (probability)", "true"):
        mistakes.add_column(col)
    for (label, prob), src, ref in wrong[:5]:
        mistakes.add_row(src if len(src) <= 160 else src[:157] + "...", f"{label} ({prob:.3f})", ref)
    return [("Confusion matrix (test)", table),
            (f"Most confident test mistakes ({len(wrong)} of {len(outputs)} wrong)", mistakes)]
