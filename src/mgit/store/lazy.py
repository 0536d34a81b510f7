"""The objects of a lazy clone: those it has on disk, and the rest fetched from its remote
the first time something reads them (with the delta bases they need), verified and kept.

A lazy clone has every version record and manifest, and a catalog row for every object
(its size, codec and delta bases, from the remote's metadata packs), so `ls`, `log`,
`show`, `lineage` and `du` never touch the network; `checkout`, `diff`, `test run` and
`cascade` fetch exactly what they read. The remote is opened on the first fetch only.

Those rows live in the repository's catalog, a layer above the store: a lazy store is
opened with it as an `ObjectIndex`, the two questions it asks of it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from mgit.errors import (
    MgitError,
    MissingObjectError,
    NotFetchedError,
    ReceivedMissingError,
    RemoteAuthError,
    RemoteError,
    RemoteNotFoundError,
    RemoteUnavailableError,
)
from mgit.store.base import ObjectStore
from mgit.store.local import LocalStore
from mgit.store.objectformat import Expected, ObjectHeader
from mgit.store.remote import RemoteObjects
from mgit.store.transfer import SLACK, TransferStats, fetch_objects

T = TypeVar("T")


class ObjectIndex(Protocol):
    """What a lazy store asks of the index of every object its clone knows of (the
    repository's catalog, `mgit.index.catalog.Catalog`)."""

    def sizes_and_bases(self, oids: Iterable[str]) -> dict[str, tuple[int, tuple[str, ...]]]:
        """{id: (logical size, delta bases)} of the objects among `oids` it has a row for."""
        ...

    def index_objects(self, store: ObjectStore, oids: Iterable[str]) -> None:
        """Rows for these objects from their headers in `store` (they just arrived: the
        remote's pack described them, now the real sizes and codecs are here)."""
        ...


class LazyStore(LocalStore):
    """`root` and the rest as for `LocalStore`; `remote` opens the remote (on the first
    fetch), `index` says what the objects not here are and records those that arrive,
    `jobs` objects are fetched at once."""

    lazy = True

    def __init__(
        self,
        root: Path,
        *,
        remote: Callable[[], RemoteObjects],
        index: ObjectIndex,
        fsync: bool = True,
        lock_path: Path | None = None,
        jobs: int = 2,
    ) -> None:
        super().__init__(root, fsync=fsync, lock_path=lock_path)
        self._open_remote = remote
        self._remote: RemoteObjects | None = None
        self.index = index
        self.jobs = jobs
        self.fetched = TransferStats()
        self._inflight: dict[str, Future[None]] = {}
        self._guard = threading.Lock()

    @property
    def remote(self) -> RemoteObjects:
        with self._guard:
            if self._remote is None:
                self._remote = self._open_remote()
            return self._remote

    def promised(self, oid: str) -> tuple[str, ...] | None:
        if self.has(oid):
            return None
        found = self.index.sizes_and_bases([oid]).get(oid)
        return None if found is None else found[1]

    def _here(self, read: Callable[..., T], oid: str, *args: Any) -> T:
        """`read(oid, *args)` from the local files, fetching the object first if it is not here."""
        try:
            return read(oid, *args)
        except MissingObjectError:
            self.fetch([oid])
            return read(oid, *args)

    def prefetch(self, oid: str, expect: Expected | None) -> None:
        if expect is not None and not self.has(oid):
            self.fetch([oid], expect={oid: expect})

    def read_record(self, oid: str) -> np.ndarray:
        return self._here(super().read_record, oid)

    def read_range(self, oid: str, offset: int, length: int) -> Any:
        return self._here(super().read_range, oid, offset, length)

    def read_bytes(self, oid: str) -> bytes:
        return self._here(super().read_bytes, oid)

    def header(self, oid: str) -> ObjectHeader:
        return self._here(super().header, oid)

    def fetch(self, oids: Iterable[str], *, expect: dict[str, Expected] | None = None) -> TransferStats:
        """Fetch these objects and every base they need that is not here yet, in parallel;
        threads asking for the same object wait for one fetch of it. Each is bounded by what
        the record naming it expects (`expect`: a manifest's entry), else by its catalog row
        (its kind and size, as the manifests or the remote's packs describe it); a base, on
        arrival, by its child."""
        wanted = self.closure_missing(oids)
        if not wanted:
            return TransferStats()
        mine: dict[str, Future[None]] = {}
        waits: list[Future[None]] = []
        with self._guard:
            for oid in wanted:
                if oid in self._inflight:
                    waits.append(self._inflight[oid])
                else:
                    mine[oid] = self._inflight[oid] = Future()
        stats = TransferStats()
        try:
            if mine:
                rows = self.index.sizes_and_bases(mine)
                unknown = [o for o in mine if o not in rows]
                if unknown:  # not in any version this clone knows: nothing to ask the remote for
                    raise MissingObjectError(unknown[0])
                expected = {o: (expect or {}).get(o) or Expected("its catalog row", max_size=rows[o][0]) for o in mine}
                limits = {o: (expected[o].most or 0) + SLACK for o in mine}
                with self.lock():  # gc waits: it removes leftover quarantines
                    stats = self._fetch_from_remote(limits, expected)
                self.index.index_objects(self, list(mine))
        except BaseException as exc:
            self._settle(mine, exc)
            raise
        self._settle(mine, None)
        for w in waits:
            w.result()
        with self._guard:
            self.fetched.add(stats)
        return stats

    def _fetch_from_remote(self, limits: dict[str, int], expected: dict[str, Expected]) -> TransferStats:
        """fetch_objects, with a remote that cannot be reached said as that (the object is not
        fetched yet), not as an object missing from the remote or from this repository."""
        first = next(iter(limits))
        try:
            remote = self.remote
            where = remote.url
        except (RemoteError, OSError) as exc:
            raise NotFetchedError(first, where="of this clone", why=_why(exc)) from None
        try:
            return fetch_objects(remote, self, limits, jobs=self.jobs, expect=expected)
        except (RemoteNotFoundError, RemoteUnavailableError, RemoteAuthError, OSError) as exc:
            raise NotFetchedError(first, where=where, why=_why(exc)) from None
        except ReceivedMissingError as exc:
            try:  # missing from a remote that is there, or is the remote itself gone?
                remote.check()
            except (RemoteError, OSError) as gone:
                raise NotFetchedError(exc.oid, where=where, why=_why(gone), used_by=exc.used_by) from None
            raise

    def _settle(self, mine: dict[str, Future[None]], exc: BaseException | None) -> None:
        with self._guard:
            for oid, future in mine.items():
                del self._inflight[oid]
                if exc is None:
                    future.set_result(None)
                else:
                    future.set_exception(exc)

    def closure_missing(self, oids: Iterable[str]) -> list[str]:
        """These objects and, recursively, their delta bases (from the catalog's rows),
        those not on disk: what a fetch must bring."""
        wanted: dict[str, None] = {}
        stack = [o for o in oids]
        seen: set[str] = set()
        while stack:
            batch = [o for o in dict.fromkeys(stack) if o not in seen]
            stack = []
            seen.update(batch)
            rows = self.index.sizes_and_bases(batch)
            for oid in batch:
                if not self.has(oid):
                    wanted[oid] = None
                    stack.extend(rows.get(oid, (0, ()))[1])
        return list(wanted)


def _why(exc: BaseException) -> str:
    return exc.message if isinstance(exc, MgitError) else (getattr(exc, "strerror", None) or str(exc))
