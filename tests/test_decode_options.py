"""Decode options per request and per variant, the decode hook's purpose, and what misled an author:
through the CLI, the Python API and the server.

The tasks are ``tests/decode_options_plugin.py``'s (``echo``, an encoder-decoder with an option of its
own; ``vote``, a classifier), trained for a few updates; the language model is a tiny
``shakespeare-char`` run. Their scores are meaningless; what is checked is what each surface accepts,
refuses and answers.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import decode_options_plugin
import pytest
import torch
from test_language_model import train_lm
from tokenizers import Tokenizer

from taskformer import BOS, PAD, UNK, DataError, DecodeConfig, TaskformerError, encode_sources, read_tsv, search
from taskformer.plugins.manager import plugins
from taskformer.testing import cli, run_task

pytestmark = pytest.mark.slow  # trains, serves or starts processes: the full run's, not the quick tier's

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    """tests/test_language_model.py's tiny language model."""
    return train_lm(tmp_path_factory)


TINY = {"model.d_model": 32, "model.n_heads": 2, "model.enc_layers": 1, "model.dec_layers": 1, "model.d_ff": 64,
        "model.max_len": 16, "train.bf16": False}
# The server process registers the fixture plugins, as the in-process tests do.
LAUNCH = ("import sys, decode_options_plugin as p; from taskformer.plugins.manager import plugins; "
          "[plugins().pm.register(plugin, name=name) for name, plugin in p.PLUGINS.items()]; plugins().refresh(); "
          "from taskformer.app.cli import main; main(sys.argv[1:])")


@pytest.fixture(scope="module", autouse=True)
def fixture_plugins():
    for name, plugin in decode_options_plugin.PLUGINS.items():
        plugins().pm.register(plugin, name=name)
    plugins().refresh()
    yield
    for name in decode_options_plugin.PLUGINS:
        plugins().pm.unregister(name=name)
    plugins().refresh()


