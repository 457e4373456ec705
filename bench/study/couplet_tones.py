"""Decode one trained couplet run under every setting of the tone rules (平仄) and print their scores.

This is how the couplet's default rules are chosen: on the validation split of one checkpoint, keep
the setting with final-tone rate >= 99% and opposition rate >= 90% and the best char BLEU. The first
row scores the human second lines as if they were outputs: how often the references keep each rule.
The data is read once; each setting then costs one decoding pass (``taskformer eval RUN --set ...``
gives the same figures, one setting per call).

    python bench/study/couplet_tones.py RUN_DIR [--split val] [--penalties 1 2 4] [--finals hard] [--beam 8]
    python bench/study/couplet_tones.py RUN_DIR --split test --samples 20   # rules off vs the run's, side by side
    python bench/study/couplet_tones.py RUN_DIR --split test --paired 1000  # is the BLEU gap larger than chance?

``--paired N`` decodes the whole split with the rules off and as the run decodes, and compares their
char BLEU by sacrebleu's paired bootstrap (N resamples of the pairs): a gap well inside the 95%
intervals, or a p-value far above 0.05, is one that another set of couplets may reverse.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any, cast

from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest, Result

from taskformer.app import hooks, runner
from taskformer.core.checkpoint import read_json
from taskformer.plugins.run import spread
from taskformer.tasks.couplet import TONE_MODES


def settings(penalties: list[float], finals=TONE_MODES):
    """(final, opposition, penalty) triples; the penalty only matters where a rule is soft."""
    yield "off", "off", None
    for final in finals:
        for opposition in TONE_MODES:
            if "soft" in (final, opposition):
                for p in penalties:
                    yield final, opposition, p
            elif (final, opposition) != ("off", "off"):
                yield final, opposition, None


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return int(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--split", default="val", choices=["val", "test"])
    ap.add_argument("--penalties", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    ap.add_argument("--finals", nargs="+", default=list(TONE_MODES), choices=TONE_MODES,
                    help="the final-tone settings to try (all three unless given)")
    ap.add_argument("--beam", type=positive, help="decode with this beam size instead of the run's")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--samples", type=int, default=0,
                    help="instead of the grid: N pairs spread over the split, decoded with the rules off and as the run decodes")
    ap.add_argument("--paired", type=positive, default=0, metavar="N",
                    help="instead of the grid: the rules off against the run's, with a paired bootstrap of N resamples")
    args = ap.parse_args()

    run = runner.load(args.run_dir)
    if args.beam:
        run.config = runner.with_search(run.config, beam=args.beam)
    data_dir = read_json(run.dir / "config.json").get("data_dir")
    pairs = hooks.load_data(run.task, run.config, data_dir, [args.split], run.tokenizer).splits[args.split]
    print(f"{args.run_dir}: {args.split}, {len(pairs)} pairs")
    rules: Any = run.config.decode  # the couplet's decoding options: the search's and its tone rules
    off = replace(run.config, decode=replace(rules, tone_final="off", tone_opposition="off"))
    if args.paired:
        paired(run, pairs, {"tone rules off": off, "the run's decoding": run.config}, args.paired)
        return
    if args.samples:
        chosen = spread(list(pairs), args.samples)
        plain, _ = runner.predict(run, [s for s, _ in chosen], off)
        ruled, _ = runner.predict(run, [s for s, _ in chosen], run.config)
        print("| first line | reference | tone rules off | tone rules on (the run's) |\n| --- | --- | --- | --- |")
        for (source, reference), a, b in zip(chosen, plain, ruled):
            print(f"| {source} | {reference} | {a} | {b} |")
        return
    print(f"{'final':>5} {'opp.':>5} {'pen.':>5} | {'BLEU':>6} {'final%':>7} {'opp.%':>6} {'len%':>6} {'punct%':>6} "
          f"{'dist-2':>6} {'s':>5}")
    refs = hooks.score(run.task, pairs, [r for _, r in pairs])  # the human second lines, scored as outputs
    print(f"  the references themselves | {'':>6} {refs['final_tone']:7.2f} {refs['opposition']:6.2f}")
    rows = [{"references": True, **refs}]
    for final, opposition, penalty in settings(args.penalties, args.finals):
        decode = replace(rules, tone_final=final, tone_opposition=opposition, tone_penalty=penalty or rules.tone_penalty)
        decode.validate()
        started = time.perf_counter()
        metrics, _ = hooks.evaluate_split(run, pairs, replace(run.config, decode=decode))
        seconds = time.perf_counter() - started
        rows.append({"tone_final": final, "tone_opposition": opposition, "tone_penalty": penalty, **metrics})
        print(f"{final:>5} {opposition:>5} {penalty or '':>5} | {metrics['bleu']:6.2f} {metrics['final_tone']:7.2f} "
              f"{metrics['opposition']:6.2f} {metrics['length_match']:6.2f} {metrics['punct_match']:6.2f} "
              f"{metrics['distinct_2']:6.2f} {seconds:5.0f}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


def paired(run, pairs, configs: dict, resamples: int) -> None:
    """Decode ``pairs`` under each of ``configs`` (the first is the baseline) and bootstrap their BLEU gap."""
    outputs = {}
    for name, config in configs.items():
        metrics, rows = hooks.evaluate_split(run, pairs, config)
        outputs[name] = [hyp for _, hyp, _ in rows]
        print(f"{name:>20}: char BLEU {metrics['bleu']:.3f}, final tone {metrics['final_tone']:.2f}%, "
              f"opposition {metrics['opposition']:.2f}%, distinct-2 {metrics['distinct_2']:.2f}", flush=True)
    test = PairedTest(list(outputs.items()), {"BLEU": BLEU(tokenize="char")}, [[r for _, r in pairs]],
                      test_type="bs", n_samples=resamples)
    _, scores = test()
    (first, *names), (base, *others) = outputs, cast(list[Result], scores["BLEU"])
    print(f"paired bootstrap, {resamples} resamples (95% intervals of each system's mean):")
    print(f"{first:>20}: {base.mean:.3f} ± {base.ci:.3f}")
    for name, result in zip(names, others):
        print(f"{name:>20}: {result.mean:.3f} ± {result.ci:.3f}; gap {result.score - base.score:+.3f}, "
              f"p = {result.p_value:.3f}")


if __name__ == "__main__":
    main()
