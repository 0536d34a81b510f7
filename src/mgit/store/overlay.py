"""A read-only view of two stores: objects that arrived (a fetch's quarantine) first, then
the repository's own, so a delta's base may be on either side. It records what was read to be
decoded, so a fetch knows which arrivals were verified on the way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.store.base import ObjectStore
from mgit.store.local import LocalStore
from mgit.store.objectformat import ObjectHeader, parse_record

HELD_BYTES = 256 << 20  # records kept in memory as they arrive in packs; past this, written to the quarantine


class OverlayStore(ObjectStore):
    """Reads from the quarantine, then from the repository's store; writes nothing."""

    def __init__(self, quarantine: LocalStore, store: ObjectStore) -> None:
        super().__init__()
        self.quarantine = quarantine
        self.store = store
        self.decoded: set[str] = set()  # every object read to be decoded (and so re-hashed)
        self._held: dict[str, bytes] = {}  # the bytes of records that arrived in packs
        self._held_bytes = 0

    def hold(self, oid: str, raw: bytes) -> bool:
        """Keep `raw` in memory as `oid` (a record from a metadata pack), up to HELD_BYTES in
        all, so that reading, verifying, parsing and keeping it opens no file but its own in
        `objects/`; False past that bound (the caller writes it to the quarantine instead)."""
        if self._held_bytes + len(raw) > HELD_BYTES:
            return False
        self._held[oid] = raw
        self._held_bytes += len(raw)
        return True

    def held(self, oid: str) -> bytes | None:
        """The bytes `hold` keeps for `oid`, if it keeps them."""
        return self._held.get(oid)

    def arrived(self, oid: str) -> bool:
        """Whether `oid` is among what arrived (held in memory or in the quarantine)."""
        return oid in self._held or self.quarantine.has(oid)

    def has(self, oid: str) -> bool:
        return oid in self._held or self.quarantine.has(oid) or self.store.has(oid)

    def read_record(self, oid: str) -> bytes | np.ndarray:
        self.decoded.add(oid)
        if oid in self._held:
            return self._held[oid]
        try:
            return self.quarantine.read_record(oid)
        except MissingObjectError:
            return self.store.read_record(oid)

    tracks_verified = True

    def mark_verified(self, oid: str) -> None:
        self.decoded.add(oid)

    def read_range(self, oid: str, offset: int, length: int) -> Any:
        # Not counted as decoded: a blocked object's base read block by block is not verified.
        if oid in self._held:
            got = self._held[oid][offset : offset + length]
            if len(got) != length:
                raise CorruptObjectError(oid, f"the record ends {length - len(got)} bytes before the block it declares")
            return got
        try:
            return self.quarantine.read_range(oid, offset, length)
        except MissingObjectError:
            return self.store.read_range(oid, offset, length)

    def header(self, oid: str) -> ObjectHeader:
        if oid in self._held:
            return parse_record(oid, self._held[oid])[0]
        try:
            return self.quarantine.header(oid)
        except MissingObjectError:
            return self.store.header(oid)

    def stored_size(self, oid: str) -> int:
        if oid in self._held:
            return len(self._held[oid])
        try:
            return self.quarantine.stored_size(oid)
        except MissingObjectError:
            return self.store.stored_size(oid)
