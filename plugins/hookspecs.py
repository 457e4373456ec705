"""The plugin API of taskformer: every hook a task plugin can implement.

A task plugin is a module (or object) with functions named like the hooks below, each marked
``@hookimpl``; everything it needs comes from ``import taskformer``. Built-in tasks are plugins of
exactly this kind; third-party packages register theirs under the ``taskformer`` entry-point group
in their ``pyproject.toml``::

    [project.entry-points.taskformer]
    reverse = "taskformer_reverse"

Dispatch: a hook that receives a ``task`` (data, head, normalize, decode, metrics, report sections)
reaches the plugin that declared that task and the plugins that declare no task at all, never the
plugin of another task. So a task's hooks need no guard that checks ``task.name``, and a plugin that
declares no task (the built-in defaults and report sections, or a package that adds a metric to
every task) is cross-cutting: it hears every task. A plugin that implements ``taskformer_tasks`` is
a task plugin; to add something to other tasks as well, ship that part as a second plugin (a second
entry point) that declares no task.

Implementations may accept fewer arguments than the spec lists: pluggy passes only the ones they
name, so a plugin keeps working when a hook gains arguments. ``docs/plugins.md`` renders these
docstrings as the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the types the hooks receive and return; none of them is imported at run time
    from pathlib import Path

    import click
    import torch
    from rich.console import RenderableType
    from tokenizers import Tokenizer

    from taskformer.core.config import RunConfig
    from taskformer.core.data import TaskData
    from taskformer.core.decoding import Label
    from taskformer.core.model import SequenceModel
    from taskformer.core.model_config import ModelConfig
    from taskformer.plugins.run import Run

import pluggy

from taskformer.core import variants

hookspec = pluggy.HookspecMarker("taskformer")
hookimpl = pluggy.HookimplMarker("taskformer")


@dataclass(frozen=True)
class Task:
    """A task as declared by :func:`taskformer_tasks`.

    ``variant`` is the model: ``"encoder-decoder"`` (text to text), ``"encoder-only"`` (one class
    per input), ``"tagging"`` (an encoder-only model with one label per input word) or
    ``"decoder-only"`` (a language model: it continues a prompt). ``metric``
    names the key of the metrics dict that selects the best checkpoint (``higher_is_better`` tells
    which way); a tagging task may pick the core's ``token_accuracy``.
    ``pairs=True`` makes an encoder-only task read a pair of texts per input (premise and hypothesis,
    question and answer): each source in ``TaskData`` is a tuple ``(first, second)``, the model reads
    ``[BOS] first [EOS] second [EOS]`` with a learned embedding per text (``model.pairs``), ``predict``
    reads ``FIRST<TAB>SECOND`` lines, the Python API takes ``(first, second)`` tuples, and
    ``taskformer serve`` takes ``{"text": ..., "text_pair": ...}`` and offers two text boxes.
    ``data_options`` is a dataclass of the task's ``data`` section: one field per option, each made
    by :func:`taskformer.option` with its default, help and allowed range (``--set data.KEY=VALUE``
    changes it; unknown keys, wrong types and values out of range are refused before any work
    starts; ``taskformer config TASK`` lists them), and optionally a ``validate()`` that raises
    ``ValueError`` for a combination no single field can refuse. Options that
    make the data themselves (not read from files) may also state its size with ``footprint()``,
    returning ``{"vocab_size": ..., "tokens": ...}`` (the vocabulary and the tokens of every split,
    roughly): a size that cannot fit in the machine's memory is then refused before the data is made.
    ``decode_options``, a subclass of :class:`taskformer.DecodeConfig`, adds search options of the
    task's own to the ``decode`` section. ``defaults`` overlays the core's defaults for the sections
    ``model``, ``train``, ``decode`` (and ``data``, changing defaults of ``data_options``); data options
    given there without ``data_options``, as the earlier plugin API took them, are refused with a message
    saying how to declare them. ``metric_groups`` orders the metrics in the
    report and in ``taskformer eval``: a title for each group and its metrics in order, e.g.
    ``{"entities": ["span_f1", "span_precision", "span_recall"]}``; the selecting ``metric`` comes
    first, metrics in no group last.
    ``recipes`` is what a larger time budget should change, as rows of ``(minimum budget in target
    tokens, overrides, one-line reason)``, e.g. ``(20e6, {"model": {"members": 2}}, "each member gets
    the budget of the one-hour recipe")``. A run with ``--time-limit`` measures its pace (target
    tokens/s; ``train.pace`` gives it instead), multiplies it by the time limit and takes the row
    with the largest minimum that budget reaches; below every row the ``defaults`` stand. The
    overrides (sections ``model``, ``train``, ``decode``) sit between ``defaults`` and the user's
    ``--config`` and ``--set``, which override every choice. Choose the rows on val and record the
    evidence with the task's results; without a time limit, or with no rows, nothing is measured
    and the ``defaults`` are the recipe.
    ``examples`` are a few inputs that show what the task does (``taskformer serve``'s page offers
    them to try, and ``GET /v1/models`` lists them), written as a user would type them (a pair task's
    as ``(first, second)`` tuples).
    ``languages`` is a translation task's ``(source, target)`` pair of language codes, as
    LibreTranslate spells them (``("de", "en")``): ``taskformer serve`` answers a ``/translate``
    request for that pair with this task's model, under whatever name it is served.
    """

    name: str
    description: str
    variant: str = "encoder-decoder"
    metric: str = "loss"
    higher_is_better: bool = True
    defaults: dict[str, dict[str, Any]] = field(default_factory=dict)
    data_options: type | None = None
    decode_options: type | None = None
    metric_groups: dict[str, list[str]] = field(default_factory=dict)
    recipes: tuple[tuple[float, dict[str, dict[str, Any]], str], ...] = ()
    examples: tuple[str | tuple[str, str], ...] = ()
    languages: tuple[str, str] | None = None
    pairs: bool = False
    plugin: str = ""  # filled in by the plugin manager: who provides the task

    def __post_init__(self):
        if self.pairs and not variants.of(self.variant).classifies:  # said when the plugin loads, not when a run starts
            raise ValueError(f"task {self.name!r}: pairs=True is for encoder-only tasks (one class per pair of "
                             f"texts), not {self.variant}")


class Output(tuple):
    """One evaluated example, ``(source, prediction, reference)`` as before, with ``.fields``: the
    dict of per-example fields the data hook attached to its row (``{}`` when it attached none), so
    existing ``for source, prediction, reference in ...`` loops keep working."""

    fields: dict[str, Any]

    def __new__(cls, source: str, prediction: Any, reference: str, fields: dict[str, Any] | None = None) -> Output:
        row = super().__new__(cls, (source, prediction, reference))
        row.fields = fields or {}
        return row


@hookspec
def taskformer_tasks() -> list[Task]:
    """Declare the tasks this plugin provides.

    Return a list of :class:`Task`. Called once at start-up; keep it cheap (no data loading).

    Example::

        @dataclass
        class Options:
            length: int = option(8, "Digits per sequence.", at_least=1)

        @hookimpl
        def taskformer_tasks():
            return [Task(name="reverse", description="Reverse a digit sequence",
                         metric="exact_match", data_options=Options)]
    """


@hookspec(firstresult=True)
def taskformer_data(task: Task, config: RunConfig, data_dir: Path | None, splits: tuple[str, ...],
                    tokenizer: Tokenizer | None) -> TaskData:
    """The task's data pipeline: load the splits and train the tokenizer.

    ``config`` is the run's :class:`taskformer.RunConfig`: the task's options are ``config.data``
    (an instance of its ``data_options``), the seed is ``config.train.seed``. ``data_dir`` is the
    ``--data-dir`` path or ``None``. Return a :class:`taskformer.TaskData` with ``train``, ``val``
    and ``test`` splits of ``(source, target)`` strings and a tokenizer trained on the train split
    only. ``splits`` names the splits the caller needs: all three to train, only the scored ones
    when ``taskformer eval`` scores a saved run. ``tokenizer`` is the run's saved tokenizer when a
    saved run is evaluated or resumed (``None`` for a new run): it replaces the one you return, so
    return it instead of training one; a hook that also reads only ``splits`` lets ``eval`` work
    without the train files. Returning more splits than asked is fine (a synthetic task may
    generate all of them, as the same seed must give the same rows); hooks that do not name these
    two arguments keep working. A classifier's target is one of ``labels`` (a task of pairs,
    ``Task(pairs=True)``, has a tuple of two texts as each source: ``(("A man sleeps.", "A person
    rests."), "entailment")``); a tagger's is one of ``labels`` per
    whitespace-separated word of the source, joined by spaces (``("anna lives in paris", "title
    lower lower title")``). Put the most common tag first: it is what a word beyond ``max_len``
    gets. ``subword``, ``characters`` and ``symbols`` build tokenizers that reserve the special ids
    the core expects. A split may also be any sized, indexable sequence of rows, or a
    ``datasets.Dataset`` with ``source`` and ``target`` columns (its other columns become each
    row's fields): the train split is then read, tokenized and encoded a chunk at a time and never
    held as Python strings, so a corpus larger than memory as text can train; val and test are read
    into lists, as they are decoded and scored as text. Raise
    :class:`taskformer.DataError` for bad files: the CLI shows its message on one line. Slow work
    of your own can show a progress bar with ``track(items, "what it is doing")``; the core's
    readers and tokenizer trainers already do.

    Example::

        @hookimpl
        def taskformer_data(config):
            rng = random.Random(config.train.seed)
            def pairs(n):
                seqs = [" ".join(rng.choice("0123456789") for _ in range(config.data.length)) for _ in range(n)]
                return [(s, " ".join(reversed(s.split()))) for s in seqs]
            return TaskData(tokenizer=symbols(list("0123456789")),
                            splits={"train": pairs(5000), "val": pairs(200), "test": pairs(200)})
    """


@hookspec(firstresult=True)
def taskformer_head(task: Task, model_config: ModelConfig) -> torch.nn.Module | None:
    """The module that turns final hidden states into logits.

    Called as ``head(hidden, src_mask)``. ``hidden`` is ``(B, T, D)``: decoder states for
    encoder-decoders (beam and greedy search pass one position, ``T = 1``), encoder states
    (``T = S``) for encoder-only and tagging models. ``src_mask`` is ``(B, 1, 1, S)``, ``True`` at
    real (non-padding) source tokens. Return logits: ``(B, T, vocab_size)`` for encoder-decoders,
    ``(B, num_classes)`` for encoder-only models, ``(B, S, num_classes)`` (a score for every tag at
    every position) for tagging. Return ``None`` to keep the core default: a vocabulary projection
    (``Generator``), a pooled ``ClassificationHead``, a per-token ``TaggingHead``. ``model_config``
    is the :class:`taskformer.ModelConfig` with ``vocab_size`` and ``num_classes`` (the number of
    ``labels``) already filled in. On CPU, evaluation and prediction run a copy of the model whose
    ``nn.Linear`` layers, the head's included, compute on weights pre-packed for oneDNN; each keeps
    ``weight`` and ``bias``, so a head that reads them directly works unchanged.

    Example::

        @hookimpl
        def taskformer_head(model_config):
            return ClassificationHead(replace(model_config, pooling="first"))
    """


@hookspec(firstresult=True)
def taskformer_normalize(task: Task, text: str, config: RunConfig) -> str | None:
    """Clean one raw input line before it is tokenized, as the data hook cleaned its sources.

    ``predict`` calls it on every input line (so do the Python API and ``taskformer serve``): that
    text, unlike the splits, never passes through the data hook. Call the same function in your data
    hook, so that the model sees the same kind of text in training and in prediction. Return the
    cleaned string (``None``: keep the line). A task of pairs has each of its two texts cleaned by a
    call of its own. ``config`` is the run's configuration, as the data hook received it (with the
    call's decode settings), for a cleaning that follows a data option; a hook that does not name it
    does not receive it.

    Example::

        @hookimpl
        def taskformer_normalize(text, config):
            text = " ".join(text.split())
            return text.lower() if config.data.lowercase else text
    """


@hookspec(firstresult=True)
def taskformer_decode(task: Task, model: SequenceModel, src: torch.Tensor, tokenizer: Tokenizer,
                      labels: list[str] | None, words: list[list[int]] | None,
                      config: RunConfig, purpose: str) -> list[str] | list[Label] | None:
    """The task's decoder: turn a batch of encoded sources into predictions.

    ``src`` is a ``(B, S)`` tensor of source ids, right-padded with ``PAD`` (0) and framed by the
    core: ``ids + [EOS]`` for encoder-decoders, ``[BOS] + ids`` for encoder-only and tagging
    models, ``[BOS] + first + [EOS] + second + [EOS]`` for a task of pairs. For tagging, each
    whitespace-separated word is tokenized on its own and ``words[i][w]`` is the position in row
    ``i`` of word ``w``'s first token, where its tag is read (``-1``: the word was cut off by
    ``max_len``); ``words`` is ``None`` for the other variants.
    ``config.decode`` holds the search settings (strategy, beam size, length limits, and the task's
    own ``decode_options``; a request to ``taskformer serve`` may set any of them that the model
    lists). ``purpose`` says why it is called: ``"evaluate"`` for a val or test evaluation (training's
    validations, the final evaluation, ``taskformer eval``), ``"predict"`` for a user's inputs
    (``predict``, :meth:`taskformer.Model.predict`, ``serve``): a task may sample for its users and stay
    deterministic on val, e.g. ``replace(config.decode, temperature=0.0) if purpose == "evaluate"``.
    Return one prediction per row: a string (what ``predict`` prints and
    the metrics hook scores; for tagging, one tag per word, joined by spaces) or, for a classifier,
    a :class:`taskformer.Label`. Return ``None`` to use the core default: ``search`` for sequences,
    the arg-max ``Label`` for classification, ``best_tags`` (the arg-max tag of each word's first
    token) for tagging.

    Scores from the model, by variant (``model`` is in eval mode; call it under ``torch.no_grad()``):

    - encoder-decoder: ``search(model, src, config.decode)`` runs beam or greedy search as the
      config says, within ``max_len`` tokens per row if given, and takes a ``constraint``
      (:class:`taskformer.Constraint`) that sees and edits the log-probabilities of every step; the
      ``couplet`` task forces length, punctuation and tones that way. For scores of your own,
      ``memory, mask = model.encode(src)``, then ``model.head(model.decode(prefix, memory, mask),
      mask).log_softmax(-1)`` gives ``(B, T, V)`` for the target ``prefix`` (BOS first).
    - encoder-only: ``model(src)`` is ``(B, C)``, one logit per class (an ensemble's are already
      log-probabilities); ``classify(model, src)`` gives the probabilities, ``best_labels`` the
      arg-max ``Label(label, probability)`` per row.
    - tagging: ``model(src).log_softmax(-1)`` is ``(B, S, C)``, a distribution over tags at every
      token; a word's tag is read at ``words[i][w]``. ``tag_scores`` gives each word's best
      ``Label(tag, probability)``, ``best_tags`` the line of tags.

    On CPU several batches are decoded at once, one per thread (``decode.workers``): keep the hook
    free of shared mutable state.

    Example::

        @hookimpl
        def taskformer_decode(model, src, tokenizer, config):
            budget = (src != PAD).sum(1) - 1  # as many tokens as the source, without its EOS
            ids = search(model, src, config.decode, max_len=budget, ignore_eos=True)
            return [tokenizer.decode(x) for x in ids]
    """


@hookspec
def taskformer_metrics(task: Task, sources: list[str], hypotheses: list[str] | list[Label],
                       references: list[str], fields: list[dict[str, Any]],
                       logprobs: list[list[float]]) -> dict[str, float]:
    """Score predictions against references; return a dict of metric name to number.

    Called for each evaluated split with lists of equal length: ``hypotheses`` are what the decode
    hook returned (strings, or ``Label`` values for classifiers), ``references`` the target strings,
    ``fields`` the per-example dicts the data hook attached (a row ``(source, target, {"domain":
    "news"})``; ``{}`` for plain pairs): name it to score by group, e.g. accuracy per domain.
    ``sources`` are the data hook's sources: a task of pairs gets its ``(first, second)`` tuples.
    ``logprobs`` are the model's log-probabilities (nats) of each reference, computed once per
    evaluation: one per scored token (with EOS) of a text, one for a class, one per tagged word; their
    sum is a row's log-likelihood (calibration, perplexity). The core adds ``loss``, the mean negative
    log-probability per scored token, to every split's metrics, so ``Task(metric="loss",
    higher_is_better=False)`` selects by it.
    Every answer is merged, so a plugin that declares no task may add metrics to any task; the
    task's ``metric`` must be among them. The core scores every decoder-only task already:
    ``perplexity``, ``bits_per_token`` and ``bits_per_char`` (bits per character of the references,
    their final EOS included in the bits). It scores every tagging task too:
    ``token_accuracy`` (percent of words tagged right) and ``exact_match`` (percent of inputs with
    every word right), and, when the tags are BIO, IOB or IOBES (``B-PER I-PER O``), the entity-level
    ``span_precision``, ``span_recall``, ``span_f1`` and ``span_f1_TYPE`` of seqeval's default
    mode; ``span_scores(hypotheses, references)`` computes them for a plugin of its own.

    Example::

        @hookimpl
        def taskformer_metrics(hypotheses, references):
            hits = sum(h == r for h, r in zip(hypotheses, references))
            return {"exact_match": 100.0 * hits / len(references)}
    """


@hookspec
def taskformer_report_sections(task: Task, run: Run) -> list[tuple[str, RenderableType]]:
    """Add sections to the end-of-run report.

    ``run`` is a :class:`taskformer.Run`: ``config``, ``metrics``, ``outputs`` (every
    ``(source, prediction, reference)`` of each evaluated split: read predictions from here; each
    row's ``.fields`` holds what the data hook attached to it),
    ``history``, the run directory ``dir`` and the loaded ``model`` and ``tokenizer``.
    ``samples`` is a view of ``outputs``: the few rows, evenly spread, that the report shows.
    Return a list of ``(title, renderable)`` pairs; a renderable is anything ``rich`` can print (a
    Table, a Text, a string). Files you write into ``run.dir`` stay with the run.

    Example::

        @hookimpl
        def taskformer_report_sections(run):
            return [("Longest input", str(max(len(s) for s, _, _ in run.outputs["test"])))]
    """


@hookspec(firstresult=True)
def taskformer_annotate(task: Task, text: str) -> list[str] | None:
    """Marks to show under each character of an input or output line on ``taskformer serve``'s page.

    Return a list with one short string per character of ``text`` (``""`` for none), or ``None``
    for no marks. The ``couplet`` task marks each character's tone class, 平 or 仄.

    Example::

        @hookimpl
        def taskformer_annotate(text):
            return ["V" if ch in "aeiou" else "" for ch in text]
    """


@hookspec
def taskformer_register_commands(cli: click.Group) -> None:
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


@hookspec
def taskformer_track(task: Task, run_dir: Path, event: dict[str, Any]) -> None:
    """Receive every event a run logs, as it logs it: a tracker (TensorBoard, MLflow, W&B) is a plugin
    of this one hook.

    ``event`` is a JSON-ready dict whose ``"event"`` names it, in the order the run logs them:

    * ``"start"``: ``config`` (the run's whole configuration, as ``config.json`` holds it), ``task``
      and ``resumed`` (true when ``run --resume`` continues it from the checkpoint at ``step``);
    * every record of ``metrics.jsonl``, the moment it is appended: ``"train"`` (loss, learning rate,
      tokens/s), ``"eval"`` (``split`` and the metrics of a validation) and the others the trainer
      logs, each with its ``step``. A resumed run logs again the records after its checkpoint, which
      the lost process had logged: drop what a tracker holds past the start's ``step``;
    * ``"result"``: ``metrics`` (val and test, as ``result.json`` holds them) and ``info``, once the
      run has finished and written them.

    Only the process that writes the run directory calls it (rank 0 of ``--nproc``). An exception
    stops the run with an ``Error:`` naming the plugin; its last checkpoint resumes it. The built-in
    TensorBoard tracker (``--set train.tensorboard=true``) is one such plugin.

    Example::

        @hookimpl
        def taskformer_track(event):
            if event["event"] == "eval":
                print(event["step"], event["loss"])
    """


PHASES = {  # the hooks in the order a run calls them, for the reference in docs/plugins.md
    "Declare": ("taskformer_tasks", "taskformer_register_commands"),
    "Data": ("taskformer_data", "taskformer_normalize"),
    "Model": ("taskformer_head",),
    "Decode": ("taskformer_decode",),
    "Score and report": ("taskformer_metrics", "taskformer_report_sections"),
    "Track": ("taskformer_track",),
    "Serve": ("taskformer_annotate",),
}
