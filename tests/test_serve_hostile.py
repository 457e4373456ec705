"""``taskformer serve`` against a careless or hostile client: signals, options, bodies no parser should
take, names no route has. Each answer is a one-line ``Error:`` at start or a JSON ``{"error", "field"}``,
and the server stays up (docs/serve.md, docs/robustness.md).
"""
from __future__ import annotations

import signal
import socket

import pytest

pytest.importorskip("httpx", reason="the serve tests need the test extra (httpx, fastapi, uvicorn)")
pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")

from test_serve import Server, wait_for  # noqa: E402


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


@pytest.mark.parametrize("options, named", [
    (["--threads", "100000"], "--threads 100000: this process may use"),
    (["--max-batch", "100000"], "--max-batch"),
    (["--max-inputs", "100000000"], "--max-inputs"),
    (["--max-chars", "100000000"], "--max-chars"),
    (["--max-queue", "10000000000"], "--max-queue"),
    (["--api-key", "   "], "--api-key: a key is printable ASCII"),
    (["--api-key", "schlüssel"], "--api-key: a key is printable ASCII"),
])
def test_numeric_options_and_keys_no_client_can_send_are_refused_at_start(finished, cli, taken_port, options, named):
    refused = cli("serve", str(finished), "--port", taken_port, *options)
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
