"""Robustness, round five's open cases: folders that cannot be written, a distillation's folder used
again, a language model's line breaks, and property-based tests over every surface that takes
outside input (``--set``, the data readers, predict's input, the server's JSON) -- one ``Error:``
line naming the culprit, or an answer; never a traceback, never lost work."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, run_cli
from test_robustness import unprivileged, wait_for_checkpoint
from test_robustness_five import LM, TEXT, one_error_line, teacher, text_dir  # noqa: F401 (teacher: a fixture)


def read_only(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode & ~0o222)


def writable(folder: Path) -> None:
    for path in [folder, *folder.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


def files(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# -- an --out that cannot be written: refused before any work, nothing changed ---------------------------------

@pytest.mark.parametrize("dry", [False, True])
@pytest.mark.parametrize("where", ["empty folder", "folder inside"])
def test_an_out_that_cannot_be_written_is_refused_before_any_work(tmp_path, where, dry):
    locked = tmp_path / "locked"
    locked.mkdir()
    out = locked if where == "empty folder" else locked / "new" / "run"
    locked.chmod(0o555)
    try:
        result = subprocess.run(unprivileged("run", "copy", "--out", str(out), *TINY, *(["--dry-run"] if dry else [])),
                                capture_output=True, text=True, timeout=300)
    finally:
        locked.chmod(0o755)
    line = one_error_line(result, f"cannot write {locked} (Permission denied)", "--out")
    assert "loading data" not in result.stderr and "nothing was changed" in line
    assert list(locked.iterdir()) == []  # no probe, no folder left behind


def test_an_out_under_a_file_is_refused_naming_the_file(tmp_path):
    mine = tmp_path / "notes.txt"
    mine.write_text("mine")
    result = run_cli("run", "copy", "--out", str(mine / "run"), *TINY, "--dry-run")
    one_error_line(result, f"{mine}: exists and is not a directory")
    assert mine.read_text() == "mine"


# -- a run directory that becomes read-only while the run writes it ------------------------------------------

SMALL = [*TINY, "--set", "train.epochs=0", "--set", "train.max_steps=6", "--set", "model.d_model=16",
         "--set", "model.n_heads=2", "--set", "model.d_ff=32"]


def read_only_while_running(out: Path, ready, *settings: str) -> subprocess.CompletedProcess:
    """Start a run as a process that file modes bind, make its folder read-only once ``ready()``."""
    proc = subprocess.Popen(unprivileged("run", "copy", "--out", str(out), *SMALL, *settings), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready(proc)
        read_only(out)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        proc.kill()
        writable(out)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_a_run_directory_made_read_only_before_its_first_checkpoint_is_one_error_and_starts_again(tmp_path):
    import time

    out = tmp_path / "run"

    def configured(proc):  # config.json is written before the first update, the first checkpoint after the last
        while not (out / "config.json").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)

    result = read_only_while_running(out, configured)
    if (out / "checkpoints").exists() and any((out / "checkpoints").iterdir()):
        pytest.skip("the run wrote its first checkpoint before its folder was made read-only")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (f"Error: cannot write {out} (Permission denied); once it can be "
                                                      f"written, then start the run again with --out {out}")
    again = run_cli("run", "copy", "--out", str(out), *TINY)  # what the failed start left is cleared
    assert again.returncode == 0, again.stderr
    assert (out / "result.json").exists()


def test_a_run_directory_made_read_only_during_training_keeps_its_last_checkpoint(tmp_path):
    out = tmp_path / "run"
    result = read_only_while_running(out, lambda proc: wait_for_checkpoint(out, 2, proc), "--set", "train.save_every=2")
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [f"Error: cannot write {out} (Permission denied); once it can be written, then resume with: "
                      f"taskformer run --resume {out}"] and "Traceback" not in result.stderr, result.stderr
    kept = sorted((out / "checkpoints").glob("step-*"))
    assert kept and not (out / "result.json").exists()
    resumed = run_cli("run", "--resume", str(out), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((out / "result.json").read_text())["info"]["steps"] == 6


# -- a distillation refused after its decode leaves a folder a new attempt can use ---------------------------

STUDENT = ["--quiet", "--set", "train.epochs=0", "--set", "train.max_steps=1"]


def test_a_folder_left_by_a_distillation_refused_after_its_decode_is_used_again(teacher, tmp_path):  # noqa: F811
    out = tmp_path / "student"
    refused = run_cli("distill", str(teacher), "--out", str(out), "--quiet", "--set", "train.epochs=0",
                      "--time-limit", "0.001")  # the student's start is refused only once the teacher has decoded
    one_error_line(refused, "--time-limit 0.001")
    assert (out / "distill-train.jsonl").exists() and not (out / "result.json").exists()
    listed = run_cli("runs", str(tmp_path))
    assert str(out) not in listed.stdout  # not a run: neither finished nor listed as one
    (tmp_path / "teacher").symlink_to(teacher, target_is_directory=True)  # given relative, through a link
    again = subprocess.run([sys.executable, "-m", "taskformer", "distill", "teacher", "--out", "student", *STUDENT],
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert again.returncode == 0, again.stderr
    record = json.loads((out / "result.json").read_text())
    assert record["info"]["distill"]["count"] == len((out / "distill-train.jsonl").read_text().splitlines())
    page = (out / "report.html").read_text()  # every path the report shows is absolute, links kept as given
    assert f"run directory: {out}" in page and f"{tmp_path / 'teacher'} (one network" in page, page
    mine = tmp_path / "mine"  # a folder holding files of the user's beside a distillation's name stays refused
    mine.mkdir()
    (mine / "distill.json").write_text("{}")
    one_error_line(run_cli("distill", str(teacher), "--out", str(mine), *STUDENT), str(mine), "not empty")
    assert (mine / "distill.json").read_text() == "{}"


# -- a language model's line breaks: kept on a terminal, an answer a line when piped, exact with --json -----

PROMPTS = ["a", "b", "ab", "ba", "aa", "bb", "aab", "bba", "abab", "baba"]


@pytest.fixture(scope="module")
def lines_lm(tmp_path_factory):
    """A tiny language model of a text that is half line breaks: its continuations hold some."""
    import random

    data = tmp_path_factory.mktemp("lines")
    draw = random.Random(0)
    (data / "input.txt").write_text("".join(draw.choice(["ab\n", "a\n", "b\n"]) for _ in range(300)))
    out = tmp_path_factory.mktemp("runs") / "lm"
    result = run_cli("run", "shakespeare-char", "--data-dir", str(data), "--out", str(out), *LM,
                     "--set", "train.max_tokens=256")
    assert result.returncode == 0, result.stderr
    return out


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
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return said.decode().replace("\r\n", "\n")


def test_a_language_models_line_breaks_are_kept_on_a_terminal_and_piped_stays_an_answer_a_line(lines_lm):
    sampled = ["--set", "decode.temperature=3", "--set", "decode.max_new_tokens=30", "--set", "decode.seed=1"]
    exact = run_cli("predict", str(lines_lm), *PROMPTS, *sampled, "--json")
    assert exact.returncode == 0, exact.stderr
    continuations = [json.loads(line)["continuation"] for line in exact.stdout.splitlines()]
    assert len(continuations) == len(PROMPTS) and any("\n" in c for c in continuations), continuations
    piped = run_cli("predict", str(lines_lm), *PROMPTS, *sampled)
    assert piped.stdout.split("\n")[:-1] == [c.replace("\n", " ") for c in continuations]  # an answer a line
    shown = on_a_terminal("predict", str(lines_lm), *PROMPTS, *sampled)
    assert shown == "".join(f"{c}\n\n" for c in continuations)  # as written, a blank line after each
