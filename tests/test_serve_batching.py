"""The server's batching, through HTTP on the app in process: a lone request is decoded at once, and what
arrives while a batch decodes is decoded together next (continuous batching), each request with its
own results, equal to what ``taskformer predict`` gives."""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")

from fastapi.testclient import TestClient  # noqa: E402

from taskformer.app import runner  # noqa: E402
from taskformer.app.server import Limits, create_app  # noqa: E402


def test_a_lone_request_is_decoded_alone_and_those_arriving_meanwhile_share_the_next_batch(finished, monkeypatch):
    run = runner.load(finished)
    expected = {text: out for text, out in zip(["1 2 3", "4 5", "6", "7 8 9 1"],
                                               runner.predict(run, ["1 2 3", "4 5", "6", "7 8 9 1"])[0])}
    batches: list[list[str]] = []
    decoding, release = threading.Event(), threading.Event()
    predict = runner.predict

    def held(run, lines, *args, **kwargs):  # the first decode waits until the test lets it finish
        batches.append(list(lines))
        decoding.set()
        assert release.wait(60)
        return predict(run, lines, *args, **kwargs)

    monkeypatch.setattr(runner, "predict", held)
    assert Limits().max_wait_ms == 0  # the server's default: no window to wait for company in
    with TestClient(create_app({"copy": run}, Limits())) as client, ThreadPoolExecutor(4) as pool:
        batcher = client.app.state.served["copy"].batcher

        def send(text: str):
            return pool.submit(client.post, "/v1/models/copy/predict", json={"inputs": [text]})

        first = send("1 2 3")
        assert decoding.wait(60)  # decoded with nothing else queued: a batch of one
        later = [send(text) for text in ("4 5", "6", "7 8 9 1")]
        for _ in range(600):  # the three queue behind the decode (polled, not timed)
            if batcher.queued == 3:
                break
            threading.Event().wait(0.1)
        release.set()
        answers = [f.result(timeout=120) for f in (first, *later)]
    assert batches[0] == ["1 2 3"]
    assert sorted(batches[1]) == ["4 5", "6", "7 8 9 1"] and len(batches) == 2  # one batch for all three
    for text, answer in zip(["1 2 3", "4 5", "6", "7 8 9 1"], answers):
        assert answer.status_code == 200 and answer.json()["results"][0]["output"] == expected[text]
