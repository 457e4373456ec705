"""The classic English->Chinese tutorial's recipe, trained for a time budget and scored like translate-en-zh.

The baseline for translate-en-zh: the widely copied "write your own Transformer" tutorial trains on the
same Tatoeba split (``nmt/en-cn``) with a word-level English vocabulary, one token per Chinese
character, 6+6 layers of d_model 256 (8 heads, FFN 1024, dropout 0.1), batches of 64 sentences
sorted by English length, Adam with the Noam schedule (factor 1, 2,000 warm-up steps), no label
smoothing, the checkpoint with the best dev loss, and greedy decoding; it reports no BLEU. Here it
trains for ``--minutes`` of wall time on the train split, then decodes test greedily (batched, each
sentence stopping at its own EOS, at most 60 tokens as the tutorial allows) and scores it with
taskformer's own sacreBLEU settings (``tokenize="zh"``, and chrF), against the references as read.

The model is the reference Transformer in ``../shared/bench/reference_transformer.py``, imported
from there (``--reference`` names another path), never copied. Run from the repository root:

    python bench/study/encn_tutorial_recipe.py --minutes 30 --json encn_tutorial.json
    taskformer run translate-en-zh --data-dir ../shared/datasets/en-cn --time-limit 30   # the other side
"""
from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: machine.py and workload.py

from machine import cpu_name  # noqa: E402
from taskformer import find_file, read_tsv, translation_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ["PAD", "UNK", "BOS", "EOS"]
WORD = re.compile(r"\w+|[^\w\s]")  # lower-cased words and single punctuation marks


def import_reference(path: Path):
    spec = importlib.util.spec_from_file_location("reference_transformer", path)
    if spec is None or spec.loader is None or not path.is_file():
        raise SystemExit(f"{path}: reference Transformer not found (give --reference PATH)")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def english(text: str) -> list[str]:
    return WORD.findall(text.lower())


def chinese(text: str) -> list[str]:
    return [ch for ch in text if not ch.isspace()]


def vocabulary(sentences: list[list[str]]) -> dict[str, int]:
    """Every token of the train split, most frequent first (the tutorial keeps up to 50,000)."""
    counts = Counter(t for s in sentences for t in s)
    return {t: i for i, t in enumerate(SPECIALS + [t for t, _ in counts.most_common(50_000)])}


def ids(tokens: list[str], vocab: dict[str, int]) -> list[int]:
    return [BOS] + [vocab.get(t, UNK) for t in tokens] + [EOS]


def pad(rows: list[list[int]]) -> torch.Tensor:
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r)
    return out


