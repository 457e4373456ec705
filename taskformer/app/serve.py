"""``taskformer serve``: trained runs behind an HTTP API and a web page (docs/serve.md).

The server itself is :mod:`taskformer.app.server` (FastAPI) run by uvicorn; both come with the
``serve`` extra and are imported only when the command runs.
"""
from __future__ import annotations

import gc
import ipaddress
import logging
import math
import re
import signal
import socket
import sys
from typing import TYPE_CHECKING

import click

from taskformer.core.errors import TaskformerError
from taskformer.plugins.sections import visible

if TYPE_CHECKING:
    from taskformer.plugins.run import Run

API_KEY_ENV = "TASKFORMER_API_KEY"
API_KEY_CHARS = re.compile(r"[!-~]+")  # visible ASCII: what an HTTP header carries unchanged


class LogLines(logging.Formatter):
    """The server's log lines with their control characters visible: an error may quote a client's
    text, which must not reach the terminal (or a log viewer) raw."""

    def format(self, record: logging.LogRecord) -> str:
        return visible(super().format(record))


class Stderr(logging.StreamHandler):
    """A handler that writes to ``sys.stderr`` as it is when a record comes, not as it was when the
    server started: a server run inside another program (a test's runner) outlives the stream it began with."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


LOGGING = {  # uvicorn's loggers and asyncio's, every record through LogLines
    "version": 1, "disable_existing_loggers": False,
    "formatters": {"lines": {"()": LogLines, "fmt": "%(levelname)s: %(message)s"}},
    "handlers": {"stderr": {"class": "taskformer.app.serve.Stderr", "formatter": "lines"}},
    "loggers": {"uvicorn": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
                "asyncio": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}},
}


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def named_runs(specs: tuple[str, ...]) -> dict[str, Run]:
    """``RUN_DIR`` or ``NAME=RUN_DIR`` -> loaded runs by name (a run's default name is its task's)."""
    from taskformer.app import runner

    runs = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep:
            name, path = "", spec
        run = runner.load(path)
        name = name or run.task.name
        if name in runs:
            raise TaskformerError(f"two runs are served as {name!r}; name them apart with NAME=RUN_DIR")
        if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise TaskformerError(f"{spec}: a model name may hold letters, digits, '-', '_' and '.' only")
        runs[name] = run
    return runs


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: a free one), refused with one Error line if taken."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as e:
        raise TaskformerError(f"--host/--port: cannot listen on {host}:{port} ({e.strerror or e})") from None
    return sock


def decode_threads(runs: dict) -> int:
    """torch's threads for the decodes: one core fewer than this process may use (at least one, at most
    torch's own choice or the run's ``train.threads``), the core left being the event loop's; every core
    where each run decodes with CTranslate2 (``decode.engine``).

    Under load the event loop (HTTP, JSON, the batcher) is busy whenever a decode runs. OpenMP's workers
    keep spinning for a while after each parallel region, and a decode step is a chain of small
    kernels, so a worker on the event loop's core mostly spins there while the loop waits for it
    (docs/benchmarks.md has the measurement). CTranslate2 instead runs one worker of one thread per
    core (it splits a batch between them, and the server keeps a batch in flight per worker), outside
    the GIL: the event loop takes its share of a core between their steps.
    """
    import torch

    from taskformer.app import hooks
    from taskformer.app.resources import usable_cores

    workers = all(hooks.engine_choice(run.task, run.model, run.config).engine == "ctranslate2" for run in runs.values())
    return max(1, min(torch.get_num_threads(), usable_cores() - (0 if workers else 1)))


@click.command("serve")
@click.argument("run_dirs", nargs=-1, required=True, metavar="[NAME=]RUN_DIR ...")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (not loopback: "
              "needs an API key).")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True, help="Port (0: any free one).")
@click.option("--max-batch", type=click.IntRange(1, 4096), default=32, show_default=True,
              help="Sentences decoded together across concurrent requests.")
@click.option("--max-wait-ms", type=click.FloatRange(0, 60_000), default=0.0, show_default=True,
              help="How long a batch waits for others to share it once the decoder is free (0: what arrived "
              "while the last batch decoded goes at once; beside another batch decoding, a worker waits a "
              "little for its share, docs/serve.md).")
@click.option("--max-inputs", type=click.IntRange(1, 10_000), default=64, show_default=True, help="Inputs per request.")
@click.option("--max-chars", type=click.IntRange(1, 1_000_000), default=2000, show_default=True,
              help="Characters per input.")  # a request body holds at most 1 MiB anyway
@click.option("--max-queue", type=click.IntRange(1, 1_000_000), default=1024, show_default=True,
              help="Sentences waiting per model before requests get 503.")
@click.option("--threads", type=click.IntRange(min=1), help="torch threads for decoding, at most the cores this "
              "process may use  [default: one core fewer, at least 1]")
@click.option("--api-key", envvar=API_KEY_ENV, help=f"Bearer token every API request must carry (or ${API_KEY_ENV}, "
              "which other users cannot read from the process list).")
@click.option("--set", "overrides", multiple=True, metavar="decode.KEY=VALUE",
              help="A decoding setting for every served run (a request may change the ones its model lists).")
def command(run_dirs, host, port, max_batch, max_wait_ms, max_inputs, max_chars, max_queue, threads, api_key,
            overrides) -> None:
    """Serve trained runs over HTTP: a JSON API, a web page at /, metrics at /metrics.

    Each RUN_DIR is served under its task's name, or as NAME=RUN_DIR. SIGTERM or Ctrl-C finishes
    the requests in flight, then exits; a second one exits at once. docs/serve.md has the API.
    """
    import torch

    from taskformer.app import resources, runner

    try:
        import uvicorn

        from taskformer.app.server import Limits, create_app
        from taskformer.app.uvicorn_server import Uvicorn, http_protocol
    except ImportError as e:
        raise TaskformerError(f"taskformer serve needs the serve extra ({e.name} is missing): "
                              "pip install 'taskformer[serve]'") from None
    if not math.isfinite(max_wait_ms):
        raise TaskformerError(f"--max-wait-ms must be a number of milliseconds, got {max_wait_ms}")
    if threads:
        resources.checked_threads(threads)
    if api_key is not None and not API_KEY_CHARS.fullmatch(api_key):
        raise TaskformerError("--api-key: a key is printable ASCII without spaces (what a client can send in an "
                              "'Authorization: Bearer KEY' header)")
    if not is_loopback(host) and not api_key:
        raise TaskformerError(f"--host {host} is reachable from other machines: give --api-key (or set "
                              f"${API_KEY_ENV}); without one, serve on 127.0.0.1")
    runs = named_runs(run_dirs)
    for name, run in runs.items():  # every run takes the settings: one its model does not use is refused
        try:
            runner.set_decoding(run, overrides, "serve --set")
        except TaskformerError as e:
            raise TaskformerError(f"{name}: {e}") from None
    limits = Limits(max_batch=max_batch, max_wait_ms=max_wait_ms, max_inputs=max_inputs, max_chars=max_chars,
                    max_queue=max_queue)
    # After loading (a run's train.threads sets it too), before the app: CTranslate2's workers follow it.
    torch.set_num_threads(threads or decode_threads(runs))
    app = create_app(runs, limits, api_key or None)
    sock = bind(host, port)  # a refused address changes nothing in this process
    # What is alive now (the runs, torch, the app) lives as long as the server. Frozen, it is left out of
    # the collector's full passes, each of which would otherwise hold the event loop for a fraction of a
    # second under load (the p99 latency).
    gc.collect()
    gc.freeze()
    shown = f"[{host}]" if ":" in host else host
    banner = (f"serving {', '.join(runs)} on http://{shown}:{sock.getsockname()[1]}/ with {torch.get_num_threads()} "
              "decoding thread(s) (Ctrl-C or SIGTERM stops)")
    # asyncio's event loop even where uvloop is installed: under 32 clients uvloop's made smaller batches and
    # fewer sentences a second (docs/serve.md); httptools' parser, with the head bounded
    config = uvicorn.Config(app, loop="asyncio", http=http_protocol(), log_level="warning", access_log=False,
                            log_config=LOGGING)
    # uvicorn stops on SIGINT whatever the process inherited, then raises it again to the handler it
    # found: one inherited as ignored (a background job's) would end the server silently with status 0.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        Uvicorn(config, banner, app.state.served).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raises the Ctrl-C again once the requests in flight are answered
        click.echo("stopped serving (Ctrl-C)", err=True)
        raise SystemExit(130) from None
