"""Checkpoint averaging: the mean itself, `train.average_last` in a run, `eval --average`, resume
(DDP: tests/test_cooldown.py)."""
import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file

from conftest import run_cli
from taskformer.app.cli import main
from taskformer.core import checkpoint as ckpt
from taskformer.core.data import Encoded
from taskformer.core.engine import Trainer
from taskformer.core.errors import TaskformerError
from taskformer.core.model import BOS, EOS, Transformer
from taskformer.core.model_config import ModelConfig
from taskformer.core.train_config import TrainConfig

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

FP32_UNIT = torch.finfo(torch.float32).eps


def make(seed, d_model=32):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=25, d_model=d_model, n_heads=4, enc_layers=1, dec_layers=1, d_ff=64,
                                   dropout=0.0)).eval()


def save_copies(model, folder, n):
    paths = [folder / f"{i}.safetensors" for i in range(n)]
    for path in paths:
        ckpt.save_weights(model, path)
    return paths


def test_the_average_of_identical_checkpoints_is_that_checkpoint(tmp_path):
    a, b = make(0), make(1)
    ckpt.load_average(b, save_copies(a, tmp_path, 3))
    src, tgt = torch.randint(4, 25, (2, 5)), torch.randint(4, 25, (2, 4))
    # Of the fp32 sum x + x + x, only 2x + x rounds; with the division, by at most one unit of x in all.
    for name, tensor in a.state_dict().items():
        torch.testing.assert_close(b.state_dict()[name], tensor, rtol=3 * FP32_UNIT, atol=0)
    torch.testing.assert_close(b(src, tgt), a(src, tgt))
    assert b.head.proj.weight is b.embed.weight  # the tied matrix, stored once, fills both names


def test_bf16_weights_are_summed_in_fp32_and_come_back_exactly(tmp_path):
    weights = {"w": torch.randn(64, 64).to(torch.bfloat16)}
    paths = [tmp_path / f"{i}.safetensors" for i in range(3)]
    for path in paths:
        ckpt.save_weights(weights, path)
    mean = ckpt.average_weights(paths)
    assert mean["w"].dtype == torch.bfloat16
    assert torch.equal(mean["w"], weights["w"])  # a bf16 running sum would have rounded 3w


