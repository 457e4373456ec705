"""Run directories: weights round-trip, atomic writes, and refusal of unsafe or broken checkpoints."""
import pytest
import torch

from taskformer.core import checkpoint as ckpt
from taskformer.core.errors import TaskformerError
from taskformer.core.model import Transformer
from taskformer.core.model_config import ModelConfig


def make(seed):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=25, d_model=32, n_heads=4, enc_layers=1, dec_layers=1, d_ff=64,
                                   dropout=0.0)).eval()


def test_weights_round_trip_gives_identical_outputs(tmp_path):
    a, b = make(0), make(1)
    src, tgt = torch.randint(4, 25, (2, 5)), torch.randint(4, 25, (2, 4))
    assert not torch.allclose(a(src, tgt), b(src, tgt))
    ckpt.save_weights(a, tmp_path / "model.safetensors")
    ckpt.load_weights(b, tmp_path / "model.safetensors")
    assert torch.equal(a(src, tgt), b(src, tgt))
    assert b.head.proj.weight is b.embed.weight  # tying survives the round trip


def test_truncated_weights_are_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(make(0), path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(TaskformerError, match="corrupt"):
        ckpt.load_weights(make(0), path)


def test_weights_of_another_shape_are_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    ckpt.save_weights(make(0), path)
    other = Transformer(ModelConfig(vocab_size=25, d_model=64, n_heads=4, enc_layers=1, dec_layers=1, d_ff=64))
    with pytest.raises(TaskformerError):
        ckpt.load_weights(other, path)


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "state.json"
    ckpt.write_json(path, {"step": 1})

    def explode(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.os, "replace", explode)
    with pytest.raises(OSError):
        ckpt.write_json(path, {"step": 2})
    assert ckpt.read_json(path) == {"step": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temp file left behind


def test_pickle_files_in_a_run_directory_are_refused(tmp_path):
    (tmp_path / "model.pt").write_bytes(b"\x80\x04K\x01.")
    with pytest.raises(TaskformerError, match="pickle"):
        ckpt.refuse_pickles(tmp_path)
