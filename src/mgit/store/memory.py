"""Objects in a dict, in the same record format as on disk: for tests, scratch work (the
original side of a lossy gate) and anything that must not touch a disk."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from mgit.codecs import byte_view
from mgit.errors import MissingObjectError
from mgit.store.base import ObjectStore


class MemoryStore(ObjectStore):
    def __init__(self) -> None:
        super().__init__()
        self.records: dict[str, bytes] = {}

    def has(self, oid: str) -> bool:
        return oid in self.records

    def write_record(self, oid: str, chunks: list[Any]) -> int:
        record = b"".join(bytes(byte_view(c)) for c in chunks)
        self.records[oid] = record
        return len(record)

    def read_record(self, oid: str) -> bytes:
        try:
            return self.records[oid]
        except KeyError:
            raise MissingObjectError(oid) from None

    def delete(self, oid: str) -> None:
        self.forget(oid)
        self.records.pop(oid, None)

    def stored_size(self, oid: str) -> int:
        return len(self.read_record(oid))

    def ids(self) -> Iterator[str]:
        yield from sorted(self.records)
