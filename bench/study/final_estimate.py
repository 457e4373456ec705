"""The final evaluation's estimate, as a time-limited run times it again during training, against the
evaluation it estimates (val and test scored and decoded, as the run's end does), alternating in one
process on a trained run.

    python bench/study/final_estimate.py RUN --data ../shared/datasets/multi30k --rounds 4

Prints each round's estimate, the seconds the evaluation took and their ratio (goal: within 1.5x, and
over 1/1.25, the margin a run keeps on top of it), and the median ratio. A trained model writes about
its own length where the probe's untrained one writes to each group's longest reference: the ratio
shows whether the estimate scales what the timing wrote to what the end will write.
"""
from __future__ import annotations

import argparse
import statistics
import time

from taskformer.app.decodetime import decode_seconds, final_seconds
from taskformer.app.hooks import evaluate_split, load_data
from taskformer.app.runner import load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", help="a trained run directory")
    parser.add_argument("--data", help="the run's data folder, where its task reads one")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    run = load(args.run)
    data = load_data(run.task, run.config, args.data, splits=("val", "test"), tokenizer=run.tokenizer)
    ratios = []
    for r in range(args.rounds):
        estimate = final_seconds(data, decode_seconds(run, data, validation=False))[0]
        begun = time.perf_counter()
        for split in ("val", "test"):
            evaluate_split(run, data.splits[split], name=f"decoding {split}")
        took = time.perf_counter() - begun
        ratios.append(estimate / took)
        print(f"round {r}: estimate {estimate:.2f} s, took {took:.2f} s: {ratios[-1]:.2f}x", flush=True)
    print(f"median estimate / took: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
