"""The compiled decoding step (``decode.compile``) against the eager one and against CTranslate2.

    python bench/race/compiled.py                          # speed: batch 1 and batch 128, 3 rounds
    python bench/race/compiled.py --quick                  # a smoke run of the script
    python bench/race/compiled.py --quantize int8          # the same rows with int8 (torchao; CTranslate2's int8)
    python bench/race/compiled.py --run runs/exp/deen5     # also a trained run: its test outputs, compiled
                                                      # against eager, and the cold and warm start of predict

Speed: bench/race/speed.py's decoding workload (its model shape, Multi30k val sources, every sentence
decoded for exactly 24 steps, EOS ignored), taskformer eager (the pre-packed copy the CLI decodes
with), taskformer compiled, and CTranslate2 on the exported weights, fp32, greedy and beam 5, in
alternating rounds in this one process, with the same threads (one batch per worker, as
bench/race/speed.py races). The first compile of each shape is timed apart (``compile s``).

``--run``: the run's test sources decoded greedy and beam by ``taskformer.load(...).predict`` with
and without ``compile=True``: how many outputs differ and each sacreBLEU; then three starts of
``taskformer predict RUN "one sentence"`` in fresh processes: without compiling, compiling into an
empty cache folder (cold), and again into that folder (warm).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py
from machine import alternate, cpu_name  # noqa: E402
from speed import ctranslate2, ctranslate2_contenders  # noqa: E402
from taskformer.app.resources import keep_freed_memory  # noqa: E402
from taskformer.core import decoding, inference  # noqa: E402
from taskformer.core.data import pad  # noqa: E402
from workload import decode_fixed, make_taskformer, multi30k  # noqa: E402


def speed(val_src, n: int, size: int, rounds: int, folder: Path, quantize: str = "none") -> dict:
    """Sentences/s of eager, compiled and CTranslate2 decoding, batches of ``size``; and the compile seconds.
    ``quantize="int8"``: torchao's int8 copy, eager and compiled, against CTranslate2's int8."""
    model = make_taskformer(False)[0].eval()
    eager = inference.for_decoding(model, quantize)
    compiled = inference.for_decoding(model, quantize, compile=True)
    order = sorted(range(n), key=lambda i: -len(val_src[i]))
    batches = [pad([val_src[j] for j in order[i : i + size]]) for i in range(0, n, size)]
    workers = decoding.decode_workers(0, torch.device("cpu"), len(batches))
    compile_seconds = {}
    for search in ("greedy", "beam5"):  # every source length compiles once: do it before the clock runs,
        started = time.perf_counter()     # in the workers the clock sees (dynamo's guards read the thread count)
        for _ in decoding.parallel_map(functools.partial(decode_fixed, compiled, search=search), batches, workers):
            pass
        compile_seconds[search] = round(time.perf_counter() - started, 1)

    def ours(model, search):
        def run(_):
            for _ in decoding.parallel_map(lambda chunk: decode_fixed(model, chunk, search), batches, workers):
                pass
            return n
        return run

    contenders = {f"taskformer {kind} {search}": ours(m, search) for search in ("greedy", "beam5")
                  for kind, m in (("eager", eager), ("compiled", compiled))}
    if ctranslate2 is not None:
        contenders |= {k: v for k, v in ctranslate2_contenders(model, val_src[:n], size, workers, folder).items()
                       if k.endswith("fp32" if quantize == "none" else "int8")}

    def work(name, fn):
        started = time.perf_counter()
        fn(None)
        return (time.perf_counter() - started) / n
    rates = {name: 1.0 / s for name, s in alternate(contenders, work, rounds).items()}
    return {"batch": size, "sentences": n, "workers": workers, "sentences_per_s": rates,
            "compile_seconds_first_pass": compile_seconds}


def outputs(run: str) -> dict:
    """Test outputs of ``run`` greedy and beam, compiled against eager: how many differ, and sacreBLEU."""
    import sacrebleu

    import taskformer
    from taskformer.app.hooks import load_data
    from taskformer.core.checkpoint import read_json
    model = taskformer.load(run)
    data = load_data(model.task, model.config, read_json(model.dir / "config.json").get("data_dir"), ["test"],
                     model.tokenizer)
    sources, references = zip(*[(row[0], row[-1]) for row in data.splits["test"]])
    result: dict[str, Any] = {"sentences": len(sources)}
    for beam in (1, 5):
        eager = model.predict(list(sources), beam=beam)
        compiled = model.predict(list(sources), beam=beam, compile=True)
        result[f"beam {beam}"] = {
            "differ": sum(a != b for a, b in zip(eager, compiled)),
            "bleu_eager": round(sacrebleu.corpus_bleu(eager, [list(references)]).score, 2),
            "bleu_compiled": round(sacrebleu.corpus_bleu(compiled, [list(references)]).score, 2)}
    return result


def starts(run: str, sentence: str) -> dict:
    """Seconds of ``taskformer predict RUN SENTENCE`` in a fresh process: eager, compiled cold and warm."""
    result = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for name, extra in (("eager", []), ("compiled, empty cache", ["--set", "decode.compile=true"]),
                            ("compiled, warm cache", ["--set", "decode.compile=true"])):
            started = time.perf_counter()
            out = subprocess.run(["taskformer", "predict", run, sentence, *extra], env=env, capture_output=True,
                                 text=True, check=True).stdout.strip()
            result[name] = {"seconds": round(time.perf_counter() - started, 2), "output": out}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="few sentences and one round: checks the script runs")
    parser.add_argument("--run", help="a trained encoder-decoder run directory: outputs and predict's starts")
    parser.add_argument("--sentence", default="Ein Mann fährt mit dem Fahrrad durch die Stadt.",
                        help="the sentence predict decodes for the start times")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--no-speed", action="store_true", help="only the --run part (outputs and starts)")
    parser.add_argument("--quantize", choices=("none", "int8"), default="none",
                        help="int8: the speed rows with torchao's int8 copy and CTranslate2's int8")
    parser.add_argument("--n1", type=int, default=200, help="sentences decoded one at a time")
    parser.add_argument("--n128", type=int, default=1000, help="sentences decoded in batches of 128")
    args = parser.parse_args()
    keep_freed_memory()
    result: dict[str, Any] = {"cpu": cpu_name(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "threads": torch.get_num_threads(), "torch": torch.__version__}
    _, _, val_src = multi30k(200 if args.quick else 2000)
    with tempfile.TemporaryDirectory() as folder:
        if not args.no_speed:
            result["quantize"] = args.quantize
            result["batch 1"] = speed(val_src, 8 if args.quick else args.n1, 1, 1 if args.quick else 3, Path(folder) / "b1",
                                      args.quantize)
            result["batch 128"] = speed(val_src, 128 if args.quick else args.n128, 128, 1 if args.quick else 3,
                                        Path(folder) / "b128", args.quantize)
    if args.run:
        result["outputs"] = outputs(args.run)
        result["starts"] = starts(args.run, args.sentence)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
