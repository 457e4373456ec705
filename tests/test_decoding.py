"""Search: cached and uncached decoding agree, beam 1 is greedy, limits and constraints hold."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from taskformer import hookimpl
from taskformer.core import decoding, inference
from taskformer.core.decoding import DecodeConfig
from taskformer.core.model import BOS, EOS, Transformer
from taskformer.core.model_config import ModelConfig


def model_and_src(seed=0, batch=6):
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(vocab_size=30, d_model=32, n_heads=4, enc_layers=2, dec_layers=2, d_ff=64,
                                    dropout=0.0, max_len=64)).eval()
    src = torch.randint(4, 30, (batch, 9))
    src[0, 6:] = 0  # one padded row
    return model, src


@torch.no_grad()
def greedy_without_cache(model, src, steps):
    """Greedy search that re-runs the whole prefix through the model at every step: the reference."""
    ys = torch.full((src.size(0), 1), BOS)
    for _ in range(steps):
        logits = model(src, ys)[:, -1]
        logits[:, decoding.NEVER_WRITTEN] = float("-inf")  # a search writes no special token but EOS
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], 1)
    return [row[1 : row.index(EOS)] if EOS in row else row[1:] for row in ys.tolist()]


def test_cached_greedy_gives_the_tokens_of_a_full_rerun():
    for seed in range(3):
        model, src = model_and_src(seed)
        fast = decoding.greedy(model, src, torch.full((src.size(0),), 20))
        assert fast == greedy_without_cache(model, src, 20)
        assert any(len(x) > 3 for x in fast)  # the comparison covers real multi-step outputs
        # the copy that decode_texts decodes with (packed weights on CPU) gives the same tokens
        assert decoding.greedy(inference.for_decoding(model, "none"), src, torch.full((src.size(0),), 20)) == fast


@pytest.mark.slow
def test_the_decoding_copy_gives_the_models_outputs_and_leaves_it_alone():
    """On CPU ``for_decoding(model, "none")`` is a copy with pre-packed linear layers: the same
    parameters, the same logits up to rounding, the same searches; made again when the weights change."""
    model, src = model_and_src(0, batch=32)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    fast = inference.for_decoding(model, "none")
    assert fast is not model and inference.for_decoding(model, "none") is fast
    original = model, src
    assert any(isinstance(m, inference.PackedLinear) for m in fast.modules())
    tgt = torch.randint(4, 30, (src.size(0), 7))
    with torch.no_grad():
        assert torch.allclose(fast(src, tgt), model(src, tgt), atol=1e-4)
        for dtype in (torch.float32, torch.bfloat16):  # bf16 autocast packs bf16 weights, as nn.Linear computes
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
                assert fast(src, tgt).dtype == model(src, tgt).dtype
                assert torch.allclose(fast(src, tgt).float(), model(src, tgt).float(), atol=0.1)
    for seed in range(3):
        model, src = model_and_src(seed)
        fast = inference.for_decoding(model, "none")
        limit = torch.full((src.size(0),), 15)
        assert decoding.greedy(fast, src, limit) == decoding.greedy(model, src, limit)
        assert decoding.beam_search(fast, src, limit, beam=4) == decoding.beam_search(model, src, limit, beam=4)
    model, src = original  # decoding through its copy left the model's own weights and modules as they were
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert not any(isinstance(m, inference.PackedLinear) for m in model.modules())
    fast = inference.for_decoding(model, "none")
    with torch.no_grad():
        model.head.proj.bias.add_(0.1)  # new weights (a training step): a new copy, with them
    assert inference.for_decoding(model, "none") is not fast
    with torch.no_grad():
        assert torch.allclose(inference.for_decoding(model, "none")(src, tgt), model(src, tgt), atol=1e-4)


@torch.no_grad()
def test_rows_that_finish_leave_the_batch_without_changing_any_output():
    """A constraint keeps every row in the batch (it reads rows by position); the plain search drops
    rows and sentences as they end. Both must give the same outputs, of varied lengths."""
    def keep_all(step, prefix, logp):
        return logp

    for seed, eos in ((0, 1.0), (1, -1.0), (2, 0.0)):  # rows end (EOS or budget) at different steps
        model, src = model_and_src(seed)
        model.head.proj.bias[EOS] += eos
        limit = torch.tensor([4, 7, 3, 6, 9, 8])
        greedy = decoding.greedy(model, src, limit)
        assert greedy == decoding.greedy(model, src, limit, constraint=keep_all)
        assert len({len(x) for x in greedy}) > 2
        assert decoding.beam_search(model, src, limit, beam=3) == decoding.beam_search(model, src, limit, beam=3,
                                                                                        constraint=keep_all)


@pytest.mark.slow
def test_int8_decoding_follows_the_fp32_model_and_leaves_it_alone():
    model, src = model_and_src(0, batch=32)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    limit = torch.full((src.size(0),), 12)
    int8 = inference.for_decoding(model, "int8")
    assert int8 is not model and inference.for_decoding(model, "int8") is int8  # one copy while the weights stay
    # the first token of every row, from the same encoder states: int8 may flip a near tie, rarely
    first = [x[:1] for x in decoding.greedy(int8, src, torch.ones_like(limit))]
    assert sum(a == b for a, b in zip(first, [x[:1] for x in decoding.greedy(model, src, torch.ones_like(limit))])) >= 28
    assert [len(x) for x in decoding.beam_search(int8, src, limit, beam=3, ignore_eos=True)] == limit.tolist()
    assert model.state_dict().keys() == weights.keys()
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        model.head.proj.bias.add_(0.1)  # new weights (a training step): a new copy
    assert inference.for_decoding(model, "int8") is not int8


def test_beam_of_one_equals_greedy():
    for seed in range(3):
        model, src = model_and_src(seed)
        limit = torch.full((src.size(0),), 15)
        assert decoding.beam_search(model, src, limit, beam=1) == decoding.greedy(model, src, limit)


def test_beam_search_respects_length_budget_and_batch_independence():
    model, src = model_and_src(1)
    limit = torch.tensor([3, 5, 8, 2, 4, 6])
    out = decoding.beam_search(model, src, limit, beam=4, ignore_eos=True)
    assert [len(x) for x in out] == [3, 5, 8, 2, 4, 6]
    alone = decoding.beam_search(model, src[2:3], limit[2:3], beam=4, ignore_eos=True)
    assert alone[0] == out[2]


def test_constraint_bans_tokens_in_both_searches():
    model, src = model_and_src(2)
    limit = torch.full((src.size(0),), 12)
    free = decoding.greedy(model, src, limit, ignore_eos=True)
    banned = {t for row in free for t in row}  # every token greedy liked

    def ban(step, prefix, logp):
        logp[:, list(banned)] = float("-inf")
        return logp

    for out in (decoding.greedy(model, src, limit, constraint=ban, ignore_eos=True),
                decoding.beam_search(model, src, limit, beam=3, constraint=ban, ignore_eos=True)):
        assert all(len(row) == 12 and not set(row) & banned for row in out)


def test_outputs_stop_at_eos():
    model, src = model_and_src(0)

    def end_at_three(step, prefix, logp):
        if step == 3:
            logp[:] = float("-inf")
            logp[:, EOS] = 0.0
        return logp

    limit = torch.full((src.size(0),), 10)
    assert any(len(row) > 3 for row in decoding.greedy(model, src, limit))
    for out in (decoding.greedy(model, src, limit, constraint=end_at_three),
                decoding.beam_search(model, src, limit, beam=3, constraint=end_at_three)):
        assert all(len(row) <= 3 for row in out)


def textbook_beam(model, src_row, beam, limit, length_penalty=1.0):
    """Beam search written the slow, obvious way for one sentence: no cache, every candidate scored.

    A hypothesis still open after ``limit`` tokens is cut there (and scored without an end token).
    """
    memory, mask = model.encode(src_row[None])
    hyps = [([BOS], 0.0)]
    for _ in range(limit):
        if all(toks[-1] == EOS for toks, _ in hyps):
            break
        cands = []
        for toks, score in hyps:
            if toks[-1] == EOS:
                cands.append((toks, score))
                continue
            h = model.decode(torch.tensor([toks]), memory, mask)
            logp = torch.log_softmax(model.head(h, mask)[:, -1].float(), -1)[0].tolist()
            cands += [(toks + [t], score + lp) for t, lp in enumerate(logp) if t not in decoding.NEVER_WRITTEN]
        hyps = sorted(cands, key=lambda c: -c[1])[:beam]
    best = max(hyps, key=lambda c: c[1] / ((5 + len(c[0]) - 1) / 6) ** length_penalty)[0]
    return [t for t in best[1:] if t != EOS]


@torch.no_grad()
def test_batched_cached_beam_search_matches_the_textbook_version():
    ended = cut = 0
    for seed in range(3):
        model, src = model_and_src(seed)
        model.head.proj.bias[EOS] += 1.5  # make ending likely, so that finished and cut hypotheses compete
        limit = torch.tensor([4, 7, 3, 6, 5, 8])
        fast = decoding.beam_search(model, src, limit, beam=3)
        assert fast == [textbook_beam(model, src[i], 3, int(limit[i])) for i in range(src.size(0))]
        ended += sum(len(x) < int(n) for x, n in zip(fast, limit))
        cut += sum(len(x) == int(n) for x, n in zip(fast, limit))
    assert ended and cut  # both ways of finishing took part in the comparison


def test_argmax_matches_torch_including_ties_and_odd_vocabularies():
    torch.manual_seed(0)
    for vocab in (7, 64, 100, 8000):
        scores = torch.randint(-3, 3, (50, vocab)).float()  # many ties: the first maximum must win
        scores[0] = float("-inf")
        scores[1, -1] = 99.0  # the maximum in a padded last block
        assert torch.equal(decoding.argmax(scores), scores.argmax(-1))
        noisy = torch.randn(50, vocab, dtype=torch.bfloat16)
        assert torch.equal(decoding.argmax(noisy), noisy.argmax(-1))


def test_parallel_map_keeps_order_restores_threads_and_passes_errors_on():
    threads = torch.get_num_threads()
    seen = []

    def work(i):
        seen.append(torch.get_num_threads())
        return i * i
    assert list(decoding.parallel_map(work, range(10), workers=3)) == [i * i for i in range(10)]
    assert set(seen) == {1}  # each worker decodes with one intra-op thread
    assert torch.get_num_threads() == threads

    def fail(i):
        if i == 4:
            raise ValueError("batch 4")
        return i
    try:
        list(decoding.parallel_map(fail, range(8), workers=2))
    except ValueError as e:
        assert str(e) == "batch 4"
    else:
        raise AssertionError("the worker's error was lost")
    assert torch.get_num_threads() == threads


def test_search_follows_the_decode_config():
    model, src = model_and_src(1)
    limit = decoding.max_lengths(src, 1.2, 10, model.cfg.max_len)
    assert decoding.search(model, src, DecodeConfig(strategy="greedy")) == decoding.greedy(model, src, limit)
    beam = DecodeConfig(strategy="beam", beam=3, length_penalty=0.5)
    assert decoding.search(model, src, beam) == decoding.beam_search(model, src, limit, beam=3, length_penalty=0.5)
    budget = torch.tensor([2, 3, 4, 5, 6, 7])
    assert [len(x) for x in decoding.search(model, src, beam, max_len=budget, ignore_eos=True)] == budget.tolist()


class Recording(torch.nn.Module):
    """A head that checks the contract ``head(hidden, src_mask)`` on every call, then projects."""

    def __init__(self, head, src, rows_per_source):
        super().__init__()
        self.head, self.calls = head, 0
        self.mask = (src != 0).repeat_interleave(rows_per_source, 0).view(-1, 1, 1, src.size(1))

    def forward(self, hidden, src_mask):
        # every row's own source mask: the whole batch at first, then the rows still searched
        assert hidden.dim() == 3 and hidden.size(0) == src_mask.size(0)
        assert torch.equal(src_mask, self.mask) if self.calls == 0 else all(
            any(torch.equal(row, m) for m in self.mask) for row in src_mask)
        self.calls += 1
        return self.head(hidden, src_mask)


def test_search_calls_the_head_with_hidden_states_and_the_source_mask():
    for strategy, beam in (("greedy", 1), ("beam", 3)):
        model, src = model_and_src(0)
        plain = decoding.search(model, src, DecodeConfig(strategy=strategy, beam=beam))
        model.head = Recording(model.head, src, beam)
        assert decoding.search(model, src, DecodeConfig(strategy=strategy, beam=beam)) == plain
        assert model.head.calls > 1


@pytest.mark.slow
def test_int8_reaches_predict_eval_and_the_python_api(default_copy_run, cli):
    import taskformer

    out, _ = default_copy_run
    inputs = ["1 4 7 2 9 3 5 8 2 6", "3 3 1 5 9 8 7 6 5 4"]
    fp32 = cli("predict", str(out), *inputs)
    int8 = cli("predict", str(out), "--set", "decode.quantize=int8", *inputs)
    assert fp32.exit_code == 0 and int8.exit_code == 0, fp32.output + int8.output
    assert int8.stdout == fp32.stdout == "".join(f"{x}\n" for x in inputs)  # the copy task, learned to the end
    assert cli("eval", str(out), "--split", "test", "--set", "decode.quantize=int8").exit_code == 0
    model = taskformer.load(out)
    model.config.decode.quantize = "int8"
    assert model.predict(inputs) == inputs
    bad = cli("predict", str(out), "--set", "decode.quantize=int4", *inputs)
    assert bad.exit_code == 2 and "decode.quantize" in bad.output and "Traceback" not in bad.output


class LinearWatch:
    """At every validation, checks that each linear layer of the model the decode hook receives computes
    with the current weights (the contract: they keep ``weight`` and ``bias``); the task's search answers."""

    def __init__(self):
        self.gaps = []

    @hookimpl(tryfirst=True)
    def taskformer_decode(self, model):
        gen, gap = torch.Generator().manual_seed(0), 0.0
        with torch.no_grad():
            for layer in model.modules():
                w = getattr(layer, "weight", None)
                if isinstance(layer, nn.Embedding) or not isinstance(w, torch.Tensor) or w.dim() != 2:
                    continue
                x = torch.randn(3, w.size(1), generator=gen)
                gap = max(gap, (layer(x) - F.linear(x, w, layer.bias)).abs().max().item())
        self.gaps.append(gap)


@pytest.mark.slow
def test_validation_during_training_decodes_the_current_weights(cli, register, tmp_path):
    # The fused optimizer writes the weights in place without moving their version counters: a
    # decoding copy kept by those counters decoded the first validation's weights ever after.
    watch = register(LinearWatch(), "linear-watch")
    result = cli("run", "copy", "--out", str(tmp_path / "run"), "--quiet", "--set", "data.train_size=200",
                 "--set", "data.val_size=4", "--set", "data.test_size=4", "--set", "train.epochs=4",
                 "--set", "train.bf16=false")
    assert result.exit_code == 0, result.output
    assert len(watch.gaps) >= 5  # a validation after each epoch, then val and test with the kept weights
    assert max(watch.gaps) < 1e-4, watch.gaps
