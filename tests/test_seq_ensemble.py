"""``model.members`` for encoder-decoders: K networks searched together, their log-probabilities
averaged at every step (greedy, beam and constrained search, with the key/value cache)."""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import taskformer
from taskformer.core.decoding import NEVER_WRITTEN, DecodeConfig, search
from taskformer.core.inference import for_decoding
from taskformer.core.loss import batch_loss
from taskformer.core.model import BOS, EOS, PAD, Ensemble, Transformer
from taskformer.core.model_config import ModelConfig

V = 24
SMALL: dict[str, Any] = dict(vocab_size=V, d_model=16, n_heads=2, enc_layers=1, dec_layers=2, d_ff=32, dropout=0.0, max_len=16,
             tie_embeddings=False)  # untied: a random tied model mostly repeats the token it was fed
BUDGET = 6


def members(n: int, seed: int = 0) -> list[Transformer]:
    """Untrained networks made opinionated: larger weights give peaked, differing next-token choices."""
    torch.manual_seed(seed)
    nets = [Transformer(ModelConfig(**SMALL)).eval() for _ in range(n)]
    with torch.no_grad():
        for net in nets:
            for p in net.parameters():
                p.add_(torch.randn_like(p) * 0.3)
            proj = net.head.proj
            assert isinstance(proj, torch.nn.Linear)
            proj.bias[EOS] -= 0.5  # some outputs end early, others run to the budget
    return nets


def sources(seed: int = 1, n: int = 12) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (n, 7), generator=g)
    src[::3, 4:] = PAD  # some rows padded
    src[:, -1] = torch.where(src[:, -1] == PAD, PAD, EOS)
    return src


def no_odd_tokens(step, prefix, logprobs):
    """A constraint: odd token ids (above the specials) are banned."""
    banned = torch.zeros(logprobs.size(-1), dtype=torch.bool)
    banned[5::2] = True
    return logprobs.masked_fill(banned, float("-inf"))


def mean_logprobs(nets, src, prefix, constraint=None, step=0) -> torch.Tensor:
    """The reference: each member's full forward on the prefix (no cache), renormalised mean of log-softmax."""
    logp = torch.stack([F.log_softmax(m(src, prefix)[:, -1].float(), -1) for m in nets]).mean(0)
    logp = F.log_softmax(logp, -1)
    logp[:, NEVER_WRITTEN] = float("-inf")  # a search writes no special token but EOS
    return logp if constraint is None else constraint(step, prefix, logp)


def reference_greedy(nets, src, constraint=None) -> list[list[int]]:
    out = []
    for row in src:
        ys = [BOS]
        for step in range(BUDGET):
            ys.append(int(mean_logprobs(nets, row[None], torch.tensor([ys]), constraint, step).argmax()))
            if ys[-1] == EOS:
                break
        out.append(strip(ys))
    return out


def reference_beam(nets, src, beam: int, length_penalty: float = 1.0) -> list[list[int]]:
    """A plain beam search on the reference log-probabilities; finished hypotheses keep their score."""
    out = []
    for row in src:
        hyps = [([BOS], 0.0, False)]
        for _ in range(BUDGET):
            live = [h for h in hyps if not h[2]]
            cands = [h for h in hyps if h[2]]
            if live:
                logp = mean_logprobs(nets, row[None].expand(len(live), -1), torch.tensor([h[0] for h in live]))
                for (ys, score, _), lp in zip(live, logp.tolist()):
                    cands += [(ys + [t], score + lp[t], t == EOS) for t in range(V)]
            hyps = sorted(cands, key=lambda h: -h[1])[:beam]
        length = lambda ys: sum(t != PAD for t in ys[1:])  # noqa: E731
        best = max(hyps, key=lambda h: h[1] / ((5.0 + length(h[0])) / 6.0) ** length_penalty)[0]
        out.append(strip(best))
    return out


def strip(ys: list[int]) -> list[int]:
    """The output: the tokens after BOS up to EOS or PAD (a model may pick PAD; the search stops reading there)."""
    end = next((i for i, t in enumerate(ys) if i and t in (EOS, PAD)), len(ys))
    return ys[1:end]


def decode(model, src, strategy, constraint=None, beam=3) -> list[list[int]]:
    config = DecodeConfig(strategy=strategy, beam=beam)
    return search(model, src, config, constraint=constraint, max_len=torch.full((src.size(0),), BUDGET))


CASES = [("greedy", None), ("beam", None), ("greedy", no_odd_tokens), ("beam", no_odd_tokens)]


@pytest.mark.parametrize("strategy, constraint", CASES)
def test_an_ensemble_of_one_decodes_what_its_member_does(strategy, constraint):
    (net,) = members(1)
    src = sources()
    alone = decode(net, src, strategy, constraint)
    assert decode(Ensemble([net]).eval(), src, strategy, constraint) == alone
    assert len({tuple(x) for x in alone}) > 3  # the outputs depend on the input: the comparison can tell


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("constraint", [None, no_odd_tokens])
def test_greedy_follows_the_mean_of_the_members_log_probabilities(k, constraint):
    nets, src = members(k), sources()
    got = decode(Ensemble(nets).eval(), src, "greedy", constraint)
    assert got == reference_greedy(nets, src, constraint)
    # the ensemble is not any one member in disguise
    assert all(got != decode(net, src, "greedy", constraint) for net in nets)


