"""Language models: the decoder-only variant through the CLI, the Python API, a plugin and the server.

A tiny ``shakespeare-char`` run on a few paragraphs written in tmp_path trains in seconds; its
scores are meaningless, its behaviour is what is checked.
"""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
from dataclasses import dataclass

import pytest
import torch

import taskformer
from taskformer import Task, TaskData, characters, hookimpl
from taskformer.testing import cli, plugin, run_task

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n\nAll:\nResolved. resolved.\n\n") * 6
TINY = {"model.d_model": 32, "model.n_heads": 2, "model.dec_layers": 1, "model.d_ff": 64, "model.max_len": 16,
        "train.max_tokens": 64, "train.warmup": 5, "train.bf16": False, "decode.max_new_tokens": 24}


def train_lm(tmp_path_factory):
    """A tiny shakespeare-char run on TEXT (seconds of training): its run directory."""
    data = tmp_path_factory.mktemp("text")
    (data / "input.txt").write_text(TEXT, encoding="utf-8")
    return run_task("shakespeare-char", tmp_path_factory.mktemp("runs") / "lm", data_dir=data, steps=12,
                    settings=TINY)


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    return train_lm(tmp_path_factory)


def predicted(run_dir, *args, prompt="Citizen:"):
    result = cli("predict", run_dir, prompt, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_a_tiny_language_model_trains_reports_its_loss_and_continues_a_prompt(lm):
    saved = json.loads((lm.dir / "result.json").read_text())
    for split in ("val", "test"):
        metrics = saved["metrics"][split]
        assert set(metrics) >= {"loss", "perplexity", "bits_per_char", "bits_per_token"}
        assert metrics["perplexity"] == pytest.approx(math.exp(metrics["loss"]))
    evaluated = cli("eval", lm.dir, "--split", "val", "--json")
    assert evaluated.exit_code == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["metrics"]["val"]["loss"] == pytest.approx(saved["metrics"]["val"]["loss"])
    assert re.search(r"loss \d+\.\d+", cli("runs", lm.dir.parent).stdout)  # the main metric, with its value
    first = predicted(lm.dir)
    assert first["prompt"] == "Citizen:" and first["settings"]["temperature"] > 0
    assert 0 < len(first["continuation"]) <= 24 and first == predicted(lm.dir)  # the same seed, the same text
    assert predicted(lm.dir, "--set", "decode.seed=1")["continuation"] != first["continuation"]
    assert "Samples" in lm.report and "Test samples" not in lm.report  # continuations of val prompts instead


def test_top_k_of_one_samples_the_greedy_continuation(lm):
    greedy = predicted(lm.dir, "--beam", "1")
    assert greedy["settings"]["strategy"] == "greedy"
    sampled = predicted(lm.dir, "--set", "decode.top_k=1", "--set", "decode.temperature=1.5", "--set", "decode.seed=7")
    assert sampled["continuation"] == greedy["continuation"]
    assert lm.model.predict(["Citizen:"])[0] == predicted(lm.dir)["continuation"]  # the API samples alike
    assert lm.model.predict(["Citizen:"], top_k=1, temperature=1.5)[0] == greedy["continuation"]


def test_a_continuations_settings_name_the_search_that_the_search_line_states(lm):
    """``predict --json`` gives a language model's ``settings`` beside each continuation and the whole
    ``search`` on stderr: the two say the same, the settings in fewer words (a beam of one is greedy)."""
    def both(*args):
        result = cli("predict", lm.dir, "Citizen:", "--json", *args)
        assert result.exit_code == 0, result.stderr
        settings = {k: v for k, v in json.loads(result.stdout.splitlines()[0])["settings"].items() if k != "engine"}
        return settings, json.loads(result.stderr.split("search: ", 1)[1].splitlines()[0])

    settings, search = both("--beam", "1")
    assert settings == {"strategy": "greedy", "beam": 1, "max_new_tokens": 24}
    assert (search["strategy"], search["beam"], search["max_new_tokens"]) == ("greedy", 1, 24)
    settings, search = both("--beam", "3", "--set", "decode.no_repeat_ngram=2")
    assert settings == {"strategy": "beam", "beam": 3, "no_repeat_ngram": 2, "max_new_tokens": 24}
    assert (search["strategy"], search["beam"]) == ("beam", 3)
    settings, search = both("--set", "decode.temperature=0.7", "--set", "decode.top_k=3", "--set", "decode.seed=2",
                            "--set", "decode.samples=2")
    assert settings == {"temperature": 0.7, "top_k": 3, "top_p": 1.0, "seed": 2, "samples": 2, "max_new_tokens": 24}
    assert search == {"strategy": "sample", **{k: settings[k] for k in ("temperature", "top_k", "top_p", "seed")},
                      "max_new_tokens": 24, "quantize": "none"}


def test_a_token_never_sees_the_future(lm):
    net = lm.model.network.eval()
    ids = torch.randint(4, net.cfg.vocab_size, (1, 12))
    changed = ids.clone()
    changed[0, 7:] = torch.randint(4, net.cfg.vocab_size, (5,))
    with torch.no_grad():
        before, after = net(ids), net(changed)
    assert torch.equal(before[0, :7], after[0, :7])  # positions 0..6 read only tokens 0..6
    assert not torch.allclose(before[0, 7:], after[0, 7:])


@dataclass
class Options:
    mask_prompt: bool = taskformer.option(True, "Score the answer only.")


QA = [("What is two plus two? ", "Four."), ("Name a colour: ", "Blue."), ("Say hello: ", "Hello.")] * 8


class PromptPlugin:
    """A question-answer language model: the question is a prompt, read but not scored when masked."""

    @hookimpl
    def taskformer_tasks(self):
        return [Task(name="qa-lm", description="questions and answers", variant="decoder-only", metric="loss",
                     higher_is_better=False, data_options=Options)]

    @hookimpl
    def taskformer_data(self, config):
        rows = QA if config.data.mask_prompt else [("", q + a) for q, a in QA]
        return TaskData(tokenizer=characters([q + a for q, a in QA], whitespace=True),
                        splits={"train": rows, "val": rows[:3], "test": rows[:3]})

    @hookimpl
    def taskformer_metrics(self, logprobs):
        return {"scored_tokens": sum(map(len, logprobs))}


def test_a_masked_prompt_is_read_but_not_scored(tmp_path):
    with plugin(PromptPlugin(), "qa-lm"):
        masked = run_task("qa-lm", tmp_path / "masked", steps=3, settings=TINY).metrics["val"]
        whole = run_task("qa-lm", tmp_path / "whole", steps=3, settings={**TINY, "data.mask_prompt": False}).metrics["val"]
    answers = sum(len(a) + 1 for _, a in QA[:3])  # each answer's characters and its EOS
    assert masked["scored_tokens"] == answers
    assert whole["scored_tokens"] == sum(len(q + a) for q, a in QA[:3]) - 1  # one stream: all but its first
    assert masked["loss"] != whole["loss"]


def test_every_variant_reports_its_loss(tmp_path):
    trained = run_task("copy", tmp_path / "copy", steps=3, settings={"data.train_size": 50, "data.val_size": 8,
                                                                     "data.test_size": 8})
    saved = json.loads((tmp_path / "copy" / "result.json").read_text())
    assert all(math.isfinite(saved["metrics"][split]["loss"]) for split in ("val", "test"))
    assert "loss" in trained.report and "None" not in trained.report.split("Metrics")[1].split("\n\n")[0]


@pytest.mark.slow
def test_the_server_streams_a_continuation(lm):
    httpx = pytest.importorskip("httpx", reason="the serve tests need the test extra")
    server = subprocess.Popen([sys.executable, "-m", "taskformer", "serve", f"lm={lm.dir}", "--port", "0"],
                              stderr=subprocess.PIPE, text=True)
    try:
        url = re.search(r"http://[\d.]+:\d+", server.stderr.readline()).group(0)
        threading.Thread(target=server.stderr.read, daemon=True).start()
        with httpx.Client(base_url=url, timeout=60) as client:
            streamed = client.post("/v1/models/lm/predict/stream", json={"inputs": ["Citizen:"]}).text
    finally:
        server.terminate()
        server.wait(30)
    events = [json.loads(line.removeprefix("data: ")) for line in streamed.splitlines() if line.startswith("data: ")]
    expected = predicted(lm.dir)
    assert events[-1]["output"] == expected["continuation"] and events[-1]["settings"] == expected["settings"]
    pieces = [e["text"] for e in events[:-1]]
    assert len(pieces) > 1 and "".join(pieces) == expected["continuation"]  # token by token, as it was written


def test_the_engine_named_beside_a_continuation_is_the_one_that_wrote_it(lm):
    pytest.importorskip("ctranslate2", reason="the engine tests need the test extra (ctranslate2)")
    # a context of 16: the default 500 new tokens leave no room for a prompt on CTranslate2, so ours writes it
    settings = predicted(lm.dir, "--set", "decode.temperature=0")["settings"]
    assert settings["engine"] == "torch"
    evaluated = cli("eval", lm.dir, "--split", "val", "--json", "--set", "decode.temperature=0")
    assert evaluated.exit_code == 0, evaluated.stderr
    assert "leaves no room for a prompt" in json.loads(evaluated.stdout)["engine"]["reason"]
    assert predicted(lm.dir, "--set", "decode.temperature=0", "--set", "decode.max_new_tokens=6")["settings"]["engine"] \
        == "ctranslate2"


def test_ctranslate2_generates_the_greedy_continuations_of_taskformer(lm, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="the export tests need the test extra (ctranslate2)")
    from tokenizers import Tokenizer

    exported = cli("export", lm.dir, "--to", "ctranslate2", tmp_path / "ct2")
    assert exported.exit_code == 0, exported.stderr
    prompts = ["Citizen:", "All:\nSpeak", "You are", "Resolved"]  # a context of 16: the prompt and 6 more fit it
    ours = [predicted(lm.dir, "--beam", "1", "--set", "decode.max_new_tokens=6", prompt=p)["continuation"]
            for p in prompts]
    tokenizer = Tokenizer.from_file(str(tmp_path / "ct2" / "tokenizer.json"))
    generator = ctranslate2.Generator(str(tmp_path / "ct2"), device="cpu", compute_type="float32")
    results = generator.generate_batch([tokenizer.encode(p).tokens for p in prompts], max_length=6,
                                       sampling_topk=1, include_prompt_in_result=False, end_token="[EOS]")
    assert [tokenizer.decode(r.sequences_ids[0]) for r in results] == ours
    assert any(ours)


def test_a_test_split_that_is_the_val_text_is_decoded_once(tmp_path):
    """shakespeare-char has no test part: its test split is the val text, so the final evaluation
    decodes it once and gives test the same metrics and outputs."""
    (tmp_path / "input.txt").write_text(TEXT, encoding="utf-8")
    result = cli("run", "shakespeare-char", "--data-dir", tmp_path, "--out", tmp_path / "lm", "--set", "train.max_steps=3",
                 *(f"--set={key}={value}" for key, value in TINY.items()))
    assert result.exit_code == 0, result.stderr
    assert "decoding val" in result.stderr and "decoding test" not in result.stderr
    saved = json.loads((tmp_path / "lm" / "result.json").read_text())
    assert saved["metrics"]["test"] == saved["metrics"]["val"]
    assert (tmp_path / "lm" / "outputs-test.jsonl").read_text() == (tmp_path / "lm" / "outputs-val.jsonl").read_text()
