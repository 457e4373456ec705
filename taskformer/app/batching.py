"""Dynamic batching for ``taskformer serve``: concurrent requests to one model share a decode.

Each served model has one :class:`Batcher`. Requests queue their sentences; a collector task on the
event loop hands what is queued (up to ``max_batch`` sentences) to the model's decode thread as
soon as that thread is free, so the event loop never blocks on a decode. A lone request is
decoded at once, and what arrives while a batch decodes makes the next batch (continuous batching):
one client pays no wait, many clients fill their batches. ``max_wait`` above 0 holds a batch of
fewer than ``max_batch`` sentences up to that long for company as well. With ``parallel`` above 1
(a runtime with that many workers, each decoding a batch on a core of its own outside the GIL) as
many batches decode at once, each taken as soon as a worker is free: a short batch never leaves the
other workers waiting for the next one. A worker freed while others still decode waits a little for
company, though: the clients its batch just answered are sending their next requests, and taken
as the first of them arrive, batches would alternate small and large (6 and 26 sentences of 32
clients), where CTranslate2's time per sentence falls with the batch. It waits until the queue holds
its share of the sentences in flight (those of the batch that ended and of the batches decoding,
over the workers), for at most :data:`COMPANY` of the time that batch took; a lone client, whose
request finds no other batch decoding, never waits. ``runner.predict`` sorts the
batch by length and returns the outputs in input order; each request gets its own slice back. Only
requests with the same decode options share a batch.

A request cancelled while it waits (its client went away) leaves the queue at once; one already
being decoded finishes and its outputs are dropped.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

COMPANY = 0.25  # of its last batch's decode time, the longest a worker freed beside others waits for its share


class QueueFull(Exception):
    """More sentences are waiting than the server accepts; the client should retry later."""


@dataclass
class Pending:
    texts: list[str]
    options: Hashable  # requests with equal options may share a decode
    future: asyncio.Future
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Merges concurrent requests to one model into decode batches of at most ``max_batch`` sentences.

    ``decode(texts, options)`` runs in one of the batcher's own threads and returns one result per text.
    ``on_batch(sentences)`` and ``on_queue(sentences)`` report batch sizes and queue depth (metrics).
    ``parallel`` batches decode at once, each in a thread of its own.
    """

    def __init__(self, decode: Callable[[list, Any], list], name: str, max_batch: int, max_wait: float,
                 max_queue: int, on_batch=lambda n: None, on_queue=lambda n: None, parallel: int = 1):
        self.decode, self.max_batch, self.max_wait, self.max_queue = decode, max_batch, max_wait, max_queue
        self.parallel = parallel
        self.on_batch, self.on_queue = on_batch, on_queue
        self.queue: deque[Pending] = deque()
        self.queued = 0  # sentences waiting
        self.arrival = asyncio.Event()
        self.thread = ThreadPoolExecutor(parallel, thread_name_prefix=f"decode-{name}")
        self.collector: asyncio.Task | None = None
        self.free = asyncio.Semaphore(parallel)  # decode threads free to take a batch
        self.decoding: set[Future] = set()  # the batches being decoded
        self.busy = 0  # sentences being decoded
        self.ended: tuple[int, float, float] | None = None  # the last batch decoded: sentences, seconds, when
        self.company = COMPANY

    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.collector = self.loop.create_task(self._collect())

    def flush(self) -> None:
        """From now on decode what is queued without waiting for more (the server is stopping).
        Safe to call from a signal handler or another thread."""
        def now():
            self.max_wait = self.company = 0.0
            self.arrival.set()
        if self.collector:
            self.loop.call_soon_threadsafe(now)

    async def stop(self) -> None:
        if self.collector:
            self.collector.cancel()
            await asyncio.gather(self.collector, return_exceptions=True)
        self.thread.shutdown(wait=True)

    def submit(self, texts: list[str], options: Hashable) -> asyncio.Future:
        """A future of the outputs for ``texts``, in order, decoded together with whatever else is queued.
        Cancelled while it waits (its client went away, or the task awaiting it was cancelled), the
        request leaves the queue at once."""
        if self.queued + len(texts) > self.max_queue:
            raise QueueFull(f"{self.queued} sentences are waiting (at most {self.max_queue})")
        item = Pending(texts, options, self.loop.create_future())
        self._change(item, +1)

        def done(future: asyncio.Future) -> None:
            if future.cancelled() and item in self.queue:  # free its place
                self._change(item, -1)

        item.future.add_done_callback(done)
        return item.future

    def waiting(self, future: asyncio.Future) -> bool:
        """Whether the request of ``future`` (from :meth:`submit`) is still queued."""
        return any(item.future is future for item in self.queue)

    def _change(self, item: Pending, sign: int) -> None:
        if sign > 0:
            self.queue.append(item)
            self.arrival.set()
        else:
            self.queue.remove(item)
        self.queued += sign * len(item.texts)
        self.on_queue(self.queued)

    async def _collect(self) -> None:
        while True:
            await self.free.acquire()  # a batch is taken once a decode thread is free: until then it grows
            while not self.queue:
                self.arrival.clear()
                await self.arrival.wait()
            while self.queue:
                wanted, until = self._wanted()
                left = until - time.monotonic()
                if self.queued >= wanted or left <= 0:
                    break
                self.arrival.clear()
                try:
                    await asyncio.wait_for(self.arrival.wait(), left)
                except TimeoutError:
                    break
            batch = self._take()
            if batch:
                self._decode(batch)
            else:
                self.free.release()

    def _wanted(self) -> tuple[int, float]:
        """The sentences the next batch waits for, and until when: ``max_batch`` for ``max_wait`` after its
        oldest request arrived (0 by default, and on flush()); beside other batches decoding, a worker's
        share of the sentences in flight for :data:`COMPANY` of the last batch's time, where that is later."""
        until = self.queue[0].arrived + self.max_wait
        if self.decoding and self.ended is not None:
            size, seconds, at = self.ended
            if at + self.company * seconds > until:
                return min(self.max_batch, -(-(size + self.busy) // self.parallel)), at + self.company * seconds
        return self.max_batch, until

    def _decode(self, batch: list[Pending]) -> None:
        """Hand one batch to a decode thread; when it ends, :meth:`_decoded` runs on the event loop (one
        callback from the thread: no task per batch, nor the hops of awaiting the thread's future)."""
        texts = [t for item in batch for t in item.texts]
        self.on_batch(len(texts))
        self.busy += len(texts)
        started = time.monotonic()
        work = self.thread.submit(self.decode, texts, batch[0].options)
        self.decoding.add(work)
        work.add_done_callback(lambda _: self.loop.call_soon_threadsafe(self._decoded, work, batch, started))

    def _decoded(self, work: Future, batch: list[Pending], started: float) -> None:
        """Give each request of a decoded batch its own results (a failed decode fails its requests only)."""
        size = sum(len(item.texts) for item in batch)
        self.busy -= size
        self.ended = (size, time.monotonic() - started, time.monotonic())
        failed = work.exception()
        start = 0
        for item in batch:
            if not item.future.done():  # its client may have gone
                if failed is not None:
                    item.future.set_exception(failed)
                else:
                    item.future.set_result(work.result()[start : start + len(item.texts)])
            start += len(item.texts)
        self.decoding.discard(work)
        self.free.release()

    def _take(self) -> list[Pending]:
        """The oldest request and the next ones with its options, up to ``max_batch`` sentences (a
        request larger than that goes alone: the decode splits it into batches itself)."""
        if not self.queue:
            return []
        first = self.queue[0]
        batch: list[Pending] = []
        size = 0
        for item in list(self.queue):
            if item.options != first.options or (batch and size + len(item.texts) > self.max_batch):
                continue
            batch.append(item)
            size += len(item.texts)
            if size >= self.max_batch:
                break
        for item in batch:
            self._change(item, -1)
        return batch
