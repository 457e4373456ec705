"""Run directories in the formats core/compat.py lists still load (the other two: test_agnews, test_binding)."""
import hashlib
import json
import shutil

import pytest
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from conftest import TINY

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's


def test_a_checkpoint_from_before_the_decay_by_time_resumes(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "copy", "--out", str(out), *TINY, "--set", "train.save_every=1").exit_code == 0
    (out / "result.json").unlink()  # an unfinished run, as a crash leaves it
    state = sorted((out / "checkpoints").glob("step-*"))[-1] / "state.json"
    saved = json.loads(state.read_text())
    del saved["decay"], saved["clock"]
    saved.update(cooldown=[2, 1, 1.0, 2], marks=[[0.5, 2]], kept={"final evaluation": 1.0})  # a decay by a count
    state.write_text(json.dumps(saved))
    resumed = cli("run", "--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "result.json").read_text())["info"]["steps"] == 2


def test_weights_stamped_before_the_architecture_hash_still_load(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "copy", "--out", str(out), *TINY).exit_code == 0
    weights = out / "model.safetensors"
    with safe_open(weights, "pt") as f:
        stamp = f.metadata()
    del stamp["model_sha256"]
    save_file(load_file(weights), weights, metadata=stamp)
    result = json.loads((out / "result.json").read_text())
    result["weights_sha256"] = hashlib.sha256(weights.read_bytes()).hexdigest()
    (out / "result.json").write_text(json.dumps(result))
    config = json.loads((out / "config.json").read_text())
    config["config"]["model"]["dropout"] = 0.5  # unchecked: nothing in the stamp to compare with
    (out / "config.json").write_text(json.dumps(config))
    assert cli("predict", str(out), "1 2 3").exit_code == 0


def test_a_run_without_a_precision_record_resumes(cli, tmp_path):
    out = tmp_path / "run"
    assert cli("run", "copy", "--out", str(out), *TINY, "--set", "train.save_every=1").exit_code == 0
    (out / "result.json").unlink()
    config = json.loads((out / "config.json").read_text())
    del config["precision"]
    (out / "config.json").write_text(json.dumps(config))
    resumed = cli("run", "--resume", str(out))
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "result.json").read_text())["info"]["precision"].startswith(("bf16 (auto", "fp32 (auto"))


def test_a_checkpoint_from_before_the_mark_resumes_and_is_pruned(cli, tmp_path):
    out = tmp_path / "run"
    options = [*TINY, "--set", "train.epochs=4", "--set", "train.max_steps=4", "--set", "train.save_every=1",
               "--set", "train.keep_last=2"]
    assert cli("run", "copy", "--out", str(out), *options).exit_code == 0
    (out / "result.json").unlink()
    for mark in (out / "checkpoints").glob("step-*/.taskformer-checkpoint"):
        mark.unlink()  # as checkpoints were written before they carried a mark
    shutil.rmtree(out / "checkpoints" / "step-000000004")  # a crash after step 3
    shutil.copytree(out / "checkpoints" / "step-000000003", out / "checkpoints" / "step-000000002")
    resumed = cli("run", "--resume", str(out), "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "result.json").read_text())["info"]["steps"] == 4
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000000003", "step-000000004"]
