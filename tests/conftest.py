"""Shared test helpers: run the CLI in-process and locate fixture data."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from taskformer import Task, TaskData, hookimpl, read_tsv, symbols
from taskformer.app.cli import main
from taskformer.plugins.manager import plugins

DATA = Path(__file__).parent / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# prepared data is cached per test process (each xdist worker has its own), never in the user's own cache folder
os.environ["TASKFORMER_CACHE"] = tempfile.mkdtemp(prefix="taskformer-test-cache-")
# and the Arrow files the datasets library makes of a user's tables go to a scratch folder too
os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["TASKFORMER_CACHE"], "hf-datasets")


def share_the_cores() -> None:
    """Under pytest-xdist (``-n N``) each worker takes its share of the cores for torch, and so do the
    commands it starts (OMP_NUM_THREADS): N workers each spinning on every core would wait on each other."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers > 1:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        os.environ["OMP_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)


share_the_cores()


@pytest.fixture(scope="session", autouse=True)
def scratch_cwd(tmp_path_factory):
    """Every test runs in a scratch folder: a command that writes to the working directory (a run
    without --out makes runs/TASK/<time>) never writes into the checkout the tests were started from."""
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path_factory.mktemp("cwd"))
        yield


@pytest.fixture
def cli():
    """``cli("run", "copy", ...)`` -> click Result (exit_code, stdout, stderr); never raises."""
    def invoke(*args: str, input: str | None = None):
        return CliRunner().invoke(main, list(args), input=input, catch_exceptions=False, env={"COLUMNS": "200"})
    return invoke


