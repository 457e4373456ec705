"""Prepared data at scale: CPU seconds and peak memory of preparing a large corpus, against the
tokenizers library alone on the same text.

Builds its corpora in FOLDER (never inside the repository):
- ``pairs/``: N train pairs (default 4.5M) from Multi30k's 29k, repeated with light perturbation
  (each copy after the first swaps two neighbouring words of each side, drops one word of one pair
  in five and appends the copy's number to one pair in ten), with Multi30k's own val and test;
- ``text/``: about ``--lm-bytes`` of text from Tiny Shakespeare, its paragraphs shuffled per copy.

Then measures, each as a child process (CPU seconds from ``wait4``'s rusage, peak RSS its maxrss, and
the peaks of its anonymous and file-backed parts sampled from ``/proc``):
(a) ``taskformer run TASK --data-dir pairs --dry-run`` with an empty cache; (b) the same with the
cache it left; (c) a real run with a warm cache to ``--updates`` updates: seconds to the first
update (from the run's log) and peak RSS; (d) the tokenizers library alone on the same text: train
the BPE (the task's vocabulary size) from an iterator and encode both sides to uint16 in batches;
(e) the cache's size against its uint16 token arrays. The same (a), (b), (c), (e) for ``--lm-task``
(the generic ``lm``: a character vocabulary) on ``text/`` unless ``--lm-bytes 0``, against the
tokenizers library alone on that text (a character vocabulary trained from the file read in
pieces, the text encoded to uint16 in batches of pieces). Prints a table of ratios and writes JSON.

    python bench/data/data_scale.py /tmp/scale [--pairs 4500000] [--task translate] [--lm-bytes 1e9] \
        [--skip-pairs] [--shakespeare PATH] [--multi30k DIR] [--json FILE]
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "datasets"
GIB = 2**30


def perturbed(words: list[str], rng: random.Random, copy: int) -> str:
    if copy and len(words) > 2:
        i = rng.randrange(len(words) - 1)
        words[i], words[i + 1] = words[i + 1], words[i]
        if rng.random() < 0.2:
            del words[rng.randrange(len(words))]
        if rng.random() < 0.1:
            words.append(str(copy))
    return " ".join(words)


def build_pairs(folder: Path, n: int, source: Path) -> Path:
    out = folder / "pairs"
    if (out / "done").exists() and json.loads((out / "done").read_text()) == n:
        return out
    out.mkdir(parents=True, exist_ok=True)
    de, en = (gzip.open(source / f"train.{lang}.gz", "rt", encoding="utf-8").read().splitlines() for lang in ("de", "en"))
    rng = random.Random(0)
    with open(out / "train.de", "w", encoding="utf-8") as fde, open(out / "train.en", "w", encoding="utf-8") as fen:
        for k in range(n):
            copy, i = divmod(k, len(de))
            fde.write(perturbed(de[i].split(), rng, copy) + "\n")
            fen.write(perturbed(en[i].split(), rng, copy) + "\n")
    for name in ("val", "test_2016_flickr"):
        for lang in ("de", "en"):
            shutil.copyfile(source / f"{name}.{lang}.gz", out / f"{name}.{lang}.gz")
    (out / "done").write_text(json.dumps(n))
    return out


def build_text(folder: Path, size: int, shakespeare: Path) -> Path:
    out = folder / "text"
    if (out / "done").exists() and json.loads((out / "done").read_text()) == size:
        return out
    out.mkdir(parents=True, exist_ok=True)
    opener = gzip.open if shakespeare.suffix == ".gz" else open
    with opener(shakespeare, "rt", encoding="utf-8") as f:
        text = f.read()
    pieces = [p for p in text.split("\n\n") if p]
    rng, written = random.Random(0), 0
    with open(out / "input.txt", "w", encoding="utf-8") as f:
        while written < size:
            rng.shuffle(pieces)
            block = "\n\n".join(pieces) + "\n\n"
            f.write(block)
            written += len(block)
    (out / "done").write_text(json.dumps(size))
    return out


def sample_peaks(pid: int, peaks: dict) -> None:
    """The peaks of ``pid``'s anonymous and file-backed resident memory (``/proc/PID/status``, every
    0.1 s until it ends): the peak RSS counts a memory-mapped file's pages once read, which the kernel
    may drop, beside the heap."""
    while os.path.exists(f"/proc/{pid}"):
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    name, _, value = line.partition(":")
                    if name in ("RssAnon", "RssFile", "RssShmem"):
                        key = f"peak_{name[3:].lower()}_mb"
                        peaks[key] = max(peaks.get(key, 0), int(value.split()[0]) // 1024)
        except (OSError, ValueError, IndexError):
            pass
        time.sleep(0.1)


def child(cmd: list[str], env: dict, watch: Path | None = None, updates: int = 0) -> dict:
    """Run ``cmd``; its CPU seconds and peak RSS (and the peaks of its anonymous and file-backed parts),
    and with ``watch`` (a run's metrics.jsonl) the seconds to its first logged update, killing it after
    ``updates`` updates (an interrupted run would still evaluate every val and test token, which is not
    what is measured: at 1 GB, hours here)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peaks: dict = {}
    sampler = threading.Thread(target=sample_peaks, args=(proc.pid, peaks), daemon=True)
    sampler.start()
    first, ended = None, None
    while watch is not None and ended is None:
        reaped = os.wait4(proc.pid, os.WNOHANG)  # not poll(): it would reap the child, and wait4 its rusage
        if reaped[0]:
            ended = reaped
            break
        steps = [json.loads(line).get("step", 0) for line in watch.read_text().splitlines()
                 if '"event": "train"' in line] if watch.exists() else []
        if steps and first is None:
            first = time.monotonic() - started
        if steps and max(steps) >= updates:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.2)
    _, status, usage = ended or os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read() if proc.stderr else ""
    if proc.returncode not in (0, 130) and not (watch and first):
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    sampler.join()
    return {"cpu_s": round(usage.ru_utime + usage.ru_stime, 1), "peak_rss_mb": round(usage.ru_maxrss / 1024),
            "wall_s": round(time.monotonic() - started, 1), "first_update_s": first and round(first, 1), **peaks}


