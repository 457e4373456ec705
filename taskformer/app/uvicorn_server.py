"""uvicorn as ``taskformer serve`` runs it: a banner once the port accepts connections, signals that
finish the requests in flight, and a bounded request head with httptools' parser."""
from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from taskformer.app.served import Served


class Uvicorn(uvicorn.Server):
    """uvicorn's server, which says ``banner`` on stderr once its port accepts connections, and on
    SIGTERM or Ctrl-C stops accepting and finishes the requests in flight; queued sentences are then
    decoded at once, whatever ``max_wait_ms`` asks. A second signal ends the process
    at once, as that signal asks (uvicorn itself would wait for every open connection on SIGTERM, and
    for the decode thread in any case)."""

    def __init__(self, config: uvicorn.Config, banner: str, served: dict[str, Served]):
        super().__init__(config)
        self.banner, self.served = banner, served

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.banner, file=sys.stderr, flush=True)

    def handle_exit(self, sig, frame) -> None:
        if self.should_exit:
            signal.signal(sig, signal.SIG_DFL)
            signal.raise_signal(sig)
        super().handle_exit(sig, frame)
        for model in self.served.values():
            model.batcher.flush()


MAX_HEAD = 1 << 20  # bytes of a request's line and headers (h11 bounds them at 16 KiB itself)


def http_protocol():
    """uvicorn's HTTP protocol: httptools' parser (the ``serve`` extra installs it), else h11's.

    httptools parses in C, where h11 is Python (about a seventh of the event loop's CPU per request);
    but uvicorn's httptools protocol buffers a request head of any size, so one client sending an
    endless header could take all memory. Here a head still incomplete after :data:`MAX_HEAD` bytes
    gets a 400 and the connection is closed, as h11 answers a head over its bound. The bytes are
    counted per read, a read that also holds the end of the request before counting whole: the bound
    may be met up to one read (a few hundred KiB at most) early, never by one read alone."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "h11"

    class BoundedHead(HttpToolsProtocol):
        head, in_head = 0, True  # bytes read of the current request's head; whether it is incomplete

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.in_head and not self.transport.is_closing():
                self.head += len(data)
                if self.head > MAX_HEAD:
                    self.send_400_response(f"Request line and headers larger than {MAX_HEAD} bytes.")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.head, self.in_head = 0, True

        def on_headers_complete(self) -> None:
            self.in_head = False
            super().on_headers_complete()

    return BoundedHead
