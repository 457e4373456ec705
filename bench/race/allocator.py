"""Side-by-side: training updates with glibc's default malloc settings and with freed memory kept for
reuse (``keep_freed_memory`` in taskformer/app/runner.py, which ``taskformer run``, ``eval`` and
``predict`` call).

Each round starts two fresh child processes in turn, default then kept, so drift of a noisy machine
hits both alike; the table gives each figure's median over the rounds and the kept/default ratio of
the medians. A child trains the translate-de-en default network (its shape read from the task's
defaults, vocabulary 10,000) on synthetic batches of ``--max-tokens`` target tokens whose sentence
length changes every update, as token-based batching does, and reports seconds per update, minor
page faults per update and its peak resident memory.

    python bench/race/allocator.py                       # 3 rounds of 20 updates: about 3 minutes on 2 cores
    python bench/race/allocator.py --rounds 5 --steps 30 --json out.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name  # bench/ is on the path when a script here runs  # noqa: E402
from taskformer.app.resources import keep_freed_memory  # noqa: E402
from taskformer.core import config as C  # noqa: E402
from taskformer.core.arrays import Ragged  # noqa: E402
from taskformer.core.data import Encoded  # noqa: E402
from taskformer.core.engine import Trainer  # noqa: E402
from taskformer.core.model import Transformer  # noqa: E402
from taskformer.core.model_config import ModelConfig  # noqa: E402
from taskformer.core.train_config import TrainConfig  # noqa: E402
from taskformer.plugins.manager import plugins  # noqa: E402

VOCAB = 10_000


def child(keep: bool, steps: int, max_tokens: int) -> dict:
    if keep and not keep_freed_memory():
        sys.exit("keep_freed_memory() is not available here (glibc on Linux only)")
    shape = C.defaults(plugins().task("translate-de-en"))["model"]
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**{**shape, "vocab_size": VOCAB})).train()
    trainer = Trainer(model, TrainConfig(bf16="false", lr=1e-4, warmup=0), train=Encoded(Ragged.of([]), Ragged.of([])),
                      evaluate=dict, select=("loss", False), run_dir=Path("."), device=torch.device("cpu"))
    lengths = torch.Generator().manual_seed(0)

    def update() -> None:  # the engine's own update: label-smoothed loss, clipping, AdamW, schedule
        length = int(torch.randint(8, 40, (), generator=lengths))
        rows = max_tokens // length
        src, tgt = torch.randint(4, VOCAB, (rows, length)), torch.randint(4, VOCAB, (rows, length + 1))
        trainer._step([(src, tgt)])

    for _ in range(2):  # warm-up: kernel selection, AdamW's state
        update()
    faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    for _ in range(steps):
        update()
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"s_per_update": seconds / steps, "faults_per_update": (usage.ru_minflt - faults) / steps,
            "peak_rss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20, help="timed updates per child")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--json", help="also write the figures here")
    parser.add_argument("--child", choices=("default", "kept"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "kept", args.steps, args.max_tokens)))
        return

    runs: dict[str, list[dict]] = {"default": [], "kept": []}
    for _ in range(args.rounds):
        for mode in runs:
            out = subprocess.run([sys.executable, __file__, "--child", mode, "--steps", str(args.steps),
                                  "--max-tokens", str(args.max_tokens)], capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout))
    medians = {mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for mode, rs in runs.items()}
    print(f"{cpu_name()}, {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, {dt.datetime.now():%Y-%m-%d %H:%M}")
    print(f"{args.rounds} rounds x {args.steps} updates of {args.max_tokens} target tokens; medians")
    print(f"{'':10} {'s/update':>9} {'faults/update':>14} {'peak RSS MiB':>13}")
    for mode, m in medians.items():
        print(f"{mode:10} {m['s_per_update']:9.3f} {m['faults_per_update']:14.0f} {m['peak_rss_mib']:13.0f}")
    ratio = medians["kept"]["s_per_update"] / medians["default"]["s_per_update"]
    print(f"kept/default time per update: {ratio:.3f} ({1 / ratio:.2f}x the updates per hour)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rounds": runs, "medians": medians, "ratio": ratio}, f, indent=1)


if __name__ == "__main__":
    main()
