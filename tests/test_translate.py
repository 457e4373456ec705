"""translate-de-en: data loading, errors, tokenizer, metrics, and a tiny run + predict on the fixture."""
from __future__ import annotations

import gzip
import json

import pytest

from conftest import run_cli, task_data
from taskformer.app.hooks import score
from taskformer.plugins.manager import plugins

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

TASK = "translate-de-en"
TINY = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.dec_layers=1", "model.d_ff=64",
        "model.max_len=48", "train.epochs=2", "train.max_tokens=600", "train.warmup=10", "train.bf16=false",
        "data.vocab_size=200", "decode.batch_size=8"]


def lines(path):
    raw = gzip.open(path, "rb").read() if path.suffix == ".gz" else path.read_bytes()
    return raw.decode("utf-8").splitlines()


def load(data_dir, *overrides):
    return task_data(TASK, data_dir, *overrides)


def metrics(hyps, refs):
    return score(plugins().task(TASK), [("", r) for r in refs], hyps)


@pytest.fixture
def fixture_copy(data_copy):
    return data_copy("multi30k")


def test_loads_plain_and_gzip_files_in_order(data_dir):
    folder = data_dir / "multi30k"
    data = load(folder)
    assert {s: len(p) for s, p in data.splits.items()} == {"train": 60, "val": 12, "test": 12}
    # train.de is gzipped, train.en plain; both test files are gzipped
    assert data.splits["train"] == list(zip(lines(folder / "train.de.gz"), lines(folder / "train.en")))
    assert data.splits["test"] == list(zip(lines(folder / "test_2016_flickr.de.gz"),
                                           lines(folder / "test_2016_flickr.en.gz")))
    assert data.splits["val"][0] == (lines(folder / "val.de")[0], lines(folder / "val.en")[0])


def test_max_train_subsamples_train_only(data_dir):
    data = load(data_dir / "multi30k", "data.max_train=25")
    full = load(data_dir / "multi30k")
    assert len(data.splits["train"]) == 25 and set(data.splits["train"]) <= set(full.splits["train"])
    assert data.splits["val"] == full.splits["val"] and data.splits["test"] == full.splits["test"]


def test_a_resumed_run_gets_the_same_train_subsample(data_dir):
    # --resume hands the hook the saved tokenizer; the subsample must not depend on that
    from taskformer.app.hooks import load_data
    from taskformer.app.prepare import make_config
    task = plugins().task("translate-de-en")
    config = make_config(task, None, ["data.max_train=25"], None)
    fresh = load_data(task, config, data_dir / "multi30k")
    resumed = load_data(task, config, data_dir / "multi30k", tokenizer=fresh.tokenizer)
    assert len(resumed.splits["train"]) == 25 and resumed.splits["train"] == fresh.splits["train"]


def test_tokenizer_is_joint_and_decodes_to_natural_text(data_dir):
    data = load(data_dir / "multi30k", "data.vocab_size=200")
    tok = data.tokenizer
    for de, en in data.splits["train"][:10] + data.splits["test"][:5]:
        for text in (de, en):
            ids = tok.encode(text).ids
            assert 3 not in ids  # no [UNK] for text made of training characters
            assert tok.decode(ids) == text  # punctuation attached, no marker characters, no extra spaces
    vocab = tok.get_vocab()
    assert {"▁Mädchen", "▁girls"} <= set(vocab)  # one vocabulary learned from both sides


def test_line_count_mismatch_is_one_line_error_naming_file(cli, fixture_copy):
    (fixture_copy / "val.en").write_text("\n".join(lines(fixture_copy / "val.en")[:-1]) + "\n", encoding="utf-8")
    result = cli("run", TASK, "--data-dir", str(fixture_copy), "--out", str(fixture_copy / "run"), "--quiet")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("Error:")
    assert "val.en" in result.stderr and "11" in result.stderr and "12" in result.stderr


def test_missing_split_is_error_naming_file(cli, fixture_copy):
    for path in fixture_copy.glob("test_2016_flickr.de*"):
        path.unlink()
    result = cli("run", TASK, "--data-dir", str(fixture_copy), "--out", str(fixture_copy / "run"), "--quiet")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "test_2016_flickr.de" in result.stderr and "not found" in result.stderr


