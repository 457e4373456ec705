"""Precision follows the hardware: bf16 only where it is native, fp32 elsewhere, on every CPU."""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from conftest import run_cli
from taskformer.core import precision
from taskformer.core.engine import lr_factor

# What an AVX2-only CPU offers, imposed on a faster one (each library reads its own variable).
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
TINY = ["--quiet", "--set", "train.max_steps=2", "--set", "data.train_size=200", "--set", "data.val_size=20",
        "--set", "data.test_size=20"]


@pytest.mark.slow
def test_forced_avx2_makes_bf16_not_native_and_says_why():
    code = "from taskformer.core import precision; print(precision.bf16_native('cpu'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **AVX2},
                         check=True).stdout
    assert out.startswith("(False, ")
    assert "AVX2" in out or "ONEDNN_MAX_CPU_ISA" in out


@pytest.mark.filterwarnings("ignore:train.bf16=true")  # the warning itself: see the CLI test below
def test_auto_is_the_hardware_decision_and_false_always_means_fp32():
    cpu = torch.device("cpu")
    native, why = precision.bf16_native("cpu")
    assert precision.choose("auto", cpu) == (native, f"auto: {why}")
    assert precision.choose(False, cpu)[0] is False
    assert precision.choose("false", cpu)[0] is False
    assert precision.choose(True, cpu)[0] is True  # forced, even where emulated


@pytest.mark.parametrize("value", ["maybe", "2", "bf16"])
def test_a_bad_bf16_setting_is_a_one_line_error(cli, value, tmp_path):
    result = cli("run", "copy", "--out", str(tmp_path / "run"), "--set", f"train.bf16={value}")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"Error: config: train.bf16 must be auto, true or false, not '{value}'"]


@pytest.mark.slow
def test_a_run_on_an_avx2_cpu_trains_in_fp32_and_records_why(tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", "copy", "--out", str(out), *TINY, env=AVX2)
    assert result.returncode == 0, result.stderr
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["precision"].startswith("fp32 (auto: ")
    assert "precision" in (out / "report.txt").read_text()


@pytest.mark.slow
def test_forcing_bf16_where_it_is_emulated_warns_in_one_line(tmp_path):
    out = tmp_path / "run"
    result = run_cli("run", "copy", "--out", str(out), *TINY, "--set", "train.bf16=true", env=AVX2)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "bf16" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: train.bf16=true but bf16 is not native")
    assert json.loads((out / "result.json").read_text())["info"]["precision"].startswith("bf16 (train.bf16=true")


def test_linear_schedule_warms_up_then_falls_to_zero_at_the_last_update():
    warmup, total = 10, 50
    factors = [lr_factor(s, warmup, "linear", total) for s in range(1, total + 1)]
    assert factors[:warmup] == [s / warmup for s in range(1, warmup + 1)]
    assert max(factors) == 1.0 and factors.index(1.0) == warmup - 1
    assert all(a > b for a, b in zip(factors[warmup - 1 :], factors[warmup:]))
    assert factors[-1] == pytest.approx(1 / (total - warmup + 1))
    # the paper's schedule is unchanged: 1/sqrt(step) after the warm-up
    assert lr_factor(40, warmup) == pytest.approx(math.sqrt(warmup / 40))


@pytest.mark.slow
def test_a_linear_schedule_run_logs_a_falling_rate(tmp_path, cli):
    out = tmp_path / "run"
    result = cli("run", "copy", "--out", str(out), "--quiet", "--set", "train.schedule=linear",
                 "--set", "train.warmup=2", "--set", "data.train_size=2000", "--set", "train.epochs=1",
                 "--set", "train.log_every=2", "--set", "data.val_size=20", "--set", "data.test_size=20")
    assert result.exit_code == 0, result.output
    rates = [e["lr"] for e in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if e["event"] == "train"]
    assert len(rates) >= 3 and rates == sorted(rates, reverse=True) and rates[-1] < 0.3 * rates[0]


@pytest.mark.slow
def test_a_run_records_its_precision_and_a_damaged_record_is_named_on_resume(tmp_path):
    run = tmp_path / "run"
    assert run_cli("run", "copy", "--out", str(run), *TINY).returncode == 0
    saved = json.loads((run / "config.json").read_text())
    native, why = precision.bf16_native("cpu")
    assert saved["precision"]["device"] == "cpu" and saved["precision"]["bf16_native"] is native
    assert saved["precision"]["why"].split(",")[0] == why.split(",")[0]  # the same units named, not timed
    (run / "result.json").unlink()  # as if it had been stopped: resumable again
    saved["precision"] = {"device": "cpu", "bf16_native": "maybe", "why": ""}
    (run / "config.json").write_text(json.dumps(saved))
    result = run_cli("run", "--resume", str(run), "--quiet")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"Error: {run / 'config.json'}: damaged 'precision' record "
                                                  "(expected device, bf16_native and why)"]
