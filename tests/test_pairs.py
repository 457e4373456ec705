"""Tasks of sentence pairs (``Task(pairs=True)``) through every surface: training, ``predict`` on
``FIRST<TAB>SECOND`` lines, the Python API, the server's ``{"text", "text_pair"}`` inputs and its page.

The task is the one ``taskformer new-task pairdemo --variant encoder-only --pairs`` writes (docs/plugins.md's
section on pairs is that module), registered as its installed entry point would be.
"""
from __future__ import annotations

import importlib.util
import json
import shutil

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import taskformer
from taskformer import Task, TaskData, hookimpl, symbols
from taskformer.app.cli import main
from taskformer.app.rundir import model_digest
from taskformer.core.checkpoint import sha256
from taskformer.plugins.manager import plugins

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

PAIRS = [("3 1 4 1 5 9 2", "9 1"), ("3 1 4 1 5 9 2", "1 8"), ("0 0 0 0 0 0 0", "0 0")]
LINES = [f"{first}\t{second}" for first, second in PAIRS]
SMALL = ["--quiet", *(a for setting in ("data.train_size=300", "train.max_steps=30", "train.threads=1",
                                         "train.eval_every=0", "decode.workers=1", "train.bf16=false")
                      for a in ("--set", setting))]
LAUNCH = ("import sys, taskformer_pairdemo; from taskformer.plugins.manager import plugins; "
          "plugins().pm.register(taskformer_pairdemo, name='pairdemo'); plugins().refresh(); "
          "from taskformer.app.cli import main; main(sys.argv[1:])")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    """The scaffold's pair package, its module registered for this test module (the CLI in-process sees it)."""
    folder = tmp_path_factory.mktemp("pairdemo") / "pkg"
    written = CliRunner().invoke(main, ["new-task", "pairdemo", "--variant", "encoder-only", "--pairs",
                                        "--dir", str(folder)], catch_exceptions=False)
    assert written.exit_code == 0, written.output
    spec = importlib.util.spec_from_file_location("taskformer_pairdemo", folder / "taskformer_pairdemo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    plugins().pm.register(module, name="pairdemo")
    plugins().refresh()
    yield folder
    plugins().pm.unregister(name="pairdemo")
    plugins().refresh()


@pytest.fixture(scope="module")
def pair_run(package, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "pairdemo"
    result = CliRunner().invoke(main, ["run", "pairdemo", "--out", str(out), *SMALL], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return out


def printed(cli, run, lines: list[str], *args: str) -> list[str]:
    result = cli("predict", str(run), *args, input="\n".join(lines) + "\n")
    assert result.exit_code == 0, result.output
    return result.stdout.split("\n")[:-1]


def test_a_pair_task_trains_and_predicts_tab_separated_lines(pair_run, cli):
    saved = [json.loads(line) for line in (pair_run / "outputs-test.jsonl").read_text().splitlines()]
    assert saved and all(isinstance(row["source"], list) and len(row["source"]) == 2 for row in saved)  # both texts
    plain = printed(cli, pair_run, LINES[:1] + [""] + LINES[1:])
    assert plain[1] == ""  # a blank line stays blank, as for any task
    shown = plain[:1] + plain[2:]
    assert all(line.split("\t")[0] in ("contained", "missing") for line in shown)
    rows = [json.loads(line) for line in printed(cli, pair_run, LINES, "--json")]
    assert [(row["text"], row["text_pair"]) for row in rows] == PAIRS
    assert [f"{row['label']}\t{row['probability']:.4f}" for row in rows] == shown
    outputs = taskformer.load(pair_run).predict(PAIRS)
    assert [(o.label, o.probability) for o in outputs] == [(row["label"], row["probability"]) for row in rows]
    report = cli("report", str(pair_run))  # the saved outputs read back, pairs and all
    written = (pair_run / "report.txt").read_text()
    assert report.exit_code == 0 and "pairs=True" in written
    assert any(first in written and second in written for first, second in (row["source"] for row in saved))


def test_a_line_without_a_tab_is_refused_after_the_lines_before_it_are_answered(pair_run, cli):
    result = cli("predict", str(pair_run), input=f"{LINES[0]}\n3 1 4 1 5 9 2 and no second text\n{LINES[1]}\n")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert [line for line in result.stderr.splitlines() if line.startswith("Error")] == [
        "Error: stdin line 2: this task reads a pair of texts per line, separated by one TAB (FIRST<TAB>SECOND); "
        "the line has no TAB"]
    assert result.stdout.split("\n")[:-1] == printed(cli, pair_run, LINES[:1])
    argument = cli("predict", str(pair_run), LINES[0], "1\t2\t3")
    assert argument.exit_code == 2 and "TEXT argument 2" in argument.stderr and "2 TABs" in argument.stderr


def test_the_python_api_takes_tuples_and_refuses_a_single_text(pair_run):
    model = taskformer.load(pair_run)
    assert model.predict([list(PAIRS[0])]) == model.predict([PAIRS[0]])  # a list of two strings is a pair too
    with pytest.raises(taskformer.TaskformerError, match=r"texts\[1\] must be a pair \(first, second\)"):
        model.predict([PAIRS[0], "3 1 4 1 5 9 2"])


def test_the_model_reads_which_text_each_token_belongs_to(pair_run):
    model = taskformer.load(pair_run)
    before = [o.probability for o in model.predict(PAIRS)]
    with torch.no_grad():
        model.network.segments.weight[1] += 1.0  # the second text's segment embedding
    assert [o.probability for o in model.predict(PAIRS)] != before


def test_only_a_pair_model_has_segment_embeddings(pair_run, finished):
    with safe_open(pair_run / "model.safetensors", "pt") as f:
        assert "segments.weight" in f.keys()
    with safe_open(finished / "model.safetensors", "pt") as f:  # a copy run: its parameters as they were
        assert not any("segment" in name for name in f.keys())
    assert json.loads((finished / "config.json").read_text())["config"]["model"]["pairs"] is False


def test_a_run_saved_before_pairs_existed_still_loads(finished, tmp_path, cli):
    old = shutil.copytree(finished, tmp_path / "old")
    saved = json.loads((old / "config.json").read_text())
    del saved["config"]["model"]["pairs"]  # config.json as taskformer wrote it before model.pairs
    (old / "config.json").write_text(json.dumps(saved))
    weights = old / "model.safetensors"
    with safe_open(weights, "pt") as f:
        stamp = f.metadata()
    stamp["model_sha256"] = model_digest(saved["config"]["model"], saved.get("labels"))
    save_file(load_file(weights), weights, metadata=stamp)
    result = json.loads((old / "result.json").read_text())
    result["weights_sha256"] = sha256(weights)
    (old / "result.json").write_text(json.dumps(result))
    assert printed(cli, old, ["1 2 3"]) == printed(cli, finished, ["1 2 3"])


def test_pairs_are_declared_by_the_task_and_checked_in_its_data(register, cli, package):
    refused = cli("config", "pairdemo", "--set", "model.pairs=false")
    assert refused.exit_code == 2 and "model.pairs is set by the task" in refused.stderr
    with pytest.raises(ValueError, match="pairs=True is for encoder-only tasks"):
        Task(name="pairs-tagger", description="tags pairs", variant="tagging", pairs=True)
    wrong = cli("new-task", "pairs-tagger", "--variant", "tagging", "--pairs", "--dir", str(package.parent / "no"))
    assert wrong.exit_code == 2 and "--pairs is for encoder-only tasks" in wrong.stderr

    class OneText:  # declares pairs, gives single texts
        @hookimpl
        def taskformer_tasks(self):
            return [Task(name="pairs-one-text", description="pairs given as one text", variant="encoder-only",
                         pairs=True, metric="accuracy")]

        @hookimpl
        def taskformer_data(self):
            rows = [("0 1", "yes"), ("1 0", "no")] * 4
            return TaskData(symbols(["0", "1"]), {s: rows for s in ("train", "val", "test")}, labels=["yes", "no"])

    register(OneText(), "pairs-one-text")
    failed = cli("run", "pairs-one-text", "--dry-run")
    assert failed.exit_code == 2
    assert "train row 0 must be" in failed.stderr and "a tuple (first, second) of two strings" in failed.stderr


@pytest.fixture(scope="module")
def server(pair_run, finished, package):
    from test_serve import Server

    s = Server(f"pairdemo={pair_run}", f"copy={finished}", launch=LAUNCH, path=str(package))
    yield s
    s.stop()


def test_the_server_takes_text_and_text_pair_and_says_the_model_reads_pairs(server, pair_run, cli):
    body = {"inputs": [{"text": first, "text_pair": second} for first, second in PAIRS]}
    response = server.post("/v1/models/pairdemo/predict", body)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    expected = [json.loads(line) for line in printed(cli, pair_run, LINES, "--json")]
    assert [{"text": r["text"], "text_pair": r["text_pair"], **r["output"]} for r in results] == expected
    assert all(set(r["probabilities"]) == {"contained", "missing"} for r in results)
    described = {m["name"]: m for m in server.client.get("/v1/models").json()["models"]}
    assert described["pairdemo"]["pairs"] is True and described["copy"]["pairs"] is False
    assert described["pairdemo"]["examples"] == [list(e) for e in plugins().task("pairdemo").examples]


@pytest.mark.parametrize("name, inputs, field", [
    ("pairdemo", ["3 1 4 1 5 9 2"], "inputs[0].text_pair"),
    ("pairdemo", [{"text": "3 1 4", "text_pair": "1"}, {"text": "3 1 4"}], "inputs[1].text_pair"),
    ("pairdemo", [{"text": "3 1 4", "text_pair": "1", "label": "missing"}], "inputs[0].label"),
    ("pairdemo", [{"text_pair": "1"}], "inputs[0].text"),
    ("copy", ["1 2", {"text": "1 2", "text_pair": "3"}], "inputs[1]"),
])
def test_a_missing_or_unwanted_pair_is_refused_naming_the_field(server, name, inputs, field):
    for route in ("predict", "predict/stream"):
        response = server.post(f"/v1/models/{name}/{route}", {"inputs": inputs})
        assert response.status_code == 422, response.text
        assert response.json()["field"] == field and response.json()["error"]
    assert server.client.get("/health").json()["status"] == "ok"


def test_the_page_offers_two_text_boxes_for_a_pair_model_and_one_for_others(server, pair_run, cli):
    from test_serve import chromium_page, playwright

    sync_api = playwright()
    boxes = "#form textarea:visible"
    with sync_api.sync_playwright() as p:
        chromium, page = chromium_page(p, server.url)
        try:
            page.goto(f"{server.url}/")
            page.select_option("#model", "copy")
            sync_api.expect(page.locator(boxes)).to_have_count(1)
            page.select_option("#model", "pairdemo")
            sync_api.expect(page.locator(boxes)).to_have_count(2)
            page.locator("#examples .chip").first.click()  # an example fills both boxes
            first, second = plugins().task("pairdemo").examples[0]
            assert (page.locator("#text").input_value(), page.locator("#text_pair").input_value()) == (first, second)
            page.locator("#text").fill("")
            page.locator("#text").press_sequentially("\n".join(first for first, _ in PAIRS))  # Enter between lines
            page.locator("#text_pair").fill("")
            page.locator("#text_pair").press_sequentially("\n".join(second for _, second in PAIRS))
            page.click("#submit")
            sync_api.expect(page.locator("#status")).to_have_text("done", timeout=60_000)
            assert page.locator("#error").text_content() == ""
            assert page.locator("#outputs .source").all_text_contents() == [f"{a}\n{b}" for a, b in PAIRS]
            assert page.locator("#outputs .output").all_text_contents() == printed(cli, pair_run, LINES)
            page.select_option("#model", "copy")
            sync_api.expect(page.locator(boxes)).to_have_count(1)
        finally:
            chromium.close()
