"""Your own data through the generic tasks: every format, split rule, column rule and bad-row case,
through ``taskformer run TASK --data PATH --dry-run`` (what it would train on) and the data hook."""
from __future__ import annotations

import gzip
import json

import pytest

from taskformer.app import hooks
from taskformer.app.prepare import make_config
from taskformer.core.data import rows
from taskformer.plugins.manager import plugins

TOPICS = {"sport": "goal match team win", "tech": "chip software laptop code", "money": "stock bank market price"}
TINY = ["--set", "model.d_model=32", "--set", "model.n_heads=2", "--set", "model.d_ff=64", "--set", "model.members=1",
        "--set", "data.vocab_size=120", "--quiet"]


def news(n: int = 60) -> list[dict]:
    """Rows whose topic follows from their words (so a tiny model can learn them), in topic order."""
    out = []
    for i in range(n):
        topic = list(TOPICS)[i * len(TOPICS) // n]
        words = TOPICS[topic].split()
        out.append({"headline": " ".join(words[(i + k) % 4] for k in range(3)),
                    "body": " ".join(words[(i * 3 + k) % 4] for k in range(5)), "topic": topic})
    return out


def jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def csv_text(rows, header=True) -> str:
    lines = ["text,label"] if header else []
    return "\n".join(lines + [f'"{r["headline"]} {r["body"]}",{r["topic"]}' for r in rows]) + "\n"


def dry(cli, task, data, *sets):
    result = cli("run", task, "--data", str(data), "--dry-run", *TINY, *(a for s in sets for a in ("--set", s)))
    assert result.exit_code == 0, result.output
    return result.stdout


def sizes(out: str) -> dict[str, int]:
    """The split sizes a dry run states (train before augmentation: the notes' count)."""
    line = next(x for x in out.splitlines() if x.startswith("data notes: splits: "))
    return {s: int(n.replace(",", "")) for s, n in (p.split() for p in line[len("data notes: splits: "):].split(" (")[0]
                                                       .split(", "))}


def refused(result, *says: str) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert all(s in errors[0] for s in says), errors[0]
    return errors[0]


def load(task: str, data, *sets, seed=None):
    """The task's data as its hook gives it, with train's rows (which may be a lazy ``datasets.Dataset``) as tuples."""
    chosen = plugins().task(task)
    data = hooks.load_data(chosen, make_config(chosen, None, list(sets), seed), data)
    data.splits["train"] = rows(data.splits["train"])
    return data


# -- formats ---------------------------------------------------------------------------------------------

def test_jsonl_with_chosen_text_columns_and_label(cli, tmp_path):
    out = dry(cli, "classify", jsonl(tmp_path / "news.jsonl", news()), "data.text=headline,body", "data.label=topic")
    assert sizes(out) == {"train": 54, "val": 3, "test": 3}
    assert "3 labels" in out and "one file" in out
    data = load("classify", tmp_path / "news.jsonl", "data.text=headline,body", "data.label=topic", "data.augment=0")
    assert data.splits["test"][0][0].count(" ") == 7  # headline (3 words) and body (5) joined


@pytest.mark.parametrize("name", ["data.csv", "data.csv.gz", "data.json", "data.parquet", "data.tsv"])
def test_table_formats_and_gzip(cli, tmp_path, name):
    rows = [{"text": f"{r['headline']} {r['body']}", "label": r["topic"]} for r in news()]
    path = tmp_path / name
    if name.startswith("data.csv"):
        text = csv_text(news())
        path.write_bytes(gzip.compress(text.encode()) if name.endswith(".gz") else text.encode())
    elif name == "data.json":
        path.write_text(json.dumps(rows))
    elif name == "data.tsv":
        path.write_text("text\tlabel\n" + "".join(f"{r['text']}\t{r['label']}\n" for r in rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq
        pq.write_table(pa.Table.from_pylist(rows), path)
    out = dry(cli, "classify", path)
    assert sizes(out) == {"train": 54, "val": 3, "test": 3} and "3 labels" in out


def test_headerless_csv_needs_its_columns_named(cli, tmp_path):
    path = tmp_path / "ag.csv"
    path.write_text("".join(f'"{i % 2 + 1}","{r["headline"]}","{r["body"]}"\n' for i, r in enumerate(news())))
    refused(cli("run", "classify", "--data", str(path), "--dry-run"), "no text column", "data.columns=a,b,c")
    out = dry(cli, "classify", path, "data.columns=label,title,description", "data.text=title,description",
              "data.label_names=World,Sports")
    assert "2 labels" in out
    data = load("classify", path, "data.columns=label,title,description", "data.text=title,description",
                "data.label_names=World,Sports")
    assert data.labels == ["World", "Sports"]  # the i-th name for the i-th smallest number


def test_numbers_as_labels_are_named_by_their_digits(tmp_path):
    rows = [{"text": r["headline"], "label": list(TOPICS).index(r["topic"])} for r in news()]
    assert load("classify", jsonl(tmp_path / "d.jsonl", rows)).labels == ["0", "1", "2"]


def test_line_aligned_files_read_languages_from_suffixes_and_splits_from_names(cli, tmp_path):
    for split, n in (("train", 30), ("val", 4), ("test_2016_flickr", 5)):
        (tmp_path / f"{split}.de").write_text("".join(f"ein Hund {i}\n" for i in range(n)))
        with gzip.open(tmp_path / f"{split}.en.gz", "wt") as f:
            f.write("".join(f"a dog {i}\n" for i in range(n)))
    (tmp_path / "README.md").write_text("not data")
    out = dry(cli, "translate", tmp_path)
    assert sizes(out) == {"train": 30, "val": 4, "test": 5} and "(file names)" in out
    assert "direction: de -> en" in out
    reverse = load("translate", tmp_path, "data.source=en")
    assert reverse.splits["train"][0] == ("a dog 0", "ein Hund 0")


def test_tsv_with_src_tgt_header_and_hf_translation_layout(cli, tmp_path):
    (tmp_path / "pairs.tsv").write_text("src\ttgt\n" + "".join(f'a "dog" {i}\tein Hund {i}\n' for i in range(40)))
    assert "direction: src -> tgt" in dry(cli, "translate", tmp_path / "pairs.tsv")
    assert load("translate", tmp_path / "pairs.tsv").splits["train"][0][0].startswith('a "dog"')  # quotes as text
    rows = [{"translation": {"fr": f"un chien {i}", "en": f"a dog {i}"}} for i in range(40)]
    out = dry(cli, "translate", jsonl(tmp_path / "hf.jsonl", rows), "data.source=en")
    assert "direction: en -> fr" in out


def test_two_languages_without_english_need_a_direction(cli, tmp_path):
    rows = [{"fr": f"un chien {i}", "de": f"ein Hund {i}"} for i in range(40)]
    refused(cli("run", "translate", "--data", jsonl(tmp_path / "p.jsonl", rows), "--dry-run"),
            "which columns are source and target", "fr, de", "data.source")
    assert "direction: fr -> de" in dry(cli, "translate", tmp_path / "p.jsonl", "data.source=fr")


def test_conll_file_and_the_tag_column_of_a_table(cli, tmp_path):
    sentence = "-DOCSTART- -X- O O\n\n" + "".join(
        f"Anna NNP B-PER\nlives VBZ O\nin IN O\nParis{i} NNP B-LOC\n\n" for i in range(40))
    (tmp_path / "ner.conll").write_text(sentence)
    out = dry(cli, "tag", tmp_path / "ner.conll")
    assert sizes(out) == {"train": 36, "val": 2, "test": 2}
    data = load("tag", tmp_path / "ner.conll")
    assert data.labels[0] == "O" and data.splits["train"][0][1] == "B-PER O O B-LOC"
    rows = [{"tokens": ["Anna", "lives", "in", "Paris"], "tags": ["B-PER", "O", "O", "B-LOC"]}] * 30
    assert sizes(dry(cli, "tag", jsonl(tmp_path / "t.jsonl", rows))) == {"train": 26, "val": 2, "test": 2}


# -- splits ----------------------------------------------------------------------------------------------

def test_shuffled_split_follows_split_seed_not_the_training_seed(tmp_path):
    rows = [{"text": f"{r['headline']} number {i}", "label": r["topic"]} for i, r in enumerate(news(100))]
    path = jsonl(tmp_path / "news.jsonl", rows)
    a, b = (load("classify", path, "data.augment=0", seed=s) for s in (1, 2))
    assert a.splits["test"] == b.splits["test"] and a.splits["val"] == b.splits["val"]
    c = load("classify", path, "data.augment=0", "data.split_seed=7")
    assert c.splits["test"] != a.splits["test"]
    assert {r[1] for r in a.splits["test"] + a.splits["val"]} != {"sport"}  # not the first rows (sorted data)
    held = set(a.splits["test"]) | set(a.splits["val"])
    assert len(held) == 10 and not held & set(a.splits["train"]) and len(a.splits["train"]) == 90


def test_split_column_and_split_files(cli, tmp_path):
    rows = [{**r, "split": ["train", "train", "dev", "test"][i % 4]} for i, r in enumerate(news())]
    out = dry(cli, "classify", jsonl(tmp_path / "s.jsonl", rows), "data.text=headline", "data.label=topic")
    assert sizes(out) == {"train": 30, "val": 15, "test": 15} and "the split column" in out
    folder = tmp_path / "files"
    folder.mkdir()
    all_rows = news(90)
    (folder / "train.csv").write_text(csv_text(all_rows[::3] + all_rows[1::3]))
    (folder / "test.csv").write_text(csv_text(all_rows[2::3]))
    out = dry(cli, "classify", folder)
    assert sizes(out) == {"train": 57, "val": 3, "test": 30}  # val: 5% of train, drawn by the shuffle


def test_running_text_keeps_its_order_and_many_files_are_held_out_whole(cli, tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "book.txt").write_text("".join(f"line {i:03d}\n" for i in range(200)))
    data = load("lm", tmp_path / "one")
    train, val, test = ("".join(t for _, t in data.splits[s]) for s in ("train", "val", "test"))
    assert train.startswith("line 000") and train.endswith("line 179\n")
    assert val.startswith("line 180") and test.startswith("line 190") and test.endswith("line 199\n")
    many = tmp_path / "many"
    many.mkdir()
    for i in range(20):
        (many / f"doc{i:02d}.txt").write_text(f"document {i}\n" * 5)
    out = dry(cli, "lm", many)
    assert "whole files held out" in out and sizes(out) == {"train": 18, "val": 1, "test": 1}



def test_large_data_is_handed_over_lazily_and_streaming_loses_no_text(tmp_path):
    """translate and lm give the core their train split as a datasets.Dataset (read a batch at a
    time, never held as Python rows), and running text read a line at a time joins back to the file."""
    import datasets

    text = "".join(f"Ça va {i}, très bien.\n" + ("\n" if i % 3 == 0 else "") + ("\n\n" if i % 7 == 0 else "")
                   for i in range(300))
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    chosen = plugins().task("lm")
    data = hooks.load_data(chosen, make_config(chosen, None, [], None), tmp_path / "book.txt")
    assert isinstance(data.splits["train"], datasets.Dataset)
    assert "".join(t for s in ("train", "val", "test") for _, t in rows(data.splits[s])) == text
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    (pairs / "train.en").write_text("".join(f"a dog {i}\n" for i in range(30)))
    (pairs / "train.de").write_text("".join(f"ein Hund {i}\n" for i in range(30)))
    chosen = plugins().task("translate")
    data = hooks.load_data(chosen, make_config(chosen, None, [], None), pairs)
    assert isinstance(data.splits["train"], datasets.Dataset)
    assert sorted(rows(data.splits["train"]))[:2] == [("ein Hund 0", "a dog 0"), ("ein Hund 1", "a dog 1")]

# -- columns ---------------------------------------------------------------------------------------------

def test_unknown_and_ambiguous_columns_are_refused_listing_the_columns(cli, tmp_path):
    path = jsonl(tmp_path / "news.jsonl", news())
    refused(cli("run", "classify", "--data", path, "--dry-run", "--set", "data.text=title"),
            "no column 'title'", "columns found: headline, body, topic")
    refused(cli("run", "classify", "--data", path, "--dry-run"), "no text column", "headline, body, topic")
    both = [{"text": r["headline"], "sentence": r["body"], "label": r["topic"]} for r in news()]
    refused(cli("run", "classify", "--data", jsonl(tmp_path / "both.jsonl", both), "--dry-run"),
            "ambiguous text column", "text and sentence", "data.text=NAME")


# -- bad rows --------------------------------------------------------------------------------------------

def test_missing_and_empty_fields_are_left_out_and_named(cli, tmp_path):
    rows = news()
    rows[5] = {"headline": rows[5]["headline"], "body": "x"}  # no topic
    rows[9] = {**rows[9], "headline": " "}
    result = cli("run", "classify", "--data", jsonl(tmp_path / "n.jsonl", rows), "--dry-run", *TINY,
                 "--set", "data.text=headline", "--set", "data.label=topic")
    assert result.exit_code == 0, result.output
    assert "missing topic" in result.stderr and "n.jsonl:6" in result.stderr
    assert "empty headline" in result.stderr and "n.jsonl:10" in result.stderr
    assert "left out (missing topic): 1: n.jsonl:6" in result.stdout  # the data notes keep them


def test_a_label_seen_only_in_test_is_left_out_and_named(cli, tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    rows = news(60)
    (folder / "train.csv").write_text(csv_text(rows))
    (folder / "test.csv").write_text(csv_text(rows[:3]) + '"a brand new thing",weather\n')
    out = dry(cli, "classify", folder)
    assert "test rows left out (a label train never has): 1: test.csv row 4 (weather)" in out


def test_a_non_utf8_line_is_refused_with_file_and_line(cli, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_bytes(csv_text(news()).encode() + b'"caf\xe9 latte",money\n')
    refused(cli("run", "classify", "--data", str(path), "--dry-run"), "bad.csv:62", "not valid UTF-8")
    (tmp_path / "train.de").write_bytes(b"gut\n\xff\n")
    (tmp_path / "train.en").write_text("good\nbad\n")
    refused(cli("run", "translate", "--data", str(tmp_path / "train.de"), "--dry-run"), "train.de")


def test_a_conll_line_without_a_tag_leaves_its_sentence_out(cli, tmp_path):
    body = "".join("Anna B-PER\nsleeps O\n\n" for _ in range(30)) + "Tom\nsleeps O\n"
    (tmp_path / "x.conll").write_text(body)
    out = dry(cli, "tag", tmp_path / "x.conll")
    assert "sentences left out (a line with no tag): 1: x.conll:91" in out
    assert sum(sizes(out).values()) == 30


def test_bad_rows_beyond_the_first_batch_are_counted_and_named_by_their_own_line(cli, tmp_path):
    """Train streams through a batch at a time (10,000 rows): each bad row keeps its own line, and
    the count covers every batch."""
    good = {"tokens": "Anna sleeps", "tags": "B-PER O"}
    rows = [good] * 10_005
    for line in (2, 10_002, 10_003, 10_005):
        rows[line - 1] = {"tokens": "Anna sleeps", "tags": "B-PER"}
    folder = tmp_path / "d"
    folder.mkdir()
    jsonl(folder / "train.jsonl", rows)
    jsonl(folder / "val.jsonl", [good])
    jsonl(folder / "test.jsonl", [good, {"tokens": "Tom", "tags": "B-ORG"}])
    out = dry(cli, "tag", folder)
    assert ("train rows left out (words and tags differ in count): 4: train.jsonl:2 (2 words, 1 tags), "
            "train.jsonl:10002 (2 words, 1 tags), train.jsonl:10003 (2 words, 1 tags) and 1 more") in out
    assert "test rows left out (a tag train never has): 1: test.jsonl:2 (B-ORG)" in out


def test_a_split_left_empty_is_refused(cli, tmp_path):
    refused(cli("run", "classify", "--data", jsonl(tmp_path / "one.jsonl", news(1)), "--dry-run",
                "--set", "data.text=headline", "--set", "data.label=topic"), "split would be empty")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "train.csv").write_text(csv_text(news()))
    (tmp_path / "d" / "val.csv").write_text("text,label\n")
    refused(cli("run", "classify", "--data", str(tmp_path / "d"), "--dry-run"), "val")


def test_no_data_and_unknown_formats_are_refused(cli, tmp_path):
    refused(cli("run", "classify", "--dry-run"), "--data PATH")
    refused(cli("run", "classify", "--data", str(tmp_path / "nothing.csv"), "--dry-run"), "no such file")
    (tmp_path / "x.xlsx").write_text("?")
    refused(cli("run", "classify", "--data", str(tmp_path / "x.xlsx"), "--dry-run"), "x.xlsx", "not a data format")