def test_without_data_dir_offline_says_to_pass_data_dir(tmp_path):
    # an empty HF cache and offline mode: the hub copy cannot be reached
    result = run_cli("run", TASK, "--out", str(tmp_path / "run"), "--quiet",
                     env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
                     timeout=120)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "--data-dir" in result.stderr and "bentrevett/multi30k" in result.stderr


def test_metrics_bleu_chrf_and_lowercase():
    refs = ["A man runs in the park.", "Two dogs play on the beach.", "A woman sits in front of a house."]
    same = metrics(refs, refs)
    assert same["bleu"] == pytest.approx(100.0) and same["chrf"] == pytest.approx(100.0)
    assert same["bleu_lowercase"] == pytest.approx(100.0)
    lower = metrics([r.lower() for r in refs], refs)
    assert lower["bleu_lowercase"] == pytest.approx(100.0) and lower["bleu"] < 90.0
    wrong = metrics(["Something else entirely here ."] * 3, refs)
    assert wrong["bleu"] < 10.0 and wrong["chrf"] < same["chrf"]


def test_unknown_tokenizer_kind_is_config_error(cli, data_dir, tmp_path):
    result = cli("run", TASK, "--data-dir", str(data_dir / "multi30k"), "--out", str(tmp_path / "run"),
                 "--set", "data.tokenizer=words", "--quiet")
    assert result.exit_code == 2 and "config:" in result.stderr and "words" in result.stderr


def test_tiny_run_then_predict(cli, data_dir, tmp_path):
    out = tmp_path / "run"
    args = ["run", TASK, "--data-dir", str(data_dir / "multi30k"), "--out", str(out), "--quiet"]
    result = cli(*args, *(x for o in TINY for x in ("--set", o)))
    assert result.exit_code == 0, result.output
    saved = json.loads((out / "result.json").read_text(encoding="utf-8"))
    for split in ("val", "test"):
        assert {"bleu", "chrf", "bleu_lowercase"} <= set(saved["metrics"][split])
        assert 0.0 <= saved["metrics"][split]["bleu"] <= 100.0
    heatmap = out / "attention.png"
    assert heatmap.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "attention.png" in (out / "report.txt").read_text(encoding="utf-8")

    text = "Ein Mann läuft im Park.\n\nZwei Männer sitzen am Strand.\nEin brauner Hund wartet im Schnee.\n"
    for extra in ([], ["--beam", "1"], ["--beam", "3"]):
        result = cli("predict", str(out), *extra, input=text)
        assert result.exit_code == 0, result.output
        got = result.stdout.split("\n")
        assert len(got) == 5 and got[-1] == ""  # four lines, each ended by a newline
        assert got[1] == ""  # empty line in, empty line out
    as_args = cli("predict", str(out), "--beam", "1", *text.splitlines())
    from_stdin = cli("predict", str(out), "--beam", "1", input=text)
    assert as_args.exit_code == 0 and as_args.stdout == from_stdin.stdout


@pytest.mark.filterwarnings("ignore:train.bf16=true")
def test_predict_gives_each_sentence_what_eval_scored(data_copy, tmp_path):
    """In bf16, where rounding is coarse, each test sentence predicted alone equals what eval scored for it
    in a batch of 64 with sources of 5 to 13 words: no output depends on the sentences beside it."""
    import taskformer

    folder = data_copy("multi30k")
    de, en = lines(folder / "train.de.gz"), lines(folder / "train.en")
    longer = [f"{a} {b}" for a, b in zip(de[::2], de[1::2])]  # two sentences as one: longer sources
    for name, rows in (("test_2016_flickr.de", de + longer), ("test_2016_flickr.en", en + en[: len(longer)])):
        (folder / f"{name}.gz").unlink()
        (folder / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    out = tmp_path / "run"
    size = ["model.d_model=64", "model.n_heads=4", "model.enc_layers=2", "model.dec_layers=2", "model.d_ff=128",
            "train.bf16=true", "decode.batch_size=64"]
    result = run_cli("run", TASK, "--data-dir", str(folder), "--out", str(out), "--quiet",
                     *(x for o in TINY + size for x in ("--set", o)))
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (out / "outputs-test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert json.loads((out / "result.json").read_text())["info"]["precision"].startswith("bf16")
    model = taskformer.load(out)
    assert [model.predict([r["source"]])[0] for r in rows] == [r["output"] for r in rows]
