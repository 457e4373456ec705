"""``couplet``: write the second line of a Chinese couplet (对联) given the first.

Data: the couplet data set of wb14123/couplet-dataset in its release layout, given with
``--data-dir DIR``: ``train/in.txt``, ``train/out.txt``, ``test/in.txt``, ``test/out.txt`` (plain or
``.gz``), one couplet half per line, characters separated by spaces. The Hugging Face copy
(``wb14123/couplet``) is a single table without the release's test split, so it is not used: the
task needs the local files. The validation split is carved from train with the run's seed.

A couplet has a strict form: the second line has as many characters as the first and punctuation
at the same positions. The decoder enforces that form inside the beam search (a ``constraint``),
so the model only chooses the characters.

It also answers the first line in tone (平仄, see :func:`tone`): where the first line ends on an
oblique tone (仄) the second ends on a level one (平), and at the 2nd, 4th, 6th... character of each
clause (clauses end at punctuation) the second line takes the opposite class. Each rule is off, soft
(a log-probability penalty) or hard (``decode.tone_final``, ``decode.tone_opposition``).

A character outside the vocabulary is ``[UNK]`` to the decoder and so sets no tone rule; the
metrics read the text and do count it.

Text is kept as the tokenizer normalizes it (NFKC, no spaces), so sources, outputs and references
compare character by character; note that NFKC turns full-width ``，？`` into ``,?``.
"""
from __future__ import annotations

import functools
import random
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.table import Table

from taskformer import (
    EOS,
    PAD,
    SPECIALS,
    DataError,
    DecodeConfig,
    Task,
    TaskData,
    TaskformerError,
    characters,
    find_file,
    hookimpl,
    option,
    read_parallel,
)

# torch, pypinyin and sacreBLEU are imported in the functions that use them: listing the installed
# tasks imports this module, and should not wait for them.
if TYPE_CHECKING:
    import torch


@dataclass
class Options:
    """The ``data`` options. ``max_train``: pairs used for training (0 = all 728k; docs/results.md
    compares subsets); ``val_size`` pairs are carved from the full train set first, seeded by
    ``train.seed``; characters seen fewer than ``min_char_freq`` times become [UNK]."""

    max_train: int = option(0, "Pairs used for training; 0: all.", at_least=0)
    val_size: int = option(1000, "Validation pairs carved from the full train set first, seeded by train.seed.",
                           at_least=1)
    min_char_freq: int = option(2, "Characters seen fewer times become [UNK].", at_least=1)


TONE_MODES = ("off", "soft", "hard")


@dataclass
class Search(DecodeConfig):
    """The core's search settings plus the couplet's own: ``constrained`` enforces the form inside
    the search (``false`` turns the tone rules off too: they need the form's positions); ``no_repeat``
    bans the first line's character at the same position; ``mirror_repeats`` bans repeats that the
    first line lacks. ``tone_final`` and ``tone_opposition`` set
    the two tone rules: ``off``, ``soft`` (``tone_penalty`` is subtracted from the log-probability of
    every character that breaks the rule) or ``hard`` (only characters that keep it are allowed).

    Defaults: the final rule hard, opposition soft with penalty 1, beam 8, chosen on val pairs of a
    separate run (bench/study/couplet_tones.py; the scores are in docs/results.md). Hard opposition is
    there for whoever wants the guarantee.
    """

    constrained: bool = option(True, "Enforce the form (length, punctuation) inside the search; false turns the "
                               "tone rules off too.")
    no_repeat: bool = option(True, "Ban the first line's character at the same position.")
    mirror_repeats: bool = option(True, "A character of the second line comes again only where the first line "
                                  "repeats its own (叠字).")
    tone_final: str = option("hard", "The rule on the last character's tone.", choices=TONE_MODES)
    tone_opposition: str = option("soft", "The rule that tones oppose the first line's.", choices=TONE_MODES)
    tone_penalty: float = option(1.0, "Subtracted from the log-probability of a character that breaks a soft rule.",
                                 above=0.0)


