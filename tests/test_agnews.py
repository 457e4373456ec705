"""The agnews task: CSV parsing, bad rows, a tiny end-to-end run, predict, metrics."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskformer import Label
from taskformer.app import hooks
from taskformer.app.cli import main
from taskformer.app.prepare import make_config
from taskformer.plugins.manager import plugins

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

LABELS = ["World", "Sports", "Business", "Sci/Tech"]
# A very small model that still learns the fixture's keyword-separable classes in a few seconds. fp32: in bf16 a
# batch of several lines and a line alone can differ in the 4th decimal of a probability.
TINY = ["--set", "train.bf16=false",
        "--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.enc_layers=1",
        "--set", "model.d_ff=64", "--set", "model.dropout=0.1", "--set", "train.epochs=12",
        "--set", "train.max_tokens=400", "--set", "train.lr=3e-3", "--set", "train.warmup=10",
        "--set", "data.vocab_size=300", "--set", "model.members=1", "--quiet"]


def task():
    return plugins().task("agnews")


def load(data_dir, *overrides, seed=None):
    cfg = make_config(task(), None, list(overrides), seed)
    return hooks.load_data(task(), cfg, data_dir)


def write(path, text: str, gz: bool = False):
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(text.encode())
    else:
        path.write_text(text, encoding="utf-8")


# -- parsing ---------------------------------------------------------------------------------------

def test_fixture_is_parsed_with_quotes_backslash_n_and_gzip(data_dir):
    data = load(data_dir / "ag_news", "data.augment=0")
    assert data.labels == LABELS
    train, val, test = data.splits["train"], data.splits["val"], data.splits["test"]
    assert len(train) + len(val) == 80 and len(val) == 4 and len(test) == 20  # 5% of 80 held out
    # test.csv is plain text; its first row has doubled quotes and a literal backslash-n
    assert test[0] == ('Rebels meet in Geneva The "so-called" rebels left the town, officials said.', "World")
    rows = dict(train + val)  # train.csv.gz: gzip, quotes, commas, entity without its "&"
    assert rows['Celtics "stun" rivals, 101-99 Fans cheered as the champion lifted the trophy at the stadium.'] == "Sports"
    assert rows["Stocks slip as rates climb Oil hit a record. Traders said supply was tight."] == "Business"
    assert rows['Intel map human genome Microsoft\'s update, called "SP2", ships today.'] == "Sci/Tech"
    assert all("\\n" not in s for s, _ in train + val + test)
    assert {label for _, label in train + val + test} == set(LABELS)


def test_validation_split_is_seeded_and_disjoint(data_dir):
    a, b = load(data_dir / "ag_news", seed=1), load(data_dir / "ag_news", seed=1)
    c = load(data_dir / "ag_news", "data.val_fraction=0.25", seed=1)
    assert a.splits["val"] == b.splits["val"]
    assert len(c.splits["val"]) == 20
    for d in (a, c):
        assert not set(d.splits["val"]) & set(d.splits["train"])
    vals = {tuple(load(data_dir / "ag_news", seed=s).splits["val"]) for s in range(4)}
    assert len(vals) > 1  # the seed decides which rows are held out


def test_tokenizer_sees_only_the_train_split(tmp_path):
    write(tmp_path / "train.csv", '"1","Ministers meet","Talks resume."\n"2","Team wins","Fans cheer."\n' * 5)
    write(tmp_path / "test.csv", '"4","Quokkaware released","Quokkaware Quokkaware ships."\n')
    for opts in (["data.tokenizer=bpe", "data.lowercase=false"], ["data.tokenizer=wordpiece"]):
        vocab = load(tmp_path, *opts).tokenizer.get_vocab()
        assert any("inisters" in piece for piece in vocab)
        assert not any("quokka" in piece.lower() for piece in vocab)


def test_lowercasing_lives_in_the_saved_tokenizer(data_dir):
    tok = load(data_dir / "ag_news").tokenizer  # lowercase is the default
    assert tok.encode("NASA LAUNCH Mars probe").tokens == tok.encode("nasa launch mars probe").tokens
    cased = load(data_dir / "ag_news", "data.lowercase=false").tokenizer
    assert cased.encode("NASA").tokens != cased.encode("nasa").tokens


def test_augment_adds_word_dropped_copies_of_train_rows_only(data_dir):
    plain = load(data_dir / "ag_news", "data.augment=0", seed=3)
    aug = load(data_dir / "ag_news", "data.augment=2", "data.word_drop=0.3", seed=3)
    assert aug.splits["val"] == plain.splits["val"] and aug.splits["test"] == plain.splits["test"]
    train, extra = aug.splits["train"][:76], aug.splits["train"][76:]
    assert train == plain.splits["train"] and len(extra) == 2 * 76
    for (text, label), (copy, copy_label) in zip(train * 2, extra):
        assert copy_label == label and set(copy.split()) <= set(text.split())
    assert sum(len(c.split()) for c, _ in extra) < 2 * sum(len(t.split()) for t, _ in train)


# -- bad input ----------------------------------------------------------------------------------------

GOOD = '"3","Stocks rise","Shares gained."\n'


@pytest.mark.parametrize("bad, line, words", [
    ('"1","Only a title"\n', 2, "expected 3 fields"),
    ('"5","Title","Description"\n', 2, "class index"),
    ('"0","Title","Description"\n', 2, "class index"),
    ('"World","Title","Description"\n', 2, "class index"),
    ('"2","Title","Description","extra"\n', 2, "got 4"),
])
@pytest.mark.parametrize("gz", [False, True])
def test_malformed_row_is_one_line_error_with_file_and_line(cli, tmp_path, bad, line, words, gz):
    name = "train.csv.gz" if gz else "train.csv"
    write(tmp_path / name, GOOD + bad + GOOD, gz=gz)
    write(tmp_path / "test.csv", GOOD)
    result = cli("run", "agnews", "--data-dir", str(tmp_path), "--out", str(tmp_path / "run"), "--quiet")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert f"{tmp_path / name}:{line}:" in lines[0] and words in lines[0]


def test_malformed_test_file_and_missing_file(cli, tmp_path):
    write(tmp_path / "train.csv", GOOD * 3)
    result = cli("run", "agnews", "--data-dir", str(tmp_path), "--quiet")
    assert result.exit_code == 2 and "test.csv" in result.stderr and "not found" in result.stderr
    write(tmp_path / "test.csv", GOOD * 3 + '"1","unterminated\n')
    result = cli("run", "agnews", "--data-dir", str(tmp_path), "--quiet")
    assert result.exit_code == 2 and f"{tmp_path / 'test.csv'}:4:" in result.stderr


def test_bad_options_are_config_errors(cli, data_dir):
    for opt in ("data.val_fraction=1.5", "data.val_fraction=0", "data.tokenizer=chars", "data.augment=-1",
                "data.word_drop=1"):
        result = cli("run", "agnews", "--data-dir", str(data_dir / "ag_news"), "--set", opt, "--quiet")
        assert result.exit_code == 2 and "config: data." in result.stderr


def test_hub_failure_tells_to_pass_data_dir(cli):
    # an unknown repository fails offline and online alike, so this can never download
    result = cli("run", "agnews", "--set", "data.hub=taskformer-tests/no-such-dataset", "--quiet")
    assert result.exit_code == 2
    assert "Hugging Face hub" in result.stderr and "--data-dir" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


# -- end to end ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run shared by the tests below (the ``data_dir`` fixture is per test, so the path is spelled out)."""
    out = tmp_path_factory.mktemp("agnews") / "run"
    fixture = Path(__file__).parent / "data" / "ag_news"
    result = CliRunner().invoke(main, ["run", "agnews", "--data-dir", str(fixture), "--out", str(out), *TINY],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out, result


def test_run_end_to_end_writes_metrics_report_and_confusion_image(trained):
    out, result = trained
    saved = json.loads((out / "result.json").read_text())
    for split in ("val", "test"):
        assert 0 <= saved["metrics"][split]["accuracy"] <= 100
        assert 0 <= saved["metrics"][split]["macro_f1"] <= 100
    assert saved["info"]["data"] == {"train": 2 * 76, "val": 4, "test": 20}  # one word-drop copy of train
    # every class is learnable from the fixture's keywords, World (class index 0) included
    assert saved["metrics"]["test"]["accuracy"] >= 90
    predicted = [json.loads(line)["output"]["label"] for line in (out / "outputs-test.jsonl").open()]
    assert set(predicted) == set(LABELS)
    assert (out / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.txt").read_text()
    assert "Confusion matrix (test)" in report and "Sci/Tech" in report
    wrong = round(20 * (1 - saved["metrics"]["test"]["accuracy"] / 100))
    assert f"({wrong} of 20 wrong)" in report


def test_predict_text_and_stdin_lines_in_order(trained, cli):
    out, _ = trained
    texts = ["Wall St. Bears Claw Back Into the Black",
             "NASA launch Mars probe The new processor doubles the speed of laptops and servers.",
             "Yankees",
             ""]
    single = []
    for text in texts[:3]:
        result = cli("predict", str(out), text)
        assert result.exit_code == 0
        lines = result.stdout.splitlines()
        assert len(lines) == 1
        label, prob = lines[0].split("\t")
        assert label in LABELS and 0.25 <= float(prob) <= 1.0  # the arg-max of 4 classes
        single.append(lines[0])
    result = cli("predict", str(out), input="\n".join(texts) + "\n")
    assert result.exit_code == 0
    assert result.stdout.splitlines() == single + [""]  # one line per input line, blank stays blank


def test_eval_reloads_the_run(trained, cli, tmp_path):
    out, _ = trained
    copy = tmp_path / "moved"
    shutil.copytree(out, copy)
    result = cli("eval", str(copy), "--split", "test")
    saved = json.loads((out / "result.json").read_text())
    assert result.exit_code == 0
    assert f"{saved['metrics']['test']['accuracy']:.4g}" in result.stdout


# -- metrics ------------------------------------------------------------------------------------------

def score(hyps, refs):
    return hooks.score(task(), [("", r) for r in refs], hyps)


def test_metrics_on_hand_made_outputs():
    refs = ["World", "World", "Sports", "Business"]
    hyps = [Label("World", 0.9), Label("Sports", 0.6), Label("Sports", 0.8), Label("Business", 0.7)]
    m = score(hyps, refs)
    assert m["accuracy"] == pytest.approx(75.0)
    # F1: World 2/3 (1 right of 1 predicted, 2 true), Sports 2/3, Business 1
    assert m["macro_f1"] == pytest.approx(100 * (2 / 3 + 2 / 3 + 1) / 3)
    perfect = score([Label(r, 0.5) for r in refs], refs)
    assert perfect == {"accuracy": 100.0, "macro_f1": 100.0}
    assert score([Label("Sci/Tech", 0.99)] * 4, refs) == {"accuracy": 0.0, "macro_f1": 0.0}


def test_metrics_of_another_task_never_reach_agnews():
    # agnews's metrics hook has no guard: were it called for copy's string outputs, it would fail
    assert hooks.score(plugins().task("copy"), [("World", "World")], ["World"]) == \
        {"exact_match": 100.0, "token_accuracy": 100.0}


def test_predict_cleans_its_input_like_the_data_files(trained, cli):
    out, _ = trained
    raw = cli("predict", str(out), "Valve #39;s game \\n ships  today")  # as the release writes them
    clean = cli("predict", str(out), "Valve's game ships today")
    assert raw.exit_code == clean.exit_code == 0
    assert raw.stdout == clean.stdout


def test_report_reads_runs_that_saved_predictions_as_text(trained, cli, tmp_path):
    out, _ = trained
    old = shutil.copytree(out, tmp_path / "old")
    expected = (out / "report.txt").read_text()
    for path in old.glob("outputs-*.jsonl"):  # the form runs wrote before predictions were Label values
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        path.write_text("".join(json.dumps({**r, "output": f"{r['output']['label']}\t{r['output']['probability']:.4f}"})
                                + "\n" for r in rows))
    result = cli("report", str(old))
    assert result.exit_code == 0, result.output
    section = lambda text: text[text.index("Confusion matrix (test)"):]  # noqa: E731
    assert section((old / "report.txt").read_text()) == section(expected)
