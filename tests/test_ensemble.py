"""``model.members``: several encoder-only networks trained and used as one ensemble."""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from test_agnews import LABELS, TINY

import taskformer
from taskformer import Label
from taskformer.core.loss import batch_loss
from taskformer.core.model import Ensemble, Transformer
from taskformer.core.model_config import ModelConfig

SMALL: dict[str, Any] = dict(variant="encoder-only", vocab_size=20, num_classes=3, d_model=16, n_heads=2, enc_layers=1, d_ff=32,
             dropout=0.0, max_len=16)


def members(n: int) -> list[Transformer]:
    torch.manual_seed(0)
    return [Transformer(ModelConfig(**SMALL)) for _ in range(n)]


def test_output_is_the_mean_of_the_members_log_probabilities():
    nets = members(3)
    ensemble = Ensemble(nets).eval()
    src = torch.randint(4, 20, (5, 7))
    expected = torch.stack([F.log_softmax(m(src), -1) for m in nets]).mean(0)
    torch.testing.assert_close(ensemble(src), expected)
    assert len({float(m(src)[0, 0].detach()) for m in nets}) == 3  # the members really differ


def test_identical_members_predict_what_one_member_does():
    net = members(1)[0].eval()
    ensemble = Ensemble([net, copy.deepcopy(net)]).eval()
    src = torch.randint(4, 20, (4, 9))
    torch.testing.assert_close(torch.softmax(ensemble(src), -1), torch.softmax(net(src), -1))


def test_each_member_learns_from_its_own_loss():
    # trained on the loss of their average, members co-adapt; each gets its own loss instead
    nets = members(4)
    src, gold = torch.randint(4, 20, (6, 5)), torch.tensor([0, 1, 2, 0, 1, 2])
    loss, count = batch_loss(Ensemble(nets).train(), src, gold, 0.0)
    own = torch.stack([F.cross_entropy(m(src), gold, reduction="sum") for m in nets]).mean()
    torch.testing.assert_close(loss, own)
    assert count == 6
    loss.backward()
    assert all(m.embed.weight.grad is not None and m.embed.weight.grad.abs().sum() > 0 for m in nets)


@pytest.mark.slow
def test_agnews_trains_saves_and_predicts_an_ensemble(cli, data_dir, tmp_path):
    out = tmp_path / "run"
    result = cli("run", "agnews", "--data-dir", str(data_dir / "ag_news"), "--out", str(out), *TINY,
                 "--set", "model.members=3", "--set", "train.epochs=2")
    assert result.exit_code == 0, result.output
    with safe_open(out / "model.safetensors", "pt") as f:
        prefixes = {key.split(".")[1] for key in f.keys() if key.startswith("members.")}
    assert prefixes == {"0", "1", "2"}
    model = taskformer.load(out)
    (label,) = model.predict(["Stocks fall as oil prices climb"])
    assert isinstance(label, Label) and label.label in LABELS and 0.25 <= label.probability <= 1.0
    result = cli("predict", str(out), "Stocks fall as oil prices climb")
    assert result.exit_code == 0 and result.output.split("\t")[0] == label.label


def test_a_member_count_below_one_is_a_config_error(cli, tmp_path):
    result = cli("run", "copy", "--out", str(tmp_path / "r"), "--set", "model.members=0", "--quiet")
    assert result.exit_code == 2 and "model.members must be at least 1" in result.output
    assert "Traceback" not in result.output
