"""The engines' race: ``decode.engine=auto`` through taskformer's predict path against the raw runtime.

    python bench/race/engine_race.py                      # the search race (bench/race/speed.py's network), a few minutes
    python bench/race/engine_race.py --quick              # tiny: checks that it runs
    python bench/race/engine_race.py --classifier RUN     # also a classifier run: ONNX Runtime against torch

1. Search: bench/race/speed.py's network (untrained, vocabulary 8,000, d_model 256, 3+3 layers) as a copy
   run held in memory, its Multi30k val sources as texts of synthetic tokens. ``auto`` decodes them
   through ``runner.predict`` (what ``taskformer predict``, the Python API and the server call:
   normalizing, tokenizing, batching by length, the runtime, detokenizing) and raw CTranslate2 decodes
   the same token lists with the same weights (exported by ``core.export``), the same options
   (budget 24 tokens, specials suppressed) and the same threads. Greedy and beam 5, fp32 and int8
   (``decode.quantize=int8``), one sentence per call (batch 1) and 128 per batch, rounds alternating.
   The ratio auto / raw is the cost of our wrapping (1.0: none).
2. ``--classifier RUN`` (a finished encoder-only run, agnews say): the batch-1 latency (median of one
   ``predict`` call per test sentence) with ``decode.engine=onnxruntime`` and ``torch``, and the share
   of the run's test sentences whose labels agree.

``--device cuda`` runs the search race on the GPU (CTranslate2 built with CUDA; bench/race/gpu_decode.py
calls it). The machine should be quiet: the figures are timings.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from taskformer.app import runner
from taskformer.app.hooks import engine_choice
from taskformer.app.prepare import make_config
from taskformer.core import export
from taskformer.core.decoding import decode_workers
from taskformer.core.model import PAD
from taskformer.core.tokenize import symbols
from taskformer.plugins.manager import plugins
from taskformer.plugins.run import Run

BUDGET = 24  # tokens per output, as bench/race/speed.py's decoding rows


def copy_run(model, vocab: int, device: str) -> Run:
    """``model`` as a copy run held in memory, fp32, with a tokenizer of synthetic tokens ``t4`` ..."""
    task = plugins().task("copy")
    shape = {k: getattr(model.cfg, k) for k in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "max_len",
                                                 "tie_embeddings")}
    config = make_config(task, None, [f"model.{k}={v}" for k, v in shape.items()] + [
        "train.bf16=false", "decode.max_len_a=0", f"decode.max_len_b={BUDGET}"], None)
    tokenizer = symbols([f"t{i}" for i in range(4, vocab)])
    return Run(Path("."), task, config, tokenizer, None, model.to(device).eval())


def texts_of(sources: list[list[int]]) -> list[str]:
    """The sources as texts of synthetic tokens, without the EOS that our framing adds again."""
    return [" ".join(f"t{i}" for i in s[:-1] if i != PAD) for s in sources]


def per_sentence(_, fn) -> float:
    """Seconds per sentence of one round of ``fn`` (which returns how many it decoded)."""
    started = time.perf_counter()
    n = fn(None)
    return (time.perf_counter() - started) / n


def race(sources: list[list[int]], model, vocab: int, rounds: int, n: dict[int, int], device: str = "cpu") -> dict:
    """Sentences/s of ``auto`` and raw CTranslate2 for each search, precision and batch size in ``n``
    (batch size -> sentences decoded), and the ratios auto / raw."""
    import ctranslate2

    from machine import alternate

    run = copy_run(model, vocab, device)
    texts = texts_of(sources)
    out: dict = {"sentences_per_s": {}, "ratios": {}, "engine": {}}
    with tempfile.TemporaryDirectory() as folder:
        for quantize in ("none", "int8"):
            config = runner.with_decoding(run, {"quantize": quantize, "engine": "auto"}, "bench")
            choice = engine_choice(run.task, run.model, config)
            out["engine"][quantize] = choice.as_dict()
            if choice.engine != "ctranslate2":
                print(f"auto chose {choice}: no race", file=sys.stderr)
                continue
            raw_path = export.to_ctranslate2(run.model.cpu(), run.tokenizer, Path(folder) / quantize,
                                             choice.compute_type if choice.compute_type in export.QUANTIZATIONS
                                             else "float32")
            run.model.to(device)
            workers = decode_workers(config.decode.workers, torch.device(device), 1 << 20)
            threads = torch.get_num_threads()
            raw = ctranslate2.Translator(str(raw_path), device=device, compute_type=choice.compute_type,
                                         inter_threads=workers, intra_threads=max(threads // workers, 1))
            torch.set_num_threads(threads)
            precision = "int8" if quantize == "int8" else "fp32"
            for search, beam in (("greedy", 1), ("beam5", 5)):
                for size, count in n.items():
                    chosen = texts[:count]
                    tokens = [t.split() for t in chosen]
                    searched = runner.with_search(config, beam, size)

                    def ours(_, chosen=chosen, searched=searched, size=size):
                        if size == 1:
                            for t in chosen:
                                runner.predict(run, [t], searched)
                        else:
                            runner.predict(run, chosen, searched)
                        return len(chosen)

                    def theirs(_, tokens=tokens, beam=beam, size=size, raw=raw):
                        options = dict(beam_size=beam, max_decoding_length=BUDGET, min_decoding_length=0,
                                       disable_unk=True, suppress_sequences=[["[PAD]"], ["[BOS]"]])
                        if size == 1:
                            for t in tokens:
                                raw.translate_batch([t], **options)
                        else:
                            raw.translate_batch(tokens, max_batch_size=size, **options)
                        return len(tokens)

                    ours(None)  # warm-up: the first call converts into the cache and loads the runtime
                    theirs(None)
                    name = f"{search} {precision} batch {size}"
                    secs = alternate({f"auto {name}": ours, f"ctranslate2 {name}": theirs}, per_sentence, rounds)
                    out["sentences_per_s"] |= {k: 1.0 / v for k, v in secs.items()}
                    out["ratios"][name] = secs[f"ctranslate2 {name}"] / secs[f"auto {name}"]
                    print(f"  {name}: auto {1 / secs[f'auto {name}']:.1f} sent/s, raw CTranslate2 "
                          f"{1 / secs[f'ctranslate2 {name}']:.1f} sent/s, auto / raw {out['ratios'][name]:.3f}x",
                          file=sys.stderr, flush=True)
    return out


def classifier(run_dir: Path, sentences: int) -> dict:
    """Batch-1 latency of a classifier run with ONNX Runtime and with torch, and label agreement on its test outputs."""
    import taskformer

    model = taskformer.load(run_dir)
    rows = [json.loads(line) for line in (run_dir / "outputs-test.jsonl").read_text().splitlines()]
    texts = [tuple(r["source"]) if isinstance(r["source"], list) else r["source"] for r in rows]
    out: dict = {"run_dir": str(run_dir), "test_sentences": len(texts), "latency_ms": {}}
    labels = {}
    for engine in ("onnxruntime", "torch"):
        labels[engine] = [p.label for p in model.predict(texts, engine=engine)]
    out["labels_agree"] = sum(a == b for a, b in zip(*labels.values())) / len(texts)
    probe = [t for t in texts if t][:sentences]
    times: dict[str, list[float]] = {"onnxruntime": [], "torch": []}
    for text in probe:  # alternating sentence by sentence: machine noise hits both alike
        for engine in times:
            started = time.perf_counter()
            model.predict([text], engine=engine)
            times[engine].append(time.perf_counter() - started)
    out["latency_ms"] = {e: 1000 * statistics.median(t[1:] or t) for e, t in times.items()}
    out["speedup"] = out["latency_ms"]["torch"] / out["latency_ms"]["onnxruntime"]
    return out


def print_race(result: dict) -> None:
    for name, ratio in result.get("ratios", {}).items():
        auto, raw = (result["sentences_per_s"][f"{who} {name}"] for who in ("auto", "ctranslate2"))
        print(f"decode.engine=auto / raw CTranslate2, {name}: {ratio:.3f}x ({auto:,.1f} vs {raw:,.1f} sent/s)")
    if "classifier" in result:
        c = result["classifier"]
        print(f"classifier batch-1 latency: ONNX Runtime {c['latency_ms']['onnxruntime']:.2f} ms, torch "
              f"{c['latency_ms']['torch']:.2f} ms ({c['speedup']:.2f}x); labels agree on "
              f"{100 * c['labels_agree']:.2f}% of {c['test_sentences']} test sentences")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny workloads: checks that it runs")
    ap.add_argument("--classifier", type=Path, metavar="RUN", help="also race a classifier run's engines")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (CTranslate2 built with CUDA)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: workload.py
    from machine import cpu_name
    from workload import V, make_taskformer, multi30k

    _, _, val_src = multi30k(200 if args.quick else 2000)
    model = make_taskformer(False)[0]
    n = {1: 4, 128: 32} if args.quick else {1: 100, 128: 1000}
    result = {"cpu": cpu_name(), "device": args.device, "threads": torch.get_num_threads(),
              **race(val_src, model, V, 1 if args.quick else 3, n, args.device)}
    if args.classifier:
        result["classifier"] = classifier(args.classifier, 5 if args.quick else 200)
    print_race(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
