"""The workload every decoding and training bench shares: bench/race/speed.py's network (vocabulary 8,000,
d_model 256, 3+3 layers, 8 heads, FFN 1024) as taskformer builds it and as the tutorial baseline does
(imported from ``../shared/bench/reference_transformer.py``, not copied), Multi30k batches, and a
decode of a fixed number of steps."""
from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
sys.path.insert(0, str(SHARED / "bench"))
import reference_transformer as ref  # noqa: E402

from taskformer.core import decoding  # noqa: E402
from taskformer.core.arrays import Ragged  # noqa: E402
from taskformer.core.data import Encoded, encode_sources  # noqa: E402
from taskformer.core.engine import Trainer  # noqa: E402
from taskformer.core.files import read_parallel  # noqa: E402
from taskformer.core.model import BOS, EOS, PAD, Transformer  # noqa: E402
from taskformer.core.model_config import ModelConfig  # noqa: E402
from taskformer.core.tokenize import subword  # noqa: E402
from taskformer.core.train_config import TrainConfig  # noqa: E402

V, D, LAYERS, FF, HEADS, B, L = 8000, 256, 3, 1024, 8, 128, 24
CPU = torch.device("cpu")


# -- the two implementations, one training step each ---------------------------------------------
def make_reference():
    torch.manual_seed(0)
    model = ref.make_model(V, V, LAYERS, D, FF, HEADS)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step(src, tgt):  # as in the reference's own benchmark: log-softmax generator + NLL
        model.train()
        ti, ty = tgt[:, :-1], tgt[:, 1:]
        sm = (src != PAD).unsqueeze(-2)
        tm = (ti != PAD).unsqueeze(-2) & ref.subsequent_mask(ti.size(1))
        out = model.generator(model(src, ti, sm, tm))
        loss = F.nll_loss(out.reshape(-1, V), ty.reshape(-1), ignore_index=PAD)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model, step


def make_taskformer(bf16: bool, module=None):
    """taskformer's network and the engine's training step; ``module``: another version of core/model.py."""
    torch.manual_seed(0)
    shape: dict[str, Any] = dict(vocab_size=V, d_model=D, n_heads=HEADS, enc_layers=LAYERS, dec_layers=LAYERS, d_ff=FF,
                                 dropout=0.1, tie_embeddings=False, max_len=128)
    module = module or sys.modules[Transformer.__module__]
    model = module.Transformer(module.ModelConfig(**shape))
    model.cfg = ModelConfig(**shape)  # the same values; an older model's config may lack what today's engine reads
    no_data = Encoded(Ragged.of([]), Ragged.of([]))  # the step is called directly, never fit()
    trainer = Trainer(model, TrainConfig(bf16=str(bf16).lower(), lr=1e-4, warmup=0), train=no_data, evaluate=dict,
                      select=("loss", False), run_dir=Path("."), device=CPU)

    def step(src, tgt):  # the engine's own update: label-smoothed loss, clipping, AdamW, schedule
        model.train()
        trainer._step([(src, tgt)])
    return model, step


def multi30k(n_train: int):
    data = SHARED / "datasets" / "multi30k"
    pairs = read_parallel(data / "train.de.gz", data / "train.en.gz")
    val = read_parallel(data / "val.de.gz", data / "val.en.gz")
    tok = subword((t for p in pairs for t in p), vocab_size=V)
    rng = random.Random(0)
    rng.shuffle(pairs)
    pairs = pairs[:n_train]
    src, _ = encode_sources(tok, [s for s, _ in pairs], 128, classify=False)
    tgt = [[BOS] + e.ids[:126] + [EOS] for e in tok.encode_batch([t for _, t in pairs])]
    val_src, _ = encode_sources(tok, [s for s, _ in val], 128, classify=False)
    return src, tgt, val_src


def decode_fixed(model, chunk: torch.Tensor, search: str, steps: int = L, budgets: torch.Tensor | None = None,
                 drop_finished: bool = True):
    """One batch decoded for exactly ``steps`` tokens a sentence (EOS ignored), or for ``budgets`` (B,);
    ``drop_finished=False`` keeps ended rows in the batch (see :func:`decoding.greedy`)."""
    limit = torch.full((chunk.size(0),), steps) if budgets is None else budgets
    if search == "greedy":
        return decoding.greedy(model, chunk, limit, ignore_eos=True, drop_finished=drop_finished)
    return decoding.beam_search(model, chunk, limit, beam=5, ignore_eos=True, drop_finished=drop_finished)
