"""The repository as the pages see it: one `Repo` shared by the request threads (its SQLite
connections are per thread) and snapshots of what whole-repository pages read (the lineage
graph, disk usage, graph pages), kept until a model's head moves.

Writers keep the catalog up to date; the refs are read again at most every few seconds
(`sync_catalog`) so that versions pushed into a bare repository appear too.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from mgit.lineage import Lineage
from mgit.repo import Repo

T = TypeVar("T")
SYNC_EVERY = 2.0  # seconds between reads of the refs
KEPT = 16  # derived values kept per state (pages of the graph around several models, ...)


class RepoView:
    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._synced = 0.0
        self._heads: dict[str, str] | None = None
        self._values: OrderedDict[Any, Any] = OrderedDict()

    def state(self) -> dict[str, str]:
        """Every model's head now; what is kept is dropped when they change."""
        now = time.monotonic()
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

    @property
    def lineage(self) -> Lineage:
        return self.kept("lineage", lambda: self.repo.lineage)
