"""Decoding outside torch: a converted model run by CTranslate2 or ONNX Runtime, fed our token ids.

Both runtimes take batches as our decoder does (:func:`taskformer.app.hooks.decode_texts` groups
sources of one length, except for a CTranslate2 translator, which batches any lengths), as lists of
id rows, unpadded (no padded tensor is built for a runtime that reads lists: at batch 1 that costs
a tenth of a millisecond of a call of a few), and give
back what it gives: token ids per row for a search, logits for a classifier or tagger, so that
tokenizing, detokenizing and labelling stay ours.

CTranslate2 is told what our search does (``taskformer.core.decoding``): the budget
``max_len_a * source length + max_len_b`` of each source (CTranslate2 takes one a call: the
longest row's, each row cut to its own after; EOS may come first, as ours allows: an empty output),
the specials no search writes (``disable_unk``, PAD and BOS suppressed), beam size and length penalty,
sampling's temperature, top-k and top-p. Two conventions differ. Its beam ranks finished hypotheses by
``score / length ** length_penalty`` where ours uses Wu et al.'s ``((5 + length) / 6) ** length_penalty``,
and equal scores may be broken differently; docs/engines.md measures the agreement. Its sampling draws
from a random generator per worker thread, seeded by ``ctranslate2.set_random_seed`` when the thread
first samples: a new process given the same inputs in the same order and seed samples the same
outputs, but an input's output depends on what was drawn before it, where ours depends on the input
and seed alone (so ``decode.engine=auto`` samples with ours).

Neither package is imported before a runtime is made: both are optional (``taskformer[export]``).
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import torch

from taskformer.core.decode_config import DecodeConfig
from taskformer.core.decoding import NEVER_WRITTEN, max_lengths
from taskformer.core.model import UNK
from taskformer.core.onnx_export import PROBABILITIES
from taskformer.core.tokenize import SPECIALS
from taskformer.core.variants import Variant


def context_fits(prompt: int, max_new_tokens: int, positions: int) -> bool:
    """Whether a language model's prompt of ``prompt`` tokens and a continuation of ``max_new_tokens`` fit in
    its ``positions`` (``model.max_len``) on CTranslate2, which cannot slide the context as our decoder does."""
    return prompt + max_new_tokens <= positions


class CTranslate2Search:
    """A CTranslate2 ``Translator`` (encoder-decoder) or ``Generator`` (decoder-only) over our ids."""

    def __init__(self, path: Path, kind: Variant, vocabulary: list[str], max_len: int, device: str,
                 compute_type: str, workers: int = 1):
        import ctranslate2

        self.ctranslate2, self.kind, self.max_len = ctranslate2, kind, max_len
        self.mixes_lengths = kind.encoder  # a batch may hold sources of several lengths (a prompt's end must align)
        self.vocabulary, self.ids = vocabulary, {t: i for i, t in enumerate(vocabulary)}
        threads = torch.get_num_threads()
        make = ctranslate2.Translator if kind.encoder else ctranslate2.Generator
        self.workers = max(workers, 1)
        self.model = make(str(path), device=device, compute_type=compute_type, inter_threads=self.workers,
                          intra_threads=max(threads // self.workers, 1))
        torch.set_num_threads(threads)  # the runtime sets the OpenMP threads it shares with torch to 1
        # What every call passes, built once: a batch-1 call is a few milliseconds, and Python's share counts.
        self.fixed = dict(disable_unk=True, suppress_sequences=[[SPECIALS[i]] for i in NEVER_WRITTEN if i != UNK])
        self.budgets: dict[tuple[int, float, int], int] = {}  # (source length, max_len_a, max_len_b) -> budget

    def fits(self, src: list[list[int]], config: DecodeConfig) -> bool:
        """Whether the outputs stay within the model's positions: a decoder-only model's prompt and
        continuation must, since CTranslate2 cannot slide the context as our decoder does; and whether
        every prompt has a token (our decoder starts an empty one from BOS, CTranslate2 cannot start one)."""
        if self.kind.encoder:
            return True
        return context_fits(max(map(len, src)), config.max_new_tokens, self.max_len) and all(src)

    def search(self, src: list[list[int]], config: DecodeConfig,
               on_token: Callable[[int], bool] | None = None) -> list[list[int]]:
        """The output ids of each id row of ``src`` (unpadded; for a decoder-only model one length a batch)
        under ``config``'s search. ``on_token(id)`` (one greedy or sampled row) is called with each token
        as it is chosen and stops the search by returning True."""
        rows = [list(map(self.vocabulary.__getitem__, row)) for row in src]
        if self.kind.encoder:
            budgets = [self.budget(len(row), config) for row in rows]
            rows = [row[:-1] for row in rows]  # the export frames sources itself (add_source_eos): ours end in EOS
        else:
            budgets = [config.max_new_tokens] * len(rows)
        sampled = config.temperature > 0
        beam = config.beam if config.strategy == "beam" and not sampled else 1
        options = dict(self.fixed, beam_size=beam, length_penalty=config.length_penalty)
        if sampled:  # top_k 0 is every token, as ours; one above the vocabulary is too (CTranslate2 refuses it)
            options.update(sampling_temperature=config.temperature, sampling_topk=min(config.top_k, len(self.ids)),
                           sampling_topp=config.top_p)
            self.ctranslate2.set_random_seed(config.seed)  # read by a worker thread the first time it samples
        if on_token is not None:
            options["callback"] = lambda step: bool(on_token(step.token_id))
        # Greedy or sampled, one call with the longest row's budget: a row cut to its own budget afterwards
        # is what a search with that budget gives (a token never depends on the budget).
        if beam == 1:
            return [ids[:b] for ids, b in zip(self._run(rows, max(budgets), options)[0], budgets)]
        return self._beam(rows, budgets, options)

    def _beam(self, rows: list[list[str]], budgets: list[int], options: dict) -> list[list[int]]:
        """A beam search's outputs, each what a call with that row's own budget alone would give.

        A beam's finished hypotheses depend on where the budget cuts them, so one call with the longest
        budget is exact only for the rows that finished before their own budget's last step. CTranslate2
        (with a length penalty) finishes a row at the step its ``beam`` th hypothesis ends, and each
        hypothesis ending at step ``s`` has ``s`` tokens: asked for all ``beam`` of them, the longest
        one's length is the step the row finished at. The rows that reached their own last step are
        decoded again, one call per budget. Without a length penalty CTranslate2 stops a row when its
        best beam ends instead, a step the hypotheses do not tell: one call per budget from the start
        (one call where all rows have one budget, a lone sentence's case)."""
        out: list[list[int] | None] = [None] * len(rows)
        # With a length penalty the number of hypotheses asked for changes neither when a row ends nor
        # which is best; without one CTranslate2 ends a row once that many have finished, so all ask as many.
        wide = dict(options, num_hypotheses=options["beam_size"])
        penalty, top = options["length_penalty"] != 0, max(budgets)
        if penalty or len(set(budgets)) == 1:
            best, longest = self._run(rows, top, wide if len(set(budgets)) > 1 or not penalty else options)
            for i, (ids, steps, budget) in enumerate(zip(best, longest, budgets)):
                if steps < budget - 1 or budget == top:  # the longest budget's rows had their own
                    out[i] = ids
        for budget in sorted({b for b, o in zip(budgets, out) if o is None}):
            at = [i for i, (b, o) in enumerate(zip(budgets, out)) if o is None and b == budget]
            for i, ids in zip(at, self._run([rows[i] for i in at], budget, options if penalty else wide)[0]):
                out[i] = ids
        return cast(list[list[int]], out)

    def budget(self, length: int, config: DecodeConfig) -> int:
        """The output budget of a source of ``length`` tokens (EOS included), as our search computes it."""
        key = (length, config.max_len_a, config.max_len_b)
        if key not in self.budgets:
            self.budgets[key] = int(max_lengths(torch.ones(1, length, dtype=torch.long), config.max_len_a,
                                                config.max_len_b, self.max_len)[0])
        return self.budgets[key]

    def _run(self, rows: list[list[str]], budget: int, options: dict) -> tuple[list[list[int]], list[int]]:
        """Each row's best output ids, and the length of its longest hypothesis returned. A batch of several
        rows is split across the runtime's workers (each sorts and decodes its share) when no other call
        is decoding: beside another call (a server's next batch) it stays whole on one worker, where
        halves would decode less efficiently (CTranslate2's time per sentence falls with the batch)."""
        split = -(-len(rows) // self.workers) if self.workers > 1 and len(rows) > 1 and (
            self.model.num_active_batches + self.model.num_queued_batches == 0) else 0
        if self.kind.encoder:
            results = self.model.translate_batch(rows, max_decoding_length=budget, min_decoding_length=0,
                                                 max_input_length=self.max_len, max_batch_size=split, **options)
            found = [r.hypotheses for r in results]  # each read makes its lists anew
            ids = self.ids.__getitem__
            return [list(map(ids, h[0])) for h in found], [max(map(len, h)) for h in found]
        results = self.model.generate_batch(rows, max_length=budget, include_prompt_in_result=False,
                                            max_batch_size=split, **options)
        return [list(r.sequences_ids[0]) for r in results], [max(map(len, r.sequences_ids)) for r in results]


class OnnxNetwork:
    """An exported encoder-only or tagging network under ONNX Runtime, called as our model is:
    ``network(src)`` gives the logits of rows of one length (no padding: :meth:`fits`), so that
    labels and tags are read from them as ours are.

    A classifier's probabilities come from the graph (:meth:`probabilities`): at batch 1 the torch
    operations around the call (a tensor made of the output, softmax, max, the lists) cost about a
    tenth of a whole ``predict``, and numpy's softmax after it nearly as much. ``workers`` batches
    run side by side (``decode.workers``), the threads split between them as CTranslate2's are."""

    def __init__(self, path: Path, cfg, device: str, workers: int = 1):
        from taskformer.core.onnx_export import session

        self.cfg = cfg
        self.session = session(path, device, max(torch.get_num_threads() // max(workers, 1), 1))

    def fits(self, src: list[list[int]], config: DecodeConfig) -> bool:
        """A batch of rows of one length (any length up to ``model.max_len``): the graph is exported for
        rows without padding (``onnx_export.for_engine``), as ``decode_texts`` batches sources."""
        return len(set(map(len, src))) == 1

    def logits(self, src: torch.Tensor | np.ndarray) -> np.ndarray:
        # The output named: with None, ONNX Runtime's wrapper reads every output's metadata anew each call.
        return self.session.run(["logits"], {"src": src.cpu().numpy() if isinstance(src, torch.Tensor) else src})[0]

    def __call__(self, src: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.logits(src))

    def probabilities(self, src: list[list[int]]) -> np.ndarray:
        """Class probabilities (B, C) of id rows of one length, as :func:`taskformer.core.decoding.classify`
        gives ours: the rows go to the session as one array, with no torch tensor between, and the
        graph's softmax (``onnx_export.for_engine``) gives them."""
        return self.session.run([PROBABILITIES], {"src": np.array(src, dtype=np.int64)})[0]
