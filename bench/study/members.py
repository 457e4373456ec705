"""What an ensemble's members are worth alone: val metrics of each member and of the whole.

The evidence that an ensemble recipe pays: the same weights, the same data and the
run's own decoding (beam, length penalty), scored with every member alone and all of them
together. Val only: the recipe is chosen on val, and the test set is decoded once by the run.

    python bench/study/members.py RUN [--split val] [--json members.json]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from typing import cast

from taskformer.app import runner
from taskformer.core.model import Ensemble, Transformer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--split", default="val", choices=("val",))
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()
    run = runner.load(args.run)
    if not isinstance(run.model, Ensemble):
        raise SystemExit(f"{args.run}: not an ensemble (model.members=1)")
    rows = []
    members = cast(list[Transformer], list(run.model.members))  # a ModuleList of the networks
    models: list[tuple[str, Transformer | Ensemble]] = [*((f"member {i}", m) for i, m in enumerate(members)),
                                                        ("ensemble", run.model)]
    for name, model in models:
        started = time.perf_counter()
        metrics = runner.evaluate_saved(dataclasses.replace(run, model=model), [args.split])[args.split]
        rows.append({"model": name, **metrics, "seconds": round(time.perf_counter() - started, 1)})
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"run": args.run, "split": args.split, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
