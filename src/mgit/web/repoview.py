"""The repository as the pages see it: one `Repo` shared by the request threads (its SQLite
connections are per thread) and snapshots of what whole-repository pages read (the lineage
graph, disk usage, graph pages), kept until a model's head moves.

Writers keep the catalog up to date; the refs are read again at most every few seconds
(`sync_catalog`) so that versions another process added appear too. A mirror of a remote is
brought up to date (`refresh`) at most every REFRESH_EVERY seconds (MGIT_SERVE_REFRESH_EVERY)
while pages are asked for, in the background: no request waits for the remote, and one that
cannot be reached leaves the pages as they were.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from mgit.errors import InvalidOptionError, MgitError
from mgit.lineage.graph import Lineage
from mgit.repo.repository import Repo

T = TypeVar("T")
SYNC_EVERY = 2.0  # seconds between reads of the refs
REFRESH_EVERY = 5.0  # seconds between fetches of a mirror's remote (MGIT_SERVE_REFRESH_EVERY)
KEPT = 16  # derived values kept per state (pages of the graph around several models, ...)


def refresh_every_from_env() -> float:
    """REFRESH_EVERY, or the seconds MGIT_SERVE_REFRESH_EVERY says (more than 0, at most 3600)."""
    raw = os.environ.get("MGIT_SERVE_REFRESH_EVERY", str(REFRESH_EVERY))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise InvalidOptionError(f"MGIT_SERVE_REFRESH_EVERY={raw!r} is not a number of seconds", hint="Use 0.1 to 3600")
    return value


class RepoView:
    def __init__(self, repo: Repo, *, refresh: Callable[[], object] | None = None) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._synced = 0.0
        self._heads: dict[str, str] | None = None
        self._values: OrderedDict[Any, Any] = OrderedDict()
        self._refresh, self._refreshed, self._refreshing = refresh, time.monotonic(), threading.Lock()
        self._refresh_every = refresh_every_from_env() if refresh is not None else REFRESH_EVERY

    def state(self) -> dict[str, str]:
        """Every model's head now; what is kept is dropped when they change."""
        now = time.monotonic()
        if (
            self._refresh is not None
            and now - self._refreshed > self._refresh_every
            and self._refreshing.acquire(False)
        ):
            self._refreshed = now
            threading.Thread(target=self._refresh_now, name="mgit-refresh", daemon=True).start()
        if now - self._synced > SYNC_EVERY:
            self._synced = now
            self.repo.sync_catalog()
        heads = self.repo.catalog.heads()
        with self._lock:
            if heads != self._heads:
                self._heads = heads
                self._values.clear()
            return self._heads

    def kept(self, key: Any, make: Callable[[], T]) -> T:
        """`make()` once per state of the repository (two requests may both make it)."""
        heads = self.state()
        with self._lock:
            if key in self._values:
                self._values.move_to_end(key)
                return self._values[key]  # type: ignore[no-any-return]
        value = make()
        with self._lock:
            if heads is not self._heads:  # the repository changed meanwhile: not kept
                return value
            self._values[key] = value
            while len(self._values) > KEPT:
                self._values.popitem(last=False)
        return value

    def _refresh_now(self) -> None:
        try:
            self._refresh()  # type: ignore[misc]
        except (MgitError, OSError) as exc:
            logging.getLogger("uvicorn.error").warning("the mirror could not be brought up to date: %s", exc)
        finally:
            self._refreshed = time.monotonic()
            self._refreshing.release()

    @property
    def lineage(self) -> Lineage:
        return self.kept("lineage", lambda: self.repo.lineage)
