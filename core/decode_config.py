"""The ``decode`` section of a run's configuration: how sequence outputs are searched.

Plain data, kept apart from the search itself (:mod:`taskformer.core.decoding`) and free of
torch, so that a task can declare search options of its own (``Task.decode_options``, a subclass)
in a module that ``taskformer tasks`` imports only to list it.
"""
from __future__ import annotations

from dataclasses import dataclass

from taskformer.core import variants
from taskformer.core.options import check, option
from taskformer.core.variants import VARIANTS

QUANTIZE = ("none", "int8")  # the weights decoding runs on: as trained, or int8 linear layers (core/inference.py)
STRATEGIES = ("beam", "greedy")
MAX_NEW_TOKENS = 100_000  # a continuation's bound: each token is a step of the model, and a request must end
MAX_WORKERS = 1024  # each worker is a thread (CTranslate2's too): billions would end the process, not the decode
ENGINES = ("auto", "torch", "ctranslate2", "onnxruntime")  # what decodes: taskformer/app/engines.py chooses
SEARCHED = tuple(v for v in VARIANTS if variants.of(v).decoder)  # outputs are searched: the search options apply
SHIFTED = tuple(v for v in VARIANTS if variants.of(v).shifted)  # an output's length follows its source's
PROMPTED = tuple(v for v in VARIANTS if not variants.of(v).encoder)  # an output continues a prompt


@dataclass
class DecodeConfig:
    """How sequence tasks search; ``max_len_a * source_length + max_len_b`` bounds each output."""

    strategy: str = option("beam", "Search for test outputs and predict.", choices=STRATEGIES, variants=SEARCHED)
    beam: int = option(5, "Beam size (1 is greedy).", at_least=1, variants=SEARCHED)
    length_penalty: float = option(1.0, "Finished beams are ranked by score / ((5 + length) / 6) ** length_penalty "
                                   "(Wu et al., 2016); 0: by score alone.", variants=SEARCHED)
    max_len_a: float = option(1.2, "Output length limit: max_len_a * source length + max_len_b tokens.",
                              at_least=0, variants=SHIFTED)
    max_len_b: int = option(10, "See max_len_a.", at_least=0, variants=SHIFTED)
    max_new_tokens: int = option(256, "Most tokens written after the prompt (EOS ends a continuation sooner); past "
                                 "model.max_len positions the context slides.", at_least=1, at_most=MAX_NEW_TOKENS,
                                 variants=PROMPTED)
    temperature: float = option(0.0, "0: search (decode.strategy); above 0: sample every token from the model's "
                                "distribution at this temperature (below 1 sharper, above 1 flatter).", at_least=0.0,
                                variants=SEARCHED)
    top_k: int = option(0, "Sampling draws among the k most likely tokens only; 0: all (1 is greedy).", at_least=0,
                        variants=SEARCHED)
    top_p: float = option(1.0, "Sampling draws among the fewest most likely tokens whose probability reaches p "
                          "(nucleus sampling); 1: all.", above=0.0, at_most=1.0, variants=SEARCHED)
    seed: int = option(0, "Seed of sampling: the same input and seed give the same output.", variants=SEARCHED)
    samples: int = option(1, "Outputs drawn per input when sampling (decode.temperature above 0): predict, the "
                          "Python API and serve give a list, sample k drawn with seed decode.seed + k; a search "
                          "(greedy, beam) gives one. Evaluations score one.", at_least=1, at_most=100,
                          variants=SEARCHED)
    no_repeat_ngram: int = option(0, "No output writes an n-gram of this many tokens twice (greedy, beam and sampling; "
                                  "a language model's prompt counts); 0: off. 3 stops 'Sox Sox Sox' loops.",
                                  at_least=0, variants=SEARCHED)
    batch_size: int = option(128, "Inputs per decoding batch.", at_least=1)
    workers: int = option(0, "Batches decoded at once (CPU threads); 0: one per torch thread on CPU, one on GPUs.",
                          at_least=0, at_most=MAX_WORKERS)
    eval_strategy: str = option("greedy", "Cheaper search for the per-evaluation validation score.",
                                choices=STRATEGIES, variants=SEARCHED)
    compile: bool = option(False, "Compile the one-token decoding step (TorchInductor, static key/value cache; "
                           "needs a C++ compiler on CPU, falls back without one; the first compile takes tens of "
                           "seconds). Pays where a step is mostly dispatch (a small model, one input at a time); "
                           "not for the translation defaults (docs/benchmarks.md).", variants=SEARCHED)
    quantize: str = option("none", "int8: decode with int8 weights: CTranslate2's int8 (ONNX Runtime's dynamic int8 "
                           "for a classifier or tagger) where decode.engine runs one, else int8 linear layers in "
                           "torch (torchao, CPU: per-row weights; inputs per token where the CPU multiplies int8 "
                           "exactly (VNNI), else fp32), which on CPU is slower than fp32 unless decode.compile; what "
                           "each buys: docs/benchmarks.md.", choices=QUANTIZE)
    engine: str = option("auto", "What decodes: torch (our decoder), ctranslate2 (encoder-decoder and decoder-only "
                         "runs) or onnxruntime (classifiers and taggers), each converted once into the user's cache; "
                         "auto: the fast engine where it is installed and can decode the run and its search, else "
                         "torch (predict --json, eval --json, serve and the report say which ran and why; "
                         "docs/engines.md).", choices=ENGINES)

    def validate(self) -> None:
        """Refuse values outside each field's range (its metadata); a task's subclass adds its own checks."""
        check("decode", self)
        if self.samples > 1 and self.temperature == 0:
            raise ValueError(f"decode.samples={self.samples} draws several outputs, which needs sampling "
                             "(decode.temperature above 0): greedy and beam search give one")
