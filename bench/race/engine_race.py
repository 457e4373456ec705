"""The engines' race: ``decode.engine=auto`` through taskformer's predict path against the raw runtime.

    python bench/race/engine_race.py --run RUN --json race.json    # a trained encoder-decoder run (translate-de-en)
    python bench/race/engine_race.py --json race.json              # bench/race/speed.py's untrained network instead
    python bench/race/engine_race.py --quick                       # tiny: checks that it runs
    python bench/race/engine_race.py --no-search --classifier RUN  # a classifier run: ONNX Runtime against torch

1. Search. ``--run RUN``: the run's weights and tokenizer, its test sources (``outputs-test.jsonl``),
   its length budget and length penalty. Without it: bench/race/speed.py's network (untrained, vocabulary
   8,000, d_model 256, 3+3 layers) as a copy run held in memory, its Multi30k val sources as texts of
   synthetic tokens, a budget of 24 tokens. Either way fp32 (``train.bf16=false``: a run trained in
   bf16 decodes in fp32 here). ``auto`` decodes through ``runner.predict`` (what ``taskformer
   predict``, the Python API and the server call: normalizing, tokenizing, batching by length, the
   runtime, detokenizing); raw CTranslate2 decodes the same token lists with the same weights
   (exported by ``core.export``), options (each sentence's budget, the specials suppressed, the
   length penalty) and threads, the idiomatic way: one ``translate_batch`` per sentence at batch 1,
   one call with ``max_batch_size=128`` (CTranslate2 sorts and batches itself) at batch 128. Greedy
   and beam 5, fp32 and int8 (``decode.quantize=int8``); at batch 1 the sides take turns in blocks of ``BLOCK``
   sentences, at batch 128 in rounds of all the sentences. The ratio raw time /
   auto time is the cost of our wrapping (1.0: none); ``cpu_ratios``, the same of the CPU seconds of
   every thread of the process, which a busy machine moves less than the wall time. ``same_ratios``
   (and ``same_cpu_ratios``): the same against the very translator ``auto`` loaded, called as raw is,
   which measures our wrapping alone, whatever the two translators were built from (raw's is
   exported here, auto's comes from the user's cache). Our own decoder
   (``decode.engine=torch``, the same ``decode.quantize``: torchao's int8) is timed once per row for
   reference, at batch 1 on a quarter of the sentences.
2. ``--classifier RUN`` (a finished encoder-only run of one network, agnews say): the batch-1 latency
   (median of one ``predict`` call per sentence, ``--rounds`` times over the sentences) with
   ``decode.engine=onnxruntime``, ``torch`` (the run's own precision, as a user gets it) and torch in
   fp32 (ONNX Runtime's precision), each in a process of its own as a user runs one engine, the
   processes taking turns in blocks of 20 sentences, each settled before the next one's block (see
   :func:`classifier`); and the share of the run's test sentences whose labels agree with torch's in
   fp32 (all of them unless ``--classifier-limit``), with torch's in the run's own precision counted apart.

``--device cuda`` runs the search race on the GPU (CTranslate2 built with CUDA; bench/race/gpu_decode.py
calls it). The machine should be quiet: the figures are timings.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch

from taskformer.app import engines, hooks, runner
from taskformer.app.prepare import make_config
from taskformer.core import export
from taskformer.core.data import encode_sources
from taskformer.core.decoding import NEVER_WRITTEN, decode_workers, max_lengths
from taskformer.core.model import PAD, UNK
from taskformer.core.precision import choose as bf16_choice
from taskformer.core.tokenize import SPECIALS, symbols
from taskformer.plugins.manager import plugins
from taskformer.plugins.run import Run

BUDGET = 24  # tokens per output of the untrained network, as bench/race/speed.py's decoding rows
BLOCK = 25  # sentences each side decodes in a turn at batch 1 (one_by_one)


def copy_run(model, vocab: int, device: str) -> Run:
    """``model`` as a copy run held in memory, fp32, with a tokenizer of synthetic tokens ``t4`` ..."""
    task = plugins().task("copy")
    shape = {k: getattr(model.cfg, k) for k in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff", "max_len",
                                                 "tie_embeddings")}
    config = make_config(task, None, [f"model.{k}={v}" for k, v in shape.items()] + [
        "train.bf16=false", "decode.max_len_a=0", f"decode.max_len_b={BUDGET}"], None)
    tokenizer = symbols([f"t{i}" for i in range(4, vocab)])
    return Run(Path("."), task, config, tokenizer, None, model.to(device).eval())


def trained_run(run_dir: Path, device: str) -> tuple[Run, list[str]]:
    """A finished encoder-decoder run, in fp32, and its test sources."""
    run = runner.load(run_dir)
    run.config = replace(run.config, train=replace(run.config.train, bf16="false"))
    run.model.to(device).eval()
    rows = [json.loads(line)["source"] for line in (run_dir / "outputs-test.jsonl").read_text().splitlines()]
    return run, [r for r in rows if isinstance(r, str) and r.strip()]


def texts_of(sources: list[list[int]]) -> list[str]:
    """The sources as texts of synthetic tokens, without the EOS that our framing adds again."""
    return [" ".join(f"t{i}" for i in s[:-1] if i != PAD) for s in sources]


def raw_inputs(run: Run, texts: list[str]) -> tuple[list[list[str]], list[int], dict]:
    """What raw CTranslate2 is given for ``texts``: each source's tokens (normalized and tokenized as
    taskformer does; the export adds the EOS itself), each one's budget (``max_len_a * length +
    max_len_b``) and the run's search options, the specials no search writes suppressed."""
    d, cfg = run.config.decode, run.model.cfg
    ids, _ = encode_sources(run.tokenizer, hooks.normalize(run.task, texts, run.config), cfg.max_len)
    vocab = export.vocabulary(run.tokenizer, cfg.vocab_size)
    budgets = [int(max_lengths(torch.tensor([row]), d.max_len_a, d.max_len_b, cfg.max_len)[0]) for row in ids]
    options = dict(length_penalty=d.length_penalty, min_decoding_length=0, disable_unk=True,
                   suppress_sequences=[[SPECIALS[i]] for i in NEVER_WRITTEN if i != UNK])
    return [[vocab[i] for i in row[:-1]] for row in ids], budgets, options


