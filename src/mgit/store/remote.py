"""A remote's objects read through the store contract, read-only (what `fsck` of a remote
reads): every read downloads the object, bounded by the largest object there can be.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from mgit.errors import MissingKeyError, MissingObjectError
from mgit.store.base import ObjectStore

if TYPE_CHECKING:
    import numpy as np

    from mgit.util.parallel import TransferProgress

MAX_OBJECT = 1 << 40  # fsck reads whatever objects a remote holds; the largest tensor it could be


class RemoteObjects(Protocol):
    """What the stores need of a remote's objects (`mgit.remotes.repository.RemoteRepository`
    is one): the store family sits below the remotes that name their records, so it asks for
    this shape rather than importing them."""

    url: str
    pack_threshold: int  # objects stored smaller than this are sent in data packs (0: none)

    def map(self, fn: Any, items: Iterable[Any]) -> list[Any]: ...
    def check(self) -> dict[str, Any]: ...
    def has_object(self, oid: str) -> bool: ...
    def has_objects(self, sizes: Mapping[str, int | None]) -> set[str]: ...
    def read_object(self, oid: str, *, limit: int) -> bytes: ...
    def read_objects_into(
        self, wanted: Mapping[str, tuple[Path, int]], *, progress: TransferProgress | None = None
    ) -> dict[str, int | None]: ...
    def abort_unfinished(self, oids: Iterable[str]) -> int: ...
    def write_object(self, oid: str, data: bytes | Path, *, progress: TransferProgress | None = None) -> None: ...
    def write_packed(self, files: list[tuple[str, Path, int]], *, progress: TransferProgress | None = None) -> int: ...
    def object_ids(self) -> list[str]: ...


class RemoteStore(ObjectStore):
    """A remote's objects read through the store contract (for fsck): every read downloads."""

    def __init__(self, remote: RemoteObjects) -> None:
        super().__init__()
        self.remote = remote

    def has(self, oid: str) -> bool:
        return self.remote.has_object(oid)

    def read_record(self, oid: str) -> np.ndarray:
        import numpy as np

        try:
            return np.frombuffer(self.remote.read_object(oid, limit=MAX_OBJECT), np.uint8)
        except MissingKeyError:
            raise MissingObjectError(oid) from None

    def ids(self) -> Iterator[str]:
        return iter(self.remote.object_ids())

    def stored_size(self, oid: str) -> int:
        return int(self.read_record(oid).size)
