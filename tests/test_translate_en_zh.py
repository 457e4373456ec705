"""translate-en-zh: tab-separated pairs, errors with file and line, the en+zh tokenizer, Chinese-tokenized
sacreBLEU, and a tiny run + predict through the CLI on the fixture (simple sentences written for the tests)."""
from __future__ import annotations

import gzip
import json
import re

import pytest
import sacrebleu

from conftest import task_data
from taskformer.app.hooks import score
from taskformer.plugins.manager import plugins

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

TASK = "translate-en-zh"
TINY = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1", "model.d_ff=64",
        "model.max_len=48", "train.epochs=12", "train.max_tokens=600", "train.lr=3e-3", "train.warmup=10",
        "train.bf16=false", "data.vocab_size=200", "decode.batch_size=8"]
HAN = re.compile(r"[\u4e00-\u9fff]")


def pairs(path):
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    return [tuple(line.split("\t")) for line in raw.decode("utf-8").splitlines()]


def test_reads_plain_and_gzip_pairs_unaltered(data_dir):
    folder = data_dir / "en-cn"
    data = task_data(TASK, folder)
    assert {s: len(p) for s, p in data.splits.items()} == {"train": 169, "val": 22, "test": 18}
    assert data.splits["train"] == pairs(folder / "train.txt.gz")  # gzipped
    assert data.splits["val"] == pairs(folder / "dev.txt") and data.splits["test"] == pairs(folder / "test.txt")
    assert any("？" in zh for _, zh in data.splits["test"])  # full-width punctuation kept as written


@pytest.mark.parametrize("chinese", ["characters", "subword"])
def test_tokenizer_decodes_to_natural_chinese(data_dir, chinese):
    data = task_data(TASK, data_dir / "en-cn", f"data.chinese={chinese}", "data.vocab_size=300")
    tok = data.tokenizer
    for en, zh in data.splits["train"]:
        for text in (en, zh):
            ids = tok.encode(text).ids
            assert 3 not in ids and tok.decode(ids) == text  # no [UNK], no spaces added, full-width ，？！ kept
    assert tok.decode(tok.encode("Tom喜欢茶。").ids) == "Tom喜欢茶。"  # a Latin name inside Chinese
    chinese_tokens = [t for t in tok.get_vocab() if HAN.search(t)]
    longest = max(len(t.lstrip("▁")) for t in chinese_tokens)
    if chinese == "characters":
        assert longest == 1 and tok.encode("我们不喜欢茶。").tokens == list("我们不喜欢茶。")
        assert "▁apples" in tok.get_vocab()  # English stays subwords
    else:
        assert longest > 1  # BPE merged Chinese characters


@pytest.mark.parametrize("bad, message", [
    ("No tab on this line.", "expected one TAB between source and target, found 0"),
    ("One\tTwo\t三", "expected one TAB between source and target, found 2"),
    ("\t我喜欢茶。", "empty source"),
    ("I like tea.\t ", "empty target"),
])
def test_malformed_line_is_one_line_error_with_file_and_line(cli, data_copy, bad, message):
    folder = data_copy("en-cn")
    dev = folder / "dev.txt"
    rows = dev.read_text(encoding="utf-8").splitlines()
    rows[2] = bad
    dev.write_text("\n".join(rows) + "\n", encoding="utf-8")
    result = cli("run", TASK, "--data-dir", str(folder), "--out", str(folder / "run"), "--quiet")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error:")
    assert f"dev.txt:3: {message}" in result.stderr


def test_missing_split_is_error_naming_file(cli, data_copy):
    folder = data_copy("en-cn")
    (folder / "test.txt").unlink()
    result = cli("run", TASK, "--data-dir", str(folder), "--out", str(folder / "run"), "--quiet")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "test.txt" in result.stderr and "not found" in result.stderr


def test_without_data_dir_says_where_to_get_the_data(cli, tmp_path):
    result = cli("run", TASK, "--out", str(tmp_path / "run"), "--quiet")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    for hint in ("--data-dir", "train.txt", "dev.txt", "test.txt", "English<TAB>Chinese", "tatoeba.org"):
        assert hint in result.stderr


def test_bleu_reads_chinese_characters_as_words():
    refs = ["我喜欢喝茶。", "他们在北京住了三年。", "你今天累了吗？"]
    got = score(plugins().task(TASK), [("", r) for r in refs], refs)
    assert got["bleu"] == pytest.approx(100.0) and got["chrf"] == pytest.approx(100.0)
    hyps = ["我喜欢喝水。", "他们在上海住了三年。", "你今天累了吗？"]
    got = score(plugins().task(TASK), [("", r) for r in refs], hyps)
    assert got["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs], tokenize="zh").score)
    # sacreBLEU's default tokenizer would take each unsegmented sentence as one word: 2 of 3 wrong
    assert got["bleu"] > 50.0 > sacrebleu.corpus_bleu(hyps, [refs]).score
    assert got["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [refs]).score)


def test_tiny_run_then_predict_chinese(cli, data_dir, tmp_path):
    out, sets = tmp_path / "run", [x for o in TINY for x in ("--set", o)]
    result = cli("run", TASK, "--data-dir", str(data_dir / "en-cn"), "--out", str(out), "--quiet", *sets)
    assert result.exit_code == 0, result.output
    metrics = json.loads((out / "result.json").read_text(encoding="utf-8"))["metrics"]
    assert {split: sorted(m) for split, m in metrics.items()} == {"val": ["bleu", "chrf", "loss"],
                                                                  "test": ["bleu", "chrf", "loss"]}
    assert all(0.0 <= m["bleu"] <= 100.0 and 0.0 <= m["chrf"] <= 100.0 for m in metrics.values())
    report = (out / "report.txt").read_text(encoding="utf-8")  # the shared heatmap section, English -> Chinese
    assert "Cross-attention" in report and (out / "attention.png").read_bytes().startswith(b"\x89PNG")

    result = cli("predict", str(out), "How about another piece of cake?")
    assert result.exit_code == 0, result.output
    line = result.stdout.removesuffix("\n")
    assert "\n" not in line and HAN.search(line) and not re.search(r"\s", line)  # Chinese, no spaces

    text = "She likes tea.\n\nDo they play tennis?\n"
    got = cli("predict", str(out), input=text)
    assert got.exit_code == 0, got.output
    rows = got.stdout.split("\n")
    assert len(rows) == 4 and rows[1] == "" and rows[-1] == ""  # one line per input, empty stays empty
    assert all(HAN.search(r) and not re.search(r"\s", r) for r in (rows[0], rows[2]))
