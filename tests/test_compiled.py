"""``decode.compile``: the one-token step over a static key/value cache, compiled, gives the tokens of
the model as it is, falls back when compiling fails, and keeps compiled code out of run directories."""
from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
import torch

from conftest import run_cli
from taskformer.core import compiled, decoding, inference
from taskformer.core.decoding import DecodeConfig
from taskformer.core.model import PAD, Ensemble, Transformer
from taskformer.core.model_config import ModelConfig

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

V = 24


def network(variant: str, seed: int = 0) -> Transformer:
    """An untrained network made opinionated (larger weights: peaked, varied next-token choices)."""
    torch.manual_seed(seed)
    layers: dict[str, Any] = {"enc_layers": 1} if variant == "encoder-decoder" else {}
    net = Transformer(ModelConfig(variant=variant, vocab_size=V, d_model=16, n_heads=2, dec_layers=2, d_ff=32,
                                  dropout=0.0, max_len=40, tie_embeddings=False, **layers)).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return net


def sources(variant: str, n: int = 6) -> torch.Tensor:
    src = torch.randint(4, V, (n, 7), generator=torch.Generator().manual_seed(1))
    if variant == "encoder-decoder":
        src[::3, 4:] = PAD  # padded rows: the cross-attention mask
    return src


def no_odd_tokens(step, prefix, logprobs):
    """A constraint: odd token ids (above the specials) are banned."""
    banned = torch.zeros(logprobs.size(-1), dtype=torch.bool)
    banned[5::2] = True
    return logprobs.masked_fill(banned, float("-inf"))


SEARCHES = {
    "greedy": (DecodeConfig(strategy="greedy"), None),
    "beam": (DecodeConfig(beam=3), None),
    "constrained greedy": (DecodeConfig(strategy="greedy"), no_odd_tokens),
    "constrained beam": (DecodeConfig(beam=3), no_odd_tokens),
    "sampling": (DecodeConfig(temperature=0.9, top_k=10, seed=3), None),
}


@pytest.mark.parametrize("variant", ["encoder-decoder", "decoder-only"])
@pytest.mark.parametrize("members", [1, 2])
def test_the_static_step_searches_what_the_growing_cache_does(variant, members):
    """Every search, alone and as an ensemble: the step traced over the static cache (the compiler's
    graph, run without generating code) gives the tokens of the model as it is. A decoder-only model
    writes past its positions, so its context slides and the static cache is made again."""
    nets = [network(variant, seed) for seed in range(members)]
    model = nets[0] if members == 1 else Ensemble(nets).eval()
    src, longest = sources(variant), 0
    for name, (config, constraint) in SEARCHES.items():
        config.max_new_tokens = 45  # past max_len=40: the context slides
        static = compiled.Compiled(copy.deepcopy(model), backend="eager")
        expected = decoding.search(model, src, config, constraint)
        assert decoding.search(static, src, config, constraint) == expected, name
        longest = max(longest, *map(len, expected))
    # the comparison covers long outputs: a decoder-only prompt of 7 and 34 more tokens slide past max_len
    assert longest > (33 if variant == "decoder-only" else 10)


def test_a_compiler_that_fails_leaves_the_model_as_it_is_and_says_so_once():
    def refuse(graph, inputs):
        raise RuntimeError("no C++ compiler here")

    model, src = network("encoder-decoder"), sources("encoder-decoder")
    static = compiled.Compiled(copy.deepcopy(model), backend=refuse)
    with pytest.warns(UserWarning, match="decode.compile: compiling the decoding step failed") as warned:
        out = decoding.search(static, src, DecodeConfig(beam=3))
        assert decoding.search(static, src, DecodeConfig(strategy="greedy")) == decoding.search(
            model, src, DecodeConfig(strategy="greedy"))
    assert out == decoding.search(model, src, DecodeConfig(beam=3))
    assert len([w for w in warned if "decode.compile" in str(w.message)]) == 1


