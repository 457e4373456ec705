"""How long decoding will take at the end of a time-limited run, timed before it trains.

A probe decodes whole groups of val (or test) sources (:func:`timing_sample`) with the final evaluation's
search, on the engine that will decode it, and with a validation's, each output written to its
reference's length (a trained model's: an untrained one writes to the length limit). The seconds per
example are scaled to the splits by :func:`final_seconds`; a validation during training is scaled
to the references' lengths by :func:`length_share`.
"""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

import torch

from taskformer.app.hooks import engine_choice, evaluate_split
from taskformer.core import decoding, progress, variants
from taskformer.core.config import RunConfig
from taskformer.core.data import TaskData
from taskformer.plugins.run import Run


class DecodeTiming(NamedTuple):
    """What the end of a run's training costs, timed before it trains."""

    final: float  # seconds per example of the final evaluation: its search, on the engine that will decode it
    validation: float  # seconds per example of a validation: decode.eval_strategy, on validation_engine
    fixed: float  # seconds the final evaluation spends once: converting the weights for a runtime
    validation_engine: str = "torch"  # where validations decode: the faster of our decoder and the final's runtime
    validation_torch: float = 0.0  # seconds per example of a validation on our decoder, where a runtime was faster


@torch.no_grad()
def decode_seconds(run: Run, data: TaskData, validation: bool = True) -> DecodeTiming:
    """Time the final evaluation on a sample of the larger of val and test and (``validation``) a
    validation on one of val (:func:`timing_sample`), each output written to its reference's length
    (see :func:`seconds_per_example`). The final evaluation
    is timed on the engine that will decode it (``decode.engine``: a runtime is timed twice, the
    first time converting the weights, into a temporary folder and not the user's cache, after an
    untimed decode that pays what a process pays once). Each search is timed after an untimed decode:
    of a few rows on a CPU, of the same groups on a GPU, whose first call of each shape picks kernels.

    A validation is timed on our decoder and, where the final evaluation's runtime runs its search
    too, on the runtime, its conversion included (the weights change between validations): the
    faster is where the run's validations decode. The runtime batches sources of any length, where
    our decoder batches one length at a time; on a small model the conversion can cost more than
    that gains."""
    run.model.eval()
    config, larger = run.config, max(("val", "test"), key=lambda split: len(data.splits[split]))
    # the final evaluation's groups from the split it decodes most of: a small val's groups are a few rows
    # each, where a large test's are whole batches (agnews: 250 rows against 7,600), decoded at a fraction
    # of the time an example
    final_sample = timing_sample(run, data, larger)
    sample = final_sample if larger == "val" or not validation else timing_sample(run, data)

    def warm(decode_config: RunConfig, groups: list[list[tuple]]) -> None:
        """An untimed decode: a first decode's one-time costs, and on a GPU each new shape's choice of kernels."""
        seconds_per_example(run, groups if run.device.type == "cuda" else [groups[0][:4]], decode_config)

    def timed(decode_config: RunConfig, groups: list[list[tuple]]) -> float:
        warm(decode_config, groups)
        return seconds_per_example(run, groups, decode_config)

    def on_runtime(decode_config: RunConfig, groups: list[list[tuple]]) -> tuple[float, float]:
        """Seconds per example on the runtime, and the seconds its conversion of new weights takes."""
        with uncached():
            warm(decode_config, groups)  # the runtime's one-time costs in this process (on a GPU its context)
            for weight in run.model.parameters():  # new weights, as the end's: the next decode converts them again
                weight.mul_(1.0)
            first = seconds_per_example(run, groups, decode_config, side_by_side=False)
            wrote: list = []
            again = seconds_per_example(run, groups, decode_config, wrote, side_by_side=False)
        # a runtime drops each row as it ends: on a CPU, whose time follows the tokens written, what it will write
        # is each reference's length, not what the timing wrote (an untrained model: its group's longest
        # reference; a trained one: about its own); a GPU's time follows the steps of a batch's longest
        share = length_share(run, wrote, decode_config.decode.engine) if run.device.type == "cpu" else 1.0
        return again * share, max(first - again, 0.0) * sum(map(len, groups))

    validating, engine, on_torch = 0.0, "torch", 0.0
    if validation:
        validating = timed(validation_config(config), sample)
        runtime = validation_config(config, config.decode.engine)
        choice = engine_choice(run.task, run.model, runtime).engine
        if choice != "torch":
            per_example, converting = on_runtime(runtime, sample)
            there = per_example + converting / len(data.splits["val"])  # each validation converts its weights
            if there < validating:
                validating, engine, on_torch = there, choice, validating
    if engine_choice(run.task, run.model, config).engine == "torch":
        same = validation and larger == "val" and config.decode.strategy == config.decode.eval_strategy
        final = validating if same and engine == "torch" else timed(config, final_sample)
        return DecodeTiming(final, validating, 0.0, engine, on_torch)
    final, fixed = on_runtime(config, final_sample)
    return DecodeTiming(final, validating, fixed, engine, on_torch)


