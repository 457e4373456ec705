"""The plugin API of taskformer: every hook a task plugin can implement.

A task plugin is a module (or object) with functions named like the hooks below, each marked
``@hookimpl``. Built-in tasks are plugins of exactly this kind; third-party packages register
theirs under the ``taskformer`` entry-point group in their ``pyproject.toml``::

    [project.entry-points.taskformer]
    reverse = "taskformer_reverse"

Hooks that belong to one task (data, head, decode, metrics, report sections) receive the
:class:`Task` being run and must return ``None`` for tasks that are not theirs, so that several
plugins can live side by side. Implementations may accept fewer arguments than the spec lists:
pluggy passes only the ones they name, so a plugin keeps working when a hook gains arguments.
``docs/plugins.md`` renders these docstrings as the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("taskformer")
hookimpl = pluggy.HookimplMarker("taskformer")


@dataclass(frozen=True)
class Task:
    """A task as declared by :func:`taskformer_tasks`.

    ``variant`` is ``"encoder-decoder"`` or ``"encoder-only"``. ``metric`` names the key of the
    metrics dict that selects the best checkpoint (``higher_is_better`` tells which way).
    ``defaults`` is a nested config (sections ``model``, ``train``, ``decode``, ``data``) laid over
    the core's defaults; the ``data`` section declares every data option the task accepts.
    """

    name: str
    description: str
    variant: str = "encoder-decoder"
    metric: str = "loss"
    higher_is_better: bool = True
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    plugin: str = ""  # filled in by the plugin manager: who provides the task


@hookspec
def taskformer_tasks():
    """Declare the tasks this plugin provides.

    Return a list of :class:`Task`. Called once at start-up; keep it cheap (no data loading).

    Example::

        @hookimpl
        def taskformer_tasks():
            return [Task(name="reverse", description="Reverse a digit sequence",
                         metric="exact_match", defaults={"data": {"length": 8}})]
    """


@hookspec(firstresult=True)
def taskformer_data(task, config, data_dir):
    """The task's data pipeline: load the splits and train the tokenizer.

    ``config`` is the full nested config dict (read your options from ``config["data"]``),
    ``data_dir`` the ``--data-dir`` path or ``None``. Return a
    :class:`taskformer.core.data.TaskData` with ``train``, ``val`` and ``test`` splits of
    ``(source, target)`` strings and a tokenizer trained on the train split only (the helpers in
    :mod:`taskformer.core.tokenize` reserve the special ids the core expects). Raise
    :class:`taskformer.core.errors.DataError` for bad files: the CLI shows its message on one line.
    Slow work of your own can show a progress bar with ``taskformer.core.progress.track(items,
    "what it is doing")``; the core's readers and tokenizer trainers already do.

    Example::

        @hookimpl
        def taskformer_data(task, config):
            if task.name != "reverse":
                return None
            rng = random.Random(config["train"]["seed"])
            def pairs(n):
                seqs = [" ".join(rng.choice("0123456789") for _ in range(8)) for _ in range(n)]
                return [(s, " ".join(reversed(s.split()))) for s in seqs]
            return TaskData(tokenizer=tokenize.symbols(list("0123456789")),
                            splits={"train": pairs(5000), "val": pairs(200), "test": pairs(200)})
    """


@hookspec(firstresult=True)
def taskformer_head(task, model_config):
    """The module that turns final hidden states into logits.

    Called as ``head(hidden, src_mask)``. Return ``None`` to keep the core default: a vocabulary
    projection (``Generator``) for encoder-decoders, a pooled ``ClassificationHead`` for
    encoder-only models. ``model_config`` is the :class:`taskformer.core.model.ModelConfig`
    with ``vocab_size`` and ``num_classes`` already filled in.

    Example::

        @hookimpl
        def taskformer_head(task, model_config):
            if task.name == "sentiment":
                return ClassificationHead(model_config)
    """


@hookspec(firstresult=True)
def taskformer_decode(task, model, src, tokenizer, labels, config):
    """The task's decoder: turn a batch of encoded sources into output lines.

    ``src`` is a padded ``(B, S)`` tensor of source ids, ``config`` the run's nested config
    (``config["decode"]`` holds strategy, beam size and length limits). Return one string per
    row: that string is what ``predict`` prints and what the metrics hook scores. Return
    ``None`` to use the core default (beam or greedy search for sequences, arg-max label with its
    probability as ``LABEL<TAB>PROBABILITY`` for classification). Tasks that constrain the
    search pass a ``constraint`` to :func:`taskformer.core.decoding.beam_search`. On CPU several
    batches are decoded at once, one per thread (``decode.workers``): keep the hook free of shared
    mutable state.

    Example::

        @hookimpl
        def taskformer_decode(task, model, src, tokenizer, config):
            if task.name != "reverse":
                return None
            out = decoding.greedy(model, src, max_len=(src != 0).sum(1) + 1)
            return [tokenizer.decode(ids) for ids in out]
    """


@hookspec
def taskformer_metrics(task, sources, hypotheses, references):
    """Score decoded outputs against references; return a dict of metric name to number.

    Called for each evaluated split with lists of equal length. Every plugin may add metrics to
    any task (results are merged); the task's ``metric`` must be among them.

    Example::

        @hookimpl
        def taskformer_metrics(task, hypotheses, references):
            if task.name == "reverse":
                hits = sum(h == r for h, r in zip(hypotheses, references))
                return {"exact_match": 100.0 * hits / len(references)}
    """


@hookspec
def taskformer_report_sections(task, run):
    """Add sections to the end-of-run report.

    ``run`` is a :class:`taskformer.plugins.runner.Run` (config, metrics, samples, history,
    the run directory and the loaded model). Return a list of ``(title, renderable)`` pairs;
    a renderable is anything ``rich`` can print (a Table, a Text, a string). Files you write into
    ``run.dir`` stay with the run.

    Example::

        @hookimpl
        def taskformer_report_sections(task, run):
            if task.name == "reverse":
                return [("Longest input", str(max(len(s) for s, _, _ in run.samples["test"])))]
    """


@hookspec
def taskformer_register_commands(cli):
    """Add subcommands to the ``taskformer`` command line.

    ``cli`` is the top-level ``click.Group``; decorate new commands with ``@cli.command()``.

    Example::

        @hookimpl
        def taskformer_register_commands(cli):
            @cli.command()
            def hello():
                "Say hello."
                click.echo("hello")
    """
