"""Done means (issue 31): a named-entity tagger written from the docs alone, with names from
``taskformer`` and ``taskformer.testing`` only, trains in seconds, prints word/tag pairs and span F1."""
import json
import random
from dataclasses import dataclass

import pytest

from taskformer import Task, TaskData, hookimpl, option, symbols
from taskformer.testing import cli, dry_run, plugin, run_task

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

FIRST, LAST = ["anna", "tom", "maria", "jan"], ["schmidt", "meyer", "rossi"]
CITIES, WORDS = ["berlin", "paris", "oslo"], ["met", "visited", "left", "saw", "the", "old", "bridge", "in"]
TAGS = ["O", "B-PER", "I-PER", "B-LOC"]  # the most common first


@dataclass
class Options:
    sentences: int = option(600, "Training sentences.", at_least=10)


class Entities:
    """The plugin: people (one or two words) and cities in short sentences, tagged BIO."""

    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="entities", description="Tag people and cities (BIO)", variant="tagging",
                     metric="span_f1", data_options=Options,
                     metric_groups={"entities": ["span_precision", "span_recall"],
                                    "words": ["token_accuracy", "exact_match"]},
                     defaults={"model": {"d_model": 32, "n_heads": 2, "enc_layers": 1, "d_ff": 64, "dropout": 0.0,
                                         "max_len": 32},
                               "train": {"max_tokens": 512, "lr": 3e-3, "warmup": 10, "label_smoothing": 0.0}})]

    @hookimpl
    def taskformer_data(self, config):
        rng = random.Random(config.train.seed)

        def sentence():
            person = [rng.choice(FIRST)] + ([rng.choice(LAST)] if rng.random() < 0.5 else [])
            words = person + [rng.choice(WORDS), rng.choice(WORDS), rng.choice(CITIES)]
            return " ".join(words), " ".join(["B-PER"] + ["I-PER"] * (len(person) - 1) + ["O", "O", "B-LOC"])

        rows = lambda n: [sentence() for _ in range(n)]  # noqa: E731
        return TaskData(tokenizer=symbols(FIRST + LAST + CITIES + WORDS), labels=TAGS,
                        splits={"train": rows(config.data.sentences), "val": rows(40), "test": rows(40)})

    @hookimpl
    def taskformer_normalize(self, text):
        return " ".join(word.strip(".,!?").lower() or word for word in text.split())  # one word per word


def test_a_bio_tagger_prints_word_tag_pairs_and_span_f1(tmp_path):
    with plugin(Entities(), "entities-plugin"):
        assert dry_run("entities", settings={"data.sentences": 50})["data"]["train"] == 50
        trained = run_task("entities", tmp_path / "run", steps=40)
        test = trained.metrics["test"]
        assert {"span_f1", "span_precision", "span_recall", "span_f1_PER", "span_f1_LOC"} <= set(test)
        assert all(0.0 <= test[name] <= 100.0 for name in ("span_f1", "span_precision", "span_recall"))

        # The report lists the metrics grouped as the plugin asked: the selecting one first.
        rows = [line.strip("│ ").split() for line in trained.report.splitlines()]
        order = [row[0] for row in rows if row and (row[0] in test or row[0] in ("entities", "words", "other"))]
        assert order == ["span_f1", "entities", "span_precision", "span_recall", "words", "token_accuracy",
                         "exact_match", "other", "loss", "span_f1_LOC", "span_f1_PER"], order
        assert "decode" in trained.report and "beam" not in trained.report  # a tagger has no search settings

        sentence = "Anna Schmidt visited Berlin."
        shown = cli("predict", trained.dir, input=sentence + "\n")
        assert shown.exit_code == 0, shown.output
        pairs = [line.split("\t") for line in shown.stdout.splitlines() if line]
        assert [word for word, _ in pairs] == sentence.split() and all(tag in TAGS for _, tag in pairs)
        as_json = cli("predict", trained.dir, "--json", sentence)
        assert json.loads(as_json.stdout) == pairs
        assert trained.model.predict([sentence]) == [[tuple(pair) for pair in pairs]]


class Domains:
    """A plugin whose data hook attaches a field to each example and whose metric and report hooks read it."""

    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="domains", description="copy digits, two domains", metric="exact_match",
                     defaults={"model": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 32,
                                         "max_len": 16}, "decode": {"strategy": "greedy"}})]

    @hookimpl
    def taskformer_data(self):
        rows = [(f"{i % 10} {i % 7}", f"{i % 10} {i % 7}", {"domain": "even" if i % 2 else "odd"}) for i in range(60)]
        rows.append(("1 2", "1 2"))  # a plain pair among them: its fields are {}
        return TaskData(tokenizer=symbols(list("0123456789")), splits={"train": rows, "val": rows, "test": rows})

    @hookimpl
    def taskformer_metrics(self, hypotheses, references, fields):
        domains = [f.get("domain", "none") for f in fields]
        right = [h == r for h, r in zip(hypotheses, references)]
        return {"exact_match": 100.0 * sum(right) / len(right),
                **{f"examples_{d}": float(domains.count(d)) for d in set(domains)}}

    @hookimpl
    def taskformer_report_sections(self, run):
        return [("Domains", " ".join(sorted({row.fields.get("domain", "none") for row in run.outputs["test"]})))]


def test_metric_and_report_hooks_receive_the_fields_the_data_hook_attached(tmp_path):
    with plugin(Domains(), "domains-plugin"):
        trained = run_task("domains", tmp_path / "run", steps=2)
        assert {k: v for k, v in trained.metrics["test"].items() if k.startswith("examples_")} == {
            "examples_even": 30.0, "examples_odd": 30.0, "examples_none": 1.0}
        assert "even none odd" in trained.report
        shown = cli("report", trained.dir)  # the fields are kept with the run's outputs
        assert shown.exit_code == 0 and "even none odd" in shown.stdout
