"""Use a trained run from Python, without the command line.

    import taskformer
    model = taskformer.load("runs/translate-de-en/20261122-101500")
    model.predict(["Ein Hund rennt über die Wiese."])      # ['A dog runs across the meadow.']
    model.evaluate("test")                                  # {'bleu': 36.9, 'chrf': 56.5, ...}

``predict`` goes through the same task decoder as ``taskformer predict`` (constraints included) and
returns one result per input, in order: a string for sequence tasks, a :class:`taskformer.Label`
``(label, probability)`` for classifiers (``Label("", 0.0)`` for a blank input; a task of sentence
pairs takes each input as a tuple ``(first, second)``), and for taggers
a list of ``(word, tag)`` pairs, the words as given (punctuation kept), ``[]`` for a blank input.
Loading refuses what the command line refuses (pickles beside the weights, corrupt or mismatched
weights) with the same :class:`taskformer.TaskformerError`, and nothing is printed.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from taskformer.app import hooks, runner
from taskformer.core import config as C
from taskformer.core.decoding import word_tags
from taskformer.core.errors import TaskformerError


class Model:
    """A trained run, loaded once: its best weights, tokenizer, task and configuration."""

    def __init__(self, run: runner.Run):
        self._run = run

    def __repr__(self) -> str:
        return f"<taskformer.Model {self.task.name!r} from {str(self.dir)!r}>"

    @property
    def task(self):
        """The :class:`taskformer.Task` the run trained."""
        return self._run.task

    @property
    def config(self):
        """The run's configuration (:class:`taskformer.RunConfig`)."""
        return self._run.config

    @property
    def dir(self) -> Path:
        return self._run.dir

    @property
    def tokenizer(self):
        """The run's ``tokenizers.Tokenizer``: ``model.tokenizer.encode(text).ids`` counts what a text costs."""
        return self._run.tokenizer

    @property
    def network(self) -> torch.nn.Module:
        """The trained network (a ``taskformer`` Transformer or ensemble), for scores of your own:
        ``model.network(src)`` gives a decoder-only model's next-token logits ``(B, L, vocab)``."""
        return self._run.model

    def predict(self, texts: Iterable[str], *, beam: int | None = None, batch_size: int | None = None,
                return_attention: bool = False, **decode) -> list:
        """One prediction per text, in order; a blank text gives an empty prediction (a language
        model: the continuation of each prompt, ``""`` sampling from nothing). A task of sentence
        pairs takes each input as a tuple ``(first, second)``: ``model.predict([("A man sleeps.", "A person rests.")])``.
        With ``samples=N`` (and a ``temperature`` above 0) each prediction is a list of N samples.

        ``beam`` overrides the run's search (1 = greedy), ``batch_size`` the sentences decoded at once.
        ``return_attention`` (encoder-decoder runs) gives ``(prediction, taskformer.Attention)`` pairs:
        the cross-attention of the last decoder layer (``None`` for a blank text). Any other keyword
        is a ``decode`` setting for this call, checked as ``--set decode.KEY=VALUE`` is, e.g.
        ``model.predict(["ROMEO:"], temperature=0.8, top_k=200, seed=1, max_new_tokens=500)``.
        """
        pairs = self._run.model.cfg.pairs
        if isinstance(texts, str):
            raise TaskformerError("predict takes a list of texts, not one string: model.predict([text])")
        try:
            rows: list[Any] = list(texts)  # strings, or a pair task's pairs of strings
        except TypeError:
            raise TaskformerError(f"predict: texts must be a list of strings, got {type(texts).__name__}") from None
        if pairs:  # each input a (first, second) tuple; a list of two strings is taken as one too
            wrong = next((i for i, t in enumerate(rows) if not (
                isinstance(t, (tuple, list)) and len(t) == 2 and all(isinstance(x, str) for x in t))), None)
            if wrong is not None:
                raise TaskformerError(f"predict: texts[{wrong}] must be a pair (first, second) of strings: task "
                                      f"{self.task.name!r} reads pairs of texts, got {rows[wrong]!r:.60}")
            rows = [tuple(t) for t in rows]
        elif (wrong := next((i for i, t in enumerate(rows) if not isinstance(t, str)), None)) is not None:
            raise TaskformerError(f"predict: texts[{wrong}] must be a string, got {type(rows[wrong]).__name__}")
        for i, text in enumerate(rows):
            for part in text if pairs else [text]:
                try:
                    part.encode("utf-8")
                except UnicodeEncodeError as e:  # a lone surrogate such as "\udcff": no tokenizer can take it
                    raise TaskformerError(f"predict: texts[{i}] is not valid unicode ({e.reason} at position "
                                          f"{e.start}); decode bytes with errors='replace'") from None
        if not decode:
            C.validate(self.config)  # the config may have been changed by hand (model.config.decode.beam = ...)
        config = runner.with_decoding(self._run, decode, "predict") if decode else self.config
        outputs, _ = runner.predict(self._run, rows, runner.with_search(config, beam, batch_size),
                                    return_attention=bool(return_attention))
        if self._run.model.cfg.kind.per_word:  # a tagger: the user's words, each with its tag
            return [word_tags(text, tags) for text, tags in zip(rows, outputs)]
        return outputs

    def engine(self, **decode) -> dict[str, str]:
        """Which engine decodes ``predict`` with these ``decode`` settings (the run's own by default), its
        compute type and why: ``model.engine()`` -> ``{"engine": "ctranslate2", "compute_type": "float32",
        "reason": ...}``; ``model.predict(texts, engine="torch")`` picks one for a call."""
        config = runner.with_decoding(self._run, decode, "engine") if decode else self.config
        return hooks.engine_choice(self.task, self._run.model, config).as_dict()

    def evaluate(self, split: str = "test", data_dir: str | Path | None = None) -> dict:
        """Metrics of the run's best weights on ``split`` (val or test) of the task's data.

        ``data_dir`` defaults to the folder the run was trained on.
        """
        return runner.evaluate_saved(self._run, [split], data_dir)[split]


def load(run_dir: str | Path) -> Model:
    """Load the run in ``run_dir`` (as written by ``taskformer run``) for prediction and evaluation."""
    if not isinstance(run_dir, (str, Path)):
        raise TaskformerError(f"load: run_dir must be a path (str or pathlib.Path), got {type(run_dir).__name__}")
    return Model(runner.load(run_dir))