def batches(src: list[list[int]], tgt: list[list[int]], size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Sentences sorted by English length, cut into batches of ``size`` (the tutorial's batching)."""
    order = sorted(range(len(src)), key=lambda i: len(src[i]))
    return [(pad([src[i] for i in order[k : k + size]]), pad([tgt[i] for i in order[k : k + size]]))
            for k in range(0, len(order), size)]


def loss_of(ref, model, src, tgt) -> tuple[torch.Tensor, int]:
    """Summed NLL of the target tokens (the tutorial's KL loss without smoothing) and their count."""
    ti, ty = tgt[:, :-1], tgt[:, 1:]
    sm = (src != PAD).unsqueeze(-2)
    tm = (ti != PAD).unsqueeze(-2) & ref.subsequent_mask(ti.size(1))
    logp = model.generator(model(src, ti, sm, tm))
    return F.nll_loss(logp.reshape(-1, logp.size(-1)), ty.reshape(-1), ignore_index=PAD, reduction="sum"), \
        int((ty != PAD).sum())


@torch.no_grad()
def greedy(ref, model, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy decoding of a batch with the reference's own encode/decode/generator; each row ends at EOS."""
    sm = (src != PAD).unsqueeze(-2)
    memory = model.encode(src, sm)
    ys = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    done = torch.zeros(src.size(0), dtype=torch.bool)
    for _ in range(max_len - 1):
        out = model.decode(memory, sm, ys, ref.subsequent_mask(ys.size(1)))
        nxt = model.generator(out[:, -1]).argmax(-1)
        ys = torch.cat([ys, nxt.unsqueeze(1)], 1)
        done |= nxt == EOS
        if done.all():
            break
    rows = []
    for row in ys[:, 1:].tolist():
        rows.append(row[: row.index(EOS)] if EOS in row else row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="training budget in wall-clock minutes")
    ap.add_argument("--data-dir", type=Path, default=ROOT.parent / "shared" / "datasets" / "en-cn")
    ap.add_argument("--reference", type=Path, default=ROOT.parent / "shared" / "bench" / "reference_transformer.py")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args()

    start = time.perf_counter()
    ref = import_reference(args.reference)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = {split: read_tsv(find_file(args.data_dir, f"{split}.txt")) for split in ("train", "dev", "test")}
    en_vocab = vocabulary([english(e) for e, _ in data["train"]])
    zh_vocab = vocabulary([chinese(z) for _, z in data["train"]])
    zh_tokens = list(zh_vocab)
    encoded = {split: ([ids(english(e), en_vocab) for e, _ in rows], [ids(chinese(z), zh_vocab) for _, z in rows])
               for split, rows in data.items()}
    train, dev = batches(*encoded["train"], args.batch_size), batches(*encoded["dev"], args.batch_size)

    model = ref.make_model(len(en_vocab), len(zh_vocab), args.layers, args.d_model, 4 * args.d_model, 8, 0.1)
    opt = torch.optim.Adam(model.parameters(), lr=0.0, betas=(0.9, 0.98), eps=1e-9)
    noam = lambda step: args.d_model ** -0.5 * min(step ** -0.5, step * args.warmup ** -1.5)  # noqa: E731

    budget, steps, epochs, best, best_state = args.minutes * 60, 0, 0, float("inf"), None
    train_start = time.perf_counter()
    out_of_time = lambda: time.perf_counter() - train_start >= budget  # noqa: E731
    while not out_of_time():
        model.train()
        random.shuffle(train)
        for src, tgt in train:
            steps += 1
            for group in opt.param_groups:
                group["lr"] = noam(steps)
            loss, n = loss_of(ref, model, src, tgt)
            (loss / n).backward()
            opt.step()
            opt.zero_grad()
            if out_of_time():
                break
        else:
            epochs += 1
        model.eval()
        with torch.no_grad():  # the tutorial keeps the checkpoint with the best dev loss
            total = [loss_of(ref, model, s, t) for s, t in dev]
        dev_loss = sum(float(loss) for loss, _ in total) / sum(n for _, n in total)
        print(f"epoch {epochs} step {steps}: dev loss {dev_loss:.3f} ({time.perf_counter() - train_start:.0f} s)",
              flush=True)
        if dev_loss < best:
            best, best_state = dev_loss, {k: v.clone() for k, v in model.state_dict().items()}
    train_seconds = time.perf_counter() - train_start

    model.load_state_dict(best_state)
    model.eval()
    decode_start = time.perf_counter()
    sources, refs = encoded["test"][0], [z for _, z in data["test"]]
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    hyps = [""] * len(sources)
    for k in range(0, len(order), args.batch_size):
        chunk = order[k : k + args.batch_size]
        for i, row in zip(chunk, greedy(ref, model, pad([sources[i] for i in chunk]), max_len=60)):
            hyps[i] = "".join(zh_tokens[t] for t in row if t >= len(SPECIALS))
    scores = translation_metrics(hyps, refs, tokenize="zh")
    result = {
        "recipe": "tutorial: word-level English, Chinese characters, reference Transformer, Noam, greedy",
        "test_bleu_zh": round(scores["bleu"], 2), "test_chrf": round(scores["chrf"], 2),
        "best_dev_loss": round(best, 4), "steps": steps, "epochs_completed": epochs,
        "train_seconds": round(train_seconds, 1), "decode_seconds": round(time.perf_counter() - decode_start, 1),
        "wall_seconds": round(time.perf_counter() - start, 1), "minutes_budget": args.minutes,
        "cpu": cpu_name(), "threads": torch.get_num_threads(), "torch": torch.__version__,
        "params_M": round(sum(p.numel() for p in model.parameters()) / 1e6, 2),
        "vocab": {"english_words": len(en_vocab), "chinese_characters": len(zh_vocab)},
        "settings": {"layers": args.layers, "d_model": args.d_model, "batch_size": args.batch_size,
                     "warmup": args.warmup, "seed": args.seed},
        "samples": [{"source": data["test"][i][0], "output": hyps[i], "reference": refs[i]} for i in range(3)],
        "date": dt.datetime.now().isoformat(timespec="seconds"),
    }
    text = json.dumps(result, ensure_ascii=False, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
