"""The content-addressed object store: the contract every backend fulfils, and what they
share: encoding on write, decoding with verification on read.

A backend (`LocalStore`: files under `objects/ab/cdef...`; `MemoryStore`: a dict) provides
raw record I/O: `has`, `read_record`, `read_range`, `write_record`, `delete`, `ids`,
`stored_size`, `sync` and `lock`. Everything else is here, but for writing (`put`, `encode`:
`mgit.store.writer`, reached through `ObjectStore` as ever). Every `get` decodes and re-hashes:
an object whose content does not match its id never leaves this module, except to a caller
that says it checks a digest of its own over what it builds (checkout: `get(verify=False)`,
`decode_block`), which then names the damaged object with `explain` when that digest fails.
Content over a block is coded and decoded block by block (docs/format.md, "Blocks").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from mgit.errors import CorruptObjectError
from mgit.store.cache import DecodedCache, Entry
from mgit.store.decoding import BlockTable, ReadBudget, Witness, check_frames, unzstd
from mgit.store.objectformat import (
    BLOCK_BYTES,
    PREFIX,
    Expected,
    ObjectHeader,
    base_expected,
    frame_spans,
    header_length,
    parse_record,
)
from mgit.store.objects import Manifest, RecordError, Version, object_hasher
from mgit.store.writer import ObjectWriter, PutResult

__all__ = ["ObjectStore", "PutResult"]  # PutResult: where callers have always imported it from

if TYPE_CHECKING:  # numpy and the codecs load when something is encoded or decoded, not before
    import numpy as np


R = TypeVar("R", Version, Manifest)

PARSED_RECORDS = 16384  # versions and manifests kept parsed (a few KB each)
BLOCK_TABLES = 4096  # where the blocks of recently read blocked objects lie


class ObjectStore(ObjectWriter):
    """Encoding (`ObjectWriter`), hashing and verification shared by every backend."""

    lazy = False  # a lazy clone's store fetches what it lacks from a remote (mgit.store.lazy)
    tracks_verified = False  # wants `mark_verified` for bases verified on the way (a fetch's overlay)
    block_bytes = BLOCK_BYTES  # larger content is coded in blocks of this size (when its chain allows)

    def __init__(self) -> None:
        """What every store keeps of the objects it read; it takes no arguments (a backend's
        own constructor takes what it needs: a folder, a remote) and each backend calls it
        first. Records verified and parsed once are kept, since they never change (an id
        names one content): walks over thousands of versions (index, fetch, push) read each
        record once. So are the block tables of recently read blocked objects."""
        self._parsed: dict[str, Version | Manifest] = {}
        self._tables: dict[str, BlockTable] = {}

    # --- backend primitives -------------------------------------------------------------
    def has(self, oid: str) -> bool:
        raise NotImplementedError

    def read_record(self, oid: str) -> bytes | np.ndarray:
        """The stored bytes of an object, unchecked (MissingObjectError if absent)."""
        raise NotImplementedError

    def write_record(self, oid: str, chunks: list[Any]) -> int:
        """Store the record of an object under its id; return its stored size."""
        raise NotImplementedError

    def read_bytes(self, oid: str) -> bytes:
        """`read_record` as bytes (small records: version and manifest records)."""
        return bytes(memoryview(self.read_record(oid)))

    def read_range(self, oid: str, offset: int, length: int) -> Any:
        """Bytes [offset, offset + length) of an object's stored record, unchecked (backends
        on files read just those)."""
        return memoryview(self.read_record(oid))[offset : offset + length]

    def delete(self, oid: str) -> None:
        """Remove an object (backends; they also call `forget`)."""
        raise NotImplementedError

    def forget(self, oid: str) -> None:
        """Drop what was parsed of an object (it is being deleted)."""
        self._parsed.pop(oid, None)
        self._tables.pop(oid, None)

    def ids(self) -> Iterator[str]:
        raise NotImplementedError

    def stored_size(self, oid: str) -> int:
        raise NotImplementedError

    def sync(self) -> None:
        """Make every object written so far durable (before a ref points to them)."""

    def lock(self, *, exclusive: bool = False) -> AbstractContextManager[Any]:
        """Held shared by writers, exclusively by gc, so that gc never deletes objects that
        a writer has written but no ref reaches yet."""
        return nullcontext()

    def temporary_files(self) -> list[Path]:
        """Leftovers of interrupted writes (only safe to remove with no writer running)."""
        return []

    def header(self, oid: str) -> ObjectHeader:
        """An object's header, checked (read alone, not the payload after it)."""
        return self._stored_header(oid)[0]

    def _stored_header(self, oid: str) -> tuple[ObjectHeader, int]:
        """An object's checked header and where its payload starts."""
        prefix = bytes(self.read_range(oid, 0, PREFIX))
        start = PREFIX + header_length(oid, prefix)
        return parse_record(oid, prefix + bytes(self.read_range(oid, PREFIX, start - PREFIX)))[0], start

    def block_table(self, oid: str, expect: Expected | None = None) -> BlockTable:
        """Where the blocks of an object lie, read (from its header and the blocks' lengths,
        not its payload) once and kept; its header checked against `expect` (see `get`)."""
        tables = self._tables
        found = tables.get(oid)
        if found is None:
            self.prefetch(oid, expect)
        if found is not None:
            if expect is not None:
                expect.check(oid, found.header)
            return found
        header, start = self._stored_header(oid)
        if expect is not None:
            expect.check(oid, header)
        spans = []
        if header.blocks:
            spans = frame_spans(
                oid, header, self.stored_size(oid) - start, lambda at, n: self.read_range(oid, start + at, n)
            )
        if len(tables) >= BLOCK_TABLES:
            with suppress(StopIteration, KeyError, RuntimeError):
                tables.pop(next(iter(tables)))
        table = tables[oid] = BlockTable(header, start, spans)
        return table

    def mark_verified(self, oid: str) -> None:
        """A base verified while another object was decoded: a blocked base all of whose
        blocks a verified decode went through, and whose blocks hash to its id (only called
        where `tracks_verified`)."""

    def promised(self, oid: str) -> tuple[str, ...] | None:
        """For an object not here that the store can fetch when read (a lazy clone's), the
        delta bases it needs; None for any other object (here, or unknown)."""
        return None

    # --- reading ------------------------------------------------------------------------
    def prefetch(self, oid: str, expect: Expected | None) -> None:
        """Bring `oid` here now if this store fetches what it lacks (a lazy clone's), bounded
        by what the record that names it expects; any other store has it or not."""

    def get(
        self, oid: str, *, reuse: DecodedCache | None = None, verify: bool = True, expect: Expected | None = None
    ) -> Entry:
        """Decode an object and check that its content hashes to its id.

        With `reuse`, the object comes from that cache when it is there, and the delta bases
        decoded on the way are kept in it (with the object itself if the cache keeps all).
        Arrays that a cache holds are read-only. `verify=False` skips the hash of the object
        itself (its bases are verified as ever) for a caller that checks what it builds of
        it against a digest, as checkout does; such an object is never kept in `reuse`.
        `expect` is what the record naming the object says of it (`objectformat.expected_by`:
        its manifest's entry), checked against its header before anything is decoded."""
        self.prefetch(oid, expect)
        found = reuse.lookup(oid) if reuse is not None else None
        if found is None and verify and reuse is not None and reuse.keep_all:
            found = reuse.get_or_decode(oid, lambda: self._decode(oid, reuse, None, expect=expect))
        if found is not None:
            if expect is not None:
                expect.check(oid, found[0])
            return found
        return self._decode(oid, reuse, None, verify=verify, expect=expect)

    def load_base(self, oid: str, reuse: DecodedCache | None, *, _read: ReadBudget | None = None) -> np.ndarray:
        """The decoded bytes of an object that others are coded against (a delta's base, a
        parent tensor an add encodes against), kept in `reuse` for the next that need it and,
        within one read, decoded once however many of the objects on the way name it."""
        found = _read.whole.get(oid) if _read is not None else None
        if found is not None:
            return found

        def decode() -> Entry:
            return self._decode(oid, reuse, _read)

        arr = (decode() if reuse is None else reuse.get_or_decode(oid, decode))[1]
        if _read is not None:
            _read.whole[oid] = arr
        return arr

    def _decode(
        self,
        oid: str,
        reuse: DecodedCache | None,
        read: ReadBudget | None,
        *,
        verify: bool = True,
        expect: Expected | None = None,
    ) -> Entry:
        from mgit.codecs.buffers import scratch

        header, payload = parse_record(oid, self.read_record(oid))
        if expect is not None:
            expect.check(oid, header)
        read = read if read is not None else ReadBudget(oid, header.size)
        read.charge(oid, header.size)
        self._check_bases(oid, header, read)
        witness = Witness() if verify and header.blocks and self.tracks_verified else None
        if header.blocks:
            spans = frame_spans(oid, header, len(payload), lambda at, n: payload[at : at + n])
            check_frames(oid, header, spans)  # every block within what its frame can hold, before allocating
            arr = scratch(header.size)
            for k, (at, n) in enumerate(spans):
                start, stop = header.block_span(k)
                read.blocks.clear()  # the bases' blocks k are used by block k alone: not kept past it
                arr[start:stop] = self._decode_chain(oid, header, payload[at : at + n], k, reuse, read, witness)
            read.blocks.clear()
        else:
            arr = self._decode_chain(oid, header, payload, None, reuse, read)
        if verify:
            hasher = object_hasher(header.kind, header.meta)
            hasher.update(arr)
            if hasher.hexdigest() != oid:
                if header.blocks:  # its bases, decoded block by block unverified, may be to blame
                    self.explain(header.bases)
                raise CorruptObjectError(oid, "its content does not hash to its id")
            for base in witness.verified(self) if witness else ():
                self.mark_verified(base)
        return header, arr

    def _check_bases(self, oid: str, header: ObjectHeader, read: ReadBudget) -> None:
        """A delta's bases are tensors, each of a depth below its own (so a read goes at most
        `header.depth` bases down; a writer makes it exactly one more than the deepest, and
        `prune-run`, coding a base again in place, may leave it more); their sizes are charged
        to the read when they are decoded."""
        if not header.bases:
            return
        found = {base: self.block_table(base).header for base in header.bases}
        deepest = max(h.depth for h in found.values())
        if deepest >= header.depth:
            raise CorruptObjectError(oid, f"it declares delta depth {header.depth}, its deepest base has {deepest}")
        expect = base_expected(oid, header)
        for base, h in found.items():
            expect.check(base, h)

    def _decode_chain(
        self,
        oid: str,
        header: ObjectHeader,
        data: Any,
        k: int | None,
        reuse: DecodedCache | None,
        read: ReadBudget,
        witness: Witness | None = None,
    ) -> np.ndarray:
        """The content coded in `data`: all of it (k None) or its block k."""
        import numpy as np

        from mgit.codecs import (
            CodecContext,
            CodecError,
            chain_from_list,
            decode_chain,
            decoded_bound,
        )

        size = header.size if k is None else header.block_span(k)[1] - header.block_span(k)[0]

        def base(o: str) -> np.ndarray:
            if k is None:
                return self.load_base(o, reuse, _read=read)
            return self.base_block(o, k, header.blocks, reuse, read, witness)

        try:
            chain = chain_from_list(header.codecs)
            if size > decoded_bound(chain, len(data)):
                raise CodecError(f"it declares {size} bytes, more than its {len(data)} stored bytes can hold")
            out = decode_chain(chain, data, CodecContext(size=size, load_object=base))
        except CodecError as exc:
            raise CorruptObjectError(oid, exc.message) from None
        return out if isinstance(out, np.ndarray) else np.frombuffer(out, np.uint8)

    def decode_block(
        self,
        oid: str,
        k: int,
        *,
        reuse: DecodedCache | None = None,
        expect: Expected | None = None,
        _read: ReadBudget | None = None,
        _witness: Witness | None = None,
    ) -> np.ndarray:
        """Block k of a blocked object's content, decoded but not verified: the caller checks
        what it builds of the blocks against a digest (a checkout, the file's). Its bases'
        blocks are decoded alike, block k of each, so memory stays a few blocks."""
        self.prefetch(oid, expect)
        table = self.block_table(oid, expect)
        start, stop = table.header.block_span(k)
        read = _read if _read is not None else ReadBudget(oid, table.header.size)
        read.charge(oid, stop - start)
        self._check_bases(oid, table.header, read)
        at, n = table.spans[k]
        return self._decode_chain(
            oid, table.header, self.read_range(oid, table.start + at, n), k, reuse, read, _witness
        )

    def base_block(
        self,
        oid: str,
        k: int,
        block_bytes: int,
        reuse: DecodedCache | None,
        read: ReadBudget | None = None,
        witness: Witness | None = None,
    ) -> np.ndarray:
        """Bytes [k B, (k + 1) B) of a base's content (fewer at its end; none past it): its
        block k when it is coded in blocks of the same size, else a slice of it whole."""
        header = self.block_table(oid).header
        if header.blocks != block_bytes:
            return self.load_base(oid, reuse, _read=read)[k * block_bytes : (k + 1) * block_bytes]
        if k >= header.block_count or not header.size:
            import numpy as np

            return np.empty(0, np.uint8)
        block = read.blocks.get((oid, k)) if read is not None else None
        if block is None:
            block = self.decode_block(oid, k, reuse=reuse, _read=read, _witness=witness)
            if read is not None:
                read.blocks[(oid, k)] = block
            if witness is not None:
                witness.saw(oid, header, k, block)
        return block

    def explain(self, oids: Iterable[str]) -> None:
        """Verify these objects (and so their bases), raising for the first damaged one: what
        a reader that skipped per-object checks does when its own digest does not match."""
        for oid in oids:
            self.get(oid)

    def get_record(self, oid: str, kind: str) -> dict[str, Any]:
        """A version or manifest record as JSON, verified against its id. Records are coded
        by zstd alone (or stored raw), which is read here without numpy or the codecs, so
        that commands reading only records (log, show) start fast."""
        raw = self.read_bytes(oid)
        header, payload = parse_record(oid, raw)
        if header.kind != kind:
            raise CorruptObjectError(oid, f"expected a {kind}, found a {header.kind}")
        if header.codecs and [c.get("name") for c in header.codecs] != ["zstd"]:
            data = self.get(oid)[1].tobytes()  # not as writers code records: the general path
        else:
            data = unzstd(oid, bytes(payload), header.size) if header.codecs else bytes(payload)
            hasher = object_hasher(header.kind, header.meta)
            hasher.update(data)
            if hasher.hexdigest() != oid:
                raise CorruptObjectError(oid, "its content does not hash to its id")
        try:
            record = json.loads(data)
        except ValueError:
            raise CorruptObjectError(oid, f"{kind} is not valid JSON") from None
        if not isinstance(record, dict):
            raise CorruptObjectError(oid, f"{kind} is not a JSON object")
        return record

    def get_version(self, vid: str, *, fresh: bool = False) -> Version:
        """A version record, validated field by field (`fresh`: read and verified again
        even if parsed before, as fsck and gc want)."""
        return self._parsed_record(vid, Version, "version", "a valid version record", fresh=fresh)

    def get_manifest(self, oid: str, *, fresh: bool = False) -> Manifest:
        """A manifest record, validated field by field (paths included)."""
        return self._parsed_record(oid, Manifest, "manifest", "a valid manifest", fresh=fresh)

    def _parsed_record(self, oid: str, cls: type[R], kind: str, what: str, *, fresh: bool) -> R:
        found = None if fresh else self._parsed.get(oid)
        if isinstance(found, cls):
            return found
        try:
            record = cls.from_json(self.get_record(oid, kind))
        except RecordError as exc:
            raise CorruptObjectError(oid, f"not {what} ({exc})") from None
        self._remember(oid, record)
        return record

    def remember(self, oid: str, record: Version | Manifest) -> None:
        """Keep a record parsed and verified elsewhere (a fetch's quarantine) for this store's
        readers; the caller has just kept its object here."""
        self._remember(oid, record)

    def parsed(self, oid: str) -> Version | Manifest | None:
        """The record of `oid` if it was parsed and verified here already."""
        return self._parsed.get(oid)

    def _remember(self, oid: str, record: Version | Manifest) -> None:
        parsed = self._parsed
        if len(parsed) >= PARSED_RECORDS:
            with suppress(StopIteration, KeyError, RuntimeError):  # another thread got there first
                parsed.pop(next(iter(parsed)))  # the oldest (dicts keep insertion order)
        parsed[oid] = record
