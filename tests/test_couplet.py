"""couplet: data loading, errors, the form constraint, metrics, and a tiny run + predict on the fixture."""
from __future__ import annotations

import gzip
import json
import random
import shutil
import unicodedata

import pytest
import torch

from dataclasses import replace

from taskformer import EOS, UNK, characters
from taskformer.app.runner import build_model, decode_texts, load_data, make_config, score
from taskformer.plugins.manager import plugins

TASK = "couplet"
TINY = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1", "model.d_ff=64",
        "model.max_len=40", "train.epochs=2", "train.max_tokens=400", "train.warmup=10", "train.bf16=false",
        "train.eval_every=0", "data.val_size=6", "decode.batch_size=16"]


def task():
    return plugins().task(TASK)


def config(*overrides):
    return make_config(task(), None, [*TINY, *overrides], None)


def load(folder, *overrides):
    return load_data(task(), config(*overrides), str(folder))


def raw_lines(path):
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    return raw.decode("utf-8").splitlines()


def punct(text):
    return [(i, c) for i, c in enumerate(text) if unicodedata.category(c).startswith("P")]


def metrics(sources, hyps, refs):
    return score(task(), list(zip(sources, refs)), hyps)


@pytest.fixture
def folder(data_dir):
    return data_dir / "couplets"


# -- data -------------------------------------------------------------------------------------

def test_loads_spaced_plain_and_gzip_files_as_unspaced_text(folder):
    data = load(folder, "data.min_char_freq=1")
    assert {s: len(p) for s, p in data.splits.items()} == {"train": 54, "val": 6, "test": 12}
    norm = data.tokenizer.normalizer.normalize_str
    raw_train = list(zip(raw_lines(folder / "train/in.txt.gz"), raw_lines(folder / "train/out.txt")))
    assert sorted(data.splits["train"] + data.splits["val"]) == sorted((norm(a), norm(b)) for a, b in raw_train)
    test = list(zip(raw_lines(folder / "test/in.txt"), raw_lines(folder / "test/out.txt")))
    assert data.splits["test"] == [(norm(a), norm(b)) for a, b in test]
    first = data.splits["test"][0]
    assert first == ("晚风摇树树还挺", "晨露润花花更红")
    assert all(" " not in s + t and len(s) == len(t) for s, t in data.splits["test"])
    # full-width punctuation comes through the tokenizer's NFKC, identically on both sides
    assert any(punct(s) and punct(s) == punct(t) for s, t in data.splits["test"])
    assert data.notes["train chars -> [UNK]"] == 0


def test_val_is_seeded_and_max_train_subsamples(folder):
    a, b = load(folder), load(folder)
    assert a.splits == b.splits
    other = load_data(task(), make_config(task(), None, TINY, 1), str(folder))
    assert other.splits["val"] != a.splits["val"]
    small = load(folder, "data.max_train=20")
    assert len(small.splits["train"]) == 20 and set(small.splits["train"]) <= set(a.splits["train"])
    assert small.splits["val"] == a.splits["val"]


def test_rare_characters_become_unk_and_are_counted(folder):
    data = load(folder, "data.min_char_freq=3")
    vocab = data.tokenizer.get_vocab()
    for split, pairs in data.splits.items():
        rare = sum(ch not in vocab for pair in pairs for text in pair for ch in text)
        ids = [i for pair in pairs for text in pair for i in data.tokenizer.encode(text).ids]
        assert data.notes[f"{split} chars -> [UNK]"] == rare == ids.count(UNK)
    assert data.notes["train chars -> [UNK]"] > 0


def test_line_count_mismatch_is_a_one_line_error(cli, folder, tmp_path):
    copy = shutil.copytree(folder, tmp_path / "couplets")
    out = copy / "test/out.txt"
    out.write_text("".join(out.read_text(encoding="utf-8").splitlines(keepends=True)[:-1]), encoding="utf-8")
    result = cli("run", TASK, "--data-dir", str(copy), "--out", str(tmp_path / "run"), "--quiet")
    assert result.exit_code == 2
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in result.output
    assert "test/in.txt has 12 lines" in message and "test/out.txt has 11" in message


def test_missing_data_dir_and_empty_vocabulary_are_clear_errors(cli, folder, tmp_path):
    result = cli("run", TASK, "--out", str(tmp_path / "a"), "--quiet")
    assert result.exit_code == 2 and "--data-dir" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = cli("run", TASK, "--data-dir", str(folder), "--out", str(tmp_path / "b"), "--quiet",
                 "--set", "data.val_size=6", "--set", "data.min_char_freq=1000")
    assert result.exit_code == 2 and "data.min_char_freq" in result.stderr


# -- the form constraint ----------------------------------------------------------------------

def untrained(data, cfg, bias=()):
    """A random model; ``bias`` pushes the output layer towards some tokens (to tempt the search)."""
    torch.manual_seed(0)
    model = build_model(task(), cfg, data.tokenizer.get_vocab_size(), None).eval()
    with torch.no_grad():
        for token in bias:
            model.head.proj.bias[token] += 50.0
    return model


def random_lines(rng, chars, marks, n):
    lines = []
    for _ in range(n):
        line = [rng.choice(chars) for _ in range(rng.randint(1, 14))]
        for i in rng.sample(range(len(line)), k=min(len(line), rng.randint(0, 2))):
            line[i] = rng.choice(marks)
        lines.append("".join(line))
    return lines


