"""Does the copy that decodes give the trained model's outputs? Packed layers against `nn.Linear`, and int8.

    python bench/study/decode_agreement.py RUN_DIR [--split test] [--int8]

On CPU, `taskformer eval`, `predict`, the Python API and the server decode through a copy of the
model whose linear layers are pre-packed for oneDNN (``core/inference.py``). Its products round
differently from the model's own ``nn.Linear`` layers (MKL), in the last bits of fp32, so a search
can pick another token where two score almost alike. This decodes the sources of the run's
``outputs-SPLIT.jsonl`` both ways in fp32, in one process, as ``predict`` does (the run's search),
and prints how many outputs differ as ``predict`` prints them (for a classifier also how many
labels) and the score of each (sacreBLEU for text, accuracy for labels,
against the file's references). With ``--int8`` it also decodes with ``decode.quantize=int8``.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import sacrebleu

import taskformer
from taskformer.core import inference


def score(outputs: list, references: list[str]) -> str:
    if all(isinstance(o, str) for o in outputs):
        return f"sacreBLEU {sacrebleu.corpus_bleu(outputs, [references]).score:.2f}"
    right = sum(o.label == r for o, r in zip(outputs, references))
    return f"accuracy {100 * right / len(outputs):.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--split", default="test", help="whose outputs-SPLIT.jsonl gives the sources (default test)")
    parser.add_argument("--int8", action="store_true", help="also decode with decode.quantize=int8")
    args = parser.parse_args()
    rows = [json.loads(line) for line in (args.run_dir / f"outputs-{args.split}.jsonl").read_text().splitlines()]
    sources, references = [r["source"] for r in rows], [r["reference"] for r in rows]
    model = taskformer.load(args.run_dir)
    model.config.train.bf16 = False  # the claim is about fp32
    packed = inference.for_decoding

    def as_trained(model, quantize, *rest):
        """The model itself: its own ``nn.Linear`` layers, not the pre-packed copy."""
        return model

    def decode(name: str, quantize: str = "none", unpacked: bool = False) -> list:
        model.config.decode.quantize = quantize
        inference.for_decoding = as_trained if unpacked else packed
        try:
            started = time.perf_counter()
            outputs = model.predict(sources)
        finally:
            inference.for_decoding = packed
        print(f"{name}: {score(outputs, references)} ({time.perf_counter() - started:.1f} s)", flush=True)
        return outputs

    print(f"{len(sources)} sources of {args.run_dir}/outputs-{args.split}.jsonl, fp32, the run's search")
    mine, theirs = decode("packed copy (what taskformer decodes with)"), decode("nn.Linear (the model's own layers)",
                                                                                  unpacked=True)
    differ = [i for i, (a, b) in enumerate(zip(mine, theirs)) if str(a) != str(b)]
    print(f"outputs that differ as `predict` prints them: {len(differ)} of {len(sources)}"
          + (f" (lines {differ[:10]})" if differ else "") + labels_differ(mine, theirs))
    if args.int8:
        int8 = decode("int8 (decode.quantize=int8)", "int8")
        print(f"int8 outputs that differ from fp32: {sum(str(a) != str(b) for a, b in zip(int8, theirs))} of "
              f"{len(sources)}" + labels_differ(int8, theirs))


def labels_differ(mine: list, theirs: list) -> str:
    """For a classifier, how many predicted labels differ (a probability may differ in its printed digits alone)."""
    if all(isinstance(o, str) for o in mine):
        return ""
    return f"; labels that differ: {sum(a.label != b.label for a, b in zip(mine, theirs))}"


if __name__ == "__main__":
    main()