@pytest.fixture(scope="module")
def echo_data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("echo-data")
    (folder / "rows.tsv").write_text(decode_options_plugin.echo_rows(), encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def echo(tmp_path_factory, echo_data):
    return run_task("echo", tmp_path_factory.mktemp("runs") / "echo", data_dir=echo_data, steps=4, settings=TINY)


@pytest.fixture(scope="module")
def vote(tmp_path_factory):
    encoder = {k: v for k, v in TINY.items() if k != "model.dec_layers"}
    return run_task("vote", tmp_path_factory.mktemp("runs") / "vote", steps=3, settings=encoder)


@pytest.fixture(scope="module")
def server(echo, vote, lm):
    from test_serve import Server

    s = Server(f"echo={echo.dir}", f"vote={vote.dir}", f"lm={lm.dir}", launch=LAUNCH)
    yield s
    s.stop()


def predicted(run_dir, texts, *args) -> list:
    result = cli("predict", run_dir, *texts, "--json", *args)
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def refused(result, *says: str) -> str:
    """The one ``Error:`` line of a refused command, checked to say each of ``says``."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    assert all(s in errors[0] for s in says), errors[0]
    return errors[0]


# Decode options per request, and the purpose the decode hook is told.

def test_the_decode_hook_is_told_an_evaluation_from_a_users_request(echo, server):
    val = [json.loads(line) for line in (echo.dir / "outputs-val.jsonl").read_text().splitlines()]
    assert val and all(row["output"].startswith("evaluate: ") for row in val)
    assert all(out.startswith("predict: ") for out in predicted(echo.dir, ["a b c", "d e"]))
    assert all(out.startswith("predict: ") for out in echo.model.predict(["a b c", "d e"]))
    answered = server.post("/v1/models/echo/predict", {"inputs": ["a b c", "d e"]})
    assert [r["output"] for r in answered.json()["results"]] == predicted(echo.dir, ["a b c", "d e"])


def test_a_request_sets_the_decode_options_its_model_lists_the_tasks_own_included(echo, server):
    texts = ["a b c", "e d"]
    for body, args in (({"repeat": 3}, ["--set", "decode.repeat=3"]),
                       ({"beam": 2, "max_len_b": 1}, ["--beam", "2", "--set", "decode.max_len_b=1"]),
                       ({"temperature": 1.5, "seed": 3}, ["--set", "decode.temperature=1.5", "--set", "decode.seed=3"])):
        answered = server.post("/v1/models/echo/predict", {"inputs": texts, **body})
        assert answered.status_code == 200, answered.text
        expected = predicted(echo.dir, texts, *args)
        assert [r["output"] for r in answered.json()["results"]] == expected, body
        decode = {k: v for k, v in body.items() if k != "beam"}
        assert echo.model.predict(texts, beam=body.get("beam"), **decode) == expected
    tripled = server.post("/v1/models/echo/predict", {"inputs": ["a b"], "repeat": 3}).json()["results"][0]["output"]
    assert len(tripled.removeprefix("predict: ").split()) == 3 * len(
        server.post("/v1/models/echo/predict", {"inputs": ["a b"]}).json()["results"][0]["output"]
        .removeprefix("predict: ").split())

    listed = {m["name"]: m["options"] for m in server.client.get("/v1/models").json()["models"]}
    assert listed["echo"]["repeat"] == {"default": 1, "min": 1, "max": 3, "allowed": "[1, 3]",
                                        "help": "Write the output this many times."}
    assert {"beam", "temperature", "seed", "max_len_a", "return_attention"} <= set(listed["echo"])
    assert not {"batch_size", "workers", "quantize", "eval_strategy", "max_new_tokens"} & set(listed["echo"])
    assert {"temperature", "top_k", "top_p", "seed", "max_new_tokens"} <= set(listed["lm"])
    assert "max_len_a" not in listed["lm"]


@pytest.mark.parametrize("body, field, says", [
    ({"repeat": 0}, "repeat", "decode.repeat must be in [1, 3], got 0"),
    ({"repeat": "2"}, "repeat", "expects int"),
    ({"repeat": 1.5}, "repeat", "expects int"),
    ({"temperature": -1}, "temperature", "must not be negative"),
    ({"top_p": 0}, "top_p", "decode.top_p must be in (0, 1]"),
    ({"strategy": "sample"}, "strategy", "must be beam or greedy"),
    ({"beam": 17}, "beam", "at most 16"),
    ({"quantize": "int8"}, "quantize", "set for the whole process, not per request"),
    ({"max_new_tokens": 5}, "max_new_tokens", "not a decode option"),
    ({"nope": 1}, "nope", "it takes"),
])
def test_a_bad_or_unknown_decode_option_is_a_422_naming_it_and_the_server_stays_up(server, body, field, says):
    answer = server.post("/v1/models/echo/predict", {"inputs": ["a b"], **body})
    assert answer.status_code == 422 and answer.json()["field"] == field, answer.text
    assert says in answer.json()["error"], answer.json()
    assert server.post("/v1/models/echo/predict/stream", {"inputs": ["a b"], **body}).status_code == 422
    assert server.post("/v1/models/echo/predict", {"inputs": ["a b"]}).status_code == 200


def test_serve_set_changes_every_requests_default_and_refuses_a_bad_value_in_one_line(echo, vote):
    from test_serve import Server

    refused(cli("serve", echo.dir, "--set", "decode.repeat=9"), "echo:", "decode.repeat must be in [1, 3], got 9")
    refused(cli("serve", echo.dir, "--set", "train.lr=1"), "serve --set changes decoding only")
    refused(cli("serve", echo.dir, vote.dir, "--set", "decode.beam=2"), "vote:", "decode.beam", "encoder-only")
    served = Server(f"echo={echo.dir}", "--set", "decode.repeat=2", launch=LAUNCH)
    try:
        answered = served.post("/v1/models/echo/predict", {"inputs": ["a b c"]}).json()["results"]
        assert [r["output"] for r in answered] == predicted(echo.dir, ["a b c"], "--set", "decode.repeat=2")
        listed = served.client.get("/v1/models").json()["models"][0]["options"]
        assert listed["repeat"]["default"] == 2
    finally:
        served.stop()


# Only the options a variant uses are listed and accepted.

def test_a_classifier_lists_and_takes_no_search_option(vote, server):
    listed = {m["name"]: m["options"] for m in server.client.get("/v1/models").json()["models"]}
    assert listed["vote"] == {}
    for body in ({"beam": 4}, {"temperature": 0.5}, {"max_len_b": 3}):
        answer = server.post("/v1/models/vote/predict", {"inputs": ["a b a"], **body})
        assert answer.status_code == 422 and answer.json()["field"] == next(iter(body)), answer.text
    assert server.post("/v1/models/vote/predict", {"inputs": ["a b a"]}).status_code == 200

    refused(cli("predict", vote.dir, "a b a", "--beam", "3"), "beam", "encoder-only models do not use it")
    refused(cli("predict", vote.dir, "a b a", "--set", "decode.temperature=0.5"), "decode.temperature",
            "encoder-only models do not use it")
    with pytest.raises(TaskformerError, match="encoder-only models do not use it"):
        vote.model.predict(["a b a"], beam=3)
    with pytest.raises(TaskformerError, match="decode.top_k"):
        vote.model.predict(["a b a"], top_k=2)
    assert cli("predict", vote.dir, "a b a", "--set", "decode.batch_size=8").exit_code == 0  # it decodes in batches
    refused(cli("run", "vote", "--dry-run", "--set", "decode.beam=3"),
            "--set decode.beam: encoder-only models do not use it")


# The language model's page and stream.

def test_the_page_streams_a_language_models_text_and_the_stream_equals_a_request(server, lm):
    page = server.client.get("/").text
    assert "/predict/stream" in page and "getReader()" in page and "!model.kind.encoder" in page
    [described] = [m for m in server.client.get("/v1/models").json()["models"] if m["name"] == "lm"]
    assert described["kind"] == {"name": "decoder-only", "decoder": True, "per_word": False, "encoder": False}
    body = {"inputs": ["Citizen:", "All:"], "temperature": 0.9, "seed": 5}
    whole = server.post("/v1/models/lm/predict", body).json()["results"]
    expected = predicted(lm.dir, ["Citizen:", "All:"], "--set", "decode.temperature=0.9", "--set", "decode.seed=5")
    events = [json.loads(line.removeprefix("data: ")) for line in
              server.post("/v1/models/lm/predict/stream", body).text.splitlines() if line.startswith("data: ")]
    for i, result in enumerate(whole):
        pieces = [e["text"] for e in events if e["index"] == i and "text" in e]
        [final] = [e for e in events if e["index"] == i and "output" in e]
        assert "".join(pieces) == final["output"] == result["output"] and len(pieces) > 1
        assert result["output"] == expected[i]["continuation"]
        assert final["settings"] == result["settings"] == expected[i]["settings"]
        assert (result["settings"]["temperature"], result["settings"]["seed"]) == (0.9, 5)
    other = server.post("/v1/models/lm/predict", {**body, "seed": 6}).json()["results"]
    assert [r["output"] for r in other] != [r["output"] for r in whole]


# Every change to the outputs, counted in the page: a streamed continuation changes its output many times.
COUNT_CHANGES = """() => { window.changes = 0;
  new MutationObserver((seen) => { window.changes += seen.length; })
    .observe(document.getElementById("outputs"), { childList: true, subtree: true, characterData: true }); }"""


def test_the_page_in_headless_chromium_shows_a_continuation_as_it_grows(server, lm):
    from test_serve import chromium_page, playwright

    sync_api = playwright()
    [expected] = predicted(lm.dir, ["Citizen:"])
    with sync_api.sync_playwright() as p:
        chromium, page = chromium_page(p, server.url)
        try:
            page.goto(f"{server.url}/")
            page.select_option("#model", "lm")
            page.locator("#text").press_sequentially("Citizen:")
            page.evaluate(COUNT_CHANGES)
            page.click("#submit")
            sync_api.expect(page.locator("#status")).to_have_text("done", timeout=60_000)
            assert page.locator("#error").text_content() == ""
            assert page.locator("#outputs .output").all_text_contents() == [expected["continuation"]]
            assert page.evaluate("window.changes") > 3  # piece by piece, not the whole text at once
        finally:
            chromium.close()


# Search writes no special token but EOS.

def test_search_never_writes_a_special_token_but_eos_even_where_the_model_prefers_them(echo):
    net = echo.model.network
    tokenizer = Tokenizer.from_file(str(echo.dir / "tokenizer.json"))
    ids, _ = encode_sources(tokenizer, ["a b c d", "e d c b"], net.cfg.max_len)
    src = torch.tensor(ids)
    bias = net.head.proj.bias
    kept = bias.detach().clone()
    with torch.no_grad():  # a barely trained model that favours [PAD], [BOS] and [UNK] above every other token
        bias[[PAD, BOS, UNK]] += 100.0
    try:
        budget = torch.tensor([6, 6])
        for decode in (DecodeConfig(strategy="greedy"), DecodeConfig(strategy="beam", beam=3),
                       DecodeConfig(temperature=1.0, seed=1)):
            outputs = search(net, src, decode, max_len=budget, ignore_eos=True)
            assert [len(out) for out in outputs] == [6, 6], decode  # a [PAD] would have ended them at once
            assert not {PAD, BOS, UNK} & {t for out in outputs for t in out}, decode
    finally:
        with torch.no_grad():
            bias.copy_(kept)


# What misled an author.

def test_a_step_budget_cut_by_the_epochs_says_which_limit_ended_it(tmp_path, echo_data):
    ran = cli("run", "echo", "--data-dir", echo_data, "--out", tmp_path / "run", "--quiet", "--set", "train.epochs=2",
              "--set", "train.max_steps=2500", *(a for k, v in TINY.items() for a in ("--set", f"{k}={v}".lower())))
    assert ran.exit_code == 0, ran.output
    info = json.loads((tmp_path / "run" / "result.json").read_text())["info"]
    said = (f"stopped at {info['steps']:,} updates: train.epochs=2 ended it before train.max_steps=2500; "
            "set train.epochs=0 to train by steps")
    assert info["steps"] < 2500 and info["stopped"] == said
    squash = lambda text: re.sub(r"[^\w=.,]+", "", text)  # noqa: E731 -- the report's table wraps its cells
    assert squash("train.epochs=2 ended it before train.max_steps=2500") in squash(ran.stdout)  # the report

    still = {**TINY, "train.lr": 1e-30, "train.patience": 1, "train.eval_every": 1, "train.epochs": 0}  # no improvement
    stale = run_task("echo", tmp_path / "stale", data_dir=echo_data, steps=2500, settings=still)
    assert json.loads((stale.dir / "result.json").read_text())["info"]["stopped"] == (
        "stopped at 2 updates: train.patience=1 (no improvement) ended it before train.max_steps=2500; "
        "set train.patience=0 to train to train.max_steps")


def test_read_tsv_reads_any_number_of_columns(tmp_path):
    (tmp_path / "three.tsv").write_text("a man sleeps\ta person rests\tentailment\nit rains\tit is dry\tcontradiction\n")
    assert read_tsv(tmp_path / "three.tsv", columns=3) == [("a man sleeps", "a person rests", "entailment"),
                                                          ("it rains", "it is dry", "contradiction")]
    with pytest.raises(DataError, match=r"three.tsv:1: expected one TAB between source and target, found 2"):
        read_tsv(tmp_path / "three.tsv")
    (tmp_path / "bad.tsv").write_text("a\tb\tc\nd\t\tf\n")
    with pytest.raises(DataError, match=r"bad.tsv:2: empty column 2"):
        read_tsv(tmp_path / "bad.tsv", columns=3)
    with pytest.raises(DataError, match=r"bad.tsv:1: expected 3 TABs between 4 columns, found 2"):
        read_tsv(tmp_path / "bad.tsv", columns=4)


def test_eval_of_a_run_whose_data_moved_names_data_dir(echo, echo_data, tmp_path):
    moved = tmp_path / "moved"
    echo_data.rename(moved)
    try:
        refused(cli("eval", echo.dir, "--split", "val"), "rows.tsv", f"taskformer eval {echo.dir} --data-dir DIR")
        assert cli("eval", echo.dir, "--split", "val", "--data-dir", moved).exit_code == 0
    finally:
        moved.rename(echo_data)


def test_the_guide_lists_every_option_of_eval_and_predict():
    readme = (ROOT / "docs" / "guide.md").read_text(encoding="utf-8")
    for command in ("eval", "predict"):
        row = next(line for line in readme.splitlines() if line.startswith(f"| `taskformer {command} "))
        usage = row.split("|")[1]
        for option in re.findall(r"(?m)^\s+(--[a-z-]+)", cli(command, "--help").output):
            assert option in usage or option == "--help", (command, option)


def test_predict_sets_its_decoding_threads(echo):
    threads = torch.get_num_threads()
    try:
        assert predicted(echo.dir, ["a b"], "--threads", "1") == predicted(echo.dir, ["a b"])
        refused(cli("predict", echo.dir, "a b", "--threads", "100000"), "--threads 100000: this process may use")
    finally:
        torch.set_num_threads(threads)