@pytest.mark.parametrize("strategy", ["beam", "greedy"])
def test_constrained_outputs_keep_the_form(folder, strategy):
    cfg = config(f"decode.strategy={strategy}", "decode.beam=3", "decode.batch_size=100", "data.min_char_freq=2")
    data = load_data(task(), cfg, str(folder))
    vocab = data.tokenizer.get_vocab()
    chars = [c for c in vocab if len(c) == 1 and not punct(c)]
    marks = [c for c in vocab if len(c) == 1 and punct(c)]
    assert set(marks) >= {",", "?"}
    rng = random.Random(0)
    # inputs from the vocabulary, with unknown characters (卍, 龘) and punctuation at random places
    lines = random_lines(rng, chars + ["卍", "龘"], marks, 100)
    comma, eos = vocab[","], EOS
    for bias in [(), (eos,), (UNK,), (comma,), tuple(vocab[c] for c in chars[:3])]:
        outs, _ = decode_texts(task(), untrained(data, cfg, bias), data.tokenizer, None, cfg, lines)
        for src, out in zip(lines, outs):
            assert len(out) == len(src), (bias, src, out)
            assert punct(out) == punct(src), (bias, src, out)
            assert all(ch in vocab for ch in out)  # never [UNK] (it would vanish from the text)
            assert not any(a == b for a, b in zip(src, out) if not punct(a)), (bias, src, out)


def test_no_repeat_can_be_switched_off(folder):
    cfg = config("data.min_char_freq=1")
    data = load_data(task(), cfg, str(folder))
    vocab = data.tokenizer.get_vocab()
    lines = ["春风春风", "风春", "春春风风春"]
    model = untrained(data, cfg, bias=(vocab["春"], vocab["风"]))  # tempted to copy
    on, _ = decode_texts(task(), model, data.tokenizer, None, cfg, lines)
    cfg = replace(cfg, decode=replace(cfg.decode, no_repeat=False))
    off, _ = decode_texts(task(), model, data.tokenizer, None, cfg, lines)
    copies = lambda outs: sum(a == b for src, out in zip(lines, outs) for a, b in zip(src, out))  # noqa: E731
    assert copies(on) == 0 < copies(off)
    assert [len(o) for o in on] == [len(o) for o in off] == [len(s) for s in lines]


def test_unconstrained_search_is_the_plain_core_search(folder):
    cfg = config("decode.constrained=false", "decode.strategy=greedy")
    data = load_data(task(), cfg, str(folder))
    model = untrained(data, cfg, bias=(EOS,))  # a model that wants to stop at once
    outs, _ = decode_texts(task(), model, data.tokenizer, None, cfg, ["春风送暖", "山高,月小"])
    assert outs == ["", ""]
    cfg = replace(cfg, decode=replace(cfg.decode, constrained=True))
    outs, _ = decode_texts(task(), model, data.tokenizer, None, cfg, ["春风送暖", "山高,月小"])
    assert [len(o) for o in outs] == [4, 5] and outs[1][2] == ","


def test_a_row_is_never_left_without_a_token():
    # one ordinary character only: no_repeat would ban it everywhere, so the fallback allows it
    tok = characters(["春春", ",春"])
    cfg = config()
    model = build_model(task(), cfg, tok.get_vocab_size(), None).eval()
    outs, _ = decode_texts(task(), model, tok, None, cfg, ["春春", "春,春"])
    assert outs == ["春春", "春,春"]


# -- metrics ----------------------------------------------------------------------------------

def test_metrics_on_hand_made_strings():
    sources = ["春风送暖", "山高,月小", "花开"]
    refs = ["瑞雪迎新", "水落,石出", "鸟啼"]
    same = metrics(sources, refs, refs)
    assert same["bleu"] == pytest.approx(100.0)
    assert same["length_match"] == same["punct_match"] == 100.0
    hyps = ["瑞雪迎新年", "水落石,出", "鸟鸟"]  # too long; comma moved; a repeat
    m = metrics(sources, hyps, refs)
    assert m["length_match"] == pytest.approx(200 / 3)
    assert m["punct_match"] == pytest.approx(200 / 3)  # line 1 has no punctuation to misplace
    assert 0 < m["bleu"] < 100
    # distinct-1: 11 unique of 12 characters (鸟 twice); distinct-2: 9 unique of 9 bigrams
    assert m["distinct_1"] == pytest.approx(100 * 11 / 12)
    assert m["distinct_2"] == pytest.approx(100.0)
    assert metrics(sources, ["春春春春", "春春,春春", "春春"], refs)["distinct_2"] == pytest.approx(100 * 3 / 8)


# -- end to end -------------------------------------------------------------------------------

def test_tiny_run_then_predict_and_eval(cli, folder, tmp_path):
    run_dir = tmp_path / "run"
    args = [a for o in TINY for a in ("--set", o)]
    result = cli("run", TASK, "--data-dir", str(folder), "--out", str(run_dir), "--quiet", *args)
    assert result.exit_code == 0, result.output
    saved = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert saved["metrics"]["test"]["length_match"] == saved["metrics"]["test"]["punct_match"] == 100.0
    assert "Couplet form of the test samples" in result.output

    spaced = cli("predict", str(run_dir), "晚 风 摇 树 树 还 挺", "春 风 ， 送 暖")
    plain = cli("predict", str(run_dir), "晚风摇树树还挺", "春风，送暖")
    assert spaced.exit_code == plain.exit_code == 0
    assert spaced.stdout == plain.stdout
    first, second = plain.stdout.splitlines()
    assert len(first) == 7 and len(second) == 5 and second[2] == ","
    piped = cli("predict", str(run_dir), input="晚风摇树树还挺\n\n春风，送暖\n")
    assert piped.stdout.splitlines() == [first, "", second]

    greedy = cli("eval", str(run_dir), "--split", "test", "--set", "decode.constrained=false",
                 "--set", "decode.strategy=greedy")
    assert greedy.exit_code == 0 and "length_match" in greedy.stdout
