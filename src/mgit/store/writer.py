"""How every object store writes an object: hash its content, find it already there or choose
the smallest codec chain (`mgit.store.codec_policy`), code it (block by block when it is large)
and write its record. `ObjectStore` (mgit.store.base) is built on this; what it relies on of the
store (the backend primitives, headers, block tables) is declared below for readers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.store.cache import UNBOUNDED, DecodedCache
from mgit.store.decoding import BaseReader, BlockTable, framed
from mgit.store.objectformat import DEFAULT_MAX_DEPTH, MAX_READ_DECODES, READ_FACTOR, READ_FLOOR, ObjectHeader
from mgit.store.objects import canonical_json, object_hasher, tensor_meta

if TYPE_CHECKING:  # numpy and the codecs load when something is encoded, not before
    import numpy as np

    from mgit.codecs import Codec
    from mgit.store.codec_policy import Encoding


@dataclass(frozen=True)
class PutResult:
    """What a put wrote (or found stored): the id, kind, sizes, whether it is new, codec chain, bases."""

    oid: str
    kind: str
    stored_size: int
    new: bool
    codec: str
    size: int  # logical bytes
    bases: tuple[str, ...] = ()  # objects it was encoded against (known when it was new)


class ObjectWriter:
    """The writing half of `ObjectStore`: put, encode, and what a write may be coded against."""

    if TYPE_CHECKING:  # provided by ObjectStore and its backends
        block_bytes: int

        def has(self, oid: str) -> bool: ...
        def stored_size(self, oid: str) -> int: ...
        def write_record(self, oid: str, chunks: list[Any]) -> int: ...
        def promised(self, oid: str) -> tuple[str, ...] | None: ...
        def header(self, oid: str) -> ObjectHeader: ...
        def block_table(self, oid: str) -> BlockTable: ...

    def existing(self, oid: str, kind: str, size: int) -> PutResult | None:
        """What a put of an object with this id would find: the object here, or one a lazy
        clone fetches when read (not written again: coded here anew, it could name as its
        delta base an object whose stored form names it). Every delta base a writer is
        offered is here or promised, so past this check none is the object itself."""
        if self.has(oid):
            return PutResult(oid, kind, self.stored_size(oid), False, "", size)
        if self.promised(oid) is not None:
            return PutResult(oid, kind, 0, False, "", size)
        return None

    def put(
        self,
        kind: str,
        meta: dict[str, Any],
        data: Any,
        *,
        bases: Sequence[str] = (),
        max_depth: int = DEFAULT_MAX_DEPTH,
        extra: Sequence[list[Codec]] = (),
        encoding: Encoding | None = None,
        reuse: DecodedCache | None = None,
    ) -> PutResult:
        """Store `data` (bytes or a uint8 array) unless an object with its id exists.

        With `bases` (tensors this one probably derives from), the smallest of the standalone
        encoding and a delta against each base wins (see mgit.store.codec_policy). An `encoding` from
        `encode` is written as it is. `reuse` keeps the bases decoded on the way for the
        next tensors that use them (an int8 copy's weight and its scales share one).
        """
        from mgit.codecs import byte_array

        buf = byte_array(data)  # flat: a 2-D array would be measured by its rows
        hasher = object_hasher(kind, meta)
        hasher.update(buf)
        oid = hasher.hexdigest()
        found = self.existing(oid, kind, buf.nbytes)
        if found is not None:
            return found
        bases_read = BaseReader(self, reuse if reuse is not None else DecodedCache(UNBOUNDED))
        if encoding is None:
            encoding = self.encode(kind, meta, buf, bases=bases, max_depth=max_depth, extra=extra, reuse=bases_read)
        frames = None
        if encoding.deferred:  # coded here one block at a time, as they are written
            count = -(-buf.nbytes // encoding.blocks)
            frames = (self.encode_block(encoding, buf, k, bases_read) for k in range(count))
        return self.put_encoded(oid, kind, meta, buf.nbytes, encoding, frames)

    def put_encoded(
        self,
        oid: str,
        kind: str,
        meta: dict[str, Any],
        size: int,
        encoding: Encoding,
        frames: Iterable[Any] | None = None,
    ) -> PutResult:
        """Write an object whose id and encoding are known (its id is not computed again).
        A blocked encoding's coded blocks come from `frames` in order when they are coded as
        they are written (a writer coding them in parallel), else from its payload."""
        from mgit.codecs import chain_to_list

        header = ObjectHeader(kind, meta, size, chain_to_list(encoding.codecs), encoding.depth, encoding.blocks)
        if encoding.blocks:
            stored = self.write_record(oid, framed(header, encoding.payload if frames is None else frames))
        else:
            stored = self.write_record(oid, [header.to_bytes(), encoding.payload])
        return PutResult(oid, kind, stored, True, header.codec_names, size, tuple(header.bases))

    def encode_block(self, encoding: Encoding, buf: np.ndarray, k: int, bases: BaseReader) -> bytes:
        """Block k of a blocked encoding of `buf`."""
        from mgit.store.codec_policy import block_encode

        return block_encode(encoding.codecs, buf, encoding.blocks, k, lambda o, a, b: bases.range(o, a, b, use=True))

    def encode(
        self,
        kind: str,
        meta: dict[str, Any],
        data: Any,
        *,
        bases: Sequence[str] = (),
        max_depth: int = DEFAULT_MAX_DEPTH,
        extra: Sequence[list[Codec]] = (),
        reuse: DecodedCache | BaseReader | None = None,
        blocks: bool = True,
    ) -> Encoding:
        """What `put` would store for `data`, without writing it (pass it to `put` to write it).
        A blocked encoding's blocks are coded when it is written (`blocks=False`: coded whole,
        its payload at hand to compare)."""
        from mgit.codecs import byte_array
        from mgit.store.codec_policy import choose_encoding

        read = reuse if isinstance(reuse, BaseReader) else BaseReader(self, reuse or DecodedCache(UNBOUNDED))
        buf = byte_array(data)
        bases = [b for b in bases if self.affordable(b, buf.nbytes)]
        return choose_encoding(
            kind,
            meta,
            buf,
            bases=bases,
            max_depth=max_depth,
            extra=extra,
            header=self.header,
            load=read.whole,
            load_range=read.range,
            block_bytes=self.block_bytes if blocks else 0,
        )

    def affordable(self, base: str, size: int) -> bool:
        """Whether content of `size` bytes may be coded against `base`: a read of it would
        decode the base and the bases behind it (each once) within the read bound, so what a
        writer makes a reader never refuses (a 4-byte scale is not coded against a 1 GB
        weight). A damaged base is never used (fsck reports it)."""
        budget = READ_FACTOR * size + READ_FLOOR - size
        seen, stack = set(), [base]
        try:
            while stack and budget >= 0:
                oid = stack.pop()
                if oid not in seen:
                    seen.add(oid)
                    header = self.block_table(oid).header
                    budget -= header.size
                    stack += header.bases
        except (CorruptObjectError, MissingObjectError):
            return False
        return budget >= 0 and len(seen) < MAX_READ_DECODES

    def put_tensor(
        self,
        dtype: str,
        shape: tuple[int, ...],
        data: np.ndarray,
        *,
        bases: Sequence[str] = (),
        max_depth: int = DEFAULT_MAX_DEPTH,
        encoding: Encoding | None = None,
        reuse: DecodedCache | None = None,
    ) -> PutResult:
        return self.put(
            "tensor", tensor_meta(dtype, shape), data, bases=bases, max_depth=max_depth, encoding=encoding, reuse=reuse
        )

    def put_blob(self, data: Any) -> PutResult:
        return self.put("blob", {}, data)

    def put_record(self, kind: str, record: dict[str, Any]) -> PutResult:
        return self.put(kind, {}, canonical_json(record))
