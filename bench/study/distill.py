"""Knowledge distillation end to end: a student of a teacher run, against the teacher.

Given a finished teacher run (the translate-de-en hour's 3-member ensemble, say), the script runs
``taskformer distill TEACHER --out OUT [--time-limit MIN] [--set ...] [--teacher-set ...]`` (or
reads a student it made before, ``--student``), whose final evaluation decodes val and test once,
and then measures on the same machine:

- quality: the teacher's and the student's val and test metrics (their result.json), and the
  difference on the task's metric;
- speed: seconds to decode the same sentences (the test sources) with the teacher's own search (as
  it is served, not the --teacher-set of the decode) and with the student's, each the best of
  ``--rounds``, as ``taskformer predict`` decodes, and their ratio; also the student greedy where
  its outputs are searched (a classifier has no search: its ratio is the one network's against the
  ensemble's);
- export: where the outputs are searched and ctranslate2 is installed, the student exported in
  float32 and its greedy outputs against ``predict --beam 1`` in fp32 on the same sentences (how
  many are equal);
- cost in minutes: the teacher's run (its wall time), the decode of the train split, the student's
  run, and their sum, against the teacher alone.

Choices (``distill.mix``, the teacher's beam and length penalty, the student's recipe) are made on
val; test is the student run's own final evaluation, once. Time figures are for an idle machine.

    python bench/study/distill.py TEACHER --out runs/student [--time-limit 60] [--set distill.mix=true]
        [--teacher-set decode.beam=5] [--student DIR] [--rounds 3] [--json FILE]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from taskformer.app import runner
from taskformer.core import checkpoint as ckpt
from taskformer.core.errors import TaskformerError


def distill(args) -> tuple[Path, float]:
    """The student's run directory and the wall seconds of its ``taskformer distill`` command."""
    command = [sys.executable, "-m", "taskformer", "distill", args.teacher, "--out", args.out, "--quiet"]
    command += ["--time-limit", str(args.time_limit)] if args.time_limit else []
    command += [x for s in args.set for x in ("--set", s)] + [x for s in args.teacher_set for x in ("--teacher-set", s)]
    print("$", " ".join(command), flush=True)
    begun = time.monotonic()
    subprocess.run(command, check=True)
    return Path(args.out), time.monotonic() - begun


def best_seconds(run, sources: list[str], config, rounds: int) -> float:
    """The fastest of ``rounds`` decodes of ``sources`` (after one warm-up batch), as predict decodes."""
    runner.predict(run, sources[: config.decode.batch_size], config)
    times = []
    for _ in range(rounds):
        begun = time.perf_counter()
        runner.predict(run, sources, config)
        times.append(time.perf_counter() - begun)
    return min(times)


def fp32_greedy(run):
    config = runner.with_search(run.config, beam=1)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, bf16="false"))


def exported_agreement(student, sources: list[str]) -> dict | None:
    """How many of ``sources`` the student's CTranslate2 export (float32, greedy) decodes as
    ``predict --beam 1`` does in fp32; None without ctranslate2."""
    try:
        import ctranslate2
        from tokenizers import Tokenizer
    except ImportError:
        return None
    ours, _ = runner.predict(student, sources, fp32_greedy(student))
    with tempfile.TemporaryDirectory() as folder:
        try:
            runner.export(student, Path(folder) / "ct2", "float32")
        except TaskformerError as e:  # a task decoded by its own rules (couplet's)
            return {"refused": str(e)}
        info = json.loads((Path(folder) / "ct2" / "taskformer.json").read_text())
        tok = Tokenizer.from_file(str(Path(folder) / "ct2" / "tokenizer.json"))
        threads = torch.get_num_threads()
        translator = ctranslate2.Translator(str(Path(folder) / "ct2"), device="cpu", compute_type="float32")
        torch.set_num_threads(threads)  # the Translator sets the OpenMP threads it shares with torch
        a, b, cap = info["decode"]["max_len_a"], info["decode"]["max_len_b"], info["max_input_length"] - 1
        tokens = [tok.encode(s).tokens for s in sources]
        theirs = [""] * len(sources)
        vocab = tok.get_vocab()
        budgets: dict[int, list[int]] = {}  # one max_decoding_length per call: sentences of one budget together
        for i, t in enumerate(tokens):
            budgets.setdefault(min(max(int(a * (len(t) + 1) + b), 1), cap), []).append(i)
        for budget, rows in budgets.items():
            results = translator.translate_batch([tokens[i] for i in rows], beam_size=1, max_decoding_length=budget,
                                                 max_input_length=info["max_input_length"])
            for i, r in zip(rows, results):
                theirs[i] = tok.decode([vocab[t] for t in r.hypotheses[0]])
    return {"equal": sum(x == y for x, y in zip(ours, theirs)), "of": len(sources)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("teacher", help="the finished teacher run")
    ap.add_argument("--out", help="the student's run directory to create")
    ap.add_argument("--student", help="a student distill made before (instead of --out: nothing is trained)")
    ap.add_argument("--time-limit", type=float, help="the student's minutes (distill --time-limit)")
    ap.add_argument("--set", action="append", default=[], help="distill --set (distill.mix=true, the student's)")
    ap.add_argument("--teacher-set", action="append", default=[], help="distill --teacher-set decode.KEY=VALUE")
    ap.add_argument("--rounds", type=int, default=3, help="decodes per speed figure (the fastest counts)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    if bool(args.out) == bool(args.student):
        ap.error("give --out (run distill) or --student (a student made before)")
    student_dir, command_seconds = (distill(args) if args.out else (Path(args.student), None))

    teacher_result, student_result = (ckpt.read_json(Path(d) / "result.json") for d in (args.teacher, student_dir))
    record = student_result["info"]["distill"]
    teacher, student = runner.load(args.teacher), runner.load(student_dir)
    metric = student_result["metric"]
    sources = [json.loads(line)["source"] for line in (student_dir / "outputs-test.jsonl").read_text().splitlines()]
    searched = student.model.cfg.kind.decoder
    speed = {"sentences": len(sources),
             "teacher_s": best_seconds(teacher, sources, teacher.config, args.rounds),
             "student_s": best_seconds(student, sources, student.config, args.rounds)}
    speed["ratio"] = speed["teacher_s"] / max(speed["student_s"], 1e-9)
    if searched:
        speed["student_greedy_s"] = best_seconds(student, sources, runner.with_search(student.config, beam=1),
                                                 args.rounds)
        speed["ratio_greedy"] = speed["teacher_s"] / max(speed["student_greedy_s"], 1e-9)
    minutes = {"teacher": teacher_result["info"]["wall_seconds"] / 60,
               "decode": record["decode_seconds"] / 60,
               "student": student_result["info"]["wall_seconds"] / 60}
    minutes["distill_command"] = command_seconds / 60 if command_seconds is not None else None
    minutes["total"] = minutes["teacher"] + (minutes["distill_command"] or minutes["decode"] + minutes["student"])
    figures = {
        "teacher": args.teacher, "student": str(student_dir), "metric": metric, "distill": record,
        "cpu": os.cpu_count(), "threads": torch.get_num_threads(),
        "teacher_metrics": teacher_result["metrics"], "student_metrics": student_result["metrics"],
        "student_minus_teacher": {s: student_result["metrics"][s][metric] - teacher_result["metrics"][s][metric]
                                  for s in ("val", "test")},
        "speed": speed, "minutes": minutes, "export": exported_agreement(student, sources) if searched else None,
    }
    print(json.dumps(figures, indent=1))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