def raw_translator(run: Run, folder: Path, compute_type: str, device: str, workers: int):
    """Raw CTranslate2 on ``run``'s weights, exported into ``folder``, with our runtime's threads."""
    import ctranslate2

    model_device = next(run.model.parameters()).device
    path = export.to_ctranslate2(run.model.cpu(), run.tokenizer, folder,
                                 compute_type if compute_type in export.QUANTIZATIONS else "float32")
    run.model.to(model_device)
    threads = torch.get_num_threads()
    translator = ctranslate2.Translator(str(path), device=device, compute_type=compute_type, inter_threads=workers,
                                        intra_threads=max(threads // workers, 1))
    torch.set_num_threads(threads)  # CTranslate2 sets the OpenMP threads it shares with torch to 1
    return translator


def through_predict(run: Run, texts: list[str], config, size: int, _=None) -> int:
    """Decode ``texts`` as ``taskformer predict`` does, one per call at batch 1 (``size``), else in one
    call; how many."""
    if size == 1:
        for t in texts:
            runner.predict(run, [t], config)
    else:
        runner.predict(run, texts, config)
    return len(texts)


CPU: dict[str, list[float]] = {}  # contender -> CPU seconds per sentence of each round (every thread of the process)


def per_sentence(name, fn) -> float:
    """Seconds per sentence of one round of ``fn`` (which returns how many it decoded); its CPU seconds
    per sentence go to :data:`CPU` (on a busy machine they move less than the wall time does)."""
    started, cpu = time.perf_counter(), time.process_time()
    n = fn(None)
    CPU.setdefault(name, []).append((time.process_time() - cpu) / n)
    return (time.perf_counter() - started) / n


def one_by_one(calls: dict, count: int, rounds: int, block: int = BLOCK) -> dict[str, float]:
    """Seconds per sentence of each of ``calls`` (name -> ``fn(i)``, decoding sentence ``i`` alone), taking
    turns in blocks of ``block`` sentences, the order turning with each block: a machine whose load
    changes from one second to the next weighs on all alike. Turns of one sentence measured the caches
    instead: each call found them holding the other translator's weights, except where auto and its
    own translator called raw (one translator, one copy of the weights) ran back to back, so raw's
    translator read 12% slower than that one on the same files (1-3% in blocks; docs/benchmarks.md).
    Their CPU seconds go to :data:`CPU`."""
    wall, cpu, names = dict.fromkeys(calls, 0.0), dict.fromkeys(calls, 0.0), list(calls)
    for r in range(rounds):
        for b, start in enumerate(range(0, count, block)):
            for name in names if (b + r) % 2 == 0 else names[::-1]:
                started, cpu_started = time.perf_counter(), time.process_time()
                for i in range(start, min(start + block, count)):
                    calls[name](i)
                wall[name] += time.perf_counter() - started
                cpu[name] += time.process_time() - cpu_started
    CPU.update({name: [cpu[name] / (count * rounds)] for name in names})
    return {name: wall[name] / (count * rounds) for name in names}


def race(run: Run, texts: list[str], rounds: int, n: dict[int, int], device: str = "cpu",
         torch_reference: bool = True) -> dict:
    """Sentences/s of ``auto`` and raw CTranslate2 (and once, of torch) for each search, precision and
    batch size in ``n`` (batch size -> sentences decoded), and the ratios auto / raw."""
    from machine import alternate

    out: dict = {"sentences_per_s": {}, "ratios": {}, "cpu_ratios": {}, "same_ratios": {}, "same_cpu_ratios": {},
                 "engine": {}, "sentences": n}
    with tempfile.TemporaryDirectory() as folder:
        for quantize in ("none", "int8"):
            config = runner.with_decoding(run, {"quantize": quantize, "engine": "auto"}, "bench")
            choice = hooks.engine_choice(run.task, run.model, config)
            out["engine"][quantize] = choice.as_dict()
            if choice.engine != "ctranslate2":
                print(f"auto chose {choice}: no race", file=sys.stderr)
                continue
            workers = decode_workers(config.decode.workers, torch.device(device), 1 << 20)
            raw = raw_translator(run, Path(folder) / quantize, choice.compute_type, device, workers)
            reference = runner.with_decoding(run, {"quantize": quantize, "engine": "torch"}, "bench")
            precision = "int8" if quantize == "int8" else "fp32"
            # torchao's int8 is a CPU path: our int8 copy's weights stay on the CPU, and a run on a GPU
            # would hand it CUDA inputs. Its reference row is left out there; CTranslate2's int8 still races.
            timed_torch = torch_reference and (quantize == "none" or device == "cpu")
            if torch_reference and not timed_torch:
                print(f"no torch reference for int8 on {device}: torchao's int8 decodes on the CPU only",
                      file=sys.stderr)
            for search, beam in (("greedy", 1), ("beam5", 5)):
                for size, count in n.items():
                    chosen = texts[:count]
                    tokens, budgets, options = raw_inputs(run, chosen)
                    options["beam_size"] = beam

                    def theirs(_, tokens=tokens, budgets=budgets, options=options, size=size, raw=raw):
                        if size == 1:
                            for t, b in zip(tokens, budgets):
                                raw.translate_batch([t], max_decoding_length=b, **options)
                        else:
                            raw.translate_batch(tokens, max_batch_size=size, max_decoding_length=max(budgets),
                                                **options)
                        return len(tokens)

                    ours = partial(through_predict, run, chosen, runner.with_search(config, beam, size), size)
                    ours(None)  # warm-up: the first call converts into the cache and loads the runtime
                    theirs(None)
                    # The very translator auto loaded, called as raw is: only our wrapping differs.
                    mine = engines.runtime(choice, run.model, run.tokenizer, config.decode).model
                    same = partial(theirs, raw=mine)
                    same(None)
                    name = f"{search} {precision} batch {size}"
                    if size == 1:  # in turns of a few sentences
                        one = runner.with_search(config, beam, 1)
                        def alone(i, tokens=tokens, budgets=budgets, options=options, raw=raw):
                            return raw.translate_batch([tokens[i]], max_decoding_length=budgets[i], **options)

                        secs = one_by_one({
                            f"auto {name}": lambda i, chosen=chosen, one=one: runner.predict(run, [chosen[i]], one),
                            f"ctranslate2 {name}": alone, f"same {name}": partial(alone, raw=mine)}, count, rounds)
                    else:
                        secs = alternate({f"auto {name}": ours, f"ctranslate2 {name}": theirs, f"same {name}": same},
                                         per_sentence, rounds)
                    if timed_torch:  # one round; a quarter of the sentences at batch 1 (it is the slow one)
                        few = chosen[: max(count // 4, 1)] if size == 1 else chosen
                        secs[f"torch {name}"] = per_sentence(None, partial(
                            through_predict, run, few, runner.with_search(reference, beam, size), size))
                    out["sentences_per_s"] |= {k: 1.0 / v for k, v in secs.items()}
                    out["ratios"][name] = secs[f"ctranslate2 {name}"] / secs[f"auto {name}"]
                    out["same_ratios"][name] = secs[f"same {name}"] / secs[f"auto {name}"]
                    cpu = {who: statistics.median(CPU[f"{who} {name}"]) for who in ("auto", "ctranslate2", "same")}
                    out["cpu_ratios"][name] = cpu["ctranslate2"] / cpu["auto"]  # raw's CPU seconds / ours
                    out["same_cpu_ratios"][name] = cpu["same"] / cpu["auto"]
                    print(f"  {name}: " + ", ".join(f"{k.split()[0]} {1 / v:.1f} sent/s" for k, v in secs.items())
                          + f"; auto / raw {out['ratios'][name]:.3f}x (CPU seconds {out['cpu_ratios'][name]:.3f}x), "
                          f"/ its own translator called raw {out['same_ratios'][name]:.3f}x "
                          f"(CPU seconds {out['same_cpu_ratios'][name]:.3f}x)", file=sys.stderr, flush=True)
    speeds = out["sentences_per_s"]
    out["int8_speedup"] = {key.replace(" int8", ""): v / speeds[key.replace("int8", "fp32")]  # what int8 buys
                           for key, v in speeds.items() if " int8 " in key and key.replace("int8", "fp32") in speeds}
    return out


ENGINES = ("onnxruntime", "torch", "torch fp32")  # the classifier's contenders (torch fp32: ONNX Runtime's precision)


def engine_process(conn, run_dir: Path, engine: str) -> None:
    """One contender of :func:`classifier`, in a process of its own as a user runs one engine: the run
    loaded with ``decode.engine`` set (``torch fp32``: ``train.bf16=false`` too), then requests from
    ``conn``: ``("labels", texts)`` -> their labels in one ``predict`` call; ``("time", texts)`` -> the
    seconds and CPU seconds of one ``predict`` per text; None ends it."""
    run = runner.load(run_dir)
    auto = hooks.engine_choice(run.task, run.model, run.config)  # what the run's own setting decodes with
    if engine == "onnxruntime" and auto.engine != "onnxruntime":
        conn.send({"engine": auto.as_dict()})
        return
    runner.set_decoding(run, [f"decode.engine={engine.split()[0]}"], "--set")
    if engine == "torch fp32":
        run.config = replace(run.config, train=replace(run.config.train, bf16="false"))
    choice = hooks.engine_choice(run.task, run.model, run.config)
    bf16, _ = bf16_choice(run.config.train.bf16, run.device)
    threads = torch.get_num_threads()
    runner.predict(run, ["warm up"], run.config)  # ONNX Runtime's converts into the cache, or loads the entry
    if choice.engine == "onnxruntime":
        session = engines.runtime(choice, run.model, run.tokenizer, run.config.decode).session
        threads = session.get_session_options().intra_op_num_threads
    conn.send({"engine": auto.as_dict(), "precision": "bf16" if bf16 else "fp32", "threads": threads})
    while (request := conn.recv()) is not None:
        what, texts = request
        if what == "labels":
            conn.send([p.label for p in runner.predict(run, texts, run.config)[0]])
            continue
        wall, cpu = [], []
        for text in texts:
            started, cpu_started = time.perf_counter(), time.process_time()
            runner.predict(run, [text], run.config)
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
        conn.send((wall, cpu))


def cpu_seconds(pid: int) -> float | None:
    """The CPU seconds a process has used (every thread), where /proc tells; None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(pid: int, limit: float = 1.0) -> float:
    """Wait until process ``pid`` uses no CPU for 30 ms (its threads still spinning after its last
    call stop), at most ``limit`` seconds (a fixed 0.1 s where /proc is not there); the seconds waited."""
    started = time.perf_counter()
    last = cpu_seconds(pid)
    if last is None:
        time.sleep(0.1)
        return 0.1
    while time.perf_counter() - started < limit:
        time.sleep(0.03)
        now = cpu_seconds(pid)
        if now == last:
            break
        last = now
    return time.perf_counter() - started


def classifier(run_dir: Path, sentences: int, limit: int = 0, rounds: int = 1) -> dict:
    """Batch-1 latency of a classifier run with ONNX Runtime and with torch, and label agreement on its
    test outputs.

    Each engine runs in a process of its own (:func:`engine_process`), as a user runs one, with the
    engine as the run's setting (``--set decode.engine=...``, as ``taskformer predict`` and the server
    take it). The processes take turns in blocks of 20 sentences, the order turning with each block,
    ``rounds`` times over the sentences (machine noise hits all alike), after one untimed pass, and
    the median of one ``predict`` per sentence is each one's latency. Before a block the process that ran the last one
    is left to settle (:func:`settle`): torch's OpenMP threads spin for some milliseconds after its
    calls, as in any torch process, and on two cores they would take the next engine's core, which a
    user's process of that engine never meets. In one process the two engines' threads met (ONNX
    Runtime's predict was a fifth slower beside torch's blocks than alone); torch's own calls keep
    their spinning, which they have in a user's process too.

    Like is compared with like: ONNX Runtime runs the exported network in fp32, so the labels are
    compared with torch in fp32 (``train.bf16=false``); torch in the run's own precision (bf16 where
    ``train.bf16=auto`` finds it native) is timed, as a user gets it, and its labels counted too;
    torch in fp32 is timed as well (``speedup_fp32``). Each process has the run's threads (torch's
    intra-op threads; ONNX Runtime's split between ``decode.workers``, recorded)."""
    import multiprocessing

    rows = [json.loads(line) for line in (run_dir / "outputs-test.jsonl").read_text().splitlines()][: limit or None]
    texts = [tuple(r["source"]) if isinstance(r["source"], list) else r["source"] for r in rows]
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no thread pool of the parent's
    conns, processes, ready = {}, {}, {}
    try:
        for engine in ENGINES:  # started one after another: each loads alone; ONNX Runtime's first
            conns[engine], theirs = context.Pipe()
            processes[engine] = context.Process(target=engine_process, args=(theirs, run_dir, engine), daemon=True)
            processes[engine].start()
            ready[engine] = conns[engine].recv()
            auto = ready["onnxruntime"]["engine"]
            if auto["engine"] != "onnxruntime":  # an ensemble (agnews' default: model.members=20), say
                print(f"classifier {run_dir}: auto decodes with {auto['engine']} ({auto['reason']}): no race",
                      file=sys.stderr)
                return {"run_dir": str(run_dir), "engine": auto}
        out: dict = {"run_dir": str(run_dir), "engine": auto, "processes": "one per engine"}

        def ask(engine: str, request: tuple):
            conns[engine].send(request)
            answer = conns[engine].recv()
            pid = processes[engine].pid
            assert pid is not None  # started above
            settle(pid)
            return answer

        out |= {"test_sentences": len(texts), "torch_precision": ready["torch"]["precision"],
                "threads": {"torch": ready["torch"]["threads"], "onnxruntime": ready["onnxruntime"]["threads"]}}
        labels = {engine: ask(engine, ("labels", texts)) for engine in ENGINES}
        out["labels_equal"] = sum(a == b for a, b in zip(labels["onnxruntime"], labels["torch fp32"]))
        out["labels_agree"] = out["labels_equal"] / len(texts)
        out["labels_equal_run_precision"] = sum(a == b for a, b in zip(labels["onnxruntime"], labels["torch"]))
        probe = [t for t in texts if t][:sentences]
        for engine in ENGINES:  # untimed: torch's first call at each length prepares its kernels for it
            ask(engine, ("time", probe))
        times: dict[str, list[float]] = {e: [] for e in ENGINES}
        cpu: dict[str, list[float]] = {e: [] for e in ENGINES}
        out["load"] = {"before": os.getloadavg()[0]}  # the 1-minute load average: the others' work shows
        for r in range(rounds):
            for block, start in enumerate(range(0, len(probe), 20)):
                turn = (block + r) % len(ENGINES)
                for engine in ENGINES[turn:] + ENGINES[:turn]:
                    wall, used = ask(engine, ("time", probe[start : start + 20]))
                    times[engine] += wall
                    cpu[engine] += used
        out["load"]["after"] = os.getloadavg()[0]
    finally:
        for engine, process in processes.items():
            if process.is_alive():
                conns[engine].send(None)
                process.join(10)
    out["latency_ms"] = {e: 1000 * statistics.median(t) for e, t in times.items()}
    out["cpu_ms"] = {e: 1000 * statistics.median(t) for e, t in cpu.items()}  # every thread of its process
    out["speedup"] = out["latency_ms"]["torch"] / out["latency_ms"]["onnxruntime"]
    out["speedup_fp32"] = out["latency_ms"]["torch fp32"] / out["latency_ms"]["onnxruntime"]
    return out


def print_race(result: dict) -> None:
    for name, ratio in result.get("ratios", {}).items():
        auto, raw = (result["sentences_per_s"][f"{who} {name}"] for who in ("auto", "ctranslate2"))
        ours = result["sentences_per_s"].get(f"torch {name}")
        print(f"decode.engine=auto / raw CTranslate2, {name}: {ratio:.3f}x ({auto:,.1f} vs {raw:,.1f} sent/s"
              f"{f'; torch {ours:,.1f}' if ours else ''}; CPU seconds {result['cpu_ratios'][name]:.3f}x); "
              f"/ its own translator called raw {result['same_ratios'][name]:.3f}x "
              f"(CPU seconds {result['same_cpu_ratios'][name]:.3f}x)")
    for name, ratio in result.get("int8_speedup", {}).items():
        print(f"int8 / fp32 speed, {name}: {ratio:.2f}x")
    if "latency_ms" in result.get("classifier", {}):
        c = result["classifier"]
        print(f"classifier batch-1 latency: ONNX Runtime {c['latency_ms']['onnxruntime']:.2f} ms, torch "
              f"{c['latency_ms']['torch']:.2f} ms ({c['torch_precision']}; {c['speedup']:.2f}x), torch fp32 "
              f"{c['latency_ms']['torch fp32']:.2f} ms ({c['speedup_fp32']:.2f}x), each engine in a process of its own "
              f"(CPU ms a call, every thread: {', '.join(f'{k} {v:.2f}' for k, v in c['cpu_ms'].items())}); labels "
              f"equal to torch fp32's on {c['labels_equal']} of {c['test_sentences']} test sentences "
              f"({100 * c['labels_agree']:.2f}%), to torch {c['torch_precision']}'s on {c['labels_equal_run_precision']}; "
              f"load average {c['load']['before']:.1f} to {c['load']['after']:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, metavar="RUN", help="race this trained encoder-decoder run's weights and "
                    "test sources (default: bench/race/speed.py's untrained network)")
    ap.add_argument("--quick", action="store_true", help="tiny workloads: checks that it runs")
    ap.add_argument("--sentences", default="100,1000", metavar="N1,N128",
                    help="sentences decoded one at a time, and in batches of 128 (default 100,1000)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="alternating rounds of auto and raw, and of the classifier's engines (default 3)")
    ap.add_argument("--no-torch", action="store_true", help="leave out the torch reference")
    ap.add_argument("--no-search", action="store_true", help="only the classifier (--classifier)")
    ap.add_argument("--classifier", type=Path, metavar="RUN", help="race a classifier run's engines")
    ap.add_argument("--classifier-sentences", type=int, default=200, help="sentences timed one at a time")
    ap.add_argument("--classifier-limit", type=int, default=0, help="compare labels on the first N test rows (0: all)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (CTranslate2 built with CUDA)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py
    from machine import cpu_name

    n1, n128 = (4, 32) if args.quick else (int(k) for k in args.sentences.split(","))
    rounds = 1 if args.quick else args.rounds
    result: dict = {"cpu": cpu_name(), "device": args.device, "threads": torch.get_num_threads()}
    if not args.no_search:
        if args.run:
            run, texts = trained_run(args.run, args.device)
            result["run_dir"] = str(args.run)
        else:
            from workload import V, make_taskformer, multi30k

            _, _, val_src = multi30k(200 if args.quick else 2000)
            run, texts = copy_run(make_taskformer(False)[0], V, args.device), texts_of(val_src)
        result |= race(run, texts, rounds, {1: n1, 128: n128}, args.device, not args.no_torch)
    if args.classifier:
        result["classifier"] = classifier(args.classifier, 5 if args.quick else args.classifier_sentences,
                                          args.classifier_limit, rounds)
    print_race(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
