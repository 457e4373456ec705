"""`taskformer serve` under load: throughput and latency with dynamic batching against `--max-batch 1`.

    taskformer run copy --out runs/copy/bench          # a trained run in about 30 s (any run works)
    python bench/race/serve.py runs/copy/bench              # about 9 minutes; --seconds/--soak shorten it

For each server setting (dynamic batching with the default `--max-batch`, and `--max-batch 1`) it
starts `taskformer serve` on 127.0.0.1 in a subprocess and runs 1, 8 and 32 concurrent clients for
`--seconds` each; every client sends one sentence per request, taken in turn from the run's test
outputs (`outputs-test.jsonl`). It reports sentences per second and p50/p95/p99 latency, and, as the
bar to come close to, the same sentences decoded in one call of the function behind
`taskformer predict`. Then a `--soak`-second run at the highest load with batching counts failed
requests and compares the server's resident memory (RSS) at the end with RSS after the warm-up.

`--hostile SECONDS` then measures the server under hostile traffic instead (docs/robustness.md): the
highest load with batching runs clean for SECONDS, then as long again with one request in ten (drawn
with a fixed seed) replaced by a bad one: malformed or deeply nested JSON, a body over the limit, wrong
types, an unknown model, a client that sends its request and leaves, and a slow sender that trickles its
body. It reports the good requests that failed, the p99 latency of the good ones against the clean
run's (a ratio), the bad requests the server answered with a 5xx, RSS after the warm-up and at the
end, and whether the server still answers `/health`. With `--rounds N` the clean and the hostile
load alternate in N parts of SECONDS/N each, the p99s pooling each side's parts, so that the machine
slowing down or speeding up during the measurement falls on both sides alike; RSS is then read
after every part too, which shows whether memory levels off or keeps growing.

    python bench/race/serve.py runs/copy/bench --hostile 60 --rounds 4      # about 3 minutes

`--engines LIST` serves the run once per `decode.engine` (e.g. `auto,torch`) and races the raw
runtime instead: one client's p50 latency against raw CTranslate2's median time for the same
sentences one at a time (the run's search and budget per sentence, the threads our runtime uses), and
the most clients' throughput against CTranslate2 decoding all the sentences in one call with
`max_batch_size` the server's `--max-batch` (32): it sorts them by length and batches them itself,
each worker decoding a batch of 32 of like lengths, so 64 sentences at once on two workers where 32
clients keep 32 in flight. So the most clients' throughput is also given against a raw loop that
has as many in flight as the clients: the sentences in the clients' order, 32 a call, each call split
between the workers (`clients_loop_sentences_per_s`).
Raw CTranslate2 is told what bench/race/engine_race.py tells it (the run's search, budget and threads).
With `--rounds N` each row's `--seconds` come in N parts, each followed by raw's part of as long (one
sentence at a time after one client's; the loop of 32 and the call of all sentences after the most
clients'), the parts of each side pooled: on a shared machine whose speed drifts, both sides meet the
same drift. Each row also gives the CPU per sentence of the server's process (all its threads) and of
the clients, against raw's (`*_cpu_ms`), the figure a busy machine moves least, and the server's own
time per request (`server_mean_ms`, from `/metrics`: the latency less the client's side).

    python bench/race/serve.py runs/copy/bench --engines auto,torch --clients 1,32 --seconds 30 --soak 0 --rounds 4

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
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name  # noqa: E402


def sentences_of(run_dir: Path, limit: int) -> list[str]:
    path = run_dir / "outputs-test.jsonl"
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    if not any(r["source"].strip() for r in rows):  # a language model's: prompts from its texts' first lines
        rows = [{"source": r["reference"].strip().partition("\n")[0]} for r in rows]
    rows = [r["source"] for r in rows if r["source"].strip()][:limit]
    if not rows:
        sys.exit(f"{path}: no test sentences to send")
    return rows


def rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    found = re.search(r"^VmRSS:\s+(\d+) kB", status, flags=re.M)
    if not found:
        raise RuntimeError(f"/proc/{pid}/status gives no VmRSS")
    return int(found.group(1))


class Server:
    """`taskformer serve RUN ARGS` on a free port, started by ``python`` (this interpreter by default;
    another environment's, to serve its code)."""

    def __init__(self, run_dir: Path, *args: str, python: str = sys.executable):
        self.process = subprocess.Popen([python, "-m", "taskformer", "serve", str(run_dir), "--port", "0",
                                         "--max-queue", "100000", *args], stderr=subprocess.PIPE, text=True)
        stderr = self.process.stderr
        assert stderr is not None  # a pipe, as asked
        line = stderr.readline()
        found, named = re.search(r"http://[\d.]+:\d+", line), re.search(r"serving (\S+) on", line)
        if not found or not named:
            sys.exit(f"the server did not start: {line}{stderr.read()}")
        self.url = found.group(0)
        self.name = named.group(1)
        self.log: list[str] = []  # the server's log, read as it comes (a full pipe would block the server)
        self.reader = threading.Thread(target=lambda: self.log.extend(stderr), daemon=True)
        self.reader.start()

    def stop(self) -> None:
        """Ends the server; its log is then whole."""
        self.process.terminate()
        self.process.wait(timeout=120)
        self.reader.join(timeout=60)


BAD_BODIES = {  # what each bad request sends as a JSON request body
    "malformed": b'{"inputs": ["1 2"',
    "deeply nested": b'{"inputs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    "oversized": b'{"inputs": ["' + b"1 " * (1 << 19) + b'"]}',
    "wrong types": b'{"inputs": [5], "beam": true}',
    "huge number": b'{"inputs": ["1"], "beam": ' + b"9" * 5000 + b"}",
}
BAD_KINDS = (*BAD_BODIES, "unknown model", "disconnecting", "leaves a stream", "slow sender")


async def raw_request(url: str, path: str, body: bytes, trickle: float = 0.0, leave: bool = False) -> int | None:
    """One POST over a socket of its own: ``trickle`` seconds between the body's bytes (a slow sender),
    or ``leave`` at once after sending (a client that disconnects). The status, or None when it left."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n" % (path.encode(), host.encode(), len(body)))
        for i in range(0, len(body), 1 if trickle else len(body)):
            writer.write(body[i : i + (1 if trickle else len(body))])
            await writer.drain()
            if trickle:
                await asyncio.sleep(trickle)
        if leave:
            return None
        status = await reader.readline()
        return int(status.split()[1])
    finally:
        writer.close()


async def bad_request(kind: str, url: str, name: str, http: aiohttp.ClientSession) -> int | None:
    """One hostile request of ``kind``; the status the server answered (None: the client left)."""
    target = f"/v1/models/{name}/predict"
    if kind == "disconnecting":
        return await raw_request(url, target, b'{"inputs": ["1 2 3"]}', leave=True)
    if kind == "leaves a stream":  # a language model's continuation streamed, the client gone after sending
        return await raw_request(url, target + "/stream", b'{"inputs": ["1 2 3"]}', leave=True)
    if kind == "slow sender":
        return await raw_request(url, target, b'{"inputs": ["1 2 3"]}', trickle=0.02)
    if kind == "unknown model":
        target, body = "/v1/models/no-such-model/predict", b'{"inputs": ["1 2"]}'
    else:
        body = BAD_BODIES[kind]
    async with http.post(url + target, data=body, headers={"Content-Type": "application/json"}) as response:
        await response.read()
        return response.status


def totals(url: str, name: str) -> tuple[float, ...]:
    """The server's sentences decoded and batches so far (``taskformer_batch_sentences`` on ``/metrics``), and
    its seconds answering predict requests and their count (``taskformer_request_seconds``)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=60) as answer:
        text = answer.read().decode()
    series = [rf'taskformer_batch_sentences_{part}{{model="{re.escape(name)}"}}' for part in ("sum", "count")]
    series += [rf'taskformer_request_seconds_{part}{{route="/v1/models/{{name}}/predict"}}' for part in ("sum", "count")]
    found = [re.search(rf"^{one} (\S+)$", text, flags=re.M) for one in series]
    return tuple(float(f.group(1)) if f else 0.0 for f in found)