LIBRARY = r'''
import sys, numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers, decoders
folder, vocab = sys.argv[1], int(sys.argv[2])
def lines():
    for lang in ("de", "en"):
        with open(f"{folder}/train.{lang}", encoding="utf-8") as f:
            yield from (line.rstrip("\n") for line in f)
tok = Tokenizer(models.BPE(unk_token="[UNK]"))
tok.normalizer, tok.pre_tokenizer = normalizers.NFKC(), pre_tokenizers.Metaspace()
tok.train_from_iterator(lines(), trainers.BpeTrainer(vocab_size=vocab, min_frequency=2, show_progress=False,
                        special_tokens=["[PAD]", "[BOS]", "[EOS]", "[UNK]"]))
size, batch = 0, []
def flush():
    global size
    ids = [e.ids for e in tok.encode_batch(batch)]
    size += np.fromiter((t for row in ids for t in row), np.uint16).nbytes
    batch.clear()
for line in lines():
    batch.append(line)
    if len(batch) == 50_000:
        flush()
flush()
print(size)
'''


LIBRARY_LM = r'''
import sys, numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
path = sys.argv[1]
def pieces():
    with open(path, encoding="utf-8") as f:
        yield from iter(lambda: f.read(1 << 16), "")
tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
tok.train_from_iterator(pieces(), trainers.WordLevelTrainer(special_tokens=["[PAD]", "[BOS]", "[EOS]", "[UNK]"],
                        show_progress=False))
size, batch = 0, []
for piece in pieces():
    batch.append(piece)
    if len(batch) == 64:
        size += sum(np.asarray(e.ids, np.uint16).nbytes for e in tok.encode_batch(batch))
        batch.clear()
size += sum(np.asarray(e.ids, np.uint16).nbytes for e in tok.encode_batch(batch))
print(size)
'''


def cache_sizes(cache: Path) -> dict:
    entries = [p for p in (cache / "data").iterdir() if not p.name.startswith(".")]
    total = sum(f.stat().st_size for e in entries for f in e.rglob("*") if f.is_file())
    ids = sum(f.stat().st_size for e in entries for f in e.rglob("*.ids.npy"))
    stream = sum(f.stat().st_size for e in entries for f in e.rglob("stream.npy"))
    return {"cache_mb": round(total / 1e6, 1), "token_arrays_mb": round((ids + stream) / 1e6, 1),
            "ratio": round(total / max(ids + stream, 1), 2)}


