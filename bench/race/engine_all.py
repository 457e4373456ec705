"""Every figure of the engines' goals in one command: trains what is not given, runs the four races,
writes their JSON and prints the goals beside the figures.

    python bench/race/engine_all.py --out engine-figures                            # expected 15 minutes on 2 cores
    python bench/race/engine_all.py --out engine-figures --deen RUN --agnews RUN    # trained runs given: expected 9
    python bench/race/engine_all.py --out /tmp/e --quick                            # tiny: checks that it runs
    python bench/race/engine_all.py --out engine-figures --only serve,agreement     # some of them

Runs it trains when not given (``--data`` holds the shared data sets' folders):
``taskformer run translate-de-en --time-limit 3`` on multi30k and ``taskformer run agnews
--time-limit 1 --set model.members=1`` on ag_news (one network: ONNX Runtime runs one, and agnews'
default is an ensemble of 20) (``--quick``: a few updates each). Then, each in a process of its own
(the machine should be quiet: these are timings), writing ``OUT/NAME.json``:

- ``race``: bench/race/engine_race.py on the de-en run: ``decode.engine=auto`` through the predict path
  against raw CTranslate2 on the same weights, batch 1 and 128, greedy and beam 5, fp32 and int8,
  with our torch decoder once for reference (expected 3 to 5 minutes);
- ``serve``: bench/race/serve.py ``--engines auto,torch``: one client's p50 latency against raw
  CTranslate2's batch-1 time on the same sentences, 32 clients' throughput against a CTranslate2
  loop batching 32 (the server's ``--max-batch``), all sentences in one call and 32 at a time as the
  clients send them (expected 3 minutes);
- ``one_client``: bench/race/serve_one.py: one client's p50 again, with the standard library's lean
  client in place of aiohttp's, whose own CPU sits inside serve's p50, and the plain request against
  FastAPI's route in the same server (expected 2 minutes);
- ``classifier``: bench/race/engine_race.py ``--classifier`` on the agnews run: batch-1 latency with ONNX
  Runtime and torch, each in a process of its own (as a user runs one engine), the processes taking
  turns in blocks of 20 sentences; labels compared on all of agnews test (expected 1 minute);
- ``agreement``: bench/study/engine_agreement.py on the de-en run's test: greedy, beam 5 with the run's
  length penalty and with none, torch against CTranslate2 in fp32 (expected 1 to 2 minutes).

The durations are estimates, not timed on a quiet machine (they were checked at ``--quick`` sizes on a
busy one).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent
STEPS = ("race", "serve", "one_client", "classifier", "agreement")


def step(name: str, command: list[str], log: Path) -> float:
    """Run one step, its output shown and kept in ``log``; its seconds. A failed step stops nothing else."""
    print(f"== {name}: {' '.join(command)}", flush=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in process.stdout or ():
            print(f"   {line}", end="", flush=True)
            out.write(line)
        process.wait()
    seconds = time.perf_counter() - started
    print(f"== {name}: {'done' if process.returncode == 0 else f'FAILED (exit {process.returncode})'} in "
          f"{seconds:.0f} s", flush=True)
    return seconds if process.returncode == 0 else -seconds


def train(task: str, data: Path, minutes: float, out: Path, quick: bool, *settings: str) -> Path:
    if (out / "result.json").exists():
        return out
    budget = ["--set", "train.max_steps=10"] if quick else ["--time-limit", str(minutes)]
    command = [sys.executable, "-m", "taskformer", "run", task, "--data-dir", str(data), "--out", str(out), "--quiet", *budget,
               *(x for s in settings for x in ("--set", s))]
    if step(f"train {task}", command, out.parent / f"train-{task}.log") < 0:
        sys.exit(f"Error: training {task} failed: {out.parent / f'train-{task}.log'}")
    return out


def load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary(out: Path) -> list[tuple[str, str, str]]:
    """(goal, figure, met?) rows from the steps' JSON files."""
    rows = []
    race = load(out / "race.json")
    if race:
        for name, ratio in race.get("ratios", {}).items():
            rows.append((f"auto / raw CTranslate2, {name}", f"{ratio:.3f}x", "yes" if ratio >= 0.95 else "no (>= 0.95)"))
        for name, ratio in race.get("same_ratios", {}).items():
            rows.append((f"auto / its own CTranslate2 translator called raw, {name}", f"{ratio:.3f}x",
                         "yes" if ratio >= 0.95 else "no (>= 0.95)"))
        for name, ratio in race.get("int8_speedup", {}).items():
            rows.append((f"int8 / fp32 speed, {name}", f"{ratio:.2f}x", "(item 5)"))
        if not race.get("ratios"):
            rows.append(("auto / raw CTranslate2", f"no race: auto chose {race.get('engine')}", "no"))
    serve = load(out / "serve.json")
    if serve and "auto_p50_vs_raw_batch1" in serve:
        one, many = serve["auto_p50_vs_raw_batch1"], serve["auto_throughput_vs_raw_batched"]
        rows.append(("serve, 1 client: p50 / raw CTranslate2 batch-1", f"{one:.2f}x", "yes" if one <= 1.2 else "no (<= 1.2)"))
        rows.append(("serve, 32 clients: throughput / raw batched loop", f"{many:.2f}x",
                     "yes" if many >= 1.0 else "no (>= 1.0)"))
        if "auto_throughput_vs_raw_clients_loop" in serve:
            loop = serve["auto_throughput_vs_raw_clients_loop"]
            rows.append(("serve, 32 clients: throughput / raw loop of 32 at a time", f"{loop:.2f}x",
                         "yes" if loop >= 1.0 else "no (>= 1.0)"))
        if "torch_p50_vs_raw_batch1" in serve:
            rows.append(("serve with decode.engine=torch (reference)", f"p50 {serve['torch_p50_vs_raw_batch1']:.2f}x, "
                         f"throughput {serve['torch_throughput_vs_raw_batched']:.2f}x", ""))
    one_client = load(out / "one_client.json")
    if one_client:
        one = one_client["sides"]["this"]["p50_vs_raw_batch1"]
        rows.append(("serve, 1 client (http.client): p50 / raw CTranslate2 batch-1", f"{one:.2f}x",
                     "yes" if one <= 1.2 else "no (<= 1.2)"))
    classifier = (load(out / "classifier.json") or {}).get("classifier")
    if classifier and "latency_ms" not in classifier:
        rows.append(("classifier through ONNX Runtime", f"no race: auto chose {classifier['engine']['engine']}",
                     "no (an ensemble? train with --set model.members=1)"))
    elif classifier:
        rows.append(("classifier batch-1: torch / ONNX Runtime latency", f"{classifier['speedup']:.2f}x",
                     "yes" if classifier["speedup"] >= 3 else "no (>= 3)"))
        if "speedup_fp32" in classifier:  # torch in ONNX Runtime's precision: like with like
            rows.append(("  the same, torch in fp32", f"{classifier['speedup_fp32']:.2f}x",
                         "yes" if classifier["speedup_fp32"] >= 3 else "no (>= 3)"))
        rows.append(("classifier labels equal on agnews test", f"{classifier['labels_equal']} of "
                     f"{classifier['test_sentences']}", "yes" if classifier["labels_agree"] == 1 else "no (100%)"))
    agreement = load(out / "agreement.json")
    if agreement:
        for name, s in agreement["searches"].items():
            met = ("yes" if s["share"] == 1 else "no (100%)") if name == "greedy" else "(reported)"
            rows.append((f"de-en test outputs equal, {name}", f"{s['equal']} of {agreement['n']}", met))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs trained, the JSON and the logs")
    ap.add_argument("--deen", type=Path, metavar="RUN", help="a finished translate-de-en run (else one is trained)")
    ap.add_argument("--agnews", type=Path, metavar="RUN", help="a finished agnews run (else one is trained)")
    ap.add_argument("--data", type=Path, default=HERE.parents[1].parent / "shared" / "datasets",
                    help="the folder of multi30k/ and ag_news/ (default ../shared/datasets)")
    ap.add_argument("--only", default=",".join(STEPS), help=f"steps to run (default {','.join(STEPS)})")
    ap.add_argument("--quick", action="store_true", help="tiny runs and workloads: checks that it runs")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    if unknown := set(only) - set(STEPS):
        sys.exit(f"Error: --only: unknown step(s) {', '.join(sorted(unknown))} (choose from {', '.join(STEPS)})")
    args.out.mkdir(parents=True, exist_ok=True)
    python, seconds = sys.executable, {}
    if {"race", "serve", "one_client", "agreement"} & set(only):
        args.deen = args.deen or train("translate-de-en", args.data / "multi30k", 3, args.out / "deen", args.quick)
    if "classifier" in only:
        # one network: ONNX Runtime runs one, and agnews' default is an ensemble of 20
        args.agnews = args.agnews or train("agnews", args.data / "ag_news", 1, args.out / "agnews", args.quick,
                                           "model.members=1")
    quick = ["--quick"] if args.quick else []
    commands = {
        "race": [python, str(HERE / "engine_race.py"), "--run", str(args.deen), *quick],
        "serve": [python, str(HERE / "serve.py"), str(args.deen), "--engines", "auto,torch", "--clients", "1,32",
                  "--seconds", "3" if args.quick else "30", "--rounds", "1" if args.quick else "4", "--soak", "0",
                  "--sentences", "20" if args.quick else "1000"],
        "one_client": [python, str(HERE / "serve_one.py"), str(args.deen), "--rounds", "2" if args.quick else "6",
                       "--requests", "10" if args.quick else "150", "--sentences", "20" if args.quick else "1000",
                       "--route"],
        "classifier": [python, str(HERE / "engine_race.py"), "--no-search", "--classifier", str(args.agnews),
                       *(["--quick", "--classifier-limit", "50"] if args.quick else [])],
        "agreement": [python, str(HERE.parent / "study" / "engine_agreement.py"), str(args.deen),
                      *(["--limit", "30"] if args.quick else [])],
    }
    for name in only:
        seconds[name] = step(name, [*commands[name], "--json", str(args.out / f"{name}.json")],
                             args.out / f"{name}.log")
    rows = summary(args.out)
    width = max((len(r[0]) for r in rows), default=10)
    print(f"\n{'goal':<{width}}  {'figure':>22}  met")
    for goal, figure, met in rows:
        print(f"{goal:<{width}}  {figure:>22}  {met}")
    (args.out / "summary.json").write_text(json.dumps({"seconds": seconds, "deen": str(args.deen),
                                                        "agnews": str(args.agnews), "quick": args.quick,
                                                        "rows": rows}, indent=2) + "\n")
    if args.quick:
        print("(--quick: tiny runs on whatever machine this is; not figures)")


if __name__ == "__main__":
    main()