async def load(url: str, name: str, sentences: list[str], clients: int, seconds: float, bad_share: float = 0.0,
               seed: int = 0, latencies: list[float] | None = None) -> dict:
    """``clients`` concurrent clients, each on its own connection, sending one sentence per request
    until ``seconds`` pass; a ``bad_share`` of the requests (drawn with ``seed``) is a bad one instead,
    of a kind of :data:`BAD_KINDS`, and counted apart. The good requests' latencies (seconds) are
    added to ``latencies`` where given, so parts of a measurement can be pooled."""
    latencies = [] if latencies is None else latencies
    failures, server_errors = 0, 0
    bad, draw = {kind: 0 for kind in BAD_KINDS}, random.Random(seed)
    deadline = time.perf_counter() + seconds
    target = f"{url}/v1/models/{name}/predict"

    async def client(k: int, http: aiohttp.ClientSession) -> None:
        nonlocal failures, server_errors
        i = k
        while time.perf_counter() < deadline:
            if bad_share and draw.random() < bad_share:
                kind = draw.choice(BAD_KINDS)
                bad[kind] += 1
                try:
                    status = await bad_request(kind, url, name, http)
                except (aiohttp.ClientError, OSError):
                    status = None  # the server may close on a bad request; it must stay up for the rest
                server_errors += status is not None and status >= 500
                continue
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

    before = totals(url, name)
    first, started, cpu = len(latencies), time.perf_counter(), time.process_time()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                     timeout=aiohttp.ClientTimeout(total=300)) as http:
        await asyncio.gather(*(client(k, http) for k in range(clients)))
    elapsed, mine = time.perf_counter() - started, latencies[first:]  # this load's own requests
    sentences_batched, batches, answering, answered = (now - then for now, then in zip(totals(url, name), before))
    q = statistics.quantiles(mine, n=100) if len(mine) > 1 else [float("nan")] * 99
    return {"clients": clients, "requests": len(mine), "failed": failures,
            "sentences_per_s": len(mine) / elapsed, "p50_ms": 1000 * q[49], "p95_ms": 1000 * q[94],
            "p99_ms": 1000 * q[98], "client_cpu": (time.process_time() - cpu) / elapsed,
            "mean_batch": sentences_batched / batches if batches else float("nan"),
            "server_mean_ms": 1000 * answering / answered if answered else float("nan"),
            **({"bad_requests": bad, "bad_answered_5xx": server_errors} if bad_share else {})}


