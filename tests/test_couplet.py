"""couplet: data loading, errors, the form and tone constraints, metrics, and a tiny run + predict on the fixture."""
from __future__ import annotations

import gzip
import json
import random
import shutil
import unicodedata
from dataclasses import replace

import pytest
import torch

from taskformer import EOS, UNK, characters
from taskformer.app import runner
from taskformer.app.hooks import build_model, decode_texts, load_data, score
from taskformer.app.prepare import make_config
from taskformer.plugins.manager import plugins
from taskformer.tasks.couplet import FREE, LEVEL, OBLIQUE, form_constraint, tone, tone_checks, tone_targets

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

TASK = "couplet"
TONES_OFF = ["decode.tone_final=off", "decode.tone_opposition=off"]
TONES_HARD = ["decode.tone_final=hard", "decode.tone_opposition=hard"]
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


def decoder_view(line, vocab):
    """``line`` as the constraint sees it: an unknown character is [UNK] there, free of any tone rule."""
    return "".join(c if c in vocab else "\0" for c in line)


def keeps_tones(src, out):
    final, opposition = tone_checks(src, out)
    return all(final) and all(opposition)


@pytest.mark.parametrize("strategy,tones", [("beam", TONES_OFF), ("greedy", TONES_OFF), ("beam", TONES_HARD),
                                            ("greedy", TONES_HARD)])
def test_constrained_outputs_keep_the_form(folder, strategy, tones):
    cfg = config(f"decode.strategy={strategy}", "decode.beam=3", "decode.batch_size=100", "data.min_char_freq=2",
                 *tones)
    data = load_data(task(), cfg, str(folder))
    vocab = data.tokenizer.get_vocab()
    chars = [c for c in vocab if len(c) == 1 and not punct(c)]
    marks = [c for c in vocab if len(c) == 1 and punct(c)]
    assert set(marks) >= {",", "?"}
    rng = random.Random(0)
    # inputs from the vocabulary, with unknown characters (卍, 龘) and punctuation at random places
    lines = random_lines(rng, chars + ["卍", "龘"], marks, 100)
    comma, eos = vocab[","], EOS
    level, oblique = ([vocab[c] for c in chars if tone(c) == cls][:3] for cls in (LEVEL, OBLIQUE))
    broken = 0
    for bias in [(), (eos,), (UNK,), (comma,), tuple(vocab[c] for c in chars[:3]), level, oblique]:
        outs, _ = decode_texts(task(), untrained(data, cfg, bias), data.tokenizer, None, cfg, lines)
        for src, out in zip(lines, outs):
            assert len(out) == len(src), (bias, src, out)
            assert punct(out) == punct(src), (bias, src, out)
            assert all(ch in vocab for ch in out)  # never [UNK] (it would vanish from the text)
            assert not any(a == b for a, b in zip(src, out) if not punct(a)), (bias, src, out)
            # tempted towards one class, the search still keeps both rules (those it can see)
            seen = decoder_view(src, vocab)
            if tones == TONES_HARD:
                assert keeps_tones(seen, out), (bias, src, out)
            broken += not keeps_tones(seen, out)
    assert broken or tones == TONES_HARD  # the check above can fail: without the rules, lines break them


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


# -- the tone rules ---------------------------------------------------------------------------

def test_tone_classes_of_known_characters():
    assert [tone(c) for c in "天平风高"] == [LEVEL] * 4  # tiān píng fēng gāo
    assert [tone(c) for c in "地仄雨月"] == [OBLIQUE] * 4  # dì zè yǔ yuè
    assert tone("长") == OBLIQUE  # a heteronym takes pypinyin's default reading (zhǎng), whatever the context
    # neutral tone, punctuation (NFKC's half-width and full-width alike), letters, digits, specials: free
    assert [tone(c) for c in ["的", ",", "，", "?", "a", "7", "[UNK]", ""]] == [FREE] * 8


def test_tone_targets_split_clauses_at_the_tasks_punctuation():
    # 山高,月小: clauses 山高 | 月小; 高 (平) at clause position 2 asks for 仄, 小 (仄) for 平, and 小 ends the line
    assert tone_targets("山高,月小") == ({4: LEVEL}, {1: OBLIQUE, 4: LEVEL})
    # trailing punctuation: the final rule looks at the last character (暖, 仄)
    assert tone_targets("春风送暖?") == ({3: LEVEL}, {1: OBLIQUE, 3: LEVEL})
    # positions restart after the comma: 帆顺年 | 事意步; 高 (平) sets no final rule
    assert tone_targets("一帆风顺年年好,万事如意步步高") == ({}, {1: OBLIQUE, 3: LEVEL, 5: OBLIQUE, 9: LEVEL,
                                                             11: LEVEL, 13: LEVEL})
    assert tone_targets("天的") == ({}, {})  # 的 is free: no rule at position 2, nor at the end
    assert tone_targets("") == ({}, {})