TASK = Task(
    name="couplet",
    description="Chinese couplets: write the second line (form-constrained decoding; needs --data-dir)",
    variant="encoder-decoder",
    metric="bleu",
    examples=("春风送暖入屠苏", "海阔凭鱼跃", "一帆风顺年年好"),
    higher_is_better=True,
    defaults={
        # Sized for a 2-core CPU, chosen at equal time (docs/archive/results-2026-11.md, "Model size on both cores").
        # bf16 where it is native (the engine's auto): more updates an hour at the same val loss per
        # update; fp32 elsewhere. A patience of 40 evaluations: the greedy char BLEU that selects
        # checkpoints is noisy from one evaluation to the next while the val loss still falls, and
        # the time limit's default of 10 ends runs that are still learning (docs/results.md, "couplet
        # with the budget of a bf16-native CPU").
        "model": {"d_model": 128, "n_heads": 4, "enc_layers": 2, "dec_layers": 2, "d_ff": 512,
                  "dropout": 0.0, "max_len": 64, "tie_embeddings": True},
        "train": {"epochs": 10, "max_tokens": 1500, "lr": 2e-3, "warmup": 200, "label_smoothing": 0.1,
                  "eval_every": 500, "patience": 40},
        "decode": {"strategy": "beam", "beam": 8, "max_len_a": 1.0, "max_len_b": 1, "batch_size": 256},
    },
    data_options=Options,
    decode_options=Search,
    # A short budget ends its schedule: the rate falls to zero over the last 30% of the time, which
    # settles the weights a few minutes of training leave wandering (an hour is 25-70 M target tokens).
    recipes=(
        (0, {"train": {"cooldown": 0.3}}, "a short budget: decay to zero over the last 30%"),
        (10e6, {}, "the defaults, validated over an hour"),
    ),
)


def is_punct(ch: str) -> bool:
    """One punctuation character; a special token such as ``[UNK]`` is not."""
    return len(ch) == 1 and unicodedata.category(ch).startswith("P")


FREE, LEVEL, OBLIQUE = 0, 1, 2  # tone classes; 平 is LEVEL, 仄 is OBLIQUE, and OBLIQUE = 3 - LEVEL


@functools.cache
def tone(ch: str) -> int:
    """The tone class of a character: LEVEL (平) for Mandarin tones 1 and 2, OBLIQUE (仄) for 3 and 4,
    FREE for a neutral tone or no reading (punctuation, letters, digits, special tokens).

    A character with several readings (a heteronym) takes pypinyin's default, its most common
    reading, without looking at the words around it: 长 is always zhǎng (仄), 看 kàn (仄), 子 the
    neutral zi (FREE). A context-aware reading would need the whole line, and the constraint works
    on one vocabulary entry at a time; the default reading is also what anyone checking the output
    with pypinyin gets. A FREE character imposes no rule on the second line and keeps none either.
    """
    from pypinyin import Style, lazy_pinyin

    reading = "".join(lazy_pinyin(ch, style=Style.TONE3, errors="ignore")) if len(ch) == 1 else ""
    return {"1": LEVEL, "2": LEVEL, "3": OBLIQUE, "4": OBLIQUE}.get(reading[-1:], FREE)


@hookimpl
def taskformer_tasks():
    return [TASK]


@hookimpl
def taskformer_data(config, data_dir):
    if data_dir is None:
        raise DataError("couplet: no standard hub copy of this data set; give --data-dir DIR with "
                        "train/in.txt, train/out.txt, test/in.txt, test/out.txt (plain or .gz)")
    opts = config.data
    raw = {split: read_parallel(find_file(data_dir, f"{split}/in.txt"), find_file(data_dir, f"{split}/out.txt"))
           for split in ("train", "test")}
    pool = raw["train"]
    if len(pool) <= opts.val_size:
        raise DataError(f"{data_dir}/train: {len(pool)} pairs, not enough to carve data.val_size={opts.val_size}")
    random.Random(config.train.seed).shuffle(pool)
    train = pool[opts.val_size:]
    splits = {"train": train[: opts.max_train or None], "val": pool[: opts.val_size], "test": raw["test"]}
    tok = characters((s for pair in splits["train"] for s in pair), min_frequency=opts.min_char_freq)
    norm = tok.normalizer.normalize_str  # the model's view: NFKC, spaces removed
    splits = {k: [(norm(s), norm(t)) for s, t in v] for k, v in splits.items()}
    vocab = tok.get_vocab()
    if len(vocab) == len(SPECIALS):
        raise TaskformerError(f"config: data.min_char_freq={opts.min_char_freq} leaves no character in the vocabulary")
    notes = {"min char frequency": opts.min_char_freq}
    for k, v in splits.items():
        notes[f"{k} chars -> [UNK]"] = sum(ch not in vocab for pair in v for s in pair for ch in s)
    return TaskData(tokenizer=tok, splits=splits, notes=notes)


def last_char(line) -> int | None:
    """Position of the last character of ``line`` that is not punctuation (None: there is none)."""
    return max((i for i, ch in enumerate(line) if not is_punct(ch)), default=None)


