"""The Transformer through its model API: shapes, masks, ties, and the two variants."""
import pytest
import torch

from taskformer.core.model import PAD, ModelConfig, Transformer


def small(**kw) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=20, d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64, dropout=0.0, max_len=40)
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
    (dict(variant="decoder-only"), "variant"),
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
