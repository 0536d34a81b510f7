"""Advisory file locks (flock) with a bounded wait.

The kernel drops an flock when its holder dies, so a SIGKILLed writer never leaves a stale
lock behind: no lock-breaking heuristics needed. Shared locks let many writers add objects at
once while `gc` takes the exclusive one.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from mgit.errors import LockTimeoutError

LOCK_TIMEOUT = float(os.environ.get("MGIT_LOCK_TIMEOUT", "60"))  # seconds a writer waits for a lock


class FileLock:
    """`with FileLock(path, what="model 'bert'"):` holds an flock on `path` (created if needed)."""

    def __init__(self, path: Path, *, what: str, shared: bool = False, timeout: float | None = None) -> None:
        self.path = path
        self.what = what
        self.shared = shared
        self.timeout = LOCK_TIMEOUT if timeout is None else timeout
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # (its folder, made on first use: a thousand refs locked, one mkdir)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        mode = (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        start, delay = time.monotonic(), 0.002
        while True:
            try:
                fcntl.flock(fd, mode)
                self._fd = fd
                return
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited >= self.timeout:
                    os.close(fd)
                    raise LockTimeoutError(self.what, waited) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.1)

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()
