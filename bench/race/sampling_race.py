"""Sampling speed at batch 1: taskformer against nanoGPT's ``sample.py`` and CTranslate2's generator.

    python bench/race/sampling_race.py              # 5 samples of 500 characters each, per contender
    python bench/race/sampling_race.py --quick      # a smoke run of the script

The same network shape on both sides: nanoGPT's CPU recipe (4 layers, 4 heads, width 128, context
64), each trained for a few updates only (speed does not depend on the weights; ours 300, so that
its samples no longer end early at a sampled EOS and all sides write about as many tokens). nanoGPT
(../shared/bench/nanogpt, its own code, unchanged) runs ``sample.py`` from a temporary copy as a
subprocess, once with one sample and once with ``1 + samples``: the difference is the time of
``samples`` samples alone, without its start-up. taskformer samples through ``taskformer.load(...)
.predict`` with the task's sampling settings (temperature 0.8, top-k 200, as ``sample.py``), timed
in the process after a first warm-up call, in fp32 as ``sample.py`` on CPU. Both write 500 new
characters from the prompt "ROMEO:": nanoGPT re-reads the last 64 characters at every step, taskformer
keeps a key/value cache whose context slides. CTranslate2's generator decodes the exported weights
(``taskformer export --to ctranslate2``); its position table ends at the model's 64 positions, so
that race writes 63 characters a sample, against taskformer writing the same 63.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py
from nanogpt_race import nanogpt  # noqa: E402

from machine import cpu_name  # noqa: E402

PROMPT = "ROMEO:"  # every contender continues it (a blank prompt gives taskformer a blank output)


def their_samples(copy: Path, out: Path, samples: int, new: int, env: dict) -> float:
    """Seconds of ``sample.py`` writing ``samples`` samples of ``new`` characters, start-up excluded."""
    def run(n: int) -> float:
        started = time.monotonic()
        subprocess.run([sys.executable, "sample.py", f"--out_dir={out}", "--device=cpu", "--dtype=float32",
                        f"--num_samples={n}", f"--max_new_tokens={new}", "--compile=False", f"--start={PROMPT}"],
                       cwd=copy, env=env, check=True, stdout=subprocess.DEVNULL)
        return time.monotonic() - started
    return run(1 + samples) - run(1)


def our_samples(run_dir: Path, samples: int, new: int, compile: bool = False) -> tuple[float, int]:
    """Seconds of ``samples`` samplings of up to ``new`` tokens from ``PROMPT``, and the tokens written;
    ``compile``: with the compiled decoding step (its compiles happen in the warm-up)."""
    import taskformer
    model = taskformer.load(run_dir)
    settings = {"max_new_tokens": new, "temperature": 0.8, "top_k": 200, "compile": compile}
    model.predict([PROMPT], seed=0, **settings)  # warm-up: the decoding copy, the first allocations
    started, written = time.perf_counter(), 0
    for seed in range(1, samples + 1):
        out = model.predict([PROMPT], seed=seed, **settings)[0]
        written += len(model.tokenizer.encode(out).ids)
    return time.perf_counter() - started, written


def ct2_samples(export_dir: Path, samples: int, new: int) -> tuple[float, int]:
    import ctranslate2
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(export_dir / "tokenizer.json"))
    generator = ctranslate2.Generator(str(export_dir), device="cpu", compute_type="float32",
                                      intra_threads=os.cpu_count() or 1)
    prompt = [tokenizer.encode(PROMPT).tokens]

    def one(seed: int):
        ctranslate2.set_random_seed(seed)
        # top 200 of 69 characters is all of them; CTranslate2 refuses a k above its vocabulary
        return generator.generate_batch(prompt, max_length=new, sampling_topk=tokenizer.get_vocab_size(),
                                        sampling_temperature=0.8,
                                        include_prompt_in_result=False, end_token="[EOS]")
    one(0)
    started, written = time.perf_counter(), 0
    for seed in range(1, samples + 1):
        written += len(one(seed)[0].sequences_ids[0])
    return time.perf_counter() - started, written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--new", type=int, default=500, help="characters a sample writes (sample.py's default)")
    parser.add_argument("--quick", action="store_true", help="one short sample each: checks the script runs")
    parser.add_argument("--data", type=Path, default=Path("../shared/datasets/tinyshakespeare"))
    parser.add_argument("--nanogpt", type=Path, default=Path("../shared/bench/nanogpt"))
    args = parser.parse_args()
    samples, new = (1, 20) if args.quick else (args.samples, args.new)
    data, source = args.data.resolve(), args.nanogpt.resolve()
    env = dict(os.environ)
    work = Path(tempfile.mkdtemp(prefix="sampling-race-"))
    try:
        nanogpt(source, data, work, iters=20, eval_iters=1, env=env)  # a checkpoint of the shape
        subprocess.run([sys.executable, "-m", "taskformer", "run", "shakespeare-char", "--data-dir", str(data),
                        "--out", str(work / "ours"), "--quiet", "--set", "train.max_steps=300"], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, "-m", "taskformer", "export", str(work / "ours"), str(work / "ct2"), "--to",
                        "ctranslate2"], check=True, env=env, stdout=subprocess.DEVNULL)
        theirs = their_samples(work / "nanogpt", work / "nanogpt-out", samples, new, env)
        mine, written = our_samples(work / "ours", samples, new)
        room = 64 - len(PROMPT)  # CTranslate2's positions end at the model's 64: the prompt and the rest
        ct2, ct2_written = ct2_samples(work / "ct2", samples, room)
        mine_short, short_written = our_samples(work / "ours", samples, room)
        compiled, compiled_written = our_samples(work / "ours", samples, new, compile=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {"cpu": cpu_name(), "cores": os.cpu_count(), "samples": samples, "ctranslate2_written": ct2_written,
              "taskformer_short_written": short_written, "taskformer_compiled_written": compiled_written,
              "nanogpt_tokens_per_s": samples * new / theirs, "taskformer_tokens_per_s": written / mine,
              "taskformer_written": written, "ctranslate2_tokens_per_s": ct2_written / ct2,
              "taskformer_short_tokens_per_s": short_written / mine_short,
              "taskformer_compiled_tokens_per_s": compiled_written / compiled}
    print(json.dumps(result, indent=2))
    print(f"{new}-character samples, batch 1: taskformer / nanoGPT sample.py = "
          f"{result['taskformer_tokens_per_s'] / result['nanogpt_tokens_per_s']:.2f}x "
          f"({result['taskformer_tokens_per_s']:,.0f} vs {result['nanogpt_tokens_per_s']:,.0f} tokens/s)")
    print(f"{new}-character samples, compiled step: taskformer / nanoGPT sample.py = "
          f"{result['taskformer_compiled_tokens_per_s'] / result['nanogpt_tokens_per_s']:.2f}x")
    print(f"{room}-token samples: taskformer / CTranslate2 generator = "
          f"{result['taskformer_short_tokens_per_s'] / result['ctranslate2_tokens_per_s']:.2f}x "
          f"({result['taskformer_short_tokens_per_s']:,.0f} vs {result['ctranslate2_tokens_per_s']:,.0f} tokens/s)")


if __name__ == "__main__":
    main()
