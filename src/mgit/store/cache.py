"""Decoded tensors kept for reuse, by object id, within a byte budget.

Decoding a delta decodes its base first. A checkout or an add that meets the same base again
(an int8 copy's weights and their scales, the shards of one checkpoint, the members of a
family checked out in turn) takes it from a `DecodedCache` instead of decoding it again.
An id is the hash of its content, so an entry never goes stale. `ObjectStore.get(oid,
reuse=cache)` is the one way to use one.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (concurrent.futures loads logging: `mgit ls` opens a store, never decodes)
    from concurrent.futures import Future

UNBOUNDED = 1 << 62  # the budget of a short-lived cache (one pair of a diff)
CHECKOUT_BASES = 192 << 20  # delta bases one checkout or add keeps for the tensors that share them
SESSION_CACHE_BYTES = 256 << 20  # decoded tensors `Repo.caching` keeps by default

Entry = tuple[Any, Any]  # (ObjectHeader, the decoded bytes: a read-only numpy array)


class DecodedCache:
    """Decoded objects by id, least recently used out first once over `max_bytes`.

    What it keeps is its own policy: every cache keeps the delta bases decoded through it;
    one made with `keep_all` (a session, a diff of two sides) also keeps the objects asked
    for themselves. Entries are read-only arrays shared by every caller. Safe across
    threads: two threads that need the same object at once decode it once.
    """

    def __init__(self, max_bytes: int, *, keep_all: bool = False, planned: bool = False) -> None:
        self.max_bytes = max_bytes
        self.keep_all = keep_all
        # A planned cache (one checkout's) is told how often each base will be used, keeps a
        # base only while uses remain, and releases it at its last.
        self._uses: dict[str, int] | None = {} if planned else None
        self._items: OrderedDict[str, Entry] = OrderedDict()
        self._pending: dict[str, Future[Entry]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def expect(self, uses: dict[str, int]) -> None:
        """For a planned cache: these objects will be asked for so many times more (a no-op
        for any other cache)."""
        if self._uses is not None:
            with self._lock:
                for oid, n in uses.items():
                    self._uses[oid] = self._uses.get(oid, 0) + n

    def lookup(self, oid: str) -> Entry | None:
        """The entry for `oid` if it is here (marked most recently used), else None."""
        with self._lock:
            found = self._hit(oid)
            if found is not None:
                self._used(oid)
            return found

    def _hit(self, oid: str) -> Entry | None:
        """`lookup` under the lock."""
        found = self._items.get(oid)
        if found is not None:
            self._items.move_to_end(oid)
            self.hits += 1
        return found

    def _used(self, oid: str) -> None:
        """One planned use of `oid` done (under the lock): at the last, it is released."""
        if self._uses is None or oid not in self._uses:
            return
        left = self._uses[oid] - 1
        if left > 0:
            self._uses[oid] = left
            return
        del self._uses[oid]
        dropped = self._items.pop(oid, None)
        if dropped is not None:
            self._bytes -= dropped[1].nbytes

    def get_or_decode(self, oid: str, decode: Callable[[], Entry]) -> Entry:
        """The entry for `oid`, decoded by `decode()` and kept if it is not here. A thread
        that asks while another decodes it waits for that decode (and gets its error)."""
        with self._lock:
            found = self._hit(oid)
            if found is not None:
                self._used(oid)
                return found
            pending = self._pending.get(oid)
            owner = pending is None
            if pending is None:
                from concurrent.futures import Future

                pending = self._pending[oid] = Future()
                self.misses += 1
            else:
                self.hits += 1
        if not owner:
            found = pending.result()
            with self._lock:
                self._used(oid)
            return found
        try:
            found = decode()
            self.put(oid, found)
        except BaseException as exc:
            with self._lock:
                del self._pending[oid]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._pending[oid]
            self._used(oid)
        pending.set_result(found)
        return found

    def put(self, oid: str, entry: Entry) -> None:
        """Keep a decoded object (a tensor no larger than half the budget), read-only."""
        arr = entry[1]
        arr.flags.writeable = False
        if entry[0].kind != "tensor" or arr.nbytes > self.max_bytes // 2:
            return  # one object may not push out everything else
        with self._lock:
            if oid in self._items or (self._uses is not None and self._uses.get(oid, 0) < 2):
                return  # a planned cache keeps what will be asked for again
            self._items[oid] = entry
            self._bytes += arr.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1].nbytes

    def __contains__(self, oid: str) -> bool:
        with self._lock:
            return oid in self._items

    @property
    def nbytes(self) -> int:
        return self._bytes
