"""Progress of the long stages outside the training loop (reading data, training a tokenizer, decoding).

Code that does slow work announces it with :func:`stage` and counts its items; whoever is listening
(the CLI's rich display) draws a bar, and nobody pays anything when no one listens. A plugin's data
hook can use the same two calls, so its own loading shows up in the console like the built-in ones.

    with stage("reading train.csv", total=None) as advance:
        for line in lines:
            ...
            advance()
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")
_listener: ContextVar[Callable[[dict], None] | None] = ContextVar("taskformer_progress", default=None)


@contextmanager
def listening(on_event: Callable[[dict], None] | None):
    """Send ``stage`` / ``advance`` / ``stage-done`` events to ``on_event`` while the block runs (None: to nobody)."""
    token = _listener.set(on_event)
    try:
        yield
    finally:
        _listener.reset(token)


def quiet():
    """No progress events while the block runs: the many small stages of a larger one that says itself."""
    return listening(None)


@contextmanager
def stage(name: str, total: int | None = None, every: int = 1):
    """A named stage of ``total`` items (``None``: unknown); yields ``advance(n=1)``.

    ``every`` batches the events, so that counting millions of lines costs next to nothing.
    """
    emit = _listener.get()
    if emit is None:
        yield lambda n=1: None
        return
    started, pending = time.monotonic(), [0]
    emit({"event": "stage", "name": name, "total": total})

    def advance(n: int = 1) -> None:
        pending[0] += n
        if pending[0] >= every:
            emit({"event": "advance", "n": pending[0]})
            pending[0] = 0

    try:
        yield advance
    finally:
        if pending[0]:
            emit({"event": "advance", "n": pending[0]})
        emit({"event": "stage-done", "name": name, "seconds": time.monotonic() - started})


def track(items: Iterable[T], name: str, total: int | None = None, every: int = 1000) -> Iterator[T]:
    """Iterate ``items`` inside a stage, one step per item (e.g. the lines a tokenizer trains on).

    ``total`` defaults to ``len(items)`` when the items have a length (a list), else unknown.
    """
    if total is None and isinstance(items, Sized):
        total = len(items)
    with stage(name, total, every) as advance:
        for item in items:
            yield item
            advance()
