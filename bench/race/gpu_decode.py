"""Decoding on a GPU: eager, the compiled static step, the step as a CUDA graph, and CTranslate2.

    python bench/race/gpu_decode.py --out gpu.json           # on a machine with a CUDA GPU
    python bench/race/gpu_decode.py --device cpu --quick     # a smoke run of the script anywhere

bench/race/speed.py's network (vocabulary 8,000, d_model 256, 3+3 layers, 8 heads, FFN 1024) with its
seeded random weights, fp32. Sources are synthetic: ``--src-len`` random tokens each (Multi30k's
German sentences average about that many subwords), and every sentence is decoded for exactly
``--steps`` tokens (EOS ignored), as bench/race/speed.py races. Contenders, in alternating rounds:

- ``eager``: the model as ``predict`` decodes it on a GPU today;
- ``compiled``: the static-cache step through Inductor's Triton kernels, without CUDA graphs;
- ``cudagraph``: the same step captured as a CUDA graph (what ``decode.compile`` does on a GPU);
- ``ctranslate2``: the exported weights on the GPU, where CTranslate2 can use it.

Then the engine choice (bench/race/engine_race.py): ``decode.engine=auto`` through taskformer's predict
path (on a GPU: CTranslate2 with CUDA where it has it, else our decoder, and the reason) against raw
CTranslate2 on the same device and weights, batch 1 and 128, greedy and beam 5, fp32 and int8, with
natural lengths (a budget of ``--steps`` tokens, EOS ending a sentence sooner). ``--no-engines``
leaves it out.

Each is timed at batch 1 (``--n1`` sentences one by one) and batch 128 (``--n128`` sentences), greedy
and beam 5; the first pass of each (compiling and capturing) is timed apart. Greedy outputs of each
contender are compared with eager's. Inductor's counters (graphs, recompiles, CUDA graph skips) are
reported, since a skipped graph shows up only as a slow row.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py, for engine_race

from taskformer.core import decoding, export, inference
from taskformer.core.compiled import Compiled
from taskformer.core.model import EOS, Transformer
from taskformer.core.model_config import ModelConfig
from taskformer.core.tokenize import symbols

V = 8000
SHAPE: dict[str, Any] = dict(vocab_size=V, d_model=256, n_heads=8, enc_layers=3, dec_layers=3, d_ff=1024, dropout=0.1,
             tie_embeddings=False, max_len=128)


def sources(n: int, length: int, seed: int = 0) -> torch.Tensor:
    """``n`` sources of ``length`` random tokens, each ending with EOS as the tokenizer's do."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (n, length), generator=g)
    src[:, -1] = EOS
    return src


