"""`taskformer serve` under load: throughput and latency with dynamic batching against `--max-batch 1`.

    taskformer run copy --out runs/copy/bench          # a trained run in about 30 s (any run works)
    python bench/serve.py runs/copy/bench              # about 9 minutes; --seconds/--soak shorten it

For each server setting (dynamic batching with the default `--max-batch`, and `--max-batch 1`) it
starts `taskformer serve` on 127.0.0.1 in a subprocess and runs 1, 8 and 32 concurrent clients for
`--seconds` each; every client sends one sentence per request, taken in turn from the run's test
outputs (`outputs-test.jsonl`). It reports sentences per second and p50/p95/p99 latency, and, as the
bar to come close to, the same sentences decoded in one call of the function behind
`taskformer predict`. Then a `--soak`-second run at the highest load with batching counts failed
requests and compares the server's resident memory (RSS) at the end with RSS after the warm-up.

The clients are aiohttp's, all in this process, and share the machine with the server; each row
says how much of a core they took (`client_cpu`). They are lean on purpose: httpx's client, used
before, took about 3 ms of CPU per request, a core of a 2-core machine at 300 requests/s, so it
measured itself rather than the server (docs/benchmarks.md). Both settings run with the same
client in one run.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from machine import cpu_name


def sentences_of(run_dir: Path, limit: int) -> list[str]:
    path = run_dir / "outputs-test.jsonl"
    rows = [json.loads(line)["source"] for line in path.read_text(encoding="utf-8").splitlines()]
    rows = [r for r in rows if r.strip()][:limit]
    if not rows:
        sys.exit(f"{path}: no test sentences to send")
    return rows


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.M).group(1))


class Server:
    def __init__(self, run_dir: Path, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "taskformer", "serve", str(run_dir), "--port", "0",
                                         "--max-queue", "100000", *args], stderr=subprocess.PIPE, text=True)
        line = self.process.stderr.readline()
        found = re.search(r"http://[\d.]+:\d+", line)
        if not found:
            sys.exit(f"the server did not start: {line}{self.process.stderr.read()}")
        self.url = found.group(0)
        self.name = re.search(r"serving (\S+) on", line).group(1)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=120)


async def load(url: str, name: str, sentences: list[str], clients: int, seconds: float) -> dict:
    """``clients`` concurrent clients, each on its own connection, sending one sentence per request
    until ``seconds`` pass."""
    latencies, failures = [], 0
    deadline = time.perf_counter() + seconds
    target = f"{url}/v1/models/{name}/predict"

    async def client(k: int, http: aiohttp.ClientSession) -> None:
        nonlocal failures
        i = k
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                async with http.post(target, json={"inputs": [sentences[i % len(sentences)]]}) as response:
                    await response.read()
                    ok = response.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - started)
            else:
                failures += 1
            i += clients

    started, cpu = time.perf_counter(), time.process_time()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        await asyncio.gather(*(client(k, http) for k in range(clients)))
    elapsed = time.perf_counter() - started
    q = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [float("nan")] * 99
    return {"clients": clients, "requests": len(latencies), "failed": failures,
            "sentences_per_s": len(latencies) / elapsed, "p50_ms": 1000 * q[49], "p95_ms": 1000 * q[94],
            "p99_ms": 1000 * q[98], "client_cpu": (time.process_time() - cpu) / elapsed}


def predict_bar(run_dir: Path, sentences: list[str]) -> float:
    """Sentences per second of the function behind `taskformer predict`, all sentences in one call."""
    import taskformer

    model = taskformer.load(run_dir)
    model.predict(sentences[:8])  # warm-up
    started = time.perf_counter()
    model.predict(sentences)
    return len(sentences) / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--clients", default="1,8,32", help="concurrent clients per measurement (default 1,8,32)")
    parser.add_argument("--seconds", type=float, default=60, help="seconds per measurement (default 60)")
    parser.add_argument("--soak", type=float, default=60, help="seconds of the soak run at the highest load")
    parser.add_argument("--sentences", type=int, default=1000, help="distinct test sentences to cycle through")
    parser.add_argument("--serve-options", default="", help="more options for both servers, e.g. '--threads 2'")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    sentences = sentences_of(args.run_dir, args.sentences)
    stack = {m: importlib.util.find_spec(m) is not None for m in ("uvloop", "httptools")}  # uvicorn takes them if there
    figures = {"cpu": os.cpu_count(), "cpu_name": cpu_name(), "sentences": len(sentences), "serve_options":
               args.serve_options, "uvloop": stack["uvloop"], "httptools": stack["httptools"], "rows": []}
    print(f"{len(sentences)} sentences from {args.run_dir}; {os.cpu_count()} CPUs ({figures['cpu_name']}); server "
          f"{'uvloop' if stack['uvloop'] else 'asyncio'} + {'httptools' if stack['httptools'] else 'h11'} "
          f"{args.serve_options}", flush=True)
    figures["predict_sentences_per_s"] = bar = predict_bar(args.run_dir, sentences)
    print(f"taskformer predict (one call, all sentences): {bar:.1f} sentences/s", flush=True)
    print(f"{'setting':<14} {'clients':>7} {'sent/s':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'failed':>6} "
          f"{'client cores':>12}")
    for setting, options in (("batching", []), ("max-batch 1", ["--max-batch", "1"])):
        server = Server(args.run_dir, *options, *shlex.split(args.serve_options))
        try:
            asyncio.run(load(server.url, server.name, sentences, max(clients), min(5.0, args.seconds)))  # warm-up
            for c in clients:
                row = {"setting": setting, **asyncio.run(load(server.url, server.name, sentences, c, args.seconds))}
                figures["rows"].append(row)
                print(f"{setting:<14} {c:>7} {row['sentences_per_s']:>8.1f} {row['p50_ms']:>8.1f} {row['p95_ms']:>8.1f} "
                      f"{row['p99_ms']:>8.1f} {row['failed']:>6} {row['client_cpu']:>12.2f}", flush=True)
            if setting == "batching" and args.soak:
                warm = rss_kib(server.process.pid)
                soak = asyncio.run(load(server.url, server.name, sentences, max(clients), args.soak))
                end = rss_kib(server.process.pid)
                figures["soak"] = {**soak, "seconds": args.soak, "rss_warm_mib": warm / 1024, "rss_end_mib": end / 1024}
                print(f"soak {args.soak:.0f} s at {max(clients)} clients: {soak['requests']} requests, "
                      f"{soak['failed']} failed; RSS {warm / 1024:.0f} MiB after warm-up, {end / 1024:.0f} MiB at the "
                      f"end ({100 * (end - warm) / warm:+.1f}%)", flush=True)
        finally:
            server.stop()
    top = {r["setting"]: r for r in figures["rows"] if r["clients"] == max(clients)}
    if len(top) == 2:
        ratio = top["batching"]["sentences_per_s"] / top["max-batch 1"]["sentences_per_s"]
        print(f"at {max(clients)} clients batching gives {ratio:.2f}x the throughput of --max-batch 1 "
              f"(p99 {top['batching']['p99_ms']:.0f} vs {top['max-batch 1']['p99_ms']:.0f} ms)")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