def tone_targets(first) -> tuple[dict[int, int], dict[int, int]]:
    """The tone the second line must take, by position, under the final rule and the opposition rule.

    ``first`` is the first line as a string or as a list of tokens (the decoder's view, where an
    unknown character is ``[UNK]`` and so FREE). Final: when the last character that is not
    punctuation is 仄, 平 there. Opposition: at the 2nd, 4th, 6th... character of every clause, the
    class opposite to the first line's (no rule where that character is FREE).
    """
    final, opposition, k = {}, {}, 0
    for i, ch in enumerate(first):
        k = 0 if is_punct(ch) else k + 1
        if k and k % 2 == 0 and tone(ch) != FREE:
            opposition[i] = 3 - tone(ch)
    last = last_char(first)
    if last is not None and tone(first[last]) == OBLIQUE:
        final[last] = LEVEL
    return final, opposition


@functools.lru_cache(maxsize=8)
def vocab_tables(tokenizer) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """Every vocabulary entry by id, whether it is punctuation, and its tone class: worked out once
    per tokenizer, not per batch or step."""
    import torch

    tokens = [""] * tokenizer.get_vocab_size()
    for token, i in tokenizer.get_vocab().items():
        tokens[i] = token
    return tokens, torch.tensor([is_punct(t) for t in tokens]), torch.tensor([tone(t) for t in tokens])


def tone_rules(src: torch.Tensor, tokens: list[str], decode: Search) -> list[tuple[torch.Tensor, str, float]]:
    """The tone rules that are on, for :func:`form_constraint`: (targets, mode, penalty), where
    targets (B, S) holds the class that output position ``t`` must take (FREE: no rule there)."""
    import torch

    modes = {0: decode.tone_final, 1: decode.tone_opposition}
    if set(modes.values()) == {"off"}:
        return []
    targets = torch.zeros(2, *src.shape, dtype=torch.long)
    for row, ids in enumerate(src.tolist()):
        for rule, found in enumerate(tone_targets([tokens[i] for i in ids if i not in (PAD, EOS)])):
            for t, cls in found.items():
                targets[rule, row, t] = cls
    return [(targets[rule].to(src.device), mode, decode.tone_penalty) for rule, mode in modes.items() if mode != "off"]