def synchronized(device: torch.device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def decode_all(model, src: torch.Tensor, batch: int, search: str, steps: int, device) -> list[list[int]]:
    out = []
    for i in range(0, src.size(0), batch):
        chunk = src[i : i + batch].to(device)
        limit = torch.full((chunk.size(0),), steps, device=device)
        if search == "greedy":
            out += decoding.greedy(model, chunk, limit, ignore_eos=True)
        else:
            out += decoding.beam_search(model, chunk, limit, beam=5, ignore_eos=True)
    synchronized(device)
    return out


def ctranslate2_translator(model, folder: Path, device: torch.device):
    """CTranslate2 on the same weights and device, or the reason it cannot run here."""
    try:
        import ctranslate2
        if device.type == "cuda" and ctranslate2.get_cuda_device_count() < 1:
            return "CTranslate2 sees no CUDA device"
        path = export.to_ctranslate2(model.cpu(), symbols([f"t{i}" for i in range(4, V)]), folder / "ct2", "float32")
        translator = ctranslate2.Translator(str(path), device=device.type, compute_type="float32")
        translator.translate_batch([["t4"]], beam_size=1, max_decoding_length=2)  # fails here if CUDA is unusable
        return translator
    except Exception as error:  # noqa: BLE001 -- the reason is the result
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    finally:
        model.to(device)


def ctranslate2_run(translator, src: torch.Tensor, batch: int, steps: int):
    tokens = [[f"t{int(i)}" for i in row[:-1]] for row in src]  # CTranslate2 adds the EOS itself

    def run(search: str):
        out = translator.translate_batch(tokens, max_batch_size=batch, beam_size=1 if search == "greedy" else 5,
                                         min_decoding_length=steps, max_decoding_length=steps)
        return [r.hypotheses[0] for r in out]
    return run


def engines(model, args, device: torch.device, translator) -> dict | str:
    """``decode.engine=auto`` against raw CTranslate2 on this device (bench/race/engine_race.py), or why it cannot run."""
    if isinstance(translator, str):
        return f"skipped: CTranslate2 cannot decode on {device.type} here ({translator})"
    from engine_race import copy_run, print_race, race, texts_of

    rows = [row.tolist() for row in sources(max(args.n1, args.n128), args.src_len)]
    result = race(copy_run(model, V, device.type), texts_of(rows), args.rounds, {1: args.n1, 128: args.n128},
                  device.type)
    print_race(result)
    return result


def profile(model, src: torch.Tensor, steps: int, device: torch.device) -> str:
    """Where a sentence's time goes, one at a time: the profiler's table of operators by host time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    decode_all(model, src, 1, "greedy", steps, device)  # compiled and captured before the profile
    with profiler(activities=activities) as prof:
        decode_all(model, src, 1, "greedy", steps, device)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--n1", type=int, default=64, help="sentences decoded one at a time")
    parser.add_argument("--n128", type=int, default=1024, help="sentences decoded in batches of 128")
    parser.add_argument("--src-len", type=int, default=16)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few sentences, one round")
    parser.add_argument("--profile", action="store_true",
                        help="also profile the CUDA graph contender's greedy decode at batch 1 (torch.profiler)")
    parser.add_argument("--no-engines", action="store_true", help="leave out the engine choice's race")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args()
    if args.quick:
        args.n1, args.n128, args.rounds = 4, 16, 1
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SHAPE)).to(device).eval()
    eager = inference.for_decoding(model, "none")
    contenders = {"eager": eager, "compiled": Compiled(model, options={}) if device.type == "cuda" else None,
                  "cudagraph": inference.for_decoding(model, "none", compile=True)}
    contenders = {k: v for k, v in contenders.items() if v is not None}
    results: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                     "torch": torch.__version__, "shape": SHAPE, "src_len": args.src_len, "steps": args.steps,
                     "rows": {}, "first_pass_s": {}, "greedy_differs_from_eager": {}}
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        translator = ctranslate2_translator(model, Path(tmp), device)
        if isinstance(translator, str):
            results["ctranslate2"] = translator
            print(f"ctranslate2: left out, it cannot decode on {device.type} here: {translator}", flush=True)
        for batch, n in ((1, args.n1), (128, args.n128)):
            src = sources(n, args.src_len)
            runs = {name: (lambda search, m=m, batch=batch, src=src: decode_all(m, src, batch, search, args.steps, device))
                    for name, m in contenders.items()}
            if not isinstance(translator, str):
                runs["ctranslate2"] = ctranslate2_run(translator, src, batch, args.steps)
            for search in ("greedy", "beam5"):
                first = {}
                for name, run in list(runs.items()):  # compiles and captures: timed apart
                    started = time.perf_counter()
                    try:
                        first[name] = run(search)
                    except Exception as error:  # noqa: BLE001 -- a contender that cannot run here is left out, said why
                        if name == "eager":
                            raise
                        results.setdefault("left_out", {})[name] = f"{type(error).__name__}: {str(error)[:300]}"
                        print(f"{name}: left out, it failed: {results['left_out'][name]}", flush=True)
                        contenders.pop(name, None)
                        del runs[name]
                        continue
                    results["first_pass_s"][f"{name} {search} b{batch}"] = round(time.perf_counter() - started, 2)
                if search == "greedy":
                    for name in runs:
                        if name != "ctranslate2":
                            differs = sum(a != b for a, b in zip(first[name], first["eager"]))
                            results["greedy_differs_from_eager"][f"{name} b{batch}"] = f"{differs}/{n}"
                seconds: dict[str, list[float]] = {name: [] for name in runs}
                for _ in range(args.rounds):
                    for name, run in runs.items():
                        synchronized(device)
                        started = time.perf_counter()
                        run(search)
                        seconds[name].append(time.perf_counter() - started)
                row = {name: round(n / statistics.median(s), 1) for name, s in seconds.items()}
                results["rows"][f"{search} b{batch}"] = row
                print(f"{search} batch {batch} (sentences/s):", row, flush=True)
                if args.out:  # as it goes: a run cut short keeps its rows
                    args.out.write_text(json.dumps(results, indent=1) + "\n")
        if args.profile and "cudagraph" in contenders:
            results["profile greedy b1"] = profile(contenders["cudagraph"], sources(args.n1, args.src_len), args.steps,
                                                   device)
            print(results["profile greedy b1"])
    if not args.no_engines:
        results["engines"] = engines(model, args, device, translator)
        if isinstance(results["engines"], str):
            print(results["engines"], flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1) + "\n")
    from torch._dynamo.utils import counters
    results["counters"] = {group: dict(values) for group, values in counters.items()
                           if group in ("stats", "inductor", "recompiles") and values}
    results["first_pass_s"] = dict(results["first_pass_s"])
    print(json.dumps({k: v for k, v in results.items() if k != "shape"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
