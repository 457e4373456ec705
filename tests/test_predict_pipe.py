"""`taskformer predict` as a pipe filter: one line out per line in, streamed, quiet when the reader leaves."""
import signal
import subprocess
import sys

import pytest

from conftest import run_here

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipe") / "run"
    result = run_here("run", "copy", "--out", str(out), "--quiet", "--set", "data.train_size=200", "--set",
                      "data.val_size=4", "--set", "data.test_size=4", "--set", "train.max_steps=2")
    assert result.returncode == 0, result.stderr
    return out


def predict(run_dir, *args):
    """`predict` in a child that takes Ctrl-C as a terminal's foreground job does, also when pytest runs
    in the background (a shell starts background jobs with SIGINT ignored, and children inherit that)."""
    return subprocess.Popen([sys.executable, "-m", "taskformer", "predict", str(run_dir), *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def test_undecodable_input_is_replaced_with_a_warning_and_every_line_gets_an_output(run_dir, cli):
    result = cli("predict", str(run_dir), input=b"1 2 3\n\xff\xfe 4\n5 6\n")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split("\n")) - 1 == 3
    assert "stdin line 2 is not valid UTF-8" in result.stderr


def test_a_last_line_without_newline_and_a_bom_are_handled(run_dir, cli):
    with_bom = cli("predict", str(run_dir), input="\ufeff1 2 3\n4 5".encode())
    plain = cli("predict", str(run_dir), input="1 2 3\n4 5\n")
    assert with_bom.exit_code == 0 and with_bom.stdout == plain.stdout
    assert len(plain.stdout.splitlines()) == 2


def test_outputs_stream_while_stdin_is_still_open(run_dir):
    proc = predict(run_dir, "--beam", "1")
    try:
        proc.stdin.write(b"1 2 3\n")
        proc.stdin.flush()
        first = proc.stdout.readline()  # would block forever if predict waited for the end of stdin
        assert first.endswith(b"\n")
        proc.stdin.write(b"4 5 6\n")
        proc.stdin.flush()
        assert proc.stdout.readline().endswith(b"\n")
        proc.send_signal(signal.SIGINT)  # what was decoded is out already; the interrupt is one line
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and out == b""
    assert b"Traceback" not in err and err.decode().strip().splitlines() == ["interrupted"]


def test_a_reader_that_leaves_early_ends_predict_quietly(run_dir):
    proc = predict(run_dir, "--beam", "1")
    lines = b"".join(b"%d %d 3\n" % (i % 9 + 1, i % 7 + 1) for i in range(2000))  # several decoding batches
    proc.stdin.write(lines)
    proc.stdin.close()
    assert proc.stdout.readline().endswith(b"\n")
    proc.stdout.close()  # `| head -1`
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 141, err
    assert err == b""
