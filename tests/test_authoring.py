"""What plugin authors writing from the docs reached for: repetition control, ROUGE, several samples
per prompt and sampling from nothing, the run's config in ``taskformer_normalize``, renamed and retired
options, the message for a plugin of the earlier API, and ``--quiet`` on every command that shows progress.

The "looping" tasks are models whose head ignores what it reads and always prefers the same words
in the same order (``sox`` most, then ``red``, then ``win``; the end token least), as an
undertrained model loops: greedy and beam search write "sox sox sox ..." until their budget ends.
"""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

import pytest
import torch

import taskformer
from taskformer import Task, TaskData, hookimpl, option, symbols
from taskformer.testing import cli, plugin, run_task

WORDS = ["sox", "red", "win"]
ROWS = [("red sox", "red sox win"), ("win red", "sox win red")] * 6


class Preference(torch.nn.Module):
    """Logits that prefer ``sox`` > ``red`` > ``win`` > everything else, whatever the hidden states say
    (times zero: the body still gets its gradient of zero, so training runs)."""

    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.proj = torch.nn.Linear(d_model, vocab)
        bias = torch.full((vocab,), -10.0)
        bias[4:7] = torch.tensor([9.0, 6.0, 3.0])  # the ids of sox, red, win after the four specials
        self.register_buffer("bias", bias)

    def forward(self, hidden, src_mask):
        return self.proj(hidden) * 0 + self.bias


def looping(variant: str):
    class Looping:
        @hookimpl
        def taskformer_tasks(self):
            return [Task(f"loop-{variant}", "A model that loops", variant=variant,
                         defaults={"model": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 32,
                                             "max_len": 32},
                                   "decode": {"max_len_a": 0.0, "max_len_b": 12, "max_new_tokens": 12}})]

        @hookimpl
        def taskformer_data(self):
            rows = ROWS if variant == "encoder-decoder" else [("", " ".join(pair)) for pair in ROWS]
            return TaskData(tokenizer=symbols(WORDS), splits={"train": rows, "val": rows[:2], "test": rows[:2]})

        @hookimpl
        def taskformer_head(self, model_config):
            return Preference(model_config.d_model, model_config.vocab_size)
    return Looping()


@pytest.fixture(scope="module", params=["encoder-decoder", "decoder-only"])
def loop(request, tmp_path_factory):
    with plugin(looping(request.param), f"loop-{request.param}"):
        yield run_task(f"loop-{request.param}", tmp_path_factory.mktemp("runs") / "loop", steps=1)


def predicted(run_dir, *settings: str, text: str = "red sox") -> str:
    result = cli("predict", run_dir, text, *[arg for s in settings for arg in ("--set", f"decode.{s}")])
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


@contextlib.contextmanager
def served(run_dir):
    """``taskformer serve m=RUN_DIR`` in this process: a client of its HTTP API."""
    pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
    from fastapi.testclient import TestClient

    from taskformer.app.runner import load
    from taskformer.app.server import Limits, create_app
    with TestClient(create_app({"m": load(run_dir)}, Limits())) as client:
        yield client


def repeated_trigrams(text: str) -> list[tuple[str, ...]]:
    words = text.split()
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return [g for i, g in enumerate(grams) if g in grams[:i]]


@pytest.mark.parametrize("search", [("strategy=greedy",), ("beam=3",), ("temperature=0.5", "seed=2")])
def test_no_repeat_ngram_stops_a_loop_in_every_search(loop, search):
    looped = predicted(loop.dir, *search)
    assert looped.startswith("sox sox sox sox") and repeated_trigrams(looped)  # the model loops
    assert predicted(loop.dir, *search, "no_repeat_ngram=0") == looped  # 0 is off
    banned = predicted(loop.dir, *search, "no_repeat_ngram=3")
    assert banned.startswith("sox sox") and not repeated_trigrams(banned) and len(banned.split()) > 3
    assert not repeated_trigrams(loop.model.predict(["red sox"], no_repeat_ngram=3)[0])  # the API's too


def test_rouge_scores_a_summary_against_its_reference():
    perfect = taskformer.rouge_scores(["the cat sat on the mat"], ["The cat sat on the mat."])
    assert perfect == {"rouge1": 100.0, "rouge2": 100.0, "rougeL": 100.0}
    # 4 of 6 unigrams match both ways; bigrams "the cat" and "on the": 2 of 5; the longest common subsequence 4
    partial = taskformer.rouge_scores(["the cat lay on the rug"], ["the cat sat on the mat"], stem=False)
    assert partial == pytest.approx({"rouge1": 100 * 4 / 6, "rouge2": 100 * 2 / 5, "rougeL": 100 * 4 / 6})
    mean = taskformer.rouge_scores(["the cat sat on the mat", "a dog"], ["the cat sat on the mat", "no match"])
    assert mean["rouge1"] == pytest.approx(50.0)  # the mean over outputs
    german = taskformer.rouge_scores(["über den fluss"], ["über den berg"], words=str.split)
    assert german["rouge1"] == pytest.approx(100 * 2 / 3)  # the default tokenizer would drop "über"
    with pytest.raises(ValueError, match="2 hypotheses for 1 references"):
        taskformer.rouge_scores(["a", "b"], ["a"])


