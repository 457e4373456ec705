"""A validation of a trained run on our decoder against the same greedy search on CTranslate2, which
converts the weights anew each time (as every validation of a training run does: its weights changed),
into a temporary folder; the two alternate in one process.

    python bench/study/validation_engine.py RUN --data ../shared/datasets/multi30k --rounds 2

Prints the seconds and the selection metric of each, and their ratio.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from taskformer.app.decodetime import uncached, validation_config
from taskformer.app.hooks import evaluate_split, load_data
from taskformer.app.runner import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a trained run directory (encoder-decoder or decoder-only)")
    parser.add_argument("--data", required=True, help="the run's data (its val split is decoded)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    run = load(args.run)
    val = load_data(run.task, run.config, args.data, splits=("val",), tokenizer=run.tokenizer).splits["val"]
    seconds: dict[str, list[float]] = {"torch": [], "ctranslate2": []}
    for r in range(args.rounds):
        for engine in seconds:
            with uncached(), torch.no_grad():
                for weight in run.model.parameters():  # new weights, as a validation's: converted again
                    weight.mul_(1.0)
                begun = time.perf_counter()
                metrics, _ = evaluate_split(run, val, validation_config(run.config, engine), "validating")
                seconds[engine].append(time.perf_counter() - begun)
            print(f"round {r} {engine}: {seconds[engine][-1]:.2f} s, {run.task.metric} "
                  f"{metrics.get(run.task.metric, float('nan')):.2f}, loss {metrics['loss']:.4f}", flush=True)
    ours, theirs = (statistics.median(seconds[e]) for e in ("torch", "ctranslate2"))
    print(f"median: our decoder {ours:.2f} s, CTranslate2 converting {theirs:.2f} s: {ours / theirs:.2f}x")


if __name__ == "__main__":
    main()