def hostile(run_dir: Path, sentences: list[str], clients: int, seconds: float, serve_options: str,
            rounds: int) -> dict:
    """The clean and the hostile load on one server, ``seconds`` of each, alternating in ``rounds``
    parts so that a drift in the machine's speed falls on both alike; the p99s pool each side's parts.
    RSS is read after the warm-up and after every part. The figures docs/robustness.md records."""
    server = Server(run_dir, *shlex.split(serve_options))
    clean_s: list[float] = []
    rough_s: list[float] = []
    parts, rss = [], []
    try:
        asyncio.run(load(server.url, server.name, sentences, clients, min(5.0, seconds)))  # warm-up
        rss.append(rss_kib(server.process.pid))
        for r in range(rounds):
            clean = asyncio.run(load(server.url, server.name, sentences, clients, seconds / rounds, latencies=clean_s))
            rss.append(rss_kib(server.process.pid))
            rough = asyncio.run(load(server.url, server.name, sentences, clients, seconds / rounds, bad_share=0.1,
                                     seed=r, latencies=rough_s))
            rss.append(rss_kib(server.process.pid))
            parts.append((clean, rough))
        with urllib.request.urlopen(f"{server.url}/health", timeout=60) as answer:
            up = server.process.poll() is None and answer.status == 200
    finally:
        server.stop()
    log = "".join(server.log)
    p99 = {side: 1000 * statistics.quantiles(s, n=100)[98] for side, s in (("clean", clean_s), ("rough", rough_s))}
    bad = {kind: sum(rough["bad_requests"][kind] for _, rough in parts) for kind in BAD_KINDS}
    return {"clients": clients, "seconds": seconds, "rounds": rounds, "clean_p99_ms": p99["clean"],
            "clean_failed": sum(clean["failed"] for clean, _ in parts), "good_requests": len(rough_s),
            "good_failed": sum(rough["failed"] for _, rough in parts), "p99_ms": p99["rough"], "bad_requests": bad,
            "bad_answered_5xx": sum(rough["bad_answered_5xx"] for _, rough in parts),
            "p99_ratio": p99["rough"] / p99["clean"], "part_p99_ms": [[c["p99_ms"], r["p99_ms"]] for c, r in parts],
            "rss_start_mib": rss[0] / 1024, "rss_end_mib": rss[-1] / 1024, "rss_mib": [k / 1024 for k in rss],
            "server_up_at_end": up, "log_lines": len(log.splitlines()), "log_tracebacks": log.count("Traceback")}


