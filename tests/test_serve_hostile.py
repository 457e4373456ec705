"""``taskformer serve`` against a careless or hostile client: signals, options, bodies no parser should
take, names no route has. Each answer is a one-line ``Error:`` at start or a JSON ``{"error", "field"}``,
and the server stays up (docs/serve.md, docs/robustness.md).
"""
from __future__ import annotations

import json
import os
import signal
import socket

import pytest

pytestmark = pytest.mark.slow  # trains or serves through the command line: the full run's, not the quick tier's

pytest.importorskip("httpx", reason="the serve tests need the test extra (httpx, fastapi, uvicorn)")
pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")

from test_serve import HERE, Server, wait_for  # noqa: E402


def accepts(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=60).close()
        return True
    except ConnectionRefusedError:
        return False


@pytest.fixture
def taken_port():
    """A port something else listens on: a server that passed its option checks would stop there, so an
    option it should have refused is told apart from one it took."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield str(sock.getsockname()[1])


@pytest.mark.parametrize("option, value, named", [
    ("--threads", "100000", "--threads 100000: this process may use"), ("--max-batch", "100000", "--max-batch"),
    ("--max-inputs", "100000000", "--max-inputs"), ("--max-chars", "100000000", "--max-chars"),
    ("--max-queue", "10000000000", "--max-queue"), ("--api-key", "   ", "--api-key: a key is printable ASCII"),
    ("--api-key", "schlüssel", "--api-key: a key is printable ASCII"),
])
def test_numeric_options_and_keys_no_client_can_send_are_refused_at_start(finished, cli, taken_port, option, value,
                                                                          named):
    refused = cli("serve", str(finished), "--port", taken_port, option, value)
    assert refused.exit_code == 2 and "Traceback" not in refused.output
    errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and named in errors[0], refused.output


def test_the_address_is_said_once_the_port_accepts_connections(finished):
    server = Server(str(finished))
    try:
        host, port = server.url.removeprefix("http://").split(":")
        assert accepts(host, int(port))  # refused while the socket was only bound
    finally:
        server.stop()


def test_the_server_runs_on_asyncio_even_where_uvloop_is_installed(finished, tmp_path):
    """uvloop, where installed, is left unused (docs/serve.md: under load it made smaller batches): here an
    importable uvloop whose loop cannot be made would stop a server that took it."""
    (tmp_path / "uvloop.py").write_text("def new_event_loop():\n    raise RuntimeError('uvloop was used')\n")
    server = Server(str(finished), path=os.pathsep.join([str(tmp_path), str(HERE)]))
    try:
        answered = server.post("/v1/models/copy/predict", {"inputs": ["1 2 3"]})
        assert answered.status_code == 200 and answered.json()["results"][0]["output"] is not None, answered.text
    finally:
        server.stop()


def test_a_second_sigterm_ends_the_server_at_once(finished):
    """The first SIGTERM waits for the requests in flight; a client that never finishes its body would
    hold it forever. The second ends the process, as SIGTERM asks."""
    server = Server(str(finished))
    try:
        host, port = server.url.removeprefix("http://").split(":")
        slow = socket.create_connection((host, int(port)))
        slow.sendall(b"POST /v1/models/copy/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"inputs\": [")
        assert server.client.get("/health").status_code == 200  # the server has read the slow request's start
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: not accepts(host, int(port)))  # the first signal is being honoured
        assert server.process.poll() is None  # still waiting for the slow client
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == -signal.SIGTERM
        slow.close()
    finally:
        server.stop()


@pytest.fixture(scope="module")
def app(finished):
    """The server's app for the finished tiny run, in process (FastAPI's test client)."""
    from fastapi.testclient import TestClient

    from taskformer.app import runner
    from taskformer.app.server import Limits, create_app

    with TestClient(create_app({"copy": runner.load(finished)}, Limits(max_queue=8)), raise_server_exceptions=False) \
            as client:
        yield client


def still_up(app) -> None:
    assert app.post("/v1/models/copy/predict", json={"inputs": ["3"]}).status_code == 200


def test_beam_true_is_refused_as_the_api_refuses_it(app):
    refused = app.post("/v1/models/copy/predict", json={"inputs": ["1 2"], "beam": True})
    assert refused.status_code == 422 and refused.json()["field"] == "beam", refused.text
    assert "beam must be a whole number" in refused.json()["error"]
    still_up(app)


def test_control_tokens_typed_in_a_request_are_text(app):
    answer = app.post("/v1/models/copy/predict", json={"inputs": ["1 [EOS] 2 [PAD] 3"], "return_attention": True})
    assert answer.json()["results"][0]["attention"]["source"] == ["1", "[UNK]", "2", "[UNK]", "3", "[EOS]"]


DEEP = b"[" * 100_000 + b"]" * 100_000


@pytest.mark.parametrize("path, body, says", [
    ("/v1/models/copy/predict", b'{"inputs": ' + DEEP + b"}", "nested too deeply"),
    ("/v1/models/copy/predict", b'{"inputs": ["1"], "beam": ' + b"7" * 5000 + b"}", "not valid JSON"),
    ("/v1/models/copy/predict", b'{"inputs": ["\xff\xfe"]}', "not valid UTF-8"),
    ("/v1/models/copy/predict/stream", b'{"inputs": ' + DEEP + b"}", "nested too deeply"),
    ("/translate", DEEP, "nested too deeply"),
    ("/translate", b'{"q": ' + b"7" * 5000 + b"}", "not valid JSON"),
    ("/translate", b"q=1 2", "not valid JSON"),  # a form sent as JSON
    ("/translate", b'["1 2"]', "expected a JSON object"),
])
def test_a_body_no_parser_takes_is_a_422_naming_the_body(app, path, body, says):
    refused = app.post(path, content=body, headers={"Content-Type": "application/json"})
    assert refused.status_code == 422, refused.text
    assert refused.json()["field"] == "body" and says in refused.json()["error"], refused.json()
    still_up(app)


@pytest.mark.parametrize("q", [5, ["1", 5], None])
def test_translate_names_the_field_q(app, q):
    refused = app.post("/translate", json={"q": q, "source": "de", "target": "en"})
    assert refused.status_code == 422 and refused.json()["field"] in ("q", "q[1]"), refused.text


def test_a_request_larger_than_the_queue_says_it_can_never_be_served(app):
    for path, body, field in (("/v1/models/copy/predict", {"inputs": ["1"] * 9}, "inputs"),
                              ("/v1/models/copy/predict/stream", {"inputs": ["1"] * 9}, "inputs"),
                              ("/translate", {"q": ["1"] * 9}, "q")):
        refused = app.post(path, json=body)
        assert refused.status_code == 422 and refused.json()["field"] == field, refused.text
        assert "can never be served" in refused.json()["error"]


def test_a_deep_translate_body_is_refused_by_the_key_check_first(finished):
    from fastapi.testclient import TestClient

    from taskformer.app import runner
    from taskformer.app.server import Limits, create_app

    with TestClient(create_app({"copy": runner.load(finished)}, Limits(), "s3cret"),
                    raise_server_exceptions=False) as client:
        refused = client.post("/translate", content=DEEP, headers={"Content-Type": "application/json"})
        assert refused.status_code == 401 and refused.json()["field"] == "Authorization", refused.text


@pytest.fixture(scope="module")
def live(finished):
    server = Server(str(finished))
    yield server
    server.stop()


@pytest.mark.parametrize("path", ["/v1/models/a/b/predict", "/v1/models/a%2Fb/predict", "/v1/models/../predict",
                                  "/v1/models/./copy/predict", "/nowhere"])
def test_a_path_no_route_has_gets_the_json_404(live, path):
    """Sent as written (a client would resolve the dot-segments first)."""
    host, port = live.url.removeprefix("http://").split(":")
    body = b'{"inputs": ["1"]}'
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                    b"Connection: close\r\n\r\n%s" % (path.encode(), len(body), body))
        answer = b""
        while chunk := raw.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404"), answer
    refusal = json.loads(body)
    assert refusal["error"] and refusal["field"] == ("path" if path == "/nowhere" else "name"), refusal
    still_up(live.client)


def test_a_request_head_that_never_ends_is_refused_and_the_server_stays_up(live):
    """Headers past the bound (uvicorn's h11 protocol bounds them itself; its httptools one, used where
    httptools is installed, buffers any size unless the server bounds it) end that connection with a
    400 or a reset, whatever else the client sends; the server goes on answering."""
    from taskformer.app.uvicorn_server import MAX_HEAD

    host, port = live.url.removeprefix("http://").split(":")
    refused = b""
    with socket.create_connection((host, int(port)), timeout=120) as raw:
        try:
            raw.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Endless: ")
            for _ in range(2 * MAX_HEAD // 65536 + 1):  # in reads of their own, as a slow flood comes
                raw.sendall(b"a" * 65536)
            refused = raw.recv(65536)
        except ConnectionError:  # closed while the client was still sending: its rest was never read
            pass
    assert refused == b"" or refused.startswith(b"HTTP/1.1 400"), refused[:200]
    still_up(live.client)
