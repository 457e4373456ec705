"""Shared test helpers: run the CLI in-process and locate fixture data."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskformer.app.cli import main
from taskformer.plugins.manager import plugins

DATA = Path(__file__).parent / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# prepared data is cached per test session, never in the user's own cache folder
os.environ["TASKFORMER_CACHE"] = tempfile.mkdtemp(prefix="taskformer-test-cache-")
# and the Arrow files the datasets library makes of a user's tables go to a scratch folder too
os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["TASKFORMER_CACHE"], "hf-datasets")


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


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny copy run (per test module)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_cli("run", "copy", "--out", str(out), *TINY).returncode == 0
    return out
