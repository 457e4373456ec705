"""Resources: runs that cannot fit are refused before they start, run files are read within bounds,
and a full disk is named and leaves the run resumable or restartable."""
import errno
import os
import resource
import shutil
import subprocess
import sys

import pytest
from safetensors import SafetensorError
from safetensors.torch import load_file

from conftest import TINY, run_cli
from taskformer.core import optimizer_state

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's


def one_line_error(result, expected):
    assert result.exit_code == 2, result.output
    assert expected in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def limited_run(*args: str, timeout: int = 300):
    """The CLI in a process that may map at most 4 GiB: a run that tried to make what it was asked
    for would fail there within seconds instead of filling this machine's memory."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    return subprocess.run([sys.executable, "-m", "taskformer", *args], capture_output=True, text=True,
                          preexec_fn=limit, timeout=timeout, env={**os.environ, "COLUMNS": "200"})


# Each is about a terabyte or more (the data.vocab=100000000 needs about 115 GiB on copy).
@pytest.mark.parametrize("setting", ["data.vocab=1000000000", "data.train_size=1000000000000",
                                     "model.d_model=65536"])
def test_a_run_that_cannot_fit_in_memory_is_refused_before_it_starts(tmp_path, setting):
    out = tmp_path / "run"
    result = limited_run("run", "copy", "--out", str(out), "--quiet", "--set", setting)
    assert result.returncode == 2, result.stderr
    assert "does not fit in memory: it needs about" in result.stderr and "GiB is available" in result.stderr
    assert result.stderr.strip().endswith(f"lower {setting}"), result.stderr  # the option at fault, named
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not out.exists()  # refused before the run directory was made


def finished_copy(finished, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "result.json", "metrics.jsonl",
                                  "outputs-test.jsonl"])
def test_a_run_file_too_large_to_be_ours_is_refused_unread(finished, tmp_path, cli, name):
    run = finished_copy(finished, tmp_path)
    os.truncate(run / name, (1 << 30) + 1)  # sparse: costs no disk, but reading it would take a GiB
    one_line_error(cli("report", str(run)), f"{name}: 1,073,741,825 bytes, more than")


@pytest.mark.parametrize("name", ["tokenizer.json", "metrics.jsonl", "outputs-val.jsonl"])
def test_a_fifo_among_the_run_files_does_not_block(finished, tmp_path, name):
    run = finished_copy(finished, tmp_path)
    (run / name).unlink()
    os.mkfifo(run / name)  # opening it for reading would wait for a writer forever
    result = run_cli("report", str(run), timeout=120)
    assert result.returncode == 2 and f"{name}: not a regular file" in result.stderr, result.stderr


def full_disk(error, after: int = 0):
    """A save of the optimizer state of a checkpoint that fails as on a full disk, after ``after`` calls."""
    save, calls = optimizer_state.save_file, []

    def fake(*args, **kwargs):
        calls.append(1)
        if len(calls) > after:
            raise error
        return save(*args, **kwargs)
    return fake


# What Python raises on a full disk, and what safetensors' writer makes of it.
ERRORS = [OSError(errno.ENOSPC, "No space left on device"),
          SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")]


@pytest.mark.parametrize("error", ERRORS, ids=["ENOSPC", "safetensors"])
def test_a_full_disk_at_the_first_checkpoint_is_named_and_the_run_starts_again(cli, tmp_path, monkeypatch, error):
    out = tmp_path / "run"
    monkeypatch.setattr(optimizer_state, "save_file", full_disk(error))
    one_line_error(cli("run", "copy", "--out", str(out), *TINY), "no space left on ")
    monkeypatch.undo()
    assert not out.exists()  # nothing to resume, so the failed run left nothing, not half a checkpoint
    again = cli("run", "copy", "--out", str(out), *TINY)
    assert again.exit_code == 0, again.output
    assert (out / "result.json").exists()


def test_the_message_says_how_much_space_a_checkpoint_needs(cli, tmp_path, monkeypatch):
    out, whole = tmp_path / "run", tmp_path / "whole"
    assert cli("run", "copy", "--out", str(whole), *TINY).exit_code == 0
    # the model's weights as saved (a tied matrix once)
    params = sum(t.numel() for t in load_file(whole / "model.safetensors").values())
    monkeypatch.setattr(optimizer_state, "save_file", full_disk(ERRORS[0]))
    result = cli("run", "copy", "--out", str(out), *TINY)
    # weights and Adam's two moments, 4 bytes a number
    assert f"(needed about {3 * 4 * params / 1e6:.1f} MB for a checkpoint of {out})" in result.stderr


def test_a_full_disk_later_leaves_the_last_checkpoint_to_resume_from(cli, tmp_path, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.setattr(optimizer_state, "save_file", full_disk(ERRORS[1], after=1))
    one_line_error(cli("run", "copy", "--out", str(out), *TINY, "--set", "train.save_every=1"),
                   f"then resume with: taskformer run --resume {out}")
    monkeypatch.undo()
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-000000001"]  # intact, nothing half-written
    resumed = cli("run", "--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    assert (out / "result.json").exists()


def test_a_weights_file_alone_is_the_users_not_a_failed_run(cli, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"my weights")
    one_line_error(cli("run", "copy", "--out", str(out), *TINY), "holds no taskformer run")
    assert (out / "model.safetensors").read_bytes() == b"my weights"


BIG_TENSOR_FAULTS = """
import resource, sys, torch
from taskformer.app.resources import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(2**24)  # 64 MB, above any threshold glibc would serve from its heap by itself
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(*[faults() for _ in range(10)])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
                    reason="glibc's malloc only")
def test_a_training_process_reuses_freed_memory_instead_of_faulting_it_in_again():
    def fresh_allocations(mode):
        """Which of nine 64 MB allocations after the first had all their 16,384 pages mapped afresh."""
        done = subprocess.run([sys.executable, "-c", BIG_TENSOR_FAULTS, mode], capture_output=True,
                              text=True, timeout=120, check=True)
        return [int(n) > 8000 for n in done.stdout.split()[1:]]
    assert fresh_allocations("default") == [True] * 9  # unmapped on free, mapped again every time
    # Kept: reused. In some runs (the process's memory layout varies from run to run) the first few
    # allocations do not fit the freed block and the heap grows a few times more; after that every one
    # reuses it, so the last four all do.
    kept = fresh_allocations("keep")
    assert not any(kept[-4:]), kept