def form_constraint(src: torch.Tensor, punct: torch.Tensor, no_repeat: bool, classes: torch.Tensor | None = None,
                    rules=(), mirror_repeats: bool = False):
    """The couplet's form, and its tone ``rules`` (see :func:`tone_rules`), as a ``constraint`` for
    :func:`taskformer.search`; ``classes`` (V,) is the tone class of every vocabulary entry.

    Position ``t`` of the output may hold: EOS when ``t`` is the input's length; the input's own
    punctuation token where the input has punctuation; elsewhere any ordinary character except
    punctuation, specials, (``no_repeat``) the input's character at ``t`` and (``mirror_repeats``)
    any earlier output character at a position where the input's character differs from its own at ``t``. A hard tone rule keeps
    only the characters of the class it asks for; a soft one lowers the others' log-probability by
    its penalty. So that no row is ever left without a token, a hard rule gives way in a row it
    would empty, and a row whose choices are all banned (a tiny vocabulary) may take any ordinary
    character, or with none in the vocabulary any non-special token.
    """
    import torch

    lengths = (src != PAD).sum(1) - 1  # without EOS
    vocab = punct.numel()
    ordinary = ~punct
    ordinary[: len(SPECIALS)] = False
    fallback = ordinary if ordinary.any() else torch.arange(vocab, device=src.device) >= len(SPECIALS)
    cols = torch.arange(src.size(1), device=src.device)
    forced = torch.where(punct[src], src, torch.full_like(src, -1))  # (B, S): punctuation to copy
    forced[cols.unsqueeze(0) >= lengths.unsqueeze(1)] = EOS
    if rules:  # breaking[c]: the vocabulary entries that break a rule asking for class c (FREE: none)
        assert classes is not None, "tone rules need the tone class of every vocabulary entry"
        breaking = torch.stack([(classes != c) & (c != FREE) for c in (FREE, LEVEL, OBLIQUE)])

    def constrain(step: int, prefix: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
        beam = logp.size(0) // src.size(0)
        t = min(step, src.size(1) - 1)
        force, same = forced[:, t].repeat_interleave(beam), src[:, t].repeat_interleave(beam)
        allowed = ordinary.expand(logp.size(0), vocab).clone()
        if no_repeat:
            allowed[torch.arange(logp.size(0)), same] = False
        if mirror_repeats:
            # repeats mirror the first line's (叠字): an earlier output character comes again only
            # where the input repeats its own, so 检点 gets no 行行
            differs = (src[:, :t] != src[:, t : t + 1]).repeat_interleave(beam, 0)  # (N, t)
            earlier = prefix[:, 1 : t + 1]
            allowed.scatter_(1, torch.where(differs, earlier, torch.full_like(earlier, PAD)), False)
        penalty = 0.0
        for targets, mode, size in rules:
            breaks = breaking[targets[:, t].repeat_interleave(beam)]  # (N, V)
            if mode == "hard":
                keep = allowed & ~breaks
                kept = keep.any(1)
                allowed[kept] = keep[kept]
            else:
                penalty = penalty + size * breaks
        allowed[~allowed.any(1)] = fallback
        pinned = force >= 0
        allowed[pinned] = False
        allowed[pinned, force[pinned]] = True
        return logp.masked_fill(~allowed, float("-inf")) - penalty

    return constrain


@hookimpl
def taskformer_decode(model, src, tokenizer, config):
    if not config.decode.constrained:
        return None  # unconstrained: the core's plain beam or greedy search
    from taskformer import search

    tokens, punct, classes = vocab_tables(tokenizer)
    rules = tone_rules(src, tokens, config.decode)
    constraint = form_constraint(src, punct.to(src.device), config.decode.no_repeat, classes.to(src.device), rules,
                                 config.decode.mirror_repeats)
    limit = (src != PAD).sum(1)  # input length + 1: room for the forced EOS
    return [tokenizer.decode(x) for x in search(model, src, config.decode, constraint, max_len=limit)]


@hookimpl
def taskformer_annotate(text):
    return [{LEVEL: "平", OBLIQUE: "仄"}.get(tone(ch), "") for ch in text]


def form_checks(source: str, output: str) -> tuple[bool, bool, int]:
    """(same length, punctuation at the same positions, characters copied at the same position)."""
    marks = lambda s: [(i, c) for i, c in enumerate(s) if is_punct(c)]  # noqa: E731
    copies = sum(a == b and not is_punct(a) for a, b in zip(source, output))
    return len(source) == len(output), marks(source) == marks(output), copies


def tone_checks(source: str, output: str) -> tuple[list[bool], list[bool]]:
    """Whether ``output`` keeps each tone rule that ``source`` sets: (final, opposition), one flag per
    rule and position (the final rule looks at the output's own last character, as it is written)."""
    final, opposition = tone_targets(source)
    last = last_char(output)
    kept_final = [last is not None and tone(output[last]) == cls for cls in final.values()]
    return kept_final, [t < len(output) and tone(output[t]) == cls for t, cls in opposition.items()]


def rate(flags: list[bool]) -> float:
    """Percent of ``flags`` that hold; 100 when there are none (no rule, none broken)."""
    return 100.0 * sum(flags) / len(flags) if flags else 100.0


def distinct(lines: list[str], n: int) -> float:
    """Distinct-n: unique character n-grams over all n-grams of all lines, in percent."""
    grams = Counter(s[i : i + n] for s in lines for i in range(len(s) - n + 1))
    return 100.0 * len(grams) / max(sum(grams.values()), 1)


@hookimpl
def taskformer_metrics(sources, hypotheses, references):
    import sacrebleu

    checks = [form_checks(s, h) for s, h in zip(sources, hypotheses)]
    tones = [tone_checks(s, h) for s, h in zip(sources, hypotheses)]
    n = max(len(checks), 1)
    return {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references], tokenize="char").score,
        "length_match": 100.0 * sum(c[0] for c in checks) / n,
        "punct_match": 100.0 * sum(c[1] for c in checks) / n,
        "final_tone": rate([ok for final, _ in tones for ok in final]),
        "opposition": rate([ok for _, opposition in tones for ok in opposition]),
        "distinct_1": distinct(hypotheses, 1),
        "distinct_2": distinct(hypotheses, 2),
    }


@hookimpl
def taskformer_report_sections(run):
    if not run.samples.get("test"):
        return None
    table = Table("first line", "generated", "reference", "length ok", "punct. ok", "copies", "final tone",
                  "opposed")
    for src, hyp, ref in run.samples["test"]:
        same_len, same_punct, copies = form_checks(src, hyp)
        final, opposition = tone_checks(src, hyp)
        table.add_row(src, hyp, ref, "yes" if same_len else "NO", "yes" if same_punct else "NO", str(copies),
                      ("yes" if all(final) else "NO") if final else "-", f"{sum(opposition)}/{len(opposition)}")
    return [("Couplet form and tone of the test samples", table)]
