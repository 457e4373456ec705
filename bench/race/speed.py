"""Side-by-side speed benchmark: taskformer against the classic tutorial Transformer.

Both implementations run in this one process, alternating round by round on the same workloads,
so machine noise hits both alike; the table reports absolute figures and taskformer/baseline
ratios. The baseline is imported from ``../shared/bench/reference_transformer.py`` (not copied).

    python bench/race/speed.py                 # full run (several minutes on 2 cores)
    python bench/race/speed.py --quick         # reduced workloads and rounds, a few minutes
    python bench/race/speed.py --json out.json # also write the figures as JSON

Workloads (model shape for all: vocab 8000, d_model 256, 3+3 layers, 8 heads, FFN 1024):
1. training target tokens/s on a fixed synthetic batch of 128 x 24 tokens;
2. training non-padding target tokens/s on real Multi30k batches (baseline: random batches of
   128 sentences padded to the batch maximum; taskformer: its token-based length buckets);
3. decoding sentences/s on Multi30k val sources, EOS ignored so every sentence takes the same 24
   steps (baseline: greedy, one sentence at a time, no cache; taskformer: greedy and beam 5 with a
   KV cache, in length-sorted batches of 128, one batch per thread at a time, through the copy with
   pre-packed linear layers and glibc keeping freed memory, as the CLI decodes);
4. peak resident memory of each (measured in a child process per implementation) and model FLOP
   utilisation against this machine's matmul peak, measured in the same run;
5. when ``ctranslate2`` is importable: the race with CTranslate2. taskformer's decoding model is
   exported (``core.export``, fp32 and int8) and CTranslate2 decodes the same sources in the same
   rounds: greedy and beam 5, the same 24 steps (``min_decoding_length`` = ``max_decoding_length``;
   its outputs are checked to hold 24 tokens), length-sorted batches of 128, and the same threads
   (one batch per ``inter_threads`` worker, ``intra_threads=1``, as taskformer's workers). Printed
   beside taskformer's rows, with taskformer/CTranslate2 ratios; taskformer int8
   (``decode.quantize=int8``) races CTranslate2 int8, and both race again one sentence at a time
   (batch 1);
6. when ``ctranslate2`` is importable: ``decode.engine=auto`` through taskformer's predict path against
   raw CTranslate2 on the same weights (``engine_race.py``: batch 1 and 128, greedy and beam 5, fp32
   and int8), the ratios printed; ``--classifier RUN`` adds a classifier run's batch-1 latency through
   ONNX Runtime against torch, with the labels' agreement on its test outputs;
7. what each decoding change bought (``decode_ablation.py``: the current code against the same with
   one change undone by monkeypatching), and the training step with ``core/model.py`` at ``--before``
   against today's.

taskformer runs in fp32 always and in bf16 only where bf16 is native (``core.precision``); the
table's title names the CPU, its kernel capability and the bf16 decision, and the ratios are given
for fp32 alone as well as for the best precision. To see the slow path of an AVX2-only CPU on a
faster one: ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

try:
    import ctranslate2
except ImportError:  # the race rows need it: pip install taskformer[export]
    ctranslate2 = None

from decode_ablation import ablation
from engine_race import classifier, copy_run, print_race, race, texts_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import alternate, cpu_name, forced_isa, timed  # noqa: E402
from taskformer.app.resources import keep_freed_memory  # noqa: E402
from taskformer.core import decoding, export, inference, precision  # noqa: E402
from taskformer.core.data import pad, token_batches  # noqa: E402
from taskformer.core.precision import autocast  # noqa: E402
from taskformer.core.tokenize import symbols  # noqa: E402
from workload import BOS, CPU, PAD, ROOT, B, L, Transformer, V, decode_fixed, make_reference, make_taskformer, multi30k, ref  # noqa: E402


# -- workloads --------------------------------------------------------------------------------------
def synthetic_training(rounds: int, steps: int, precisions: tuple[str, ...]) -> dict:
    gen = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, V, (B, L), generator=gen), torch.randint(4, V, (B, L + 1), generator=gen)
    tgt[:, 0] = BOS
    contenders = {"baseline": make_reference()[1]} | {f"taskformer {p}": make_taskformer(p == "bf16")[1]
                                                       for p in precisions}
    for step in contenders.values():
        step(src, tgt)  # warm-up

    def work(name, step):
        return timed(lambda: [step(src, tgt) for _ in range(steps)]) / steps
    secs = alternate(contenders, work, rounds)
    return {name: B * L / s for name, s in secs.items()}


def real_training(src, tgt, rounds: int, steps: int, max_tokens: int, precisions: tuple[str, ...]) -> dict:
    rng = random.Random(0)
    lengths = [max(len(s), len(t)) for s, t in zip(src, tgt)]
    buckets = token_batches(lengths, max_tokens, seed=0)
    random_batches = [rng.sample(range(len(src)), B) for _ in range(steps * rounds + 1)]
    contenders = {"baseline": (make_reference()[1], random_batches)} | {
        f"taskformer {p}": (make_taskformer(p == "bf16")[1], buckets) for p in precisions}
    cursor = {name: 0 for name in contenders}
    tokens = {name: 0 for name in contenders}
    seconds = {name: 0.0 for name in contenders}

    def batch(name, batches):
        idx = batches[cursor[name] % len(batches)]
        cursor[name] += 1
        return pad([src[i] for i in idx]), pad([tgt[i] for i in idx])

    for name, (step, batches) in contenders.items():
        step(*batch(name, batches))  # warm-up
    for _ in range(rounds):
        for name, (step, batches) in contenders.items():
            for _ in range(steps):
                s, t = batch(name, batches)
                seconds[name] += timed(step, s, t)
                tokens[name] += int((t[:, 1:] != PAD).sum())
    return {name: tokens[name] / seconds[name] for name in contenders}


def ctranslate2_contenders(model: Transformer, sources: list[list[int]], batch_size: int, workers: int,
                           folder: Path, suffix: str = "") -> dict:
    """CTranslate2 decoding the same weights and sources: ``{name: fn}`` for the timing rounds.

    CTranslate2 takes token strings: the ids become synthetic tokens (``t4`` ...) of a tokenizer that
    only gives the export its vocabulary; the trailing EOS is left to CTranslate2 (``add_source_eos``).
    """
    tokenizer = symbols([f"t{i}" for i in range(4, V)])
    tokens = [[f"t{i}" for i in s[:-1]] for s in sorted(sources, key=len, reverse=True)]  # longest first, as ours
    contenders = {}
    for quantization, compute_type in (("float32", "float32"), ("int8", "int8")):
        path = export.to_ctranslate2(model, tokenizer, folder / quantization, quantization)
        threads = torch.get_num_threads()
        translator = ctranslate2.Translator(str(path), device="cpu", compute_type=compute_type,
                                            inter_threads=workers, intra_threads=1)
        torch.set_num_threads(threads)  # the Translator sets the OpenMP threads it shares with torch to 1
        for search, beam in (("greedy", 1), ("beam5", 5)):
            def run(_, translator=translator, beam=beam, search=search):
                out = translator.translate_batch(tokens, max_batch_size=batch_size, beam_size=beam,
                                                 min_decoding_length=L, max_decoding_length=L)
                if any(len(r.hypotheses[0]) != L for r in out):  # the workload must match ours step for step
                    raise RuntimeError(f"CTranslate2 {search} did not decode exactly {L} steps")
                return len(out)
            contenders[f"ctranslate2 {search} {'fp32' if quantization == 'float32' else quantization}{suffix}"] = run
    return contenders


def decoding_speed(val_src, n_baseline: int, n_taskformer: int, rounds: int, precisions: tuple[str, ...],
                   folder: Path | None = None, batch_size: int | None = None) -> dict:
    """Sentences/s of each contender; with ``folder`` (a scratch directory) CTranslate2 races too.

    ``batch_size`` (default: decode.batch_size, 128) sentences per batch for taskformer and CTranslate2
    alike; below the default, the rows are named ``... (batch N)`` and the baseline is left out.
    """
    base_model = make_reference()[0].eval()
    tf_model = make_taskformer(False)[0].eval()  # exported for CTranslate2 as it is
    fast = inference.for_decoding(tf_model, "none")  # the copy that taskformer decodes with (packed on CPU)
    sources = [s for s in val_src]

    def baseline(_):
        with torch.no_grad():
            for s in sources[:n_baseline]:
                x = torch.tensor([s])
                ref.greedy_decode(base_model, x, (x != PAD).unsqueeze(-2), L + 1, BOS)
        return n_baseline

    # As `taskformer run`, `eval` and `predict` decode (runner.decode_texts): length-sorted batches of
    # decode.batch_size sentences, decode.workers batches at a time.
    cfg = decoding.DecodeConfig()
    size = batch_size or cfg.batch_size
    suffix = "" if size == cfg.batch_size else f" (batch {size})"
    order = sorted(range(n_taskformer), key=lambda i: -len(sources[i]))  # longest first, as the CLI
    batches = [pad([sources[j] for j in order[i : i + size]]) for i in range(0, n_taskformer, size)]
    workers = decoding.decode_workers(cfg.workers, CPU, len(batches))
    int8_model = inference.for_decoding(tf_model, "int8")

    def ours(search, bf16, workers=workers, model=fast):
        def one(chunk):
            with autocast(bf16, CPU):
                return decode_fixed(model, chunk, search)

        def run(_):
            for _ in decoding.parallel_map(one, batches, workers):
                pass
            return n_taskformer
        return run

    contenders = {"baseline greedy (bs 1, no cache)": baseline} if not suffix else {}
    for search in ("greedy", "beam5"):
        contenders |= {f"taskformer {search} {p}{suffix}": ours(search, p == "bf16") for p in precisions}
        contenders[f"taskformer {search} int8{suffix}"] = ours(search, False, model=int8_model)
    fastest = precisions[-1]
    if not suffix:
        contenders[f"taskformer greedy {fastest}, 1 worker"] = ours("greedy", fastest == "bf16", workers=1)
    if folder is not None:
        contenders |= ctranslate2_contenders(tf_model, sources[:n_taskformer], size, workers, folder / f"batch{size}",
                                             suffix)

    def work(name, fn):
        t = time.perf_counter()
        n = fn(None)
        return (time.perf_counter() - t) / n
    secs = alternate(contenders, work, rounds)
    return {name: 1.0 / s for name, s in secs.items()} | {"workers": workers}


def model_module_at(rev: str):
    """``core/model.py`` as it was at git revision ``rev``, imported beside the current one."""
    code = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:core/model.py"], capture_output=True, text=True,
                          check=True).stdout
    module = types.ModuleType("taskformer.core._model_at_" + rev)
    module.__package__ = "taskformer.core"
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(code, f"{rev}:core/model.py", "exec"), module.__dict__)
    return module


def training_before_after(rev: str, rounds: int, steps: int) -> dict:
    """Training tokens/s (fp32, the synthetic batch) with ``rev``'s model code and with today's, side by side."""
    gen = torch.Generator().manual_seed(0)
    src, tgt = torch.randint(4, V, (B, L), generator=gen), torch.randint(4, V, (B, L + 1), generator=gen)
    tgt[:, 0] = BOS
    contenders = {f"model code at {rev}": make_taskformer(False, model_module_at(rev))[1],
                  "model code now": make_taskformer(False)[1]}
    for step in contenders.values():
        step(src, tgt)
    secs = alternate(contenders, lambda name, step: timed(lambda: [step(src, tgt) for _ in range(steps)]) / steps, rounds)
    return {name: B * L / s for name, s in secs.items()}


def matmul_peak(repeats: int, bf16: bool) -> dict:
    """Best sustained GFLOP/s of a large square matmul, fp32 and (where native) bf16.

    Emulated bf16 is skipped: oneDNN's fallback for it can take minutes for one 2048^3 product.
    """
    out = {}
    for dtype in (torch.float32, torch.bfloat16)[: 2 if bf16 else 1]:
        a, b = torch.randn(2048, 2048, dtype=dtype), torch.randn(2048, 2048, dtype=dtype)
        a @ b
        best = min(timed(products, a, b, 5) / 5 for _ in range(repeats))
        out[str(dtype).removeprefix("torch.")] = 2 * 2048 ** 3 / best / 1e9
    return out


def products(a: torch.Tensor, b: torch.Tensor, n: int) -> None:
    """``a @ b``, ``n`` times."""
    for _ in range(n):
        a @ b


def step_flops() -> int:
    """FLOPs of one training step (forward + backward) on the synthetic batch, counted by torch."""
    model, _ = make_taskformer(False)
    src, tgt = torch.randint(4, V, (B, L)), torch.randint(4, V, (B, L + 1))
    with FlopCounterMode(display=False) as counter:
        F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].reshape(-1)).backward()
    return counter.get_total_flops()


def peak_memory(steps: int, precisions: tuple[str, ...]) -> dict:
    """Peak RSS (MiB) of fresh child processes, one per implementation, each training ``steps`` synthetic steps.

    Read from the kernel's high-water mark (VmHWM): ``ru_maxrss`` would carry over this parent's
    size through fork + exec. The children run side by side: each reports only its own memory.
    """
    children = {}
    for which in ("baseline", *precisions):
        code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import workload as w, torch;"
                f"step = w.make_reference()[1] if {which!r} == 'baseline' else w.make_taskformer({which!r} == 'bf16')[1];"
                "src = torch.randint(4, w.V, (w.B, w.L)); tgt = torch.randint(4, w.V, (w.B, w.L + 1));"
                f"[step(src, tgt) for _ in range({steps})];"
                "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')))")
        children[which] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    out = {}
    for which, child in children.items():
        stdout, _ = child.communicate()
        if child.returncode:
            raise RuntimeError(f"peak-memory child for {which} failed")
        out[which] = int(stdout.split()[-1]) / 1024
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="reduced workloads and rounds (fp32 kept: it races CTranslate2)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--classifier", type=Path, metavar="RUN", help="a finished classifier run (agnews) whose batch-1 "
                    "latency through ONNX Runtime races our torch decoder")
    ap.add_argument("--max-tokens", type=int, default=4096, help="taskformer batch size in tokens (real data)")
    ap.add_argument("--before", default="568e46a", metavar="REV",
                    help="git revision whose core/model.py the training step is compared with (default: the last one before "
                         "the decoding speed-ups)")
    args = ap.parse_args()
    torch.manual_seed(0)
    keep_freed_memory()  # as `taskformer run`, `eval` and `predict` do
    quick = args.quick
    started = time.perf_counter()

    def stage(name):
        print(f"[{time.perf_counter() - started:6.1f} s] {name}", file=sys.stderr, flush=True)

    native, why = precision.bf16_native("cpu")
    precisions = ("fp32", "bf16") if native else ("fp32",)
    if not native:
        stage(f"bf16 rows skipped: bf16 is not native here ({why})")
    stage("matmul peak and FLOP count")
    peak = matmul_peak(1 if quick else 3, native)
    flops = step_flops()
    stage("synthetic training")
    synth = synthetic_training(rounds=1 if quick else 5, steps=1 if quick else 4, precisions=precisions)
    stage("Multi30k tokenizer and batches")
    src, tgt, val_src = multi30k(2000 if quick else 29000)
    stage("Multi30k training")
    real = real_training(src, tgt, rounds=1 if quick else 4, steps=1 if quick else 8, max_tokens=args.max_tokens,
                         precisions=precisions)
    stage("decoding" + ("" if ctranslate2 else ": CTranslate2 rows skipped, ctranslate2 is not installed "
                                                "(pip install taskformer[export])"))
    with tempfile.TemporaryDirectory() as folder:
        dec = decoding_speed(val_src, n_baseline=4 if quick else 50, n_taskformer=192 if quick else 1000,
                             rounds=1 if quick else 3, precisions=precisions,
                             folder=Path(folder) if ctranslate2 else None)
        stage("decoding one sentence at a time (batch 1)")
        dec |= decoding_speed(val_src, n_baseline=0, n_taskformer=16 if quick else 200, rounds=1 if quick else 3,
                              precisions=precisions, folder=Path(folder) if ctranslate2 else None, batch_size=1)
    ct2 = {k: dec.pop(k) for k in list(dec) if k.startswith("ctranslate2")}
    engines = {}
    if ctranslate2:
        stage("decode.engine=auto against raw CTranslate2")
        engines = race(copy_run(make_taskformer(False)[0], V, "cpu"), texts_of(val_src), 1 if quick else 3,
                       {1: 16 if quick else 200, 128: 192 if quick else 1000})
    if args.classifier:
        stage(f"classifier {args.classifier}: ONNX Runtime against torch")
        engines["classifier"] = classifier(args.classifier, 20 if quick else 200)
    stage("ablation: each decoding change undone alone")
    changes = ablation(val_src, n=128 if quick else 512, rounds=1 if quick else 3, workers=dec["workers"])
    stage(f"training step: model code at {args.before} vs now")
    train_ab = training_before_after(args.before, rounds=1 if quick else 5, steps=1 if quick else 4)
    stage("peak memory")
    memory = peak_memory(1 if quick else 5, precisions)

    def best(d, prefix):  # the best precision (fp32 or bf16; int8 has rows of its own)
        return max((v, k) for k, v in d.items() if k.startswith(prefix) and k.split()[-1] in ("fp32", "bf16"))

    def fp32(d, prefix):
        return next((v for k, v in d.items() if k.startswith(prefix) and k.endswith("fp32")), float("nan"))

    workers = dec.pop("workers")
    base_greedy = dec["baseline greedy (bs 1, no cache)"]
    result = {
        "date": dt.date.today().isoformat(),
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_native": native,
        "bf16_decision": why,
        "forced_isa": forced_isa(),
        "threads": torch.get_num_threads(),
        "decode_workers": workers,
        "torch": torch.__version__,
        "quick": quick,
        "matmul_peak_gflops": peak,
        "train_step_gflop": flops / 1e9,
        "train_synthetic_tokens_per_s": synth,
        "train_real_nonpad_tokens_per_s": real,
        "decode_sentences_per_s": dec,
        "peak_rss_mib": memory,
        "mfu_synthetic": {k: flops / (B * L / v) / 1e9 / peak["bfloat16" if "bf16" in k else "float32"]
                          for k, v in synth.items()},
        "train_synthetic_ratio": best(synth, "taskformer")[0] / synth["baseline"],
        "train_real_ratio": best(real, "taskformer")[0] / real["baseline"],
        "greedy_ratio": best(dec, "taskformer greedy")[0] / base_greedy,
        "beam5_vs_baseline_greedy_ratio": best(dec, "taskformer beam5")[0] / base_greedy,
        "fp32_ratios": {"train_synthetic": fp32(synth, "taskformer") / synth["baseline"],
                        "train_real": fp32(real, "taskformer") / real["baseline"],
                        "greedy": fp32(dec, "taskformer greedy") / base_greedy,
                        "beam5_vs_baseline_greedy": fp32(dec, "taskformer beam5") / base_greedy},
        "decode_ablation": changes,
        "train_before_after": train_ab,
        "train_now_vs_before_ratio": train_ab["model code now"] / train_ab[f"model code at {args.before}"],
        "engines": engines,
        "seconds": time.perf_counter() - started,
    }
    if ct2:
        result["ctranslate2"] = {"version": ctranslate2.__version__, "inter_threads": workers, "intra_threads": 1}
        result["ctranslate2_decode_sentences_per_s"] = ct2
        # taskformer / CTranslate2, above 1 when taskformer decodes faster
        vs = result["vs_ctranslate2"] = {}
        for search in ("greedy", "beam5"):
            for size, suffix in (("", ""), ("_batch1", " (batch 1)")):
                mine = {"fp32": dec.get(f"taskformer {search} fp32{suffix}", float("nan")),
                        "int8": dec[f"taskformer {search} int8{suffix}"]}
                if not suffix:
                    mine["best"] = best(dec, f"taskformer {search}")[0]
                for ours, v in mine.items():
                    for theirs in ("fp32", "int8"):
                        if v == v and (ours != "int8" or theirs == "int8"):  # not NaN; int8 races int8
                            vs[f"{search}{size}_{ours}_vs_ct2_{theirs}"] = v / ct2[f"ctranslate2 {search} {theirs}{suffix}"]
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    forced = " ".join(f"{k}={v}" for k, v in r["forced_isa"].items())
    t = Table(title=f"taskformer vs baseline — {r['cpu']} ({r['cpu_capability']}{', ' + forced if forced else ''}; "
                    f"bf16 {'native' if r['bf16_native'] else 'not native'}: {r['bf16_decision']}), {r['threads']} "
                    f"threads ({r['decode_workers']} decoding workers), torch {r['torch']}, {r['date']}")
    for col in ("workload", "implementation", "figure", "vs baseline"):
        t.add_column(col)
    for label, key, unit in (("train synthetic", "train_synthetic_tokens_per_s", "tgt tok/s"),
                             ("train Multi30k", "train_real_nonpad_tokens_per_s", "non-pad tgt tok/s")):
        base = r[key]["baseline"]
        for name, v in r[key].items():
            mfu = f" (MFU {100 * r['mfu_synthetic'][name]:.1f}%)" if key.startswith("train_synthetic") else ""
            t.add_row(label, name, f"{v:,.0f} {unit}{mfu}", f"{v / base:.2f}x")
    base = r["decode_sentences_per_s"]["baseline greedy (bs 1, no cache)"]
    for name, v in r["decode_sentences_per_s"].items():
        t.add_row("decode 24 steps", name, f"{v:,.1f} sent/s", f"{v / base:.1f}x")
    for name, v in r["train_before_after"].items():
        t.add_row("train synthetic fp32", name, f"{v:,.0f} tgt tok/s", "")
    for name, v in r.get("ctranslate2_decode_sentences_per_s", {}).items():
        c = r["ctranslate2"]
        t.add_row("decode 24 steps", f"{name} ({c['inter_threads']} x {c['intra_threads']} thread)",
                  f"{v:,.1f} sent/s", f"{v / base:.1f}x")
    for name, v in r["peak_rss_mib"].items():
        t.add_row("peak RSS (train)", name, f"{v:,.0f} MiB", "")
    t.add_row("matmul peak", " / ".join(r["matmul_peak_gflops"]),
              " / ".join(f"{v:,.0f}" for v in r["matmul_peak_gflops"].values()) + " GFLOP/s", "")
    Console().print(t)
    print(f"ratios: train_synthetic {r['train_synthetic_ratio']:.2f}x, train_real {r['train_real_ratio']:.2f}x, "
          f"greedy {r['greedy_ratio']:.1f}x, beam5 vs baseline greedy {r['beam5_vs_baseline_greedy_ratio']:.1f}x "
          f"({r['seconds']:.0f} s)")
    f = r["fp32_ratios"]
    print(f"fp32 alone: train_synthetic {f['train_synthetic']:.2f}x, train_real {f['train_real']:.2f}x, "
          f"greedy {f['greedy']:.1f}x, beam5 vs baseline greedy {f['beam5_vs_baseline_greedy']:.1f}x")
    if "vs_ctranslate2" in r:
        print(f"taskformer / CTranslate2 {r['ctranslate2']['version']} (above 1: taskformer faster): "
              + ", ".join(f"{k} {v:.2f}x" for k, v in r["vs_ctranslate2"].items()))
    print_race(r.get("engines", {}))
    print(f"training step, model code now / before: {r['train_now_vs_before_ratio']:.3f}x")
    print("each decoding change, speed with it / with it undone (above 1: it helps):")
    for change, ratios in r["decode_ablation"].items():
        print(f"  {change}: " + ", ".join(f"{w} {v:.3f}x" for w, v in ratios.items()))


if __name__ == "__main__":
    main()
