"""One client against `taskformer serve`, with a lean client, alternating with raw CTranslate2 one sentence at a time.

    python bench/race/serve_one.py RUN --rounds 6 --requests 200
    python bench/race/serve_one.py RUN --before OTHER_ENV/bin/python     # two servers, code before and after
    python bench/race/serve_one.py RUN --route      # the plain request against FastAPI's route, in one server

bench/race/serve.py measures one client with aiohttp's client, which takes 0.6-1.1 ms of CPU a request
inside the latency it measures (the raw side has no client at all). Here the client is the standard
library's `http.client` over one kept-alive connection (about 0.1 ms a request), so that what the
p50 holds beyond raw's time is the server's. Each round sends `--requests` sentences in turn to each
server (a fresh connection per block: uvicorn closes a connection idle for 5 s) and then decodes as
many seconds of sentences with raw CTranslate2 (bench/race/serve.py's `RawCTranslate2`: the run's
search, budget and threads), so that the machine speeding up or slowing down falls on every side
alike. It gives each server's p50 against raw's median, the server's CPU per request (all its threads
from /proc) and its event loop's (the main thread), and whether the outputs are equal. With `--route`
the same server also gets the requests with a charset in their content type, which FastAPI's route
answers rather than the plain request's lane: in one process, the lane's saving is not lost in the
differences between two processes' decodes.
"""
from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # serve.py's helpers

from serve import RawCTranslate2, Server, process_cpu, sentences_of  # noqa: E402

from machine import cpu_name  # noqa: E402


class Side:
    """Requests to ``server`` sent as ``content_type``, and what they measured. ``application/json`` is the
    plain request the server answers in front of FastAPI's route; with a charset the route answers it."""

    def __init__(self, name: str, server: Server, content_type: str = "application/json"):
        self.name, self.server, self.content_type = name, server, content_type
        self.latencies: list[float] = []
        self.cpu = self.loop_cpu = 0.0
        self.outputs: dict[str, bytes] = {}

    def block(self, sentences: list[str], start: int, count: int, keep: bool = True) -> float:
        """``count`` requests of one sentence each, in turn from ``start``; the seconds they took."""
        server, pid = self.server, self.server.process.pid
        host, port = server.url.removeprefix("http://").split(":")
        path = f"/v1/models/{server.name}/predict"
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        cpu, loop, began = process_cpu(pid), process_cpu(pid, pid), time.perf_counter()
        for i in range(start, start + count):
            text = sentences[i % len(sentences)]
            sent = time.perf_counter()
            connection.request("POST", path, json.dumps({"inputs": [text]}), {"Content-Type": self.content_type})
            response = connection.getresponse()
            body = response.read()
            if response.status != 200:
                sys.exit(f"{self.name}: {response.status} {body[:200]!r}")
            if keep:
                self.latencies.append(time.perf_counter() - sent)
                self.outputs[text] = body
        took = time.perf_counter() - began
        connection.close()
        if keep:
            self.cpu += process_cpu(pid) - cpu
            self.loop_cpu += process_cpu(pid, pid) - loop
        return took

    def figures(self, raw_ms: float) -> dict:
        n = len(self.latencies)
        p50 = 1000 * statistics.median(self.latencies)
        return {"requests": n, "p50_ms": p50, "p50_vs_raw_batch1": p50 / raw_ms, "server_cpu_ms": 1000 * self.cpu / n,
                "event_loop_cpu_ms": 1000 * self.loop_cpu / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=200, help="requests per server per round")
    parser.add_argument("--sentences", type=int, default=1000, help="distinct test sentences to cycle through")
    parser.add_argument("--before", metavar="PYTHON", help="also serve with this interpreter (another environment's "
                                                          "code), alternating with this one's")
    parser.add_argument("--route", action="store_true", help="also send the same requests with a charset to the same "
                                                                 "server, which FastAPI's route answers, alternating")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    sentences = sentences_of(args.run_dir, args.sentences)
    raw = RawCTranslate2(args.run_dir, sentences, 32)
    servers = [Server(args.run_dir)]
    sides = [Side("this", servers[0])]
    if args.route:
        sides.append(Side("this, through FastAPI's route", servers[0], "application/json; charset=utf-8"))
    if args.before:
        servers.append(Server(args.run_dir, python=args.before))
        sides.insert(0, Side("before", servers[-1]))
    try:
        for side in sides:
            side.block(sentences, 0, 50, keep=False)  # warm-up
        for r in range(args.rounds):
            for side in sides if r % 2 == 0 else sides[::-1]:
                took = side.block(sentences, r * args.requests, args.requests)
                raw.part("one", took)
    finally:
        for server in servers:
            server.stop()
    raw_ms = 1000 * statistics.median(raw.one_times)
    figures = {"cpu": os.cpu_count(), "cpu_name": cpu_name(), "rounds": args.rounds, "raw_batch1_median_ms": raw_ms,
               "sides": {side.name: side.figures(raw_ms) for side in sides}}
    print(f"raw CTranslate2, one sentence: {raw_ms:.2f} ms (median)")
    for name, f in figures["sides"].items():
        print(f"serve ({name}), one client: p50 {f['p50_ms']:.2f} ms = {f['p50_vs_raw_batch1']:.3f}x raw's (goal: at "
              f"most 1.2x); the server's CPU {f['server_cpu_ms']:.2f} ms a request, its event loop's "
              f"{f['event_loop_cpu_ms']:.2f} ms")
    if len(sides) > 1:
        first = sides[0].outputs
        figures["outputs_equal"] = [sum(first[t] == side.outputs[t] for side in sides[1:] for t in first),
                                    len(first) * (len(sides) - 1)]
        print(f"outputs equal: {figures['outputs_equal'][0]} of {figures['outputs_equal'][1]}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
