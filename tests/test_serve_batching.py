"""The server's batching, through HTTP on the app in process: a lone request is decoded at once, and what
arrives while a batch decodes is decoded together next (continuous batching), each request with its
own results, equal to what ``taskformer predict`` gives. A CTranslate2 runtime of several workers
decodes as many batches at once."""
from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi", reason="taskformer serve needs the serve extra")
pytest.importorskip("httpx", reason="FastAPI's test client needs httpx")

from fastapi.testclient import TestClient  # noqa: E402

from taskformer.app import runner  # noqa: E402
from taskformer.app.server import Limits, create_app  # noqa: E402


def until(condition) -> None:
    """Wait until ``condition()`` holds: polled, not timed (a busy machine only takes longer)."""
    for _ in range(600):
        if condition():
            return
        threading.Event().wait(0.1)
    raise AssertionError("the server never got there")


def test_a_lone_request_is_decoded_alone_and_those_arriving_meanwhile_share_the_next_batch(finished, monkeypatch):
    run = runner.load(finished)
    runner.set_decoding(run, ["decode.workers=1"], "test")  # one batch at a time, whatever decodes it
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


def metric(client, name: str) -> float:
    """A value of the copy model's series ``name`` on ``/metrics``."""
    found = re.search(rf'^{name}{{model="copy"}} (\S+)$', client.get("/metrics").text, flags=re.M)
    assert found, name
    return float(found.group(1))


def test_a_runtime_of_two_workers_decodes_a_batch_while_another_decodes_and_queues_the_rest(finished, monkeypatch):
    pytest.importorskip("ctranslate2", reason="the runtime of several workers is CTranslate2's")
    run = runner.load(finished)
    runner.set_decoding(run, ["decode.engine=ctranslate2", "decode.workers=2"], "test")
    texts = ["1 2 3", "4 5", "6", "7 8 9 1"]
    expected = dict(zip(texts, runner.predict(run, texts)[0]))
    batches: list[list[str]] = []
    release = threading.Event()
    predict = runner.predict

    def held(run, lines, *args, **kwargs):  # every decode waits until the test lets them finish
        batches.append(list(lines))
        assert release.wait(60)
        return predict(run, lines, *args, **kwargs)

    monkeypatch.setattr(runner, "predict", held)
    with TestClient(create_app({"copy": run}, Limits())) as client, ThreadPoolExecutor(4) as pool:
        def send(text: str):
            return pool.submit(client.post, "/v1/models/copy/predict", json={"inputs": [text]})

        first = send("1 2 3")
        until(lambda: len(batches) == 1)
        second = send("4 5")  # the other worker is free: decoded at once, beside the first
        until(lambda: len(batches) == 2)
        later = [send(text) for text in ("6", "7 8 9 1")]  # both workers busy: these wait, then share a batch
        until(lambda: metric(client, "taskformer_queue_sentences") == 2)
        release.set()
        answers = [f.result(timeout=120) for f in (first, second, *later)]
        assert metric(client, "taskformer_batch_sentences_count") == 3
        assert metric(client, "taskformer_batch_sentences_sum") == 4
    assert batches[:2] == [["1 2 3"], ["4 5"]] and sorted(batches[2]) == ["6", "7 8 9 1"]
    for text, answer in zip(texts, answers):
        assert answer.status_code == 200 and answer.json()["results"][0]["output"] == expected[text]


def test_a_worker_freed_beside_another_decode_waits_for_the_clients_its_batch_answered(finished, monkeypatch):
    """Taken as the first of them arrives, the next batch would hold one sentence and the rest wait for
    another; it waits for its share of the sentences in flight instead (bounded by a share of the last
    batch's decode time, made long here so that the test does not depend on the machine's pace)."""
    pytest.importorskip("ctranslate2", reason="the runtime of several workers is CTranslate2's")
    from taskformer.app import batching

    monkeypatch.setattr(batching, "COMPANY", 1000.0)
    run = runner.load(finished)
    runner.set_decoding(run, ["decode.engine=ctranslate2", "decode.workers=2"], "test")
    texts = ["1 2 3", "4 5", "6", "7 8 9 1", "2 2"]
    expected = dict(zip(texts, runner.predict(run, texts)[0]))
    batches: list[list[str]] = []
    releases = [threading.Event() for _ in range(3)]
    predict = runner.predict

    def held(run, lines, *args, **kwargs):  # each of the first three decodes waits until the test lets it finish
        batches.append(list(lines))
        if len(batches) <= len(releases):
            assert releases[len(batches) - 1].wait(60)
        return predict(run, lines, *args, **kwargs)

    monkeypatch.setattr(runner, "predict", held)
    with TestClient(create_app({"copy": run}, Limits())) as client, ThreadPoolExecutor(4) as pool:
        def send(*inputs: str):
            return pool.submit(client.post, "/v1/models/copy/predict", json={"inputs": list(inputs)})

        first = send("1 2 3", "4 5")  # two sentences on one worker
        until(lambda: len(batches) == 1)
        second = send("6")  # the other worker is free and nothing has ended yet: decoded at once
        until(lambda: len(batches) == 2)
        releases[0].set()
        assert first.result(timeout=120).status_code == 200
        # The first batch's two clients come back one by one while the second batch still decodes: the
        # freed worker waits for both (its share of the three sentences in flight) and takes them together.
        third = send("7 8 9 1")
        until(lambda: client.app.state.served["copy"].batcher.queued == 1)
        fourth = send("2 2")
        until(lambda: len(batches) == 3)
        releases[1].set()
        releases[2].set()
        answers = [f.result(timeout=120) for f in (second, third, fourth)]
    assert batches == [["1 2 3", "4 5"], ["6"], ["7 8 9 1", "2 2"]]
    for text, answer in zip(["6", "7 8 9 1", "2 2"], answers):
        assert answer.status_code == 200 and answer.json()["results"][0]["output"] == expected[text]