def tone_config(folder, *overrides):
    cfg = config("data.min_char_freq=1", "decode.strategy=greedy", *overrides)
    return cfg, load_data(task(), cfg, str(folder))


LINES = ["山高,月小", "春风送暖", "花开富贵,月满人间", "天"]


def test_soft_rules_change_scores_not_the_form(folder):
    cfg, data = tone_config(folder)
    vocab = data.tokenizer.get_vocab()
    src = torch.tensor([data.tokenizer.encode(line).ids + [EOS] for line in ["山高,月小"]])
    classes = torch.tensor([tone(data.tokenizer.id_to_token(i)) for i in range(len(vocab))])
    punctuation = torch.tensor([bool(punct(data.tokenizer.id_to_token(i))) for i in range(len(vocab))])
    final, opposition = torch.tensor([[0, 0, 0, 0, LEVEL, 0]]), torch.tensor([[0, OBLIQUE, 0, 0, LEVEL, 0]])
    logp = torch.zeros(1, len(vocab))
    plain = form_constraint(src, punctuation, True)
    soft = form_constraint(src, punctuation, True, classes, [(final, "soft", 1.5), (opposition, "soft", 1.5)])
    hard = form_constraint(src, punctuation, True, classes, [(final, "hard", 1.5), (opposition, "hard", 1.5)])
    for step, want in enumerate([FREE, OBLIQUE, FREE, FREE, LEVEL]):
        base, shifted, kept = plain(step, None, logp), soft(step, None, logp), hard(step, None, logp)
        open_ = torch.isfinite(base)
        assert torch.equal(torch.isfinite(shifted), open_)  # soft: the same choices...
        rules = 2 if step == 4 else 1  # ...less 1.5 per rule broken (both rules ask at the last position)
        expected = torch.where((classes != want) & (want != FREE), -1.5 * rules, 0.0)
        assert torch.equal((shifted - base)[open_], expected.expand_as(base)[open_])
        assert torch.equal(torch.isfinite(kept), open_ & ((classes == want) | (want == FREE)))

    model = untrained(data, cfg, bias=[vocab[c] for c in "雨月地"])  # 仄 characters: tempted to break the rules
    rates = {}
    for mode, penalty in [("off", 1.0), ("soft", 0.5), ("soft", 1e4), ("hard", 1.0)]:
        run_cfg = tone_config(folder, f"decode.tone_final={mode}", f"decode.tone_opposition={mode}",
                              f"decode.tone_penalty={penalty}")[0]
        outs, _ = decode_texts(task(), model, data.tokenizer, None, run_cfg, LINES)
        assert [len(o) for o in outs] == [len(s) for s in LINES] and [punct(o) for o in outs] == [punct(s) for s in LINES]
        checks = [tone_checks(s, o) for s, o in zip(LINES, outs)]
        rates[mode, penalty] = outs, sum(sum(f) + sum(o) for f, o in checks)
    assert rates["off", 1.0][1] < rates["hard", 1.0][1] == sum(len(f) + len(o) for f, o in map(tone_targets, LINES))
    assert rates["soft", 1e4] == rates["hard", 1.0]  # a huge penalty acts as a hard rule


def test_rules_off_reproduce_the_form_only_outputs(folder):
    # outputs of the decoder before the tone rules existed, for this seeded random model
    old = {"greedy": ["白白白白白白白", "惊惊,千千", "白白白白白白白", "白白白白白白白,庆庆庆庆庆庆庆", "白白白白", "惊"],
           "beam": ["惊惊惊惊惊惊惊", "白白,歌歌", "惊惊惊惊惊惊惊", "白白白白白白白,白白白白白白白", "惊惊惊惊", "惊"]}
    lines = ["晚风摇树树还挺", "山高,月小", "春风送暖入屠苏", "一帆风顺年年好,万事如意步步高", "花开富贵", "天"]
    for strategy, outputs in old.items():
        cfg = config(f"decode.strategy={strategy}", "decode.beam=3", "decode.mirror_repeats=false", *TONES_OFF)
        data = load_data(task(), cfg, str(folder))
        model = untrained(data, cfg)
        with torch.no_grad():  # a spread of preferences, so that the search has choices to make
            model.head.proj.bias.copy_(torch.randn(model.head.proj.bias.shape,
                                                   generator=torch.Generator().manual_seed(1)) * 0.3)
        outs, _ = decode_texts(task(), model, data.tokenizer, None, cfg, lines)
        assert outs == outputs


