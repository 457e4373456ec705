"""One run being served: its batcher, what ``GET /v1/models`` says of it, and its answers as JSON.

:mod:`taskformer.app.server` puts one :class:`Served` per run behind its routes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from typing import TYPE_CHECKING

import torch
from fastapi.sse import format_sse_event

from taskformer.app import hooks, runner
from taskformer.app.batching import Batcher
from taskformer.core import decoding, precision
from taskformer.core.data import encode_sources, is_blank, is_pair, pad
from taskformer.core.decoding import Label, word_tags
from taskformer.core.errors import TaskformerError
from taskformer.core.options import allowed
from taskformer.core.precision import autocast
from taskformer.core.train_config import bf16_setting
from taskformer.plugins.manager import plugins

if TYPE_CHECKING:
    from taskformer.app.server import Limits, Metrics

MAX_BEAM = 16  # the widest beam a request may ask for: each hypothesis costs the search's memory


def events(datas) -> bytes:
    """Server-sent events, one per dict, in one write. A stream writes what is ready at a turn of the
    event loop together: one write each would send a busy loop's backlog on to a client that has left,
    until the loop's next turn tells the server so (asyncio logs a warning from the fifth such write)."""
    return b"".join(format_sse_event(data_str=json.dumps(data, ensure_ascii=False)) for data in datas)


