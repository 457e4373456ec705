"""Clients that leave a language model's stream after its first piece: does the server's log stay quiet?

    python bench/faults/leave_stream.py --leaves 60 --rounds 4 --busy 3      # about two minutes

It trains a tiny character model (a few seconds), serves it with a long ``max_new_tokens``, and in each
round starts a server, opens ``--leaves`` streams one after another, reads each one's first line and
closes the connection, then counts the lines the server wrote to its log. A server that goes on writing
to a client that has left gets asyncio's "socket.send() raised exception." from the fifth such write;
that happens only when the event loop is slow to hear of the leaving, so ``--busy N`` pins the server, its
client and N processes that spin to one core (Linux only). The figure is the warnings in each round.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "race"))  # serve.py's Server

from serve import Server  # noqa: E402

TINY = ["--set", "train.max_steps=3", "--set", "model.max_len=16", "--set", "model.d_model=16", "--set",
        "model.n_heads=2", "--set", "model.d_ff=32", "--set", "train.max_tokens=256", "--quiet"]


def train(folder: Path) -> Path:
    (folder / "data").mkdir()
    hostile = "\x1b]0;PWN\x07\x1b[2J\x9b31m\u202e"  # the robustness test's text, where CI saw the warnings
    (folder / "data" / "input.txt").write_text(f"{hostile} said {hostile}\n" * 60)
    subprocess.run([sys.executable, "-m", "taskformer", "run", "shakespeare-char", "--data-dir", str(folder / "data"),
                    "--out", str(folder / "lm"), *TINY], check=True, stdout=subprocess.DEVNULL)
    return folder / "lm"


def one_round(run: Path, leaves: int, busy: int) -> dict:
    import httpx

    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    server = Server(run, "--set", "decode.max_new_tokens=20000")
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for _ in range(leaves):
                with client.stream("POST", f"/v1/models/{server.name}/predict/stream", json={"inputs": ["said"]}) as stream:
                    next(stream.iter_lines())
            healthy = client.get("/health").status_code == 200
    finally:
        server.stop()
        for spinner in spinners:
            spinner.kill()
    log = "".join(server.log)
    return {"leaves": leaves, "log_lines": len(log.splitlines()), "send_warnings": log.count("socket.send()"),
            "tracebacks": log.count("Traceback"), "healthy_after": healthy}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="pin the server and its client to one core beside N processes that spin there")
    parser.add_argument("--json", type=Path, help="write the rounds here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        run = train(Path(folder))
        if args.busy:  # the processes started from here on inherit the one core
            os.sched_setaffinity(0, {0})
        rounds = []
        for _ in range(args.rounds):
            rounds.append(one_round(run, args.leaves, args.busy))
            print(json.dumps(rounds[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"busy": args.busy, "rounds": rounds}, indent=1))


if __name__ == "__main__":
    main()
