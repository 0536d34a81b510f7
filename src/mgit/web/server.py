"""How `mgit serve` listens: uvicorn over h11, with the bounds a server reachable from a
network needs, and a quiet stop on Ctrl-C.

uvicorn alone waits forever for a connection's first request (its keep-alive timeout starts
only after an answer), so a few hundred connections that send nothing, half a request line,
or a header a byte at a time would be held for good. Here every connection must complete a
request head within HEADER_TIMEOUT seconds of opening (or of its last answer), however it
trickles; idle keep-alive connections close after KEEP_ALIVE seconds; a request head is at
most MAX_HEAD bytes; and at most MAX_CONNECTIONS are open: one more closes the connection
that has waited longest for a request (the new one itself when all others are answering),
so that a real request still gets through while the others are held.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT = 5.0  # seconds to a complete request head, from the connection or its last answer
KEEP_ALIVE = 5  # seconds an idle connection stays open after an answer
MAX_HEAD = 16 * 1024  # bytes of a request line and headers
MAX_CONNECTIONS = 100
GRACEFUL = 5  # seconds the requests being answered get when the server stops


class BoundedProtocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head and a connection limit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_since = 0.0
        self.deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._wait()
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_) > MAX_CONNECTIONS:
            waiting = [c for c in open_ if isinstance(c, BoundedProtocol) and c.idle()]
            min(waiting or [self], key=lambda c: c.waiting_since).transport.close()

    def on_response_complete(self) -> None:
        self._wait()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.deadline is not None:
            self.deadline.cancel()
        super().connection_lost(exc)

    def idle(self) -> bool:
        """Waiting for the client (no request being answered)."""
        return self.cycle is None or self.cycle.response_complete

    def _wait(self) -> None:
        """From now on the client has HEADER_TIMEOUT seconds to send a whole request head;
        bytes arriving do not extend it."""
        if self.deadline is not None:
            self.deadline.cancel()
        self.waiting_since = self.loop.time()
        self.deadline = self.loop.call_later(HEADER_TIMEOUT, self._expired)

    def _expired(self) -> None:
        if self.idle() and not self.transport.is_closing():
            self.transport.close()


def run(app: Any, sock: socket.socket) -> None:
    """Serve `app` on the bound, listening `sock` until Ctrl-C (or SIGTERM)."""
    config = uvicorn.Config(
        app,
        http=BoundedProtocol,
        timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=MAX_HEAD,
        timeout_graceful_shutdown=GRACEFUL,
        server_header=False,
        log_level="warning",
        access_log=False,
    )
    # uvicorn stops on Ctrl-C, then raises it again: the stop that was asked for, not an error.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])
