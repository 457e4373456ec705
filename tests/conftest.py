"""Shared test helpers: run the CLI in-process and locate fixture data."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskformer.app.cli import main

DATA = Path(__file__).parent / "data"
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never download
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


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
def data_dir():
    return DATA


# A few seconds of `run copy`: enough for a run directory with every file, not for a good model.
TINY = ["--quiet", "--set", "data.train_size=40", "--set", "data.val_size=4", "--set", "data.test_size=4",
        "--set", "train.max_steps=2"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny copy run (per test module)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_cli("run", "copy", "--out", str(out), *TINY).returncode == 0
    return out
