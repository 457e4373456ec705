"""Do the engines give our decoder's outputs? CTranslate2 or ONNX Runtime against torch, search by search.

    python bench/study/engine_agreement.py RUN_DIR [--split test] [--limit N] [--int8]
    python bench/study/engine_agreement.py RUN_DIR --inputs FILE    # one source per line, no references
    python bench/study/engine_agreement.py RUN_DIR --json agreement.json

Decodes the sources of the run's ``outputs-SPLIT.jsonl`` with ``decode.engine=torch`` and with the
run's runtime (CTranslate2 for a search, ONNX Runtime for a classifier or tagger), in fp32, through
the Python API as ``predict`` decodes, and prints how many outputs are equal and the score of each
(sacreBLEU for text, accuracy for labels, against the file's references). A search is compared
greedy, with beam 5 and the run's length penalty, and with beam 5 and no length penalty (where the
two engines' conventions agree, so what differs is how ties and finished hypotheses are handled);
each also with ``decode.quantize=int8`` (both engines int8) where ``--int8`` asks.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sacrebleu

import taskformer


def score(outputs: list, references: list[str]) -> str:
    if not any(references):
        return "no references"
    if all(isinstance(o, str) for o in outputs):
        return f"sacreBLEU {sacrebleu.corpus_bleu(outputs, [references]).score:.2f}"
    right = sum(getattr(o, "label", o) == r for o, r in zip(outputs, references))
    return f"accuracy {100 * right / len(outputs):.2f}%"


def same(a, b) -> bool:
    return getattr(a, "label", a) == getattr(b, "label", b)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--split", default="test", help="whose outputs-SPLIT.jsonl gives the sources (default test)")
    parser.add_argument("--limit", type=int, default=0, help="the first N sources only (0: all)")
    parser.add_argument("--int8", action="store_true", help="also compare decode.quantize=int8")
    parser.add_argument("--inputs", type=Path, help="decode these lines (one source each) instead; no scores")
    parser.add_argument("--json", type=Path, help="also write the counts here")
    args = parser.parse_args()
    where = args.inputs or args.run_dir / f"outputs-{args.split}.jsonl"
    rows = [{"source": line, "reference": ""} for line in where.read_text().splitlines()] if args.inputs else [
        json.loads(line) for line in where.read_text().splitlines()]
    rows = rows[: args.limit or None]
    sources, references = [r["source"] for r in rows], [r["reference"] for r in rows]
    if isinstance(sources[0], list):
        sources = [tuple(s) for s in sources]
    model = taskformer.load(args.run_dir)
    model.config.train.bf16 = False  # the claim is about fp32
    runtime = model.engine(engine="auto")
    searched = model.task.variant in ("encoder-decoder", "decoder-only")
    print(f"{len(sources)} sources of {where}, fp32; runtime: {runtime['engine']} "
          f"({runtime['reason']})")
    figures: dict = {"run_dir": str(args.run_dir), "sources": str(where), "n": len(sources), "engine": runtime,
                     "searches": {}}
    lp = model.config.decode.length_penalty
    searches: list[tuple[str, dict]] = [("greedy", {"beam": 1}), (f"beam 5, length_penalty {lp:g}", {"beam": 5}),
                ("beam 5, length_penalty 0", {"beam": 5, "length_penalty": 0.0})] if searched else [("labels", {})]
    if runtime["engine"] == "torch":  # nothing to compare
        searches = []
    for quantize in ("none", "int8") if args.int8 else ("none",):
        for name, options in searches:
            outputs = {}
            for engine in ("torch", runtime["engine"]):
                started = time.perf_counter()
                outputs[engine] = model.predict(sources, engine=engine, quantize=quantize, **options)
                print(f"  {name}, {engine}{' int8' if quantize == 'int8' else ''}: "
                      f"{score(outputs[engine], references)} ({time.perf_counter() - started:.1f} s)", flush=True)
            equal = sum(same(a, b) for a, b in zip(*outputs.values()))
            figures["searches"][f"{name}{' (int8)' if quantize == 'int8' else ''}"] = {
                "equal": equal, "share": equal / len(sources),
                "scores": {engine: score(out, references) for engine, out in outputs.items()}}
            print(f"{name}{' (int8)' if quantize == 'int8' else ''}: {equal} of {len(sources)} outputs equal "
                  f"({100 * equal / len(sources):.1f}%)", flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
