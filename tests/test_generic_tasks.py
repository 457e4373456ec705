"""A tiny run of each generic task on files made here, then predict and eval on the saved run, the data
moved away (a saved run predicts without it)."""
from __future__ import annotations

import json
import shutil

import pytest
from test_userdata import jsonl, news

STEPS = ["--set", "train.max_steps=2", "--set", "train.bf16=false", "--set", "model.d_model=32",
         "--set", "model.n_heads=2", "--set", "model.d_ff=64", "--quiet"]


def run(cli, tmp_path, task, data, *extra):
    out = tmp_path / f"run-{task}"
    result = cli("run", task, "--data", str(data), "--out", str(out), *STEPS, *extra)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["data_dir"] == str(data)  # the run records where its data came from
    assert (out / "outputs-test.jsonl").is_file()
    return out


def evaluated(cli, out, data) -> dict:
    result = cli("eval", str(out), "--data", str(data), "--split", "test", "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["metrics"]["test"]


def test_classify_names_its_labels_in_predict_and_eval(cli, tmp_path):
    data = jsonl(tmp_path / "news.jsonl", news(90))
    out = run(cli, tmp_path, "classify", data, "--set", "data.text=headline,body", "--set", "data.label=topic",
              "--set", "model.members=1", "--set", "data.vocab_size=120")
    assert {"accuracy", "macro_f1"} <= set(evaluated(cli, out, data))
    (tmp_path / "news.jsonl").unlink()  # predict needs only the run
    result = cli("predict", str(out), "goal match team", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.splitlines()[0])["label"] in {"sport", "tech", "money"}


def test_classify_pair_reads_two_text_columns(cli, tmp_path):
    rows = [{"premise": r["headline"], "hypothesis": r["body"], "label": int(r["topic"] == "sport")} for r in news(60)]
    out = run(cli, tmp_path, "classify-pair", jsonl(tmp_path / "p.jsonl", rows), "--set", "model.members=1",
              "--set", "data.vocab_size=120", "--set", "data.label_names=other,sport")
    result = cli("predict", str(out), "goal win\tmatch team")
    assert result.exit_code == 0, result.output
    assert result.stdout.split("\t")[0] in {"other", "sport"}


def multi30k_like(folder, n=40):
    folder.mkdir()
    words = [("Hund", "dog"), ("Katze", "cat"), ("Mann", "man"), ("Frau", "woman")]
    for split, count in (("train", n), ("val", 6), ("test_2016_flickr", 6)):
        pairs = [words[i % 4] for i in range(count)]
        (folder / f"{split}.de").write_text("".join(f"ein {de} läuft .\n" for de, _ in pairs))
        (folder / f"{split}.en").write_text("".join(f"a {en} runs .\n" for _, en in pairs))
    return folder


@pytest.mark.parametrize("reverse", [False, True])
def test_translate_a_folder_either_way(cli, tmp_path, reverse):
    data = multi30k_like(tmp_path / "m30k")
    extra = ["--set", "data.source=en"] if reverse else []
    out = run(cli, tmp_path, "translate", data, "--set", "model.enc_layers=1", "--set", "model.dec_layers=1",
              "--set", "data.vocab_size=120", "--set", "decode.beam=1", *extra)
    assert {"bleu", "chrf", "bleu_lowercase"} <= set(evaluated(cli, out, data))
    outputs = [json.loads(line) for line in (out / "outputs-test.jsonl").read_text().splitlines()]
    assert outputs[0]["source"] == ("a dog runs ." if reverse else "ein Hund läuft .")
    shutil.rmtree(data)
    result = cli("predict", str(out), "ein Hund")
    assert result.exit_code == 0, result.output


def test_lm_on_a_folder_of_text(cli, tmp_path):
    folder = tmp_path / "texts"
    folder.mkdir()
    for name in ("a.txt", "b.txt"):
        (folder / name).write_text("the cat sat on the mat.\nthe dog sat on the log.\n\n" * 20)
    out = run(cli, tmp_path, "lm", folder, "--set", "model.dec_layers=1", "--set", "model.max_len=16")
    assert {"loss", "perplexity", "bits_per_char"} <= set(evaluated(cli, out, folder))
    result = cli("predict", str(out), "the cat", "--set", "decode.max_new_tokens=5", "--set", "decode.seed=1")
    assert result.exit_code == 0 and result.stdout.strip(), result.output


def test_tag_a_conll_file(cli, tmp_path):
    sentences = "".join(f"Anna B-PER\nmet O\n{name} B-PER\nin O\nParis B-LOC\n\n"
                        for name in ("Tom", "Maria", "Olaf", "Ines") * 10)
    (tmp_path / "ner.conll").write_text(sentences)
    out = run(cli, tmp_path, "tag", tmp_path / "ner.conll", "--set", "model.enc_layers=1",
              "--set", "data.vocab_size=100")
    assert {"score", "span_f1", "token_accuracy"} <= set(evaluated(cli, out, tmp_path / "ner.conll"))
    result = cli("predict", str(out), "Anna met Tom")
    assert result.exit_code == 0, result.output
    tagged = [line.split("\t") for line in result.stdout.strip().splitlines()]
    assert [w for w, _ in tagged] == ["Anna", "met", "Tom"]
    assert {t for _, t in tagged} <= {"B-PER", "O", "B-LOC"}