def run_cli(*args: str, input: str | None = None, env: dict | None = None, timeout: int = 600):
    """The installed console script in a subprocess: for signals, stdin piping and entry points."""
    return subprocess.run([sys.executable, "-m", "taskformer", *args], input=input, capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": "200", **(env or {})}, timeout=timeout)


def run_here(*args: str, input: str | None = None) -> subprocess.CompletedProcess:
    """``run_cli``'s answer from click's runner in this process, for a test about what a command says rather
    than about the process: no fresh interpreter that imports torch again (seconds a call on two cores)."""
    result = CliRunner().invoke(main, list(args), input=input, catch_exceptions=False, env={"COLUMNS": "200"})
    return subprocess.CompletedProcess(["taskformer", *args], result.exit_code, result.stdout, result.stderr)


@pytest.fixture
def cpu_hog():
    """A busy loop beside one test: what a shared CI machine does to a run (one core of two, here).

    The loop ends by itself after ten minutes, so a test that dies cannot leave it spinning.
    """
    loop = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", loop])]
    yield hogs
    for hog in hogs:
        hog.kill()
        hog.wait()


@pytest.fixture
def data_dir():
    return DATA


@pytest.fixture
def register():
    """``register(plugin, name)`` adds a plugin to the running manager for one test (the CLI fixture sees it)."""
    added = []

    def add(plugin, name):
        plugins().pm.register(plugin, name=name)
        plugins().refresh()
        added.append(name)
        return plugin

    yield add
    for name in added:
        plugins().pm.unregister(name=name)
    plugins().refresh()


def task_data(task: str, data_dir, *overrides: str):
    """What ``task``'s data hook returns for ``data_dir`` under ``--set`` overrides, checked by the runner."""
    from taskformer.app.hooks import load_data
    from taskformer.app.prepare import make_config

    declared = plugins().task(task)
    return load_data(declared, make_config(declared, None, list(overrides), None), data_dir)


@pytest.fixture
def data_copy(tmp_path):
    """``data_copy("multi30k")`` -> a copy of that fixture folder under tmp_path, free to damage."""
    import shutil

    return lambda name: shutil.copytree(DATA / name, tmp_path / name)


# A few seconds of `run copy`: enough for a run directory with every file, not for a good model.
TINY = ["--quiet", "--set", "data.train_size=40", "--set", "data.val_size=4", "--set", "data.test_size=4",
        "--set", "train.max_steps=2"]


@pytest.fixture(scope="session")
def default_copy_run(tmp_path_factory):
    """``(run dir, click Result)`` of one full default ``taskformer run copy`` (about 30 s), shared by
    the test modules that need a trained model; they read it and must not change it."""
    out = tmp_path_factory.mktemp("default") / "copy"
    result = CliRunner().invoke(main, ["run", "copy", "--out", str(out), "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out, result


@pytest.fixture(scope="session")
def finished(tmp_path_factory):
    """A finished tiny copy run, made once and shared by every test module that needs one: tests read it
    or copy it (shutil.copytree) before they change anything; one that changed it in place fails the session."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_cli("run", "copy", "--out", str(out), *TINY).returncode == 0
    before = stamps(out)
    yield out
    assert stamps(out) == before, "a test changed the shared finished run in place"


def stamps(folder: Path) -> dict:
    """Each file and folder under ``folder``: its size, mode and modification time."""
    return {p.relative_to(folder): (p.stat().st_size, p.stat().st_mode, p.stat().st_mtime_ns)
            for p in [folder, *folder.rglob("*")]}


class Reversing:
    """A plugin task that reverses digit strings read from DIR/pairs.tsv and counts its data hook's
    calls (the cache tests' plugin). ``lazy`` hands every split over as a datasets.Dataset instead of a list."""

    MODEL = {"d_model": 32, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 64, "dropout": 0.0, "max_len": 16}

    def __init__(self, name: str, lazy: bool = False):
        self.calls, self.lazy = 0, lazy
        self.task = Task(name, "Reverse digits read from a file", metric="exact_match",
                         defaults={"model": self.MODEL,
                                   "train": {"epochs": 1, "max_tokens": 256, "warmup": 2, "threads": 1}})

    @hookimpl
    def taskformer_tasks(self):
        return [self.task]

    @hookimpl
    def taskformer_data(self, config, data_dir):
        self.calls += 1
        pairs = read_tsv(data_dir / "pairs.tsv")
        splits = {"train": pairs, "val": pairs[:4], "test": pairs[4:8]}
        if self.lazy:
            import datasets

            splits = {name: datasets.Dataset.from_dict({"source": [s for s, _ in rows], "target": [t for _, t in rows]})
                      for name, rows in splits.items()}
        return TaskData(tokenizer=symbols(list("0123456789")), splits=splits)

    @hookimpl
    def taskformer_metrics(self, hypotheses, references):
        return {"exact_match": 100.0 * sum(h == r for h, r in zip(hypotheses, references)) / len(references)}


@pytest.fixture
def reverse_data(tmp_path):
    """A folder with pairs.tsv: 40 digit strings of 1 to 6 digits and their reversals (the Reversing task's data)."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = [" ".join(f"{(i * 7 + j) % 10}" for j in range(1 + i % 6)) for i in range(40)]
    (folder / "pairs.tsv").write_text("".join(f"{r}\t{' '.join(reversed(r.split()))}\n" for r in rows))
    return folder


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A prepared-data cache folder of the test's own (TASKFORMER_CACHE)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("TASKFORMER_CACHE", str(folder))
    return folder


def run_reversing(cli, task: str, folder, out, steps: int, *more):
    """``taskformer run TASK --data-dir FOLDER --out OUT`` for ``steps`` updates, checked to succeed cleanly."""
    result = cli("run", task, "--data-dir", str(folder), "--out", str(out), "--set", f"train.max_steps={steps}", *more)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output
    return result


def on_a_terminal(*args: str) -> str:
    """What ``taskformer ARGS`` shows on a terminal (a pseudo-terminal as its stdout)."""
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "taskformer", *args], stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    said = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        said += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0, proc.stderr and proc.stderr.read()
    return said.decode().replace("\r\n", "\n")