def test_the_compiled_cache_is_the_users_keyed_by_torch_and_cpu(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = compiled.cache_folder()
    assert folder.parent == tmp_path / "taskformer" / "compiled"
    assert torch.__version__.split("+")[0] in folder.name
    assert torch.backends.cpu.get_cpu_capability() in folder.name
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compiled.cache_folder() == tmp_path / "mine"


def test_a_decoding_copy_compiles_only_when_asked():
    model = network("encoder-decoder")
    assert not getattr(inference.for_decoding(model, "none"), "static", False)
    assert inference.for_decoding(model, "none", compile=True).static
    assert inference.for_decoding(model, "none", compile=True) is inference.for_decoding(model, "none", compile=True)


def test_predict_compiled_gives_the_same_outputs_and_writes_nothing_to_the_run(finished, tmp_path):
    """Through the CLI, with Inductor's generated code (a C++ compiler is needed; without one the
    fallback gives the same outputs and warns): the compiled code goes to the user's cache folder,
    and the run directory is left exactly as it was."""
    lines = ["1 2 3 4 5", "9 8 7", "4 4 4 4 4 4 4"]
    before = sorted((p.relative_to(finished), p.stat().st_mtime_ns) for p in finished.rglob("*"))
    plain = run_cli("predict", str(finished), "--json", input="\n".join(lines) + "\n")
    assert plain.returncode == 0, plain.stderr
    cache = tmp_path / "compiled"
    fast = run_cli("predict", str(finished), "--json", "--set", "decode.compile=true",
                   input="\n".join(lines) + "\n", env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    assert fast.returncode == 0, fast.stderr
    assert [json.loads(x) for x in fast.stdout.splitlines()] == [json.loads(x) for x in plain.stdout.splitlines()]
    if "compiling the decoding step failed" not in fast.stderr:
        assert any(cache.rglob("*")), "the compiled step was not cached in TORCHINDUCTOR_CACHE_DIR"
    assert sorted((p.relative_to(finished), p.stat().st_mtime_ns) for p in finished.rglob("*")) == before
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") != str(finished)


def test_int8_decodes_through_the_static_step_as_it_does_alone():
    """torchao's int8 copy (per-row weights, per-token inputs) traced over the static cache gives the
    tokens it gives as it is; ``for_decoding`` compiles that copy when both are asked for."""
    model, src = network("encoder-decoder"), sources("encoder-decoder")
    alone = inference.for_decoding(model, "int8")
    linears = [m for m in alone.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m.weight).__name__ == "Int8Tensor" for m in linears)
    static = compiled.Compiled(copy.deepcopy(alone), backend="eager")
    for config in (DecodeConfig(strategy="greedy"), DecodeConfig(beam=3)):
        assert decoding.search(static, src, config) == decoding.search(alone, src, config)
    assert inference.for_decoding(model, "int8", compile=True).static


def test_the_gpus_kept_buffers_search_what_the_growing_cache_does():
    """On a GPU the static cache lives in buffers kept per shape and a beam reorders into them (a CUDA
    graph reads fixed addresses). Forced on here: every search, and an ensemble, gives the same tokens,
    and a second batch of sentences reuses the first one's buffers."""
    nets = [network("encoder-decoder", seed) for seed in range(2)]
    for model in (nets[0], Ensemble(nets).eval()):
        static = compiled.Compiled(copy.deepcopy(model), backend="eager")
        static.gpu = True
        src = sources("encoder-decoder")
        for name, (config, constraint) in SEARCHES.items():
            assert decoding.search(static, src, config, constraint) == decoding.search(model, src, config, constraint), name
        kept = {id(buffer) for buffer in static._pool.buffers.values()}
        decoding.search(static, sources("encoder-decoder"), DecodeConfig(beam=3))
        assert {id(buffer) for buffer in static._pool.buffers.values()} == kept
