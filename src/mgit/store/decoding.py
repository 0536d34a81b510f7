"""What decoding an object takes, apart from the store that holds it: the budget of one read
(objects and bytes decoded, bounded before anything is allocated), the witness that hashes
blocked bases as they pass, the decoded bases a writer offers its encoder (`BaseReader`), and
the record framing of blocked objects (docs/format.md, "Blocks").
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mgit.errors import CorruptObjectError
from mgit.store.cache import DecodedCache
from mgit.store.objectformat import (
    FRAME,
    MAX_READ_DECODES,
    MAX_RECORD,
    READ_FACTOR,
    READ_FLOOR,
    ObjectHeader,
)
from mgit.store.objects import object_hasher
from mgit.util.faults import crash_point

if TYPE_CHECKING:  # numpy loads when something is decoded, not before
    import numpy as np

    from mgit.store.base import ObjectStore


@dataclass(frozen=True)
class BlockTable:
    """A stored object's header and, for a blocked one, where its payload starts in the
    record and where each coded block lies from there."""

    header: ObjectHeader
    start: int
    spans: list[tuple[int, int]]


class Witness:
    """The blocked bases one verified decode goes through, each hashed block by block as it
    passes in order: a base all of whose blocks went by and that hashes to its id is verified
    too (a fetch's check then need not decode it again)."""

    def __init__(self) -> None:
        self._running: dict[str, list[Any]] = {}  # base -> [hasher, the next block it wants]

    def saw(self, oid: str, header: ObjectHeader, k: int, block: Any) -> None:
        entry = self._running.get(oid)
        if entry is None and k == 0:
            entry = self._running[oid] = [object_hasher(header.kind, header.meta), 0]
        if entry is not None and entry[1] == k:
            entry[0].update(block)
            entry[1] += 1

    def verified(self, store: ObjectStore) -> Iterator[str]:
        for oid, (hasher, seen) in self._running.items():
            if seen == store.block_table(oid).header.block_count and hasher.hexdigest() == oid:
                yield oid


class ReadBudget:
    """One read of an object: the bases it decoded (each once, so a DAG of bases costs its
    objects, not its paths: whole ones, and block k of those coded in the same blocks while
    block k is decoded), and how many objects and bytes it decoded, both bounded before
    anything is allocated (docs/format.md: at most MAX_READ_DECODES objects and READ_FACTOR
    times the object's size plus READ_FLOOR bytes)."""

    def __init__(self, oid: str, size: int) -> None:
        self.oid = oid
        self.budget = READ_FACTOR * size + READ_FLOOR
        self.decodes = self.bytes = 0
        self.whole: dict[str, np.ndarray] = {}
        self.blocks: dict[tuple[str, int], np.ndarray] = {}

    def charge(self, oid: str, size: int) -> None:
        """Count a decode of `size` bytes, before anything of it is allocated."""
        self.decodes += 1
        self.bytes += size
        if self.decodes > MAX_READ_DECODES:
            raise CorruptObjectError(self.oid, f"reading it decodes more than {MAX_READ_DECODES} objects")
        if self.bytes > self.budget:
            what = "it declares" if oid == self.oid else f"its delta base {oid[:16]} declares"
            raise CorruptObjectError(self.oid, f"{what} {size} bytes: its read would decode more than {self.budget}")


def check_frames(oid: str, header: ObjectHeader, spans: list[tuple[int, int]]) -> None:
    """Each block of a blocked object no larger than its frame can decode to."""
    from mgit.codecs import CodecError, chain_from_list, decoded_bound

    try:
        chain = chain_from_list(header.codecs)
    except CodecError as exc:
        raise CorruptObjectError(oid, exc.message) from None
    for k, (_, n) in enumerate(spans):
        start, stop = header.block_span(k)
        if stop - start > decoded_bound(chain, n):
            raise CorruptObjectError(
                oid, f"block {k} declares {stop - start} bytes, more than its {n} stored bytes can hold"
            )


class BaseReader:
    """The decoded bases of the objects one writer encodes: whole (kept in a `DecodedCache`)
    or, for a base coded in blocks of the store's block size, the block asked for; blocks
    decoded to judge samples are kept until the block's encoding uses them."""

    def __init__(self, store: ObjectStore, cache: DecodedCache) -> None:
        self.store = store
        self.cache = cache
        self._blocks: dict[tuple[str, int], np.ndarray] = {}

    def whole(self, oid: str) -> np.ndarray:
        return self.store.load_base(oid, self.cache)

    def range(self, oid: str, start: int, stop: int, *, use: bool = False) -> np.ndarray:
        """Bytes [start, stop) of a base's content. `use`: the last time this block is
        needed (a block's encoding), so it is not kept."""
        size = self.store.block_bytes
        k = start // size
        if self.store.block_table(oid).header.blocks != size or (stop - 1) // size != k:
            return self.whole(oid)[start:stop]
        block = self._blocks.pop((oid, k), None) if use else self._blocks.get((oid, k))
        if block is None:
            block = self.store.base_block(oid, k, size, self.cache)
            if not use:
                self._blocks[(oid, k)] = block
        return block[start - k * size : stop - k * size]


def framed(header: ObjectHeader, frames: Iterable[Any]) -> Iterator[Any]:
    """A blocked object's record: the header, then each coded block after its length."""
    yield header.to_bytes()
    for frame in frames:
        yield FRAME.pack(len(frame))
        yield frame
        crash_point("block-written")


def unzstd(oid: str, payload: bytes, size: int) -> bytes:
    """A record's zstd frame, bounded by the size its header declares (itself bounded)."""
    import zstandard

    if size > MAX_RECORD:
        raise CorruptObjectError(oid, f"a record of {size} bytes is larger than any mgit writes")
    try:
        data = zstandard.ZstdDecompressor().decompress(payload, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise CorruptObjectError(oid, f"zstd data does not decode: {exc}") from None
    if len(data) != size:
        raise CorruptObjectError(oid, f"decoded {len(data)} bytes where {size} were expected")
    return data