class Served:
    """One run being served: its batcher and the conversion of predictions to JSON."""

    def __init__(self, name: str, run: runner.Run, limits: Limits, metrics: Metrics):
        self.name, self.run = name, run
        self.batcher = Batcher(self.decode, name, limits.max_batch, limits.max_wait_ms / 1000, limits.max_queue,
                               on_batch=metrics.batch.labels(name).observe, on_queue=metrics.queue.labels(name).set,
                               parallel=self.parallel())

    def parallel(self) -> int:
        """Batches decoded at once: one per CTranslate2 worker (``decode.workers``; each decodes a batch on a
        core of its own, outside the GIL), so that a batch taken while another decodes finds a free worker;
        one for our decoder and ONNX Runtime, whose one batch uses every thread."""
        run = self.run
        if hooks.engine_choice(run.task, run.model, run.config).engine != "ctranslate2":
            return 1
        return decoding.decode_workers(run.config.decode.workers, run.device, 1 << 20)

    def describe(self) -> dict:
        run, task = self.run, self.run.task
        bf16, why = precision.choose(run.config.train.bf16, run.device)
        options = {name: described(run, f) for name, f in runner.request_options(run).items()}
        if "beam" in options:  # the beam a request gets without one: the run's, or 1 where its search is greedy
            options["beam"].update(default=run.config.decode.beam if run.config.decode.strategy == "beam" else 1,
                                   max=MAX_BEAM, allowed=f"[1, {MAX_BEAM}]")
        if run.model.cfg.kind.shifted:
            options["return_attention"] = {"default": False}
        return {"name": self.name, "task": task.name, "variant": task.variant, "kind": dataclasses.asdict(run.model.cfg.kind),
                "metric": task.metric,
                "metrics": {k: v for k, v in (run.metrics.get("test") or run.metrics.get("val") or {}).items()
                            if not isinstance(v, float) or math.isfinite(v)},  # JSON has no NaN
                "precision": f"{'bf16' if bf16 else 'fp32'} ({why})", "labels": run.labels, "options": options,
                "engine": hooks.engine_choice(task, run.model, run.config).as_dict(),
                "precision_words": precision_words(run.config.train.bf16, bf16, run.device.type),
                "description": task.description, "pairs": run.model.cfg.pairs,
                "examples": list(task.examples), "languages": list(task.languages or ())}

    def decode(self, texts: list, options: tuple[tuple, bool]) -> list[dict]:
        """One JSON result per text, or per pair of texts (runs in the batcher's thread); ``options`` are
        the request's decode settings, as ``(name, value)`` pairs, and whether it asks for attention."""
        settings, attention = options
        config = runner.request_config(self.run, dict(settings))
        outputs, _ = runner.predict(self.run, texts, config, attention)
        pairs = outputs if attention else [(out, None) for out in outputs]
        distributions = self.distributions(texts) if self.run.model.cfg.kind.classifies else None
        return [self.result_or_error(config, text, out, att, distributions[i] if distributions else None)
                for i, (text, (out, att)) in enumerate(zip(texts, pairs))]

    async def continuations(self, texts: list[str], settings: tuple):
        """Server-sent events of a language model: ``{"index", "text"}`` with the text each new token
        adds, then the input's result as ``/predict`` gives it; one input after another. A client that
        goes away stops the generation at its next token."""
        config = runner.request_config(self.run, dict(settings))
        for i, text in enumerate(texts):
            async for event in self.continuation(i, text, config):
                yield event

    async def continuation(self, i: int, text: str, config):
        """The events of input ``i``: its pieces as the search writes them, then its result."""
        loop, pieces = asyncio.get_running_loop(), asyncio.Queue[str | None]()
        gone = False

        def on_text(piece: str) -> None:
            if gone:
                raise asyncio.CancelledError  # the client went away: end the search
            loop.call_soon_threadsafe(pieces.put_nowait, piece)

        def ended(work: asyncio.Future) -> None:  # the search's end is read here, so a client that left logs nothing
            if not work.cancelled():
                work.exception()
            loop.call_soon_threadsafe(pieces.put_nowait, None)

        work = loop.run_in_executor(None, runner.continue_prompt, self.run, text, config, on_text)
        work.add_done_callback(ended)
        try:
            done = False
            while not done:
                written = [await pieces.get()]
                while not pieces.empty():
                    written.append(pieces.get_nowait())
                done = written[-1] is None  # the search's end is queued after its last piece
                if texts := [piece for piece in written if piece is not None]:
                    yield events({"index": i, "text": piece} for piece in texts)
            try:
                data = {"index": i, **self.result_or_error(config, text, await work, None, None)}
            except Exception as e:
                data = {"index": i, "error": f"{type(e).__name__}: {e}"}
            yield events([data])
        finally:
            gone = True

    def result_or_error(self, *args) -> dict:
        """An input the task cannot answer (a tagger's normalizer that changed its word count) fails its
        own request, not the others decoded beside it."""
        try:
            return self.result(*args)
        except TaskformerError as e:
            return {"error": str(e)}

    def result(self, config, text, prediction, attention, distribution) -> dict:
        """``output`` is the value ``taskformer predict --json`` prints for the same input and ``config``
        (the run's, with the request's decode settings); for a pair of texts, its label: the texts come
        beside it, as ``text`` and ``text_pair``."""
        if isinstance(prediction, Label):
            out = {"output": prediction._asdict(), "probabilities": distribution}
            if is_pair(text):
                out["text"], out["text_pair"] = text
        elif self.run.model.cfg.kind.per_word:
            out = {"output": [list(pair) for pair in word_tags(text, prediction)]}
        elif not self.run.model.cfg.kind.encoder:  # a language model: its continuation, as predict --json gives it
            out = {"output": prediction, "prompt": text, "settings": runner.generation_settings(self.run, config)}
        else:
            out = {"output": prediction}
            marks = [self.marks(text), self.marks(prediction)] if isinstance(prediction, str) else []  # not samples
            if any(marks):
                out["marks"] = {"input": marks[0], "output": marks[1]}
        if attention is not None:
            out["attention"] = attention._asdict()
        return out

    def marks(self, text: str) -> list[str] | None:
        return plugins().first("taskformer_annotate", self.run.task, text=text)[1]

    @torch.no_grad()
    def distributions(self, texts: list) -> list[dict[str, float] | None]:
        """Every label's probability for each text or pair (the page's bars), each on its own."""
        run = self.run
        network = hooks.label_network(run.task, run.model, run.tokenizer, run.config)  # ONNX Runtime's, where it decodes
        found: list[dict[str, float] | None] = []
        for text in hooks.normalize(run.task, texts, run.config):
            if is_blank(text):
                found.append(None)
                continue
            src, _ = encode_sources(run.tokenizer, [text], run.model.cfg.max_len, classify=True)
            with autocast(run.config.train.bf16, run.device):
                probs = decoding.classify(network, pad(src).to(run.device))[0].tolist()
            found.append(dict(zip(run.labels or [], probs)))
        return found


def described(run: runner.Run, f: dataclasses.Field) -> dict:
    """A decode option as ``GET /v1/models`` lists it: the run's value, what it accepts (``min`` and
    ``max`` inclusive, ``above`` and ``below`` not, ``choices``; ``allowed`` in words) and its help."""
    m = f.metadata
    bounds = {name: m[key] for key, name in (("at_least", "min"), ("above", "above"), ("at_most", "max"),
                                             ("below", "below"), ("choices", "choices")) if key in m}
    return {"default": getattr(run.config.decode, f.name), **bounds, "allowed": allowed(f), "help": m.get("help", "")}


def precision_words(setting, bf16: bool, device_type: str) -> str:
    """The precision decoding runs in, in plain words for the page (``precision`` gives the measured reason)."""
    unit = "GPU" if device_type == "cuda" else "processor"
    if bf16_setting(setting) != "auto":
        return f"{'16-bit (bfloat16)' if bf16 else '32-bit'}, as the run set it"
    return f"16-bit (bfloat16), native on this {unit}" if bf16 else f"32-bit; this {unit} has no fast 16-bit"