def test_quiet_is_taken_by_eval_and_predict_as_by_run(loop):
    loud = cli("eval", loop.dir, "--split", "val", "--json")
    quiet = cli("eval", loop.dir, "--split", "val", "--json", "--quiet")
    assert quiet.exit_code == 0 and quiet.stderr == "" and loud.stderr  # the progress lines are gone
    assert json.loads(quiet.stdout)["metrics"] == json.loads(loud.stdout)["metrics"]
    said = cli("predict", loop.dir, "red sox", "--quiet")
    assert said.exit_code == 0 and said.stdout.strip() == predicted(loop.dir)


@dataclass
class MarkOptions:
    mark: str = option("", "Written before every input by the normalizer.")


class Marking:
    """A task whose normalizer reads a data option: it must receive the run's config."""

    def __init__(self):
        self.seen: list[tuple[str, str]] = []

    @hookimpl
    def taskformer_tasks(self):
        return [Task("marking", "A normalizer that reads config.data", data_options=MarkOptions,
                     defaults={"model": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 32}})]

    @hookimpl
    def taskformer_data(self):
        return TaskData(tokenizer=symbols(WORDS), splits={"train": ROWS, "val": ROWS[:2], "test": ROWS[:2]})

    @hookimpl
    def taskformer_normalize(self, text, config):
        self.seen.append((text, config.data.mark))
        return config.data.mark + text


class EarlierNormalizer:
    """A normalizer written before the hook received the config: it names only ``text``."""

    def __init__(self):
        self.seen: list[str] = []

    @hookimpl(tryfirst=True)
    def taskformer_normalize(self, text):
        self.seen.append(text)
        return "red"


def test_the_normalizer_receives_the_runs_config(tmp_path):
    marking = Marking()
    with plugin(marking, "marking"):
        trained = run_task("marking", tmp_path / "run", steps=1, settings={"data.mark": "win "})
        marking.seen.clear()
        assert cli("predict", trained.dir, "red sox", "--quiet").exit_code == 0
        trained.model.predict(["sox red"], beam=2)
        assert marking.seen == [("red sox", "win "), ("sox red", "win ")]  # predict, then the API
        with served(trained.dir) as client:
            answer = client.post("/v1/models/m/predict", json={"inputs": ["win win"]})
        assert answer.status_code == 200, answer.text
        assert marking.seen[-1] == ("win win", "win ")
        earlier = EarlierNormalizer()
        with plugin(earlier, "earlier-normalizer"):  # called first, without the config it does not name
            marking.seen.clear()
            trained.model.predict(["sox"])
        assert earlier.seen == ["sox"] and marking.seen == []  # its answer was the first: the task's was not asked


class EarlierApi:
    """A plugin of the API before ``option()``: free-form data defaults, read as a dict."""

    def __init__(self, declared: bool):
        self.declared = declared

    @hookimpl
    def taskformer_tasks(self):
        if self.declared:  # the first message followed: the options declared, the hook not yet changed
            return [Task("earlier", "The earlier plugin API", data_options=MarkOptions)]
        return [Task("earlier", "The earlier plugin API", defaults={"data": {"mark": "x", "size": 3}})]

    @hookimpl
    def taskformer_data(self, config):
        mark = config["data"]["mark"]
        return TaskData(tokenizer=symbols(WORDS), splits={"train": [(mark, mark)] * 4, "val": ROWS, "test": ROWS})


@pytest.mark.parametrize("declared", [False, True])
def test_a_plugin_of_the_earlier_api_is_told_each_change(declared, tmp_path):
    with plugin(EarlierApi(declared), "earlier-api"):
        result = cli("run", "earlier", "--out", tmp_path / "run", "--quiet")
    assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    said = result.stderr
    if not declared:
        assert "data_options=Options" in said and "option(default, help" in said
        assert "config.data.mark, not config['data']['mark']" in said  # the second change, named too
    else:
        assert "plugin 'earlier-api' failed in taskformer_data" in said
        assert "read config.data.KEY, not config['data'][KEY]" in said


@dataclass
class FirstOptions:
    size: int = option(4, "Training rows.", at_least=1)
    lowercase: bool = option(False, "Lower-case the text.")


@dataclass
class LaterOptions:
    rows: int = option(4, "Training rows.", at_least=1, aliases=("size",))
    casing: str = option("keep", "What happens to letter case.", choices=("keep", "lower"))
    RETIRED = {"lowercase": "data.casing"}