def test_the_average_of_two_weight_sets_is_their_mean(tmp_path):
    a, b, c = make(0), make(1), make(2)
    ckpt.save_weights(a, tmp_path / "a.safetensors")
    ckpt.save_weights(b, tmp_path / "b.safetensors")
    ckpt.load_average(c, [tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    sa, sb = a.state_dict(), b.state_dict()
    for name, tensor in c.state_dict().items():
        assert torch.equal(tensor, (sa[name] + sb[name]) / 2), name
    assert c.head.proj.weight is c.embed.weight


def test_integer_tensors_are_taken_from_the_newest_file(tmp_path):
    old, new = tmp_path / "old.safetensors", tmp_path / "new.safetensors"
    ckpt.save_weights({"w": torch.zeros(3), "count": torch.tensor([4])}, old)
    ckpt.save_weights({"w": torch.ones(3), "count": torch.tensor([7])}, new)
    mean = ckpt.average_weights([old, new])
    assert torch.equal(mean["w"], torch.full((3,), 0.5)) and torch.equal(mean["count"], torch.tensor([7]))


def test_weights_of_different_models_do_not_average(tmp_path):
    ckpt.save_weights(make(0), tmp_path / "a.safetensors")
    ckpt.save_weights(make(0, d_model=64), tmp_path / "b.safetensors")
    with pytest.raises(TaskformerError, match="other tensors"):
        ckpt.average_weights([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])


def train(tmp_path, average_last):
    """Three epochs of a tiny model whose every evaluation scores higher than the one before, so the last
    one -- with averaging, that of the mean of the last two evaluated weights -- is kept as the best."""
    model = make(0).train()
    data = Encoded(src=[[5, 6, 7, EOS]] * 16, tgt=[[BOS, 5, 6, 7, EOS]] * 16)
    seen = []

    def evaluate():
        seen.append({k: v.clone() for k, v in model.state_dict().items()})
        return {"score": float(len(seen))}

    tmp_path.mkdir()
    cfg = TrainConfig(epochs=3, max_tokens=20, warmup=0, average_last=average_last)
    state = Trainer(model, cfg, data, evaluate, ("score", True), tmp_path, torch.device("cpu")).fit()
    return model, state, seen


def test_an_average_that_scores_best_is_kept_and_training_goes_on_from_its_own_weights(tmp_path):
    model, state, seen = train(tmp_path / "avg", 2)
    plain_model, plain_state, _ = train(tmp_path / "plain", 0)
    # Evaluations: epoch 1; epoch 2 and the mean of epochs 1-2; epoch 3 and the mean of epochs 2-3.
    assert len(seen) == 5
    assert state["best_weights"] == list(ckpt.evaluated_weights(tmp_path / "avg")) and len(state["best_weights"]) == 2
    kept = load_file(tmp_path / "avg" / "model.safetensors")
    for name, tensor in seen[4].items():
        assert torch.equal(tensor, (seen[1][name] + seen[3][name]) / 2), name
        if name in kept:
            assert torch.equal(kept[name], tensor), name
    # The averages were only read: training went on bit for bit as it does without averaging.
    assert state["step"] == plain_state["step"]
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, seen[3][name]) and torch.equal(tensor, plain_model.state_dict()[name]), name


TINY = ["--set", "data.train_size=600", "--set", "data.val_size=60", "--set", "data.test_size=60",
        "--set", "train.epochs=3", "--set", "train.average_last=2", "--quiet"]


def events(run_dir, kind="eval"):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("avg") / "run"
    result = CliRunner().invoke(main, ["run", "copy", "--out", str(out), *TINY], catch_exceptions=False,
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return out, result


def test_a_run_evaluates_the_average_and_says_which_weights_it_kept(averaged_run):
    out, result = averaged_run
    evals = events(out)
    plain = [e["step"] for e in evals if "averaged" not in e]
    averaged = [e for e in evals if "averaged" in e]
    assert len(plain) == 3  # one evaluation per epoch
    # After each evaluation from the second on, the mean of the last two evaluated weights is scored too.
    assert [e["averaged"] for e in averaged] == [plain[0:2], plain[1:3]]
    assert [p.name for p in ckpt.evaluated_weights(out).values()] == [f"step-{s:09d}.safetensors" for s in plain[1:]]
    best = [e for e in evals if e["improved"]][-1]
    kept = ckpt.weights_name(best.get("averaged", [best["step"]]))
    info = json.loads((out / "result.json").read_text())["info"]
    assert info["kept_weights"] == kept
    assert "weights kept" in result.stdout and kept in (out / "report.txt").read_text()


def test_eval_average_scores_the_mean_of_the_last_checkpoints(averaged_run, cli):
    out, _ = averaged_run
    result = cli("eval", str(out), "--split", "val", "--average", "2", "--json")
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)
    last = events(out)[-1]  # the trainer's evaluation of the same two weights
    assert last["averaged"] and shown["weights"] == ckpt.weights_name(last["averaged"])
    assert [shown["metrics"]["val"][m] for m in ("exact_match", "token_accuracy")] == pytest.approx(
        [last[m] for m in ("exact_match", "token_accuracy")])


def test_eval_average_of_more_checkpoints_than_kept_is_an_error(averaged_run, cli):
    out, _ = averaged_run
    result = cli("eval", str(out), "--average", "3")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error:") and "kept 2" in result.stderr and len(result.stderr.splitlines()) == 1


def test_resume_with_averaging_is_exact(tmp_path, cpu_hog):
    """Beside a busy loop on every core: neither run may decide anything by the clock."""
    full = tmp_path / "full"
    # Four evaluations, all kept (nothing pruned), so the copy below holds the ones from before its crash.
    options = [*TINY, "--set", "train.epochs=4", "--set", "train.average_last=4", "--set", "train.save_every=3",
               "--set", "train.keep_last=50"]
    assert run_cli("run", "copy", "--out", str(full), *options).returncode == 0
    # A crash after a mid-run checkpoint leaves that checkpoint as the newest; anything written later
    # (here even the final weights and kept evaluations, which must not join the averages before
    # their time) must not change how the run continues.
    crashed = tmp_path / "crashed"
    shutil.copytree(full, crashed)
    states = sorted((crashed / "checkpoints").glob("step-*"))
    for later in states[len(states) // 2:]:
        shutil.rmtree(later)
    (crashed / "result.json").unlink()
    resumed = run_cli("run", "--resume", str(crashed), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert events(crashed) == events(full)  # every evaluation, averages included, to the last bit of the loss
    assert list(ckpt.evaluated_weights(crashed)) == list(ckpt.evaluated_weights(full))
    for name in ("model.safetensors", *(str(p.relative_to(full)) for p in ckpt.evaluated_weights(full).values())):
        a, b = load_file(full / name), load_file(crashed / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name
    ra, rb = (json.loads((d / "result.json").read_text()) for d in (full, crashed))
    assert ra["metrics"] == rb["metrics"] and ra["info"]["kept_weights"] == rb["info"]["kept_weights"]
    assert all(hog.poll() is None for hog in cpu_hog)  # the machine was busy throughout
    assert rb["info"]["precision"].startswith(ra["info"]["precision"].removesuffix(")"))  # resumed as it began


def test_a_negative_average_last_is_refused(cli, tmp_path):
    result = cli("run", "copy", "--out", str(tmp_path / "r"), "--set", "train.average_last=-1")
    assert result.exit_code == 2
    assert "train.average_last must not be negative" in result.stderr and not (tmp_path / "r").exists()


def test_eval_average_leaves_a_stray_file_with_a_weights_like_name_alone(averaged_run, cli, tmp_path):
    out = shutil.copytree(averaged_run[0], tmp_path / "run")
    stray = out / "checkpoints" / "evaluated" / "step-abc.safetensors"
    stray.write_text("mine")
    result = cli("eval", str(out), "--split", "val", "--average", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["weights"].startswith("average of last 2") and stray.read_text() == "mine"
