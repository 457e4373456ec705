"""Decoding keeps a bounded number of oneDNN kernels, whatever sizes of batches it is given, so the
memory of a long-running server stays flat under load (it grew by hundreds of megabytes)."""
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY, run_cli

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's

# Batches of 1 to 120 sentences of 1 to 10 symbols through the Python API, as a server decodes them:
# every batch, and every step in which some of its sentences have finished, has a new number of rows.
DECODE = """
import random, re, sys, taskformer
def rss_kib():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
model = taskformer.load(sys.argv[1])
draw = random.Random(0)
def batch(n):
    return [" ".join(str(draw.randint(1, 10)) for _ in range(draw.randint(1, 10))) for _ in range(n)]
model.predict(batch(64))
before = rss_kib()
for n in range(1, 121):
    model.predict(batch(n))
print((rss_kib() - before) // 1024)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident memory from /proc")
@pytest.mark.parametrize("bf16", ["false", "auto"])  # auto: bf16 where the CPU has it (attention's products differ)
def test_decoding_batches_of_every_size_keeps_the_memory_flat(tmp_path, bf16):
    run = tmp_path / "run"
    assert run_cli("run", "copy", "--out", str(run), *TINY, "--set", f"train.bf16={bf16}",
                   "--set", "train.threads=1").returncode == 0
    grown = subprocess.run([sys.executable, "-c", DECODE, str(run)], capture_output=True, text=True, timeout=600)
    assert grown.returncode == 0, grown.stderr
    assert int(grown.stdout) < 60, f"{grown.stdout.strip()} MiB more after 120 batches"  # a kernel is ~0.6 MB
