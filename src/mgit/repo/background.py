"""Checkpoints committed in the background: a training loop hands a snapshot over and trains on
while one thread commits it (`Repo.commit_checkpoint(..., wait=False)`).

A queue of one: a new commit starts only when the one before has finished, so commits keep
their order (each is coded against the checkpoints before it), and at most one snapshot
waits in memory besides the one being committed. The loop's call waits only when the commit
before is still running. A commit that failed is never lost: its exception is raised by the
next call, or by `wait`, or `close`; one that nobody collected is printed when the process
exits. The thread is not a daemon, so a process that ends normally finishes its last commit
first; a killed one leaves its finished commits (each durable when it finished) and none of
the one in flight (an add shows nothing until its ref moves).
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PendingCommit(Generic[T]):
    """A commit running (or run) in the background: `result()` waits for it and gives what
    it returned, or raises what it raised."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self.collected = False  # its error was raised to someone
        self.seconds: float | None = None  # how long the commit itself took, once done

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> T:
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.what} is still being committed")
        if self._error is not None:
            self.collected = True
            raise self._error
        return self._value  # type: ignore[return-value]

    def run(self, work: Callable[[], T]) -> None:
        start = time.perf_counter()
        try:
            self._value = work()
        except BaseException as exc:  # handed to whoever waits next, never lost
            exc.add_note(f"(raised by the background commit of {self.what})")
            self._error = exc
        finally:
            self.seconds = time.perf_counter() - start
            self._done.set()


class BackgroundCommits:
    """One thread at a time commits what `submit` is given, in order (a queue of one)."""

    def __init__(self) -> None:
        self._last: PendingCommit | None = None
        self._lock = threading.Lock()
        atexit.register(self._report_lost)

    def submit(self, what: str, work: Callable[[], T]) -> PendingCommit[T]:
        """Wait for the commit before (raising its error, if it failed and nobody was told),
        then start `work` on a thread of its own and return at once."""
        with self._lock:
            self._collect()
            pending: PendingCommit[T] = PendingCommit(what)
            thread = threading.Thread(target=pending.run, args=(work,), name="mgit-checkpoint", daemon=False)
            thread.start()
            self._last = pending
            return pending

    def wait(self) -> None:
        """Wait for the last commit; raise its error if it failed."""
        with self._lock:
            self._collect()

    def busy(self) -> bool:
        return self._last is not None and not self._last.done()

    def _collect(self) -> None:
        last, self._last = self._last, None
        if last is not None and not last.collected:
            last.result()

    def _report_lost(self) -> None:
        """At exit (after the interpreter joined the commit's thread): an error nobody raised is said."""
        last = self._last
        if last is not None and last.done() and last._error is not None and not last.collected:
            print(f"mgit: {last._error}", file=sys.stderr)
