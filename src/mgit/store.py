"""The content-addressed object store: the contract every backend fulfils, and what they
share: encoding on write, decoding with verification on read.

A backend (`LocalStore`: files under `objects/ab/cdef...`; `MemoryStore`: a dict) provides
raw record I/O: `has`, `read_record`, `write_record`, `delete`, `ids`, `stored_size`, `sync`
and `lock`. Everything else is here. Every `get` decodes and re-hashes: an object whose
content does not match its id never leaves this module.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.cache import UNBOUNDED, DecodedCache, Entry
from mgit.errors import CorruptObjectError
from mgit.objectformat import (
    DEFAULT_MAX_DEPTH,
    MAX_DEPTH_LIMIT,
    MAX_RECORD,
    ObjectHeader,
    parse_record,
)
from mgit.objects import Manifest, RecordError, Version, canonical_json, object_hasher, tensor_meta

if TYPE_CHECKING:  # numpy and the codecs load when something is encoded or decoded, not before
    import numpy as np

    from mgit.codecs import Codec
    from mgit.encoding import Encoding

PARSED_RECORDS = 16384  # versions and manifests kept parsed (a few KB each)


@dataclass(frozen=True)
class PutResult:
    oid: str
    kind: str
    stored_size: int
    new: bool
    codec: str
    size: int  # logical bytes
    bases: tuple[str, ...] = ()  # objects it was encoded against (known when it was new)


class ObjectStore:
    """Encoding, hashing and verification shared by every backend."""

    lazy = False  # a lazy clone's store fetches what it lacks from a remote (mgit.lazystore)

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

    def delete(self, oid: str) -> None:
        """Remove an object (backends; they also call `forget`)."""
        raise NotImplementedError

    def forget(self, oid: str) -> None:
        """Drop what was parsed of an object (it is being deleted)."""
        self._parsed_records().pop(oid, None)

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
        return parse_record(oid, self.read_record(oid))[0]

    def promised(self, oid: str) -> tuple[str, ...] | None:
        """For an object not here that the store can fetch when read (a lazy clone's), the
        delta bases it needs; None for any other object (here, or unknown)."""
        return None

    # --- writing ------------------------------------------------------------------------
    def put(self, kind: str, meta: dict[str, Any], data: Any, *, bases: Sequence[str] = (),
            max_depth: int = DEFAULT_MAX_DEPTH, extra: Sequence[list[Codec]] = (), encoding: Encoding | None = None,
            reuse: DecodedCache | None = None) -> PutResult:  # fmt: skip
        """Store `data` (bytes or a uint8 array) unless an object with its id exists.

        With `bases` (tensors this one probably derives from), the smallest of the standalone
        encoding and a delta against each base wins (see mgit.encoding). An `encoding` from
        `encode` is written as it is. `reuse` keeps the bases decoded on the way for the
        next tensors that use them (an int8 copy's weight and its scales share one).
        """
        from mgit.codecs import byte_array, chain_to_list

        buf = byte_array(data)  # flat: a 2-D array would be measured by its rows
        hasher = object_hasher(kind, meta)
        hasher.update(buf)
        oid = hasher.hexdigest()
        if self.has(oid):
            return PutResult(oid, kind, self.stored_size(oid), False, "", buf.nbytes)
        if encoding is None:
            encoding = self.encode(kind, meta, buf, bases=bases, max_depth=max_depth, extra=extra, reuse=reuse)
        header = ObjectHeader(kind, meta, buf.nbytes, chain_to_list(encoding.codecs), encoding.depth)
        stored = self.write_record(oid, [header.to_bytes(), encoding.payload])
        return PutResult(oid, kind, stored, True, header.codec_names, buf.nbytes, tuple(header.bases))

    def encode(self, kind: str, meta: dict[str, Any], data: Any, *, bases: Sequence[str] = (),
               max_depth: int = DEFAULT_MAX_DEPTH, extra: Sequence[list[Codec]] = (),
               reuse: DecodedCache | None = None) -> Encoding:  # fmt: skip
        """What `put` would store for `data`, without writing it (pass it to `put` to write it)."""
        from mgit.codecs import byte_array
        from mgit.encoding import choose_encoding

        cache = reuse if reuse is not None else DecodedCache(UNBOUNDED)  # each base decoded once
        return choose_encoding(kind, meta, byte_array(data), bases=bases, max_depth=max_depth, extra=extra,
                               header=self.header, load=lambda base: self.load_base(base, cache))  # fmt: skip

    def put_tensor(self, dtype: str, shape: tuple[int, ...], data: np.ndarray, *, bases: Sequence[str] = (),
                   max_depth: int = DEFAULT_MAX_DEPTH, encoding: Encoding | None = None,
                   reuse: DecodedCache | None = None) -> PutResult:  # fmt: skip
        return self.put("tensor", tensor_meta(dtype, shape), data, bases=bases, max_depth=max_depth,
                        encoding=encoding, reuse=reuse)  # fmt: skip

    def put_blob(self, data: Any) -> PutResult:
        return self.put("blob", {}, data)

    def put_record(self, kind: str, record: dict[str, Any]) -> PutResult:
        return self.put(kind, {}, canonical_json(record))

    # --- reading ------------------------------------------------------------------------
    def get(self, oid: str, *, reuse: DecodedCache | None = None) -> Entry:
        """Decode an object and check that its content hashes to its id.

        With `reuse`, the object comes from that cache when it is there, and the delta bases
        decoded on the way are kept in it (with the object itself if the cache keeps all).
        Arrays that a cache holds are read-only."""
        if reuse is None:
            return self._decode(oid, None)
        found = reuse.lookup(oid)
        if found is not None:
            return found
        if reuse.keep_all:
            return reuse.get_or_decode(oid, lambda: self._decode(oid, reuse))
        return self._decode(oid, reuse)

    def load_base(self, oid: str, reuse: DecodedCache | None, *, _within: tuple[str, ...] = ()) -> np.ndarray:
        """The decoded bytes of an object that others are coded against (a delta's base, a
        parent tensor an add encodes against), kept in `reuse` for the next that need it."""
        if oid in _within or len(_within) > MAX_DEPTH_LIMIT:
            # Writers never make a cycle or a chain this long: a forged object did.
            raise CorruptObjectError(_within[-1], f"its delta bases form a cycle or a chain over {MAX_DEPTH_LIMIT}")
        if reuse is None:
            return self._decode(oid, None, _within)[1]
        return reuse.get_or_decode(oid, lambda: self._decode(oid, reuse, _within))[1]

    def _decode(self, oid: str, reuse: DecodedCache | None, within: tuple[str, ...] = ()) -> Entry:
        import numpy as np

        from mgit.codecs import (
            CodecContext,
            CodecError,
            chain_from_list,
            decode_chain,
            decoded_bound,
        )

        header, payload = parse_record(oid, self.read_record(oid))

        def base(o: str) -> np.ndarray:
            return self.load_base(o, reuse, _within=(*within, oid))

        try:
            chain = chain_from_list(header.codecs)
            if header.size > decoded_bound(chain, len(payload)):
                raise CodecError(f"it declares {header.size} bytes, more than its {len(payload)} stored bytes can hold")
            data = decode_chain(chain, payload, CodecContext(size=header.size, load_object=base))
        except CodecError as exc:
            raise CorruptObjectError(oid, exc.message) from None
        arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        hasher = object_hasher(header.kind, header.meta)
        hasher.update(arr)
        if hasher.hexdigest() != oid:
            raise CorruptObjectError(oid, "its content does not hash to its id")
        return header, arr

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
            data = _unzstd(oid, bytes(payload), header.size) if header.codecs else bytes(payload)
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
        found = None if fresh else self._parsed_records().get(vid)
        if isinstance(found, Version):
            return found
        try:
            version = Version.from_json(self.get_record(vid, "version"))
        except RecordError as exc:
            raise CorruptObjectError(vid, f"not a valid version record ({exc})") from None
        self._remember(vid, version)
        return version

    def get_manifest(self, oid: str, *, fresh: bool = False) -> Manifest:
        """A manifest record, validated field by field (paths included)."""
        found = None if fresh else self._parsed_records().get(oid)
        if isinstance(found, Manifest):
            return found
        try:
            manifest = Manifest.from_json(self.get_record(oid, "manifest"))
        except RecordError as exc:
            raise CorruptObjectError(oid, f"not a valid manifest ({exc})") from None
        self._remember(oid, manifest)
        return manifest

    def remember(self, oid: str, record: Version | Manifest) -> None:
        """Keep a record parsed and verified elsewhere (a fetch's quarantine) for this store's
        readers; the caller has just kept its object here."""
        self._remember(oid, record)

    def parsed(self, oid: str) -> Version | Manifest | None:
        """The record of `oid` if it was parsed and verified here already."""
        return self._parsed_records().get(oid)

    # Records verified and parsed once are kept (they never change: an id names one content),
    # so walks over thousands of versions (index, fetch, push) read each record once.
    def _parsed_records(self) -> dict[str, Version | Manifest]:
        parsed = self.__dict__.get("_parsed")
        if parsed is None:
            parsed = self.__dict__["_parsed"] = {}
        return parsed  # type: ignore[no-any-return]

    def _remember(self, oid: str, record: Version | Manifest) -> None:
        parsed = self._parsed_records()
        if len(parsed) >= PARSED_RECORDS:
            with suppress(StopIteration, KeyError, RuntimeError):  # another thread got there first
                parsed.pop(next(iter(parsed)))  # the oldest (dicts keep insertion order)
        parsed[oid] = record


def _unzstd(oid: str, payload: bytes, size: int) -> bytes:
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