@pytest.mark.parametrize("k", [2, 3])
def test_beam_search_follows_the_mean_of_the_members_log_probabilities(k):
    nets, src = members(k), sources(n=6)
    got = decode(Ensemble(nets).eval(), src, "beam")
    assert got == reference_beam(nets, src, beam=3)
    assert all(got != decode(net, src, "beam") for net in nets)


def test_int8_decodes_an_ensemble_like_its_int8_member():
    (net,) = members(1)
    src = sources()
    ensemble = for_decoding(Ensemble([copy.deepcopy(net)]).eval(), "int8")
    assert decode(ensemble, src, "beam") == decode(for_decoding(net, "int8"), src, "beam")


def test_each_member_learns_from_its_own_sequence_loss():
    nets = members(2)
    src, tgt = sources(n=4), sources(seed=2, n=4)
    tgt[:, 0] = BOS
    ensemble = Ensemble(nets).train()
    loss, count = batch_loss(ensemble, src, tgt, 0.0)
    own = torch.stack([F.cross_entropy(m(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD,
                                       reduction="sum") for m in nets]).mean()
    torch.testing.assert_close(loss, own)
    assert count == int((tgt[:, 1:] != PAD).sum())
    loss.backward()
    assert all(m.decoder[0].cross_attn.in_proj.weight.grad.abs().sum() > 0 for m in nets)


def test_attention_map_is_the_members_mean():
    nets = members(2)
    src, tgt = sources(n=2), torch.tensor([[BOS, 5, 6], [BOS, 7, 8]])
    expected = torch.stack([m.attention_maps(src, tgt) for m in nets]).mean(0)
    torch.testing.assert_close(Ensemble(nets).eval().attention_maps(src, tgt), expected)


# -- through the CLI ------------------------------------------------------------------------------

TRAIN = ["data.train_size=100", "data.val_size=4", "data.test_size=8", "train.max_steps=24", "train.epochs=30",
         "train.warmup=5", "train.threads=1", "train.bf16=false", "model.members=2", "train.average_last=2",
         "train.eval_every=12", "decode.strategy=beam", "decode.beam=3"]


@pytest.fixture(scope="module")
def ensemble_run(tmp_path_factory):
    from click.testing import CliRunner

    from taskformer.app.cli import main

    out = tmp_path_factory.mktemp("seq-ensemble") / "copy"
    args = ["run", "copy", "--out", str(out), "--quiet", *[a for s in TRAIN for a in ("--set", s)]]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.slow
def test_a_trained_ensemble_evaluates_predicts_and_loads_alike(ensemble_run, cli):
    tests = [json.loads(line) for line in (ensemble_run / "outputs-test.jsonl").read_text().splitlines()]
    sources_, outputs = [t["source"] for t in tests], [t["output"] for t in tests]
    assert any(outputs)  # trained enough to write something
    result = cli("predict", str(ensemble_run), input="\n".join(sources_) + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == outputs
    assert taskformer.load(ensemble_run).predict(sources_) == outputs
    result = cli("eval", str(ensemble_run), "--split", "test", "--json")
    assert result.exit_code == 0, result.output
    saved = json.loads((ensemble_run / "result.json").read_text())["metrics"]["test"]
    assert json.loads(result.stdout)["metrics"]["test"] == pytest.approx(saved)
    result = cli("eval", str(ensemble_run), "--split", "val", "--average", "2", "--set", "decode.quantize=int8")
    assert result.exit_code == 0, result.output


@pytest.mark.slow
def test_export_refuses_an_ensemble(ensemble_run, cli, tmp_path):
    result = cli("export", str(ensemble_run), "--to", "ctranslate2", str(tmp_path / "ct2"))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.startswith("Error:") and len(result.stderr.splitlines()) == 1
    assert "ensemble of 2 networks" in result.stderr and "model.members=1" in result.stderr
    assert not (tmp_path / "ct2").exists()


@pytest.mark.slow
def test_serve_decodes_an_ensemble_as_predict_does(ensemble_run, cli):
    pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
    from test_serve import COPY_INPUTS, Server, predicted

    server = Server(f"copy={ensemble_run}")
    try:
        response = server.post("/v1/models/copy/predict", {"inputs": COPY_INPUTS, "return_attention": True})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["output"] for r in results] == predicted(cli, ensemble_run, COPY_INPUTS)
        texts = [i for i, t in enumerate(COPY_INPUTS) if t]  # a blank input has no attention map
        pairs = taskformer.load(ensemble_run).predict([COPY_INPUTS[i] for i in texts], return_attention=True)
        assert [results[i]["attention"] for i in texts] == [attention._asdict() for _, attention in pairs]
    finally:
        server.stop()


@pytest.mark.slow
def test_the_search_memory_check_counts_every_members_cache(ensemble_run, cli):
    result = cli("predict", str(ensemble_run), "--beam", "10", "--set", "decode.batch_size=1000000000", "1 2 3")
    assert result.exit_code == 2 and result.stderr.startswith("Error:") and len(result.stderr.splitlines()) == 1
    assert "key/value cache" in result.stderr and "2 members (model.members) x beam" in result.stderr