def process_cpu(pid: int, thread: int | None = None) -> float:
    """CPU seconds of every thread of process ``pid`` so far (user and system), or of one ``thread`` of it."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RawCTranslate2:
    """Raw CTranslate2 on the run's weights (exported here), told what bench/race/engine_race.py tells it
    (the run's search, budgets and threads), measured in parts of a given length so that its parts can
    alternate with the server's: one sentence at a time, 32 at a time in the clients' order, and all
    sentences in one call (CTranslate2 sorts them by length and batches them itself)."""

    def __init__(self, run_dir: Path, sentences: list[str], batch: int):
        import tempfile

        import torch
        from engine_race import raw_inputs, raw_translator

        from taskformer.app import runner
        from taskformer.core.decoding import decode_workers

        run = runner.load(run_dir)
        d = run.config.decode
        self.tokens, self.budgets, self.options = raw_inputs(run, sentences)
        self.options["beam_size"] = d.beam if d.strategy == "beam" else 1
        self.compute = "int8" if d.quantize == "int8" else "float32"
        self.batch, self.workers = batch, decode_workers(d.workers, torch.device("cpu"), 1 << 20)
        with tempfile.TemporaryDirectory() as folder:
            self.translator = raw_translator(run, Path(folder) / "ct2", self.compute, "cpu", self.workers)
        self.translate(0, 8)  # warm-up
        self.one_times: list[float] = []  # seconds of each sentence decoded alone
        self.totals = {"one": [0, 0.0, 0.0], "loop": [0, 0.0, 0.0], "all": [0, 0.0, 0.0]}  # sentences, s, CPU s
        self.next = {"one": 0, "loop": 0}  # where each kind of part goes on in the sentences

    def translate(self, start: int, size: int, split: int = 0) -> int:
        rows = range(start, start + size)
        tokens = [self.tokens[i % len(self.tokens)] for i in rows]
        self.translator.translate_batch(tokens, max_batch_size=split, **self.options,
                                        max_decoding_length=max(self.budgets[i % len(self.budgets)] for i in rows))
        return size

    def part(self, kind: str, seconds: float) -> None:
        """``seconds`` of ``kind``: ``one`` sentence a call, a ``loop`` of ``batch`` a call (each call split
        between the workers, as many in flight as ``batch`` clients keep), or ``all`` the sentences in one call."""
        total = self.totals[kind]
        started, cpu = time.perf_counter(), time.process_time()
        if kind == "all":
            total[0] += self.translate(0, len(self.tokens), self.batch)
        while kind != "all" and time.perf_counter() - started < seconds:
            at = self.next[kind]
            if kind == "one":
                began = time.perf_counter()
                size = self.translate(at, 1)
                self.one_times.append(time.perf_counter() - began)
            else:
                size = self.translate(at, self.batch, -(-self.batch // self.workers))
            self.next[kind] = (at + size) % len(self.tokens)
            total[0] += size
        total[1] += time.perf_counter() - started
        total[2] += time.process_time() - cpu

    def figures(self) -> dict:
        speed = {kind: n / s for kind, (n, s, _) in self.totals.items()}
        cpu = {kind: 1000 * c / n for kind, (n, _, c) in self.totals.items()}
        return {"batch1_median_ms": 1000 * statistics.median(self.one_times), "batched_sentences_per_s": speed["all"],
                "clients_loop_sentences_per_s": speed["loop"], "batch": self.batch, "compute_type": self.compute,
                "beam": self.options["beam_size"], "batch1_cpu_ms": cpu["one"], "clients_loop_cpu_ms": cpu["loop"],
                "batched_cpu_ms": cpu["all"]}


def pooled(parts: list[dict], latencies: list[float]) -> dict:
    """One row of ``parts`` of :func:`load` (their latencies pooled in ``latencies``)."""
    seconds = [p["requests"] / p["sentences_per_s"] for p in parts]
    q = statistics.quantiles(latencies, n=100)
    batches = sum(p["requests"] / p["mean_batch"] for p in parts if p["mean_batch"] > 0)
    return {"clients": parts[0]["clients"], "requests": sum(p["requests"] for p in parts),
            "failed": sum(p["failed"] for p in parts), "sentences_per_s": sum(p["requests"] for p in parts) / sum(seconds),
            "p50_ms": 1000 * q[49], "p95_ms": 1000 * q[94], "p99_ms": 1000 * q[98],
            "client_cpu": sum(p["client_cpu"] * s for p, s in zip(parts, seconds)) / sum(seconds),
            "mean_batch": sum(p["requests"] for p in parts) / batches if batches else float("nan"),
            "server_cpu_ms": sum(p["server_cpu_ms"] * p["requests"] for p in parts) / sum(p["requests"] for p in parts),
            "server_mean_ms": sum(p["server_mean_ms"] * p["requests"] for p in parts) / sum(p["requests"] for p in parts),
            "parts": len(parts)}


def engines_race(run_dir: Path, sentences: list[str], clients: list[int], seconds: float, engines: list[str],
                 serve_options: str, rounds: int) -> dict:
    """Serve with each engine at one client and the most clients, against raw CTranslate2
    (:class:`RawCTranslate2`): in ``rounds`` parts each, the server's load and raw's alternating (one
    client with one sentence at a time, the most clients with raw's loop of 32 and its one call of all
    the sentences), so that the machine speeding up or slowing down falls on both sides alike."""
    figures: dict = {"rows": {}, "engine": {}, "rounds": rounds}
    raw_side = RawCTranslate2(run_dir, sentences, 32)
    for engine in engines:
        server = Server(run_dir, "--set", f"decode.engine={engine}", *shlex.split(serve_options))
        try:
            with urllib.request.urlopen(f"{server.url}/v1/models") as response:
                figures["engine"][engine] = json.load(response)["models"][0]["engine"]
            asyncio.run(load(server.url, server.name, sentences, max(clients), min(5.0, seconds)))  # warm-up
            parts: dict[int, list[dict]] = {c: [] for c in sorted({1, max(clients)})}
            latencies: dict[int, list[float]] = {c: [] for c in parts}
            for _ in range(rounds):
                for c in parts:
                    cpu = process_cpu(server.process.pid)
                    part = asyncio.run(load(server.url, server.name, sentences, c, seconds / rounds,
                                            latencies=latencies[c]))
                    part["server_cpu_ms"] = 1000 * (process_cpu(server.process.pid) - cpu) / max(part["requests"], 1)
                    parts[c].append(part)
                    for kind in ("one",) if c == 1 else ("loop", "all"):
                        raw_side.part(kind, seconds / rounds)
            for c in parts:
                row = figures["rows"][f"{engine} {c}"] = pooled(parts[c], latencies[c])
                print(f"serve decode.engine={engine} ({figures['engine'][engine]['engine']}), {c} clients: "
                      f"{row['sentences_per_s']:.1f} sent/s, p50 {row['p50_ms']:.1f} ms (the server's own time "
                      f"{row['server_mean_ms']:.1f} ms on average), batches of {row['mean_batch']:.1f} sentences "
                      f"on average; CPU per sentence: the server {row['server_cpu_ms']:.2f} ms, the client "
                      f"{1000 * row['client_cpu'] / row['sentences_per_s']:.2f} ms", flush=True)
        finally:
            server.stop()
    figures["ctranslate2"] = raw = raw_side.figures()
    print(f"raw CTranslate2: one sentence {raw['batch1_median_ms']:.1f} ms (median; CPU {raw['batch1_cpu_ms']:.2f} ms), "
          f"batches of {raw['batch']}: {raw['batched_sentences_per_s']:.1f} sent/s (all sentences in one call); "
          f"{raw['clients_loop_sentences_per_s']:.1f} sent/s ({raw['batch']} at a time, in the clients' order; CPU "
          f"{raw['clients_loop_cpu_ms']:.2f} ms a sentence)", flush=True)
    for engine in engines:
        one, many = figures["rows"][f"{engine} 1"], figures["rows"][f"{engine} {max(clients)}"]
        figures[f"{engine}_p50_vs_raw_batch1"] = one["p50_ms"] / raw["batch1_median_ms"]
        figures[f"{engine}_throughput_vs_raw_batched"] = many["sentences_per_s"] / raw["batched_sentences_per_s"]
        figures[f"{engine}_throughput_vs_raw_clients_loop"] = (many["sentences_per_s"]
                                                               / raw["clients_loop_sentences_per_s"])
        print(f"decode.engine={engine}: one client's p50 / raw batch-1 time {figures[f'{engine}_p50_vs_raw_batch1']:.2f}x "
              f"(goal: at most 1.2x); {max(clients)} clients' throughput / raw batched "
              f"{figures[f'{engine}_throughput_vs_raw_batched']:.2f}x (goal: at least 1.0x), / raw "
              f"{raw['batch']} at a time {figures[f'{engine}_throughput_vs_raw_clients_loop']:.2f}x", flush=True)
    return figures


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
    parser.add_argument("--hostile", type=float, default=0, metavar="SECONDS",
                        help="measure the server under hostile traffic instead: SECONDS clean, then SECONDS with "
                             "one request in ten a bad one")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with --hostile, alternate the clean and the hostile load in this many parts each; with "
                             "--engines, the server's loads and raw CTranslate2's")
    parser.add_argument("--engines", metavar="LIST", help="serve once per decode.engine in LIST (auto,torch,...) "
                        "and race raw CTranslate2 instead")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    sentences = sentences_of(args.run_dir, args.sentences)
    if args.engines:
        figures = {"cpu": os.cpu_count(), "cpu_name": cpu_name(), "sentences": len(sentences),
                   **engines_race(args.run_dir, sentences, clients, args.seconds, args.engines.split(","),
                                  args.serve_options, args.rounds)}
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return
    if args.hostile:
        figures = {"cpu": os.cpu_count(), "cpu_name": cpu_name(), **hostile(args.run_dir, sentences, max(clients),
                                                                             args.hostile, args.serve_options,
                                                                             args.rounds)}
        print(f"hostile traffic, {max(clients)} clients, {args.hostile:.0f} s clean then {args.hostile:.0f} s with 10% "
              f"bad requests ({', '.join(f'{k} {n}' for k, n in figures['bad_requests'].items())}): "
              f"{figures['good_failed']} of {figures['good_requests'] + figures['good_failed']} good requests failed; "
              f"p99 of the good {figures['p99_ms']:.0f} ms against {figures['clean_p99_ms']:.0f} ms clean "
              f"({figures['p99_ratio']:.2f}x); bad requests answered 5xx: {figures['bad_answered_5xx']}; RSS "
              f"{figures['rss_start_mib']:.0f} MiB after the warm-up, {figures['rss_end_mib']:.0f} MiB at the end "
              f"({100 * (figures['rss_end_mib'] / figures['rss_start_mib'] - 1):+.1f}%; after each part: "
              f"{', '.join(f'{m:.0f}' for m in figures['rss_mib'][1:])}); server up at the end: "
              f"{figures['server_up_at_end']}; server log: {figures['log_lines']} lines, "
              f"{figures['log_tracebacks']} tracebacks", flush=True)
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))
        return
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
