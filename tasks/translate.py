"""``translate-de-en``: German to English on Multi30k (task 1, Flickr30k captions), scored with sacreBLEU.

Data: ``train``, ``val`` and ``test_2016_flickr`` as line-aligned ``.de``/``.en`` files (plain or
gzip) under ``--data-dir``, the layout of the original release; without ``--data-dir`` the Hugging
Face hub copy ``bentrevett/multi30k`` is downloaded. One BPE vocabulary is trained on both sides of
the train split, so source, target and output layer share one embedding matrix: German and English
captions share many names, numbers and word pieces, and tying saves a third of a small model's parameters.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import sacrebleu
import torch
from rich.text import Text

from taskformer import BOS, EOS, DataError, Task, TaskData, encode_sources, find_file, hookimpl, read_parallel, subword

FILES = {"train": "train", "val": "val", "test": "test_2016_flickr"}  # split -> file stem of the release
HUB = "bentrevett/multi30k"
HUB_SPLITS = {"train": "train", "val": "validation", "test": "test"}
HEATMAP = "attention.png"

@dataclass
class Options:
    """The ``data`` options: the size of the joint de+en vocabulary and its kind, and how many train
    pairs to use (0: all)."""

    vocab_size: int = 8000
    tokenizer: str = "bpe"
    max_train: int = 0

    def validate(self) -> None:
        if self.max_train < 0 or self.vocab_size < 100:
            raise ValueError("data.max_train must be >= 0 and data.vocab_size >= 100")
        if self.tokenizer not in ("bpe", "unigram", "wordpiece"):
            raise ValueError(f"data.tokenizer must be bpe, unigram or wordpiece, not {self.tokenizer!r}")


TASK = Task(
    name="translate-de-en",
    description="German to English translation on Multi30k, scored with sacreBLEU",
    variant="encoder-decoder",
    metric="bleu",
    higher_is_better=True,
    defaults={
        # Sized for a 2-core CPU: captions are short (about 14 subwords), so a small model trains
        # many epochs within an hour. Precision is the core's auto choice: bf16 where it is native.
        "model": {"d_model": 256, "n_heads": 8, "enc_layers": 3, "dec_layers": 3, "d_ff": 1024,
                  "dropout": 0.1, "max_len": 128, "tie_embeddings": True},
        "train": {"epochs": 40, "max_tokens": 4096, "lr": 1e-3, "warmup": 400, "label_smoothing": 0.1},
        "decode": {"strategy": "beam", "beam": 5, "length_penalty": 1.0, "eval_strategy": "greedy"},
    },
    data_options=Options,
)


@hookimpl
def taskformer_tasks():
    return [TASK]


def _local_splits(data_dir: Path) -> dict[str, list[tuple[str, str]]]:
    return {split: read_parallel(find_file(data_dir, f"{stem}.de"), find_file(data_dir, f"{stem}.en"))
            for split, stem in FILES.items()}


def _hub_splits() -> dict[str, list[tuple[str, str]]]:
    """The hub copy, for users without local files (never reached by the tests)."""
    try:
        import datasets

        hub = datasets.load_dataset(HUB)
        return {split: list(zip(hub[name]["de"], hub[name]["en"])) for split, name in HUB_SPLITS.items()}
    except Exception as e:  # offline, hub down, renamed dataset: all the same to the user
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DataError(f"cannot load {HUB} from the Hugging Face hub ({reason}); pass --data-dir DIR with "
                        f"train, val and test_2016_flickr .de/.en files (plain or .gz)") from None


@hookimpl
def taskformer_data(config, data_dir):
    opts = config.data
    splits = _local_splits(data_dir) if data_dir else _hub_splits()
    train = splits["train"]
    if 0 < opts.max_train < len(train):  # a seeded subsample, for quick runs
        keep = random.Random(config.train.seed).sample(range(len(train)), opts.max_train)
        splits["train"] = [train[i] for i in sorted(keep)]
    texts = [side for pair in splits["train"] for side in pair]
    source = str(data_dir) if data_dir else f"hub: {HUB}"
    return TaskData(tokenizer=subword(texts, opts.vocab_size, kind=opts.tokenizer), splits=splits,
                    notes={"data source": source, "tokenizer": f"joint de+en {opts.tokenizer}, train split only"})


@hookimpl
def taskformer_metrics(hypotheses, references):
    """Corpus sacreBLEU on detokenized text (13a, cased), chrF, and lower-cased BLEU as many tutorials report."""
    refs = [references]
    return {"bleu": sacrebleu.corpus_bleu(hypotheses, refs).score,
            "chrf": sacrebleu.corpus_chrf(hypotheses, refs).score,
            "bleu_lowercase": sacrebleu.corpus_bleu(hypotheses, refs, lowercase=True).score}


def _heatmap(run, source: str, output: str, path: Path) -> None:
    """Plot last-layer cross-attention (averaged over heads) of ``output`` given ``source``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # imported here: only reports need it
    from matplotlib.figure import Figure

    tok = run.tokenizer
    src_ids, _ = encode_sources(tok, [source], run.model.cfg.max_len, classify=False)
    out_ids = tok.encode(output).ids[: run.model.cfg.max_len - 1]
    src = torch.tensor(src_ids, device=run.device)
    tgt_in = torch.tensor([[BOS] + out_ids], device=run.device)
    run.model.eval()
    weights = run.model.attention_maps(src, tgt_in)[0].float().cpu().numpy()  # (T, S): row t predicts token t
    fig = Figure(figsize=(min(2.0 + 0.35 * weights.shape[1], 20), min(1.5 + 0.3 * weights.shape[0], 20)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(weights, cmap="Blues", aspect="auto", vmin=0.0)
    ax.set_xticks(range(len(src_ids[0])), [tok.id_to_token(i) for i in src_ids[0]], rotation=90, fontsize=8)
    ax.set_yticks(range(weights.shape[0]), [tok.id_to_token(i) for i in out_ids + [EOS]], fontsize=8)
    ax.set_xlabel("source (German)")
    ax.set_ylabel("output (English)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


@hookimpl
def taskformer_report_sections(run):
    shown = [row for row in run.samples.get("test", []) if row[1].strip()]  # a sample the report shows
    if not shown:
        return [("Cross-attention", Text("no non-empty test output to plot"))]
    source, output, _ = shown[0]
    _heatmap(run, source, output, run.dir / HEATMAP)
    note = Text(f"{HEATMAP} in the run directory: last decoder layer, mean over heads, for\n"
                f"  {source}\n  -> {output}")
    return [("Cross-attention", note)]