def length_share(run: Run, outputs: list, engine: str = "torch") -> float:
    """The steps a decode of ``outputs`` would take writing its references over those it took, between 1/4
    and 4; 1 for a network that writes nothing. Our decoder batches the sources of one length (up to
    ``decode.batch_size``) and a batch runs until its longest output ends, so each batch counts its rows
    times its longest output, as the probe's timing writes each group to its longest reference; a
    runtime (``engine``) drops each row as it ends, so each row counts its own. A validation early in
    training writes on to the length limit, and one such row holds up its whole batch: counted by the
    mean length, its time, scaled to the final evaluation, kept back about twice what that takes."""
    if not variants.of(run.task.variant).decoder or not outputs:
        return 1.0
    sources = written(run, [row[0] for row in outputs])
    wrote, references = written(run, [row[1] for row in outputs]), written(run, [row[2] for row in outputs])
    batches: dict[int, list[int]] = {}
    for i, length in enumerate(sources):
        batches.setdefault(length if engine == "torch" else i, []).append(i)
    size, steps = max(run.config.decode.batch_size, 1), [0, 0]  # the references', then what was written
    for rows in batches.values():
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            steps[0] += len(batch) * max(references[i] for i in batch)
            steps[1] += len(batch) * max(wrote[i] for i in batch)
    return min(max(steps[0] / max(steps[1], 1), 0.25), 4.0)


def written(run: Run, texts: list) -> list[int]:
    """The tokens a decoder writes for each of ``texts``, its end included."""
    return [len(e.ids) + 1 for e in run.tokenizer.encode_batch([str(text) for text in texts])]


def validation_config(config: RunConfig, engine: str = "torch") -> RunConfig:
    """``config`` as validations decode: the cheaper search, on our decoder unless the probe found
    ``engine`` (a runtime, converting the weights anew for each validation) faster."""
    return replace(config, decode=replace(config.decode, strategy=config.decode.eval_strategy, engine=engine))


def timing_sample(run: Run, data: TaskData, split: str = "val") -> list[list[tuple]]:
    """Rows of ``split`` to time decoding on, as the decoder batches them: it decodes the sources of each
    length as batches of their own (up to ``decode.batch_size``), so the sample is whole groups of one
    source length, one for each of its workers (2 to 8): those of the rows at the middle of as many
    equal slices of the split sorted by length. Their lengths are spread as the split's are; a group every
    few distinct lengths would weigh the long tail's few, slow rows as much as the many short ones."""
    val, batch = data.splits[split], run.config.decode.batch_size
    lengths = [len(e.ids) for e in run.tokenizer.encode_batch([str(row[0]) for row in val])]
    groups: dict[int, list[tuple]] = {}
    for length, row in zip(lengths, val):
        groups.setdefault(length, []).append(row)
    ordered, slices = sorted(lengths), min(max(decoding.decode_workers(run.config.decode.workers, run.device, 8), 2), 8)
    middles = dict.fromkeys(ordered[(2 * i + 1) * len(ordered) // (2 * slices)] for i in range(slices))
    return [groups[n][:batch] for n in middles] or [list(val[:batch])]


def seconds_per_example(run: Run, sample: list[list[tuple]], config: RunConfig, outputs: list | None = None,
                        side_by_side: bool = True) -> float:
    """Seconds per example of scoring and decoding the groups of ``sample`` with ``config``'s search
    and engine, each group's outputs written to at most its longest reference (an untrained model
    writes to the length limit, several times what a trained one writes). The outputs, rows of
    (source, output, reference), are added to ``outputs`` where given.

    ``side_by_side``: the groups decode at once, as our decoder's workers decode a split's batches (one
    group alone would leave the other workers' cores idle). A runtime is timed one group after another
    instead: it splits a lone call's batch across its own workers, and beside another call keeps it
    whole on one worker, so two groups at once would leave one worker idle while the second group
    decodes (half as long again as a split's stream of batches, which keeps every worker busy)."""
    kind = variants.of(run.task.variant)

    def evaluate(group: list[tuple]) -> None:
        decode = config.decode
        if kind.decoder:
            longest = max(written(run, [row[1] for row in group]))
            decode = (replace(decode, max_len_a=0.0, max_len_b=longest) if kind.shifted
                      else replace(decode, max_new_tokens=longest))
        with torch.no_grad(), progress.quiet():  # a worker's grad mode is its own; the caller says what is timed
            evaluated = evaluate_split(run, group, replace(config, decode=decode), "timing")
        if outputs is not None:
            outputs.extend(evaluated[1])

    begun = time.perf_counter()
    workers = decoding.decode_workers(config.decode.workers, run.device, len(sample)) if side_by_side else 1
    for _ in decoding.parallel_map(evaluate, sample, workers):
        pass
    return (time.perf_counter() - begun) / max(sum(map(len, sample)), 1)


@contextmanager
def uncached():
    """Runtimes convert a throwaway model into a temporary folder, not into the user's engine cache."""
    before = os.environ.get("TASKFORMER_CACHE")
    os.environ["TASKFORMER_CACHE"] = "off"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TASKFORMER_CACHE"]
        else:
            os.environ["TASKFORMER_CACHE"] = before


def final_seconds(data: TaskData, timing: DecodeTiming) -> tuple[float, float]:
    """Seconds of the final evaluation of val and test (a test that is val decoded once) and of the
    last validation that may follow the last update, from ``timing``."""
    val, test = data.splits["val"], data.splits["test"]
    return (timing.fixed + timing.final * (len(val) + (0 if test == val else len(test))),
            timing.validation * len(val))