@pytest.mark.parametrize("setting,message", [
    ("decode.tone_final=strict", "decode.tone_final must be off, soft or hard, not 'strict'"),
    ("decode.tone_opposition=HARD", "decode.tone_opposition must be off, soft or hard"),
    ("decode.tone_penalty=0", "decode.tone_penalty must be a positive number"),
    ("decode.tone_penalty=-1", "decode.tone_penalty must be a positive number"),
    ("decode.tone_penalty=inf", "decode.tone_penalty must be a finite number"),
    ("decode.tone_penalty=nan", "decode.tone_penalty must be a finite number"),
    ("decode.tone_penalty=big", "decode.tone_penalty expects float"),
])
def test_bad_tone_options_are_one_line_errors(cli, folder, tmp_path, setting, message):
    result = cli("run", TASK, "--data-dir", str(folder), "--out", str(tmp_path / "run"), "--quiet", "--set", setting)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr
    assert not (tmp_path / "run").exists()  # refused before any work


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


def test_tone_metrics_on_hand_made_strings():
    # 山高,月小: 高 asks for 仄 at 1, 小 for 平 at 4 (both rules); 春风送暖: 风 仄 at 1, 暖 平 at 3 (both);
    # 花开: 开 (平) asks for 仄 at 1, no final rule (平 ending)
    sources, refs = ["山高,月小", "春风送暖", "花开"], ["水落,石出", "瑞雪迎新", "鸟啼"]
    kept = metrics(sources, ["水落,石出", "瑞雪迎新", "鸟语"], refs)
    assert kept["final_tone"] == kept["opposition"] == 100.0
    # 破 (仄) breaks the final rule and its opposition; 的 is free, so it keeps nothing; 鸟鸣 (平) breaks 1
    m = metrics(sources, ["水落,石破", "瑞的迎新", "鸟鸣"], refs)
    assert m["final_tone"] == pytest.approx(50.0)  # 2 lines end in 仄: 1 answered by 平
    assert m["opposition"] == pytest.approx(100 * 2 / 5)  # of 落 破 的 新 鸣, 落 and 新 keep it
    # a line cut short keeps none of the positions it lacks; the final rule reads its own last character (石, 平)
    assert tone_checks("山高,月小", "水落,石") == ([True], [True, False])
    assert tone_checks("春风送暖", "瑞雪新") == ([True], [True, False])
    # no rule at all (平 endings, free characters): nothing broken
    none = metrics(["天", "的的"], ["地", "了了"], ["地", "了了"])
    assert none["final_tone"] == none["opposition"] == 100.0


# -- end to end -------------------------------------------------------------------------------

def test_tiny_run_then_predict_and_eval(cli, folder, tmp_path):
    run_dir = tmp_path / "run"
    args = [a for o in TINY for a in ("--set", o)]
    result = cli("run", TASK, "--data-dir", str(folder), "--out", str(run_dir), "--quiet", *args)
    assert result.exit_code == 0, result.output
    saved = json.loads((run_dir / "result.json").read_text(encoding="utf-8"))
    assert saved["metrics"]["test"]["length_match"] == saved["metrics"]["test"]["punct_match"] == 100.0
    assert "Couplet form and tone of the test samples" in result.output
    assert 0 <= saved["metrics"]["test"]["final_tone"] <= 100 and 0 <= saved["metrics"]["test"]["opposition"] <= 100

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

    # the hard tone rules hold on every output of the trained model: the test split and random lines
    hard = cli("eval", str(run_dir), "--split", "test", *(a for o in TONES_HARD for a in ("--set", o)))
    assert hard.exit_code == 0 and "final_tone" in hard.stdout and "opposition" in hard.stdout
    run = runner.load(run_dir)
    vocab = run.tokenizer.get_vocab()
    chars = [c for c in vocab if len(c) == 1 and not punct(c)]
    norm = run.tokenizer.normalizer.normalize_str
    lines = random_lines(random.Random(1), chars, [",", "?"], 60) + [norm(s) for s in raw_lines(folder / "test/in.txt")]
    for strategy in ("greedy", "beam"):
        cfg = replace(run.config, decode=replace(run.config.decode, strategy=strategy, tone_final="hard",
                                                 tone_opposition="hard"))
        outs, _ = runner.predict(run, lines, cfg)
        assert sum(len(tone_targets(s)[1]) for s in lines) > 100  # the rules had work to do
        for src, out in zip(lines, outs):
            assert len(out) == len(src) and punct(out) == punct(src), (src, out)
            assert keeps_tones(decoder_view(src, vocab), out), (strategy, src, out)


def test_repeats_in_the_second_line_mirror_the_first_line_s(folder):
    cfg = config("data.min_char_freq=1")
    data = load_data(task(), cfg, str(folder))
    model = untrained(data, cfg, bias=(data.tokenizer.get_vocab()["月"],))  # it wants 月 everywhere
    outs, _ = decode_texts(task(), model, data.tokenizer, None, cfg, ["春风送暖", "年年有余"])
    assert len(set(outs[0])) == 4  # no repeats where the first line has none, not 月月月月
    assert outs[1][:2] == "月月" and "月" not in outs[1][2:]  # 年年: a repeat where the first line repeats
