"""Two CPU processes under DistributedDataParallel update the model exactly as one process would."""
import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from conftest import run_cli

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

CPU = {"CUDA_VISIBLE_DEVICES": ""}  # these are CPU (gloo) tests, also on a machine with one GPU
COMMON = ["--set", "data.train_size=2000", "--set", "train.max_steps=6", "--set", "train.warmup=0",
          "--set", "train.lr=1e-3", "--quiet"]


def last_weights(run_dir):
    return load_file(sorted((run_dir / "checkpoints").glob("step-*"))[-1] / "model.safetensors")


def info(run_dir):
    return json.loads((run_dir / "result.json").read_text())["info"]


def test_two_processes_match_one_process_over_the_same_global_batches(tmp_path):
    two, one = tmp_path / "two", tmp_path / "one"
    ddp = run_cli("run", "copy", "--nproc", "2", "--out", str(two), *COMMON, env=CPU)
    assert ddp.returncode == 0, ddp.stderr
    # The ranks share out the threads torch takes here. A spawned rank starts a fresh torch, which
    # would take all of them again, and the ranks would fight over the cores.
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
                           capture_output=True, text=True, check=True)
    threads = max(1, int(fresh.stdout) // 2)
    # One process summing the gradients of the same two batches per update (gradient accumulation),
    # with a rank's threads: the same kernels, so the sums round alike.
    single = run_cli("run", "copy", "--set", "train.accumulate=2", "--set", f"train.threads={threads}",
                     "--out", str(one), *COMMON, env=CPU)
    assert single.returncode == 0, single.stderr
    a, b = last_weights(two), last_weights(one)
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-4
    assert info(two)["threads"] == threads
    assert info(two)["train_tokens"] == info(one)["train_tokens"]  # both ranks' tokens, not rank 0's
    # The comparison has teeth: one process stepping on single batches ends elsewhere.
    other = tmp_path / "other"
    assert run_cli("run", "copy", "--out", str(other), *COMMON, env=CPU).returncode == 0
    c = last_weights(other)
    assert max(float((a[k] - c[k]).abs().max()) for k in a) > 1e-3


def test_a_failing_rank_ends_the_run_with_a_message(tmp_path):
    result = run_cli("run", "copy", "--nproc", "2", "--out", str(tmp_path / "r"), "--set", "train.lr=1e30",
                     "--set", "train.warmup=0", "--set", "train.clip=0", "--quiet", timeout=300, env=CPU)
    assert result.returncode == 2
    assert "training loss became" in result.stderr and "Traceback" not in result.stderr