class Evolving:
    """A plugin whose options change between releases: ``size`` became ``rows``, ``lowercase`` retired."""

    def __init__(self, options: type):
        self.options = options

    @hookimpl
    def taskformer_tasks(self):
        return [Task("evolving", "Options renamed and retired", data_options=self.options,
                     defaults={"model": {"d_model": 16, "n_heads": 2, "enc_layers": 1, "dec_layers": 1, "d_ff": 32}})]

    @hookimpl
    def taskformer_data(self, config):
        rows = getattr(config.data, "rows", None) or config.data.size
        return TaskData(tokenizer=symbols(WORDS), splits={"train": ROWS[:rows], "val": ROWS[:2], "test": ROWS[:2]})


def test_a_renamed_or_retired_option_keeps_earlier_runs_loading(tmp_path):
    with plugin(Evolving(FirstOptions), "evolving"):
        run_task("evolving", tmp_path / "run", steps=1, settings={"data.size": 6, "data.lowercase": True})
    assert json.loads((tmp_path / "run" / "config.json").read_text())["config"]["data"] == {"size": 6,
                                                                                            "lowercase": True}
    with plugin(Evolving(LaterOptions), "evolving"):
        loaded = cli("predict", tmp_path / "run", "red sox", "--quiet")
        assert loaded.exit_code == 0 and loaded.stdout.strip(), loaded.stderr
        notes = loaded.stderr.strip().splitlines()
        assert len(notes) == 2 and all(note.startswith("warning: ") for note in notes)
        assert "data.size is now called data.rows" in notes[0]
        assert "data.lowercase was retired (replaced by data.casing); its saved value is ignored" in notes[1]
        assert taskformer.load(tmp_path / "run").config.data == LaterOptions(rows=6)  # the value under its new name

        renamed = cli("config", "evolving", "--set", "data.size=3", "--json")
        assert renamed.exit_code == 0 and "data.size is now called data.rows" in renamed.stderr
        assert {row["key"]: row["value"] for row in json.loads(renamed.stdout)["options"]}["data.rows"] == 3
        refused = cli("config", "evolving", "--set", "data.lowercase=true")
        assert refused.exit_code == 2 and refused.stderr.strip() == (
            "Error: --set: data.lowercase was retired (replaced by data.casing); leave it out")


SAMPLING = ("--set", "decode.temperature=3", "--set", "decode.seed=5")


def test_several_samples_per_input_through_predict_the_api_and_serve(loop):
    drawn = cli("predict", loop.dir, "red sox", "--json", *SAMPLING, "--set", "decode.samples=3")
    assert drawn.exit_code == 0, drawn.stderr
    shown = json.loads(drawn.stdout)
    samples = shown if loop.model.task.variant == "encoder-decoder" else shown["continuation"]
    assert len(samples) == 3 and len(set(samples)) > 1 and all(samples)
    for k, sample in enumerate(samples):  # sample k is what seed 5 + k draws alone
        assert predicted(loop.dir, "temperature=3", f"seed={5 + k}") == sample
    plain = cli("predict", loop.dir, "red sox", *SAMPLING, "--set", "decode.samples=3")
    assert plain.stdout.splitlines() == samples  # one line per sample
    assert loop.model.predict(["red sox", "win"], temperature=3.0, seed=5, samples=3)[0] == samples

    refused = cli("predict", loop.dir, "red sox", "--set", "decode.samples=3")  # a search gives one output
    assert refused.exit_code == 2 and refused.stderr.startswith("Error: ") and len(refused.stderr.splitlines()) == 1
    assert "decode.samples=3" in refused.stderr and "decode.temperature above 0" in refused.stderr

    with served(loop.dir) as client:
        answer = client.post("/v1/models/m/predict", json={"inputs": ["red sox"], "temperature": 3.0, "seed": 5,
                                                           "samples": 3})
        assert answer.status_code == 200, answer.text
        assert answer.json()["results"][0]["output"] == samples
        greedy = client.post("/v1/models/m/predict", json={"inputs": ["red sox"], "samples": 3})
        assert greedy.status_code == 422 and greedy.json()["field"] == "samples"


def test_a_language_model_samples_from_an_empty_prompt(loop):
    language_model = loop.model.task.variant == "decoder-only"
    argument = predicted(loop.dir, text="")
    piped = cli("predict", loop.dir, input="\nred sox\n")
    assert piped.exit_code == 0, piped.stderr
    api = loop.model.predict([""])[0]
    if language_model:  # it starts from BOS: "sox" is what the model prefers after anything
        assert argument.startswith("sox sox") and piped.stdout.splitlines()[0] == argument == api
    else:  # an empty source still gives an empty output
        assert argument == "" and piped.stdout.splitlines()[0] == "" and api == ""