def measure(task: str, data: Path, work: Path, updates: int, extra: list[str], out: dict, save) -> dict:
    """The figures of ``task`` into ``out``, ``save()`` called after each (a run cut short keeps them)."""
    cache = work / f"cache-{task}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "TASKFORMER_CACHE": str(cache)}
    run = [sys.executable, "-m", "taskformer", "run", task, "--data-dir", str(data), *extra]
    for stage in ("cold_dry_run", "warm_dry_run"):
        out[stage] = child([*run, "--dry-run"], env)
        save()
    out["cache"] = cache_sizes(cache)
    save()
    if updates:
        run_dir = work / f"run-{task}"
        shutil.rmtree(run_dir, ignore_errors=True)
        out["warm_run"] = child([*run, "--out", str(run_dir), "--set", f"train.max_steps={updates}",
                                 "--set", "train.log_every=1"], env, run_dir / "metrics.jsonl", updates)
        shutil.rmtree(run_dir, ignore_errors=True)
        save()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="where the corpora, caches and runs go (outside the repository)")
    ap.add_argument("--pairs", type=int, default=4_500_000)
    ap.add_argument("--task", default="translate")
    ap.add_argument("--vocab", type=int, default=10_000, help="the task's data.vocab_size (translate-de-en's default)")
    ap.add_argument("--updates", type=int, default=50, help="updates of the real runs with a warm cache (0: none)")
    ap.add_argument("--skip-pairs", action="store_true", help="measure the lm corpus only")
    ap.add_argument("--lm-task", default="lm")
    ap.add_argument("--lm-bytes", type=float, default=1e9, help="size of the lm corpus (0: skip the lm runs)")
    ap.add_argument("--json", type=Path, help="write the figures here too, after each stage (a run cut short keeps them)")
    ap.add_argument("--shakespeare", type=Path, default=SHARED / "tinyshakespeare" / "input.txt.gz",
                    help="Tiny Shakespeare's input.txt (or .gz), which the lm corpus is made of")
    ap.add_argument("--multi30k", type=Path, default=SHARED / "multi30k",
                    help="Multi30k's folder (train, val, test_2016_flickr .de/.en.gz), which the pairs are made of")
    args = ap.parse_args()
    folder = args.folder.resolve()
    if folder.is_relative_to(ROOT):
        sys.exit(f"{folder} is inside the repository; pick a folder outside it")
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=folder, prefix="work-"))
    figures: dict = {"cpu": cpu_name(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                     "pairs": 0 if args.skip_pairs else args.pairs, "task": args.task, "lm_task": args.lm_task}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2) + "\n")

    try:
        if not args.skip_pairs:
            pairs = build_pairs(folder, args.pairs, args.multi30k)
            figures["library"] = child([sys.executable, "-c", LIBRARY, str(pairs), str(args.vocab)], dict(os.environ))
            save()
            measure(args.task, pairs, work, args.updates, ["--set", f"data.vocab_size={args.vocab}"],
                    figures.setdefault(args.task, {}), save)
        if args.lm_bytes:
            text = build_text(folder, int(args.lm_bytes), args.shakespeare)
            figures["lm_bytes"] = int(args.lm_bytes)
            figures["lm_library"] = child([sys.executable, "-c", LIBRARY_LM, str(text / "input.txt")], dict(os.environ))
            save()
            measure(args.lm_task, text, work, args.updates, [], figures.setdefault(args.lm_task, {}), save)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(figures, args.task)
    save()


def report(f: dict, task: str) -> None:
    rows = []
    for name, library, size in ((task, "library", f"{f['pairs']:,} pairs"),
                                (f.get("lm_task", ""), "lm_library", f"{f.get('lm_bytes', 0) / 1e6:,.0f} MB of text")):
        if name not in f:
            continue
        lib, t = f[library], f[name]
        cold = t["cold_dry_run"]
        rows += [(f"{name} on {size}: the library alone, CPU s / peak RSS MB", f"{lib['cpu_s']} / {lib['peak_rss_mb']}", ""),
                 ("  dry run, empty cache: CPU s / peak RSS MB", f"{cold['cpu_s']} / {cold['peak_rss_mb']}",
                  f"{cold['cpu_s'] / lib['cpu_s']:.2f}x the library's CPU (goal <= 1.5x); "
                  f"{cold['peak_rss_mb'] / 1024:.2f} GiB (goal <= 4)"),
                 ("  dry run, warm cache: CPU s / peak RSS MB",
                  f"{t['warm_dry_run']['cpu_s']} / {t['warm_dry_run']['peak_rss_mb']}", ""),
                 ("  cache MB / its token arrays MB", f"{t['cache']['cache_mb']} / {t['cache']['token_arrays_mb']}",
                  f"{t['cache']['ratio']}x (goal <= 1.5x)")]
        if "warm_run" in t:
            w = t["warm_run"]
            rows.append(("  real run, warm cache: first update s / peak RSS MB", f"{w['first_update_s']} / {w['peak_rss_mb']}",
                         f"{w['peak_rss_mb'] / 1024:.2f} GiB (goal <= 4); first update goal <= 30 s (wall time)"))
    print(f"{f['cpu']}, {f['date']}")
    for name, value, ratio in rows:
        print(f"{name:<62} {value:<28} {ratio}")

if __name__ == "__main__":
    main()
