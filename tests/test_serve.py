"""``taskformer serve``: the real server in a subprocess on 127.0.0.1, real HTTP requests, real runs.

Every result is compared with what ``taskformer predict`` prints for the same run and options.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

httpx = pytest.importorskip("httpx", reason="the serve tests need the test extra (httpx, fastapi, uvicorn)")
pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")

import tagging_plugin  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from taskformer.app.cli import main  # noqa: E402
from taskformer.plugins.manager import plugins  # noqa: E402

HERE = Path(__file__).parent
# The test tagging plugin is not installed: the server process registers it as the CLI tests do.
LAUNCH = ("import sys, tagging_plugin; from taskformer.plugins.manager import plugins; "
          "plugins().pm.register(tagging_plugin, name='truecase-fixture'); plugins().refresh(); "
          "from taskformer.app.cli import main; main(sys.argv[1:])")
COPY_INPUTS = ["1 4 7 2 9 3 5 8 2 6", "5 5 1", "", "9 8 7 6 5 4 3 2", "3", "2 2 2 2 2 2 2 2 2 2 2 2"]
NEWS = ["Rebels meet in Geneva, officials said", "The team won the final match of the season",
        "Shares fell as the bank reported losses", "A new chip doubles battery life"]
COUPLETS = ["晚风摇树树还挺", "春风，送暖"]
CASING = ["anna met tom in paris", "the bbc saw a train near rome"]


class Server:
    """``taskformer serve ... --port 0`` in a subprocess (started by ``launch``, which imports its plugins
    from ``path``); ``url`` once it listens."""

    def __init__(self, *args: str, launch: str = LAUNCH, path: str = str(HERE)):
        self.process = subprocess.Popen([sys.executable, "-c", launch, "serve", *args, "--port", "0"],
                                        stderr=subprocess.PIPE, text=True, cwd=HERE,
                                        env={**os.environ, "PYTHONPATH": path})
        stderr = self.process.stderr
        assert stderr is not None
        self.banner = stderr.readline()  # the first line names the address, or is an Error line
        found = re.search(r"http://[\d.]+:\d+", self.banner)
        assert found, self.banner + stderr.read()
        self.url = found.group(0)
        self.client = httpx.Client(base_url=self.url, timeout=120)
        threading.Thread(target=stderr.read, daemon=True).start()  # never block on a full pipe

    def post(self, path: str, body=None, **kw):
        return self.client.post(path, json=body, **kw) if body is not None else self.client.post(path, **kw)

    def stat(self, name: str) -> float:
        """A Prometheus sample of /metrics (0 when it has none yet)."""
        text = self.client.get("/metrics", headers=self.client.headers).text
        found = re.search(rf"^{re.escape(name)} (\S+)$", text, flags=re.M)
        return float(found.group(1)) if found else 0.0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            self.process.wait(timeout=60)
        self.client.close()


def predicted(cli, run, texts, *args) -> list:
    """What ``taskformer predict --json`` prints for the texts, one JSON value each."""
    result = cli("predict", str(run), "--json", *args, input="\n".join(texts) + "\n")
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, default_copy_run):
    """A run of every variant with a page feature: copy (attention), agnews (bars), truecase (tags),
    couplet (tone marks); all tiny but copy, which must write real outputs to compare."""
    root = tmp_path_factory.mktemp("serve")
    tiny = ["model.d_model=32", "model.n_heads=2", "model.enc_layers=1", "model.d_ff=64", "train.threads=1",
            "train.bf16=false"]
    plugins().pm.register(tagging_plugin, name="truecase-fixture")
    plugins().refresh()
    for task, data, options in [
            ("agnews", "ag_news", ["train.epochs=3", "data.vocab_size=300"]),
            ("couplet", "couplets", ["model.dec_layers=1", "model.max_len=40", "train.max_steps=3",
                                     "train.eval_every=0", "data.val_size=6", "decode.strategy=greedy"]),
            ("truecase", None, ["train.max_steps=5"])]:
        where = ["--data-dir", str(HERE / "data" / data)] if data else []
        result = CliRunner().invoke(main, ["run", task, *where, "--out", str(root / task), "--quiet",
                                           *(a for o in tiny + options for a in ("--set", o))], catch_exceptions=False)
        assert result.exit_code == 0, result.output
    yield {"copy": default_copy_run[0], "agnews": root / "agnews", "couplet": root / "couplet",
           "truecase": root / "truecase"}
    plugins().pm.unregister(name="truecase-fixture")
    plugins().refresh()


@pytest.fixture(scope="module")
def server(runs):
    s = Server(*(f"{name}={path}" for name, path in runs.items()), "--max-inputs", "64", "--max-queue", "48",
               "--max-chars", "300")
    yield s
    s.stop()


def test_every_output_equals_taskformer_predict(server, runs, cli):
    for name, texts, args in [("copy", COPY_INPUTS, ()), ("copy", COPY_INPUTS, ("--beam", "3")),
                              ("agnews", NEWS, ()), ("couplet", COUPLETS, ()), ("truecase", CASING, ())]:
        body = {"inputs": texts, **({"beam": int(args[1])} if args else {})}
        response = server.post(f"/v1/models/{name}/predict", body)
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["output"] for r in results] == predicted(cli, runs[name], texts, *args), name
        streamed = server.post(f"/v1/models/{name}/predict/stream", body).text
        events = [json.loads(line[len("data: "):]) for line in streamed.splitlines() if line.startswith("data: ")]
        assert sorted((e["index"], json.dumps(e["output"])) for e in events) == [
            (i, json.dumps(r["output"])) for i, r in enumerate(results)]


def test_a_plain_request_is_answered_as_the_route_answers_it(server):
    """``{"inputs": [...]}`` in JSON is answered in front of FastAPI's route; the same request spelled
    otherwise (a charset, a default option given) goes through the route: the same bytes, each counted
    on /metrics under the route."""
    count = 'taskformer_request_seconds_count{route="/v1/models/{name}/predict"}'
    counted = server.stat(count)
    body = json.dumps({"inputs": COPY_INPUTS})
    answers = [server.post("/v1/models/copy/predict", content=body, headers={"Content-Type": kind})
               for kind in ("application/json", "application/json; charset=utf-8")]
    answers.append(server.post("/v1/models/copy/predict", {"inputs": COPY_INPUTS, "return_attention": False}))
    assert answers[0].status_code == 200, answers[0].text
    assert answers[0].content == answers[1].content == answers[2].content
    assert server.stat(count) == counted + 3


def test_page_data_per_variant(server, runs):
    import taskformer
    from taskformer.tasks.couplet import tone

    texts = [t for t in COPY_INPUTS if t]
    results = server.post("/v1/models/copy/predict", {"inputs": texts, "return_attention": True}).json()["results"]
    pairs = taskformer.load(runs["copy"]).predict(texts, return_attention=True)
    for result, (output, attention) in zip(results, pairs):
        assert result["output"] == output and result["attention"] == attention._asdict()
        assert len(result["attention"]["weights"]) == len(attention.output)
        assert all(abs(sum(row) - 1) < 1e-2 for row in result["attention"]["weights"])

    for r in server.post("/v1/models/agnews/predict", {"inputs": NEWS}).json()["results"]:
        assert set(r["probabilities"]) == {"World", "Sports", "Business", "Sci/Tech"}
        assert max(r["probabilities"], key=r["probabilities"].get) == r["output"]["label"]

    for text, r in zip(CASING, server.post("/v1/models/truecase/predict", {"inputs": CASING}).json()["results"]):
        assert [word for word, _ in r["output"]] == text.split()

    for text, r in zip(COUPLETS, server.post("/v1/models/couplet/predict", {"inputs": COUPLETS}).json()["results"]):
        for line, marks in ((text, r["marks"]["input"]), (r["output"], r["marks"]["output"])):
            assert marks == [{1: "平", 2: "仄"}.get(tone(ch), "") for ch in line]
        assert "平" in r["marks"]["input"] and "仄" in r["marks"]["input"]

    described = {m["name"]: m for m in server.client.get("/v1/models").json()["models"]}
    assert described["agnews"]["variant"] == "encoder-only" and described["agnews"]["metric"] == "accuracy"
    assert "return_attention" in described["copy"]["options"]
    assert "return_attention" not in described["agnews"]["options"]


def test_32_concurrent_clients_each_get_their_own_output(server, runs, cli):
    texts = [" ".join(str((i * 7 + j) % 10 + 1) for j in range(1 + i % 10)) for i in range(32)]
    expected = predicted(cli, runs["copy"], texts)
    batches = server.stat('taskformer_batch_sentences_count{model="copy"}')

    def ask(text):
        with httpx.Client(base_url=server.url, timeout=120) as client:
            return client.post("/v1/models/copy/predict", json={"inputs": [text]}).json()["results"][0]["output"]

    with ThreadPoolExecutor(32) as pool:
        assert list(pool.map(ask, texts)) == expected
    assert server.stat('taskformer_batch_sentences_count{model="copy"}') > batches


@pytest.mark.parametrize("path, body, status, field", [
    ("/v1/models/nope/predict", {"inputs": ["1"]}, 404, "name"),
    ("/v1/models/copy/predict", {"inputs": ["1"], "beam": 0}, 422, "beam"),
    ("/v1/models/copy/predict", {"inputs": ["1"], "beem": 2}, 422, "beem"),
    ("/v1/models/copy/predict", {"inputs": ["1", 5]}, 422, "inputs[1]"),
    ("/v1/models/copy/predict", {"inputs": "1 2"}, 422, "inputs"),
    ("/v1/models/copy/predict", {"inputs": ["1"] * 65}, 422, "inputs"),
    ("/v1/models/copy/predict", {"inputs": ["1", "2" * 301]}, 422, "inputs[1]"),
    ("/v1/models/copy/predict", b'{"inputs": ["1"', 422, "body"),
    ("/v1/models/copy/predict", b"x" * ((1 << 20) + 1), 413, "body"),
    ("/v1/models/agnews/predict", {"inputs": ["a"], "return_attention": True}, 422, "return_attention"),
    ("/v1/models/copy/predict", {"inputs": ["1"] * 49}, 422, "inputs"),  # more than --max-queue can ever wait
    ("/translate", {"q": "1", "source": "xx", "target": "yy"}, 400, "source"),  # no model translates anything
])
def test_bad_requests_get_a_json_error_naming_the_field_and_the_server_stays_up(server, path, body, status, field):
    if isinstance(body, bytes):
        response = server.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = server.post(path, body)
    assert response.status_code == status, response.text
    assert response.json()["field"] == field and response.json()["error"]
    if status == 503:
        assert response.headers["Retry-After"] == "1"
    assert server.client.get("/health").json()["status"] == "ok"
    assert server.post("/v1/models/copy/predict", {"inputs": ["3"]}).status_code == 200


def test_bad_options_get_one_error_line(runs, cli):
    for options, named in ((["--host", "0.0.0.0"], "--api-key"), (["--max-wait-ms", "nan"], "--max-wait-ms"),
                           (["--port", "70000"], "--port"), (["--threads", "0"], "--threads")):
        refused = cli("serve", str(runs["copy"]), *options)
        assert refused.exit_code == 2 and named in refused.output and "Traceback" not in refused.output


def test_decoding_threads_are_said_and_change_no_output(server, runs, cli):
    assert re.search(r"with [1-9]\d* decoding thread\(s\)", server.banner), server.banner  # the default: the cores'
    two = Server(str(runs["copy"]), "--threads", "2")
    try:
        assert "with 2 decoding thread(s)" in two.banner
        results = two.post("/v1/models/copy/predict", {"inputs": COPY_INPUTS}).json()["results"]
        assert [r["output"] for r in results] == predicted(cli, runs["copy"], COPY_INPUTS)
    finally:
        two.stop()


def test_api_key_is_checked_before_any_work(runs, cli):
    server = Server(str(runs["copy"]), "--api-key", "s3cret")
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            response = server.post("/v1/models/copy/predict", {"inputs": ["1 2"]}, headers=headers)
            assert response.status_code == 401 and response.json()["field"] == "Authorization"
            assert response.headers["WWW-Authenticate"] == "Bearer"
        assert server.client.get("/v1/models").status_code == 401
        assert server.client.get("/health").status_code == 200
        for open_path in ("/", "/favicon.svg", "/docs", "/docs/assets/swagger-ui-bundle.js", "/redoc", "/openapi.json"):
            assert server.client.get(open_path).status_code == 200, open_path  # no model data: no key needed
        server.client.headers["Authorization"] = "Bearer s3cret"
        assert server.stat('taskformer_batch_sentences_count{model="copy"}') == 0  # nothing was decoded
        ok = server.post("/v1/models/copy/predict", {"inputs": ["1 2"]})
        assert ok.status_code == 200 and [r["output"] for r in ok.json()["results"]] == predicted(cli, runs["copy"],
                                                                                                   ["1 2"])
        del server.client.headers["Authorization"]
        libre = server.client.post("/translate", data={"q": "1 2", "source": "de", "target": "en",
                                                       "api_key": "s3cret"})
        assert libre.status_code == 400 and "pairs served: none" in libre.json()["error"]  # past the key: copy translates no pair
    finally:
        server.stop()


def test_a_client_that_leaves_frees_its_place_and_sigterm_finishes_in_flight_requests(runs, cli):
    server = Server(str(runs["copy"]), "--max-wait-ms", "60000")  # a lone request waits for company
    queued = 'taskformer_queue_sentences{model="copy"}'
    try:
        leaving = socket.create_connection((server.client.base_url.host, server.client.base_url.port))
        body = json.dumps({"inputs": ["1 2 3"]}).encode()
        leaving.sendall(b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        wait_for(lambda: server.stat(queued) == 1)
        leaving.close()
        wait_for(lambda: server.stat(queued) == 0)
        assert server.stat('taskformer_batch_sentences_count{model="copy"}') == 0  # its decode never ran

        with ThreadPoolExecutor(1) as pool:
            answer = pool.submit(server.post, "/v1/models/copy/predict", {"inputs": ["4 5 6 7"]})
            wait_for(lambda: server.stat(queued) == 1)
            server.process.send_signal(signal.SIGTERM)
            response = answer.result(timeout=120)
        assert response.status_code == 200
        assert [r["output"] for r in response.json()["results"]] == predicted(cli, runs["copy"], ["4 5 6 7"])
        assert server.process.wait(timeout=60) == -signal.SIGTERM  # uvicorn ends as the signal asks, once done
    finally:
        server.stop()


def wait_for(condition, tries: int = 600) -> None:
    """Poll a server state (not a clock): up to ``tries`` polls a tenth of a second apart."""
    import time

    for _ in range(tries):
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError("the server never reached the expected state")


def chromium_page(p, url: str):
    """A page of Debian's Chromium, driven by Playwright (no browser can be downloaded here), that can
    reach nothing but the server: what the page needs must come from it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    chromium = p.chromium.launch(executable_path=browser, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-quic"])  # as root, offline
    page = chromium.new_page()
    page.set_default_timeout(60_000)  # generous: the machine may be busy
    page.route("**/*", lambda route: route.continue_() if route.request.url.startswith(url) else route.abort())
    return chromium, page


def playwright():
    if not (shutil.which("chromium") or shutil.which("chromium-browser")):
        pytest.skip("Debian's chromium is not installed (.ci/run installs it)")
    return pytest.importorskip("playwright.sync_api", reason="the page test needs playwright (the test extra)")


# How wide each input's placeholder is drawn, against the room the input gives it.
PLACEHOLDER_ROOM = """() => [...document.querySelectorAll("input[placeholder]")].map((input) => {
  const style = getComputedStyle(input), context = document.createElement("canvas").getContext("2d");
  context.font = `${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return [input.id, context.measureText(input.placeholder).width, room];
})"""


def test_page_in_headless_chromium_shows_what_predict_prints(server, runs, cli):
    """Used as a person uses it (issue 33): load ``/``, choose the model, type the inputs with key events and press
    Predict; the page must show what ``taskformer predict`` prints. It offers the task's examples, says the
    precision in words, draws every placeholder whole and needs nothing from elsewhere, nor does ``/docs``."""
    sync_api = playwright()
    texts = [t for t in COPY_INPUTS if t]  # the page sends its non-blank lines
    described = {m["name"]: m for m in server.client.get("/v1/models").json()["models"]}["copy"]
    with sync_api.sync_playwright() as p:
        chromium, page = chromium_page(p, server.url)
        try:
            page.goto(f"{server.url}/")
            page.select_option("#model", "copy")  # waits for the chooser to list it
            assert page.locator("#examples .chip").all_text_contents() == described["examples"] != []
            page.locator("#examples .chip").first.click()
            assert page.locator("#text").input_value() == described["examples"][0]
            about = page.locator("#about").text_content()
            assert described["precision_words"] in about and "fp32" not in about and "matmul" not in about
            page.locator("#text").fill("")
            page.locator("#text").press_sequentially("\n".join(texts))  # Enter between lines
            page.click("#submit")
            sync_api.expect(page.locator("#status")).to_have_text("done", timeout=60_000)
            assert page.locator("#error").text_content() == ""
            assert page.locator("#outputs .source").all_text_contents() == texts
            assert page.locator("#outputs .output").all_text_contents() == predicted(cli, runs["copy"], texts)
            assert page.locator("#outputs table.heatmap").count() == len(texts)
            page.locator("details.settings summary").click()
            for name, drawn, room in page.evaluate(PLACEHOLDER_ROOM):
                assert 0 < drawn <= room, f"#{name}'s placeholder is cut off: {drawn:.0f} px in {room:.0f} px"
            icon = server.client.get(page.locator("link[rel=icon]").get_attribute("href"))
            assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
            page.goto(f"{server.url}/docs")  # Swagger UI from the server itself: every route listed
            sync_api.expect(page.locator(".opblock-summary-path")).to_have_count(6, timeout=60_000)
        finally:
            chromium.close()


def test_the_page_shows_tokens_without_subword_markers(translators):
    sync_api = playwright()
    server = Server(f"de_en={translators['de']}")
    text = "Ein Hund rennt über die Wiese."
    try:
        raw = server.post("/v1/models/de_en/predict", {"inputs": [text], "return_attention": True}).json()
        source = raw["results"][0]["attention"]["source"]
        assert any(t.startswith("\u2581") for t in source)  # the tokenizer's word starts: what must not show
        with sync_api.sync_playwright() as p:
            chromium, page = chromium_page(p, server.url)
            try:
                page.goto(f"{server.url}/")
                page.select_option("#model", "de_en")
                page.locator("#text").press_sequentially(text)
                page.click("#submit")
                sync_api.expect(page.locator("#status")).to_have_text("done", timeout=60_000)
                shown = page.locator("#outputs table.heatmap thead th").all_text_contents()[1:]
                assert len(shown) == len(source) and not [t for t in shown if any(m in t for m in ("\u2581", "##"))]
                plain = {i: t.lstrip("\u2581") for i, t in enumerate(source) if t.lstrip("\u2581") and t[0] != "["}
                assert plain and all(shown[i] == t for i, t in plain.items()) and shown[-1] == "end"  # [EOS]
            finally:
                chromium.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def translators(tmp_path_factory):
    """Tiny translate-de-en and translate-en-zh runs: what they output does not matter, which model answers does."""
    root = tmp_path_factory.mktemp("translators")
    for task, data in (("translate-de-en", "multi30k"), ("translate-en-zh", "en-cn")):
        result = CliRunner().invoke(main, ["run", task, "--data-dir", str(HERE / "data" / data), "--out",
                                           str(root / task), "--quiet", "--set", "train.max_steps=2",
                                           "--set", "data.vocab_size=200", "--set", "model.d_model=32",
                                           "--set", "model.d_ff=64", "--set", "model.enc_layers=1",
                                           "--set", "model.dec_layers=1", "--set", "decode.strategy=greedy"],
                                    catch_exceptions=False)
        assert result.exit_code == 0, result.output
    return {"de": root / "translate-de-en", "zh": root / "translate-en-zh"}


def test_translate_takes_the_language_pair_from_the_task_whatever_the_served_name(translators, runs, cli):
    server = Server(f"de_en={translators['de']}", f"foo={translators['zh']}", f"copy={runs['copy']}")
    try:
        for source, target, run, text in (("de", "en", "de", "Ein Hund rennt."), ("en", "zh", "zh", "I read."),
                                          ("auto", "zh", "zh", "It rains.")):
            libre = server.post("/translate", {"q": [text], "source": source, "target": target})
            assert libre.status_code == 200, libre.text
            assert libre.json() == {"translatedText": predicted(cli, translators[run], [text])}, (source, target)
        for source, target, field in (("fr", "es", "source"), ("de", "zh", "target"), ("auto", "fr", "target")):
            refused = server.post("/translate", {"q": "Hallo", "source": source, "target": target})
            assert refused.status_code == 400 and refused.json()["field"] == field, refused.text
            assert "de->en (de_en), en->zh (foo)" in refused.json()["error"]  # the pairs that are served
        listed = {m["name"]: m for m in server.client.get("/v1/models").json()["models"]}
        assert listed["de_en"]["languages"] == ["de", "en"] and listed["copy"]["languages"] == []
        assert listed["foo"]["examples"] and all(isinstance(e, str) for e in listed["foo"]["examples"])
    finally:
        server.stop()
