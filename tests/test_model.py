"""The Transformer through its model API: shapes, masks, ties, and the two variants."""
from typing import Any

import pytest
import torch

from taskformer.core.model import PAD, Transformer
from taskformer.core.model_config import ModelConfig


def small(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg: dict[str, Any] = dict(vocab_size=20, d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64, dropout=0.0, max_len=40)
    cfg.update(kw)
    return Transformer(ModelConfig(**cfg)).eval()


def test_encoder_decoder_logits_shape():
    model = small()
    src, tgt = torch.randint(4, 20, (3, 7)), torch.randint(4, 20, (3, 5))
    assert model(src, tgt).shape == (3, 5, 20)


def test_encoder_only_gives_class_logits():
    model = small(variant="encoder-only", num_classes=4)
    assert model(torch.randint(4, 20, (3, 9))).shape == (3, 4)


@pytest.mark.parametrize("norm_first", [True, False])
def test_causal_mask_hides_future_target_tokens(norm_first):
    model = small(norm_first=norm_first)
    src, tgt = torch.randint(4, 20, (2, 6)), torch.randint(4, 20, (2, 8))
    changed = tgt.clone()
    changed[:, 5:] = torch.randint(4, 20, (2, 3))
    a, b = model(src, tgt), model(src, changed)
    assert torch.allclose(a[:, :5], b[:, :5], atol=1e-5)  # positions before the change see nothing of it
    assert not torch.allclose(a[:, 5:], b[:, 5:], atol=1e-5)


def test_source_padding_does_not_change_outputs():
    model = small()
    src, tgt = torch.randint(4, 20, (1, 6)), torch.randint(4, 20, (1, 4))
    padded = torch.cat([src, torch.full((1, 5), PAD)], 1)
    assert torch.allclose(model(src, tgt), model(padded, tgt), atol=1e-5)


def test_encoder_only_pooling_ignores_padding():
    for pooling in ("mean", "max", "first"):
        model = small(variant="encoder-only", num_classes=3, pooling=pooling)
        src = torch.randint(4, 20, (1, 6))
        padded = torch.cat([src, torch.full((1, 4), PAD)], 1)
        assert torch.allclose(model(src), model(padded), atol=1e-5), pooling


def test_tied_embeddings_share_one_matrix():
    tied, untied = small(tie_embeddings=True), small(tie_embeddings=False)
    assert tied.head.proj.weight is tied.embed.weight
    assert untied.num_parameters() > tied.num_parameters()


@pytest.mark.parametrize("bad, message", [
    (dict(d_model=30, n_heads=4), "divisible"),
    (dict(enc_layers=-1), "enc_layers"),
    (dict(variant="decoder-encoder"), "variant"),
    (dict(dropout=1.5), "dropout"),
])
def test_impossible_shapes_are_refused(bad, message):
    with pytest.raises(ValueError, match=message):
        small(**bad)


def test_attention_maps_are_distributions_over_source():
    model = small()
    src, tgt = torch.randint(4, 20, (2, 6)), torch.randint(4, 20, (2, 3))
    maps = model.attention_maps(src, tgt)
    assert maps.shape == (2, 3, 6)
    assert torch.allclose(maps.sum(-1), torch.ones(2, 3), atol=1e-5)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_drops_at_its_rate_and_keeps_the_mean(p):
    model = small(dropout=p).train()
    drop = model.drop
    x = torch.ones(200, 100, 50)
    torch.manual_seed(1)
    y = drop(x)
    kept = y != 0
    assert abs(1 - kept.float().mean().item() - p) < 0.005
    assert abs(y.mean().item() - 1.0) < 0.01  # survivors are scaled up by 1 / (1 - p)
    assert torch.equal(y.unique(), torch.tensor([0.0, 1 / (1 - round(p * 65536) / 65536)]))
    torch.manual_seed(1)
    assert torch.equal(drop(x), y)  # seeded: the same mask again
    assert not torch.equal(drop(x), y)  # and a fresh one each call
    assert torch.equal(model.eval().drop(x), x)


def test_dropout_masks_are_independent_between_elements():
    drop = small(dropout=0.5).train().drop
    torch.manual_seed(0)
    kept = drop(torch.ones(400_000)) != 0
    # Neighbours come from the same 64-bit draw; their masks must still be uncorrelated.
    pairs = kept.view(-1, 4).float()
    corr = torch.corrcoef(pairs.T)
    assert (corr - torch.eye(4)).abs().max() < 0.01
