"""A run killed with SIGKILL inside a checkpoint write resumes to the uninterrupted run's weights.

The kill lands at an exact point of the write (tests/killpoint.py): a random kill rarely hits a
write of a few milliseconds, and these are the points where a half-done write could be left.
"""
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from conftest import run_cli

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

KILLPOINT = Path(__file__).with_name("killpoint.py")
# Seven checkpoint writes: steps 4 and 4 again (an epoch of 4 updates ends), 6 (an evaluation), 8 and 8
# again, 12 (an evaluation) and 12 again (with why the run stopped).
TINY = ["--set", "data.train_size=400", "--set", "data.val_size=16", "--set", "data.test_size=8", "--set",
        "train.epochs=0", "--set", "train.max_steps=12", "--set", "train.eval_every=6", "--set", "train.save_every=4",
        "--set", "train.keep_last=2", "--set", "train.threads=1", "--set", "train.bf16=false", "--quiet"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run never killed, with the settings of every trial."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert run_cli("run", "copy", "--out", str(out), *TINY).returncode == 0
    return out


def evaluations(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "elapsed"} for row in rows if row["event"] == "eval"]


@pytest.mark.parametrize("point, lands", [
    ("checkpoint:3:os.replace", "(step 6), event"),  # the temporary folder is whole, not yet renamed into place
    ("checkpoint:4:os.unlink#3", "(step 8), event"),  # pruning step 4: two of its files deleted
    ("checkpoint:7:os.unlink#3", "(step 12), event"),  # step 12 saved again: two files of its first deleted
])
def test_a_kill_inside_a_checkpoint_write_resumes_to_the_uninterrupted_weights(reference, tmp_path, point, lands):
    out = tmp_path / "run"
    killed = subprocess.run([sys.executable, str(KILLPOINT), "--kill", point, "run", "copy", "--out", str(out), *TINY],
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert f"killpoint: checkpoint {point.split(':')[1]} {lands}" in killed.stderr
    resumed = run_cli("run", "--resume", str(out), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert "warning" not in resumed.stderr  # no half checkpoint taken for a folder of the user's
    a, b = load_file(reference / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    assert evaluations(out) == evaluations(reference)
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000000008", "step-000000012"]
    assert run_cli("predict", str(out), "1 2 3").returncode == 0
