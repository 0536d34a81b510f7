"""The content-addressed object store: encoding on write, verify-on-read, two backends.

On disk an object is `MGITOBJ\\x01`, a u32 little-endian header length, a JSON header
(`kind`, `meta`, logical `size`, `codecs`: the chain that produced the payload), then the
payload. `ObjectStore` holds everything but raw record I/O, which `LocalStore` (files under
`objects/ab/cdef...`) and `MemoryStore` (a dict, for tests and scratch work) provide. Every
`get` decodes and re-hashes: an object whose content does not match its id never leaves here.
"""

from __future__ import annotations

import json
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mgit.atomicfile import TMP_PREFIX, fsync_dir, write_atomic
from mgit.codecs import (
    AbsmaxScaleCodec,
    ByteplanesCodec,
    CastCodec,
    Codec,
    CodecContext,
    CodecError,
    LowRankCodec,
    PatchCodec,
    PcoCodec,
    QuantizeInt8Codec,
    SubDeltaCodec,
    TransposeCodec,
    XorDeltaCodec,
    ZstdCodec,
    byte_array,
    byte_view,
    chain_from_list,
    chain_to_list,
    decode_chain,
    encode_chain,
)
from mgit.codecs.derived import low_rank_of
from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.formats.safetensors import DTYPES, element_count, is_float, itemsize
from mgit.objects import KINDS, OID_RE, canonical_json, object_hasher, tensor_meta

MAGIC = b"MGITOBJ\x01"
MAX_HEADER = 1 << 20
MAX_RECORD = 256 << 20  # manifests and versions are small; refuse to decode a forged giant
DEFAULT_MAX_DEPTH = 2  # longer chains are cut: checkout decodes every link (benchmarks/chain_depth.py)
MAX_DEPTH_LIMIT = 64  # no writer goes deeper; a header claiming more is forged
# Derived tensors (casts, int8 quantizations and their scales) and patches (pruning) may be
# encoded against a base at the depth bound, one link past it: they end a family (a
# quantized copy of a fine-tune of a new base version), nothing is encoded against them
# (their depth is above the bound), and their decode costs one more base. Without this a
# cascade's rebuilt int8 copy of a rebuilt fine-tune was stored whole (20 MB instead of 34 kB).
LEAF_CODECS = ("cast", "quantize_int8", "absmax_scale", "patch", "transpose")
PREDICTIVE_CODECS = ("cast", "quantize_int8", "absmax_scale", "quantized_delta", "low_rank", "transpose")
UNBOUNDED = 1 << 62  # a DecodedCache budget for a short-lived memo
CHECKOUT_BASES = 512 << 20  # delta bases one checkout keeps for the tensors that share them
SESSION_CACHE_BYTES = 1 << 30  # decoded tensors `Repo.caching` keeps by default
SAMPLE_FROM = 256 << 10  # tensors larger than this choose their encoding on samples
SAMPLE_BYTES = 32 << 10
SAMPLES = 4


@dataclass(frozen=True)
class ObjectHeader:
    kind: str
    meta: dict[str, Any]
    size: int
    codecs: list[dict[str, Any]]
    depth: int = 0  # how many delta bases must be decoded before this object (0: none)

    @property
    def codec_names(self) -> str:
        return "+".join(c["name"] for c in self.codecs) or "raw"

    @property
    def bases(self) -> list[str]:
        """Objects this one is encoded against (they must be kept while it is)."""
        return [c["configuration"]["base"] for c in self.codecs
                if isinstance(c.get("configuration"), dict) and isinstance(c["configuration"].get("base"), str)]  # fmt: skip


@dataclass(frozen=True)
class Encoding:
    """How an object would be stored: its codec chain, the encoded payload, its delta depth."""

    codecs: list[Codec]
    payload: Any
    depth: int


@dataclass(frozen=True)
class PutResult:
    oid: str
    stored_size: int
    new: bool
    codec: str
    size: int  # logical bytes


def _header_bytes(header: ObjectHeader) -> bytes:
    fields = {"kind": header.kind, "meta": header.meta, "size": header.size, "codecs": header.codecs}
    if header.depth:
        fields["depth"] = header.depth
    body = canonical_json(fields)
    return MAGIC + struct.pack("<I", len(body)) + body


def parse_record(oid: str, raw: bytes | memoryview | np.ndarray) -> tuple[ObjectHeader, memoryview]:
    """Split a stored object into its validated header and its payload."""
    view = memoryview(raw)
    if len(view) < len(MAGIC) + 4 or bytes(view[: len(MAGIC)]) != MAGIC:
        raise CorruptObjectError(oid, "not an mgit object (bad magic bytes)")
    (n,) = struct.unpack("<I", view[len(MAGIC) : len(MAGIC) + 4])
    start = len(MAGIC) + 4
    if n > MAX_HEADER or start + n > len(view):
        raise CorruptObjectError(oid, f"header length {n} is out of range")
    try:
        h = json.loads(bytes(view[start : start + n]))
        kind, meta, size, codecs, depth = h["kind"], h["meta"], h["size"], h["codecs"], h.get("depth", 0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptObjectError(oid, f"unreadable header ({exc})") from None
    if kind not in KINDS or not isinstance(meta, dict) or not isinstance(codecs, list):
        raise CorruptObjectError(oid, "malformed header")
    if not isinstance(size, int) or size < 0:
        raise CorruptObjectError(oid, "malformed size")
    if not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH_LIMIT:
        raise CorruptObjectError(oid, f"malformed delta depth {depth!r}")
    if kind == "tensor":
        _check_tensor_meta(oid, meta, size)
    elif kind in ("manifest", "version") and size > MAX_RECORD:
        raise CorruptObjectError(oid, f"a {kind} of {size} bytes is larger than any mgit writes")
    return ObjectHeader(kind, meta, size, codecs, depth), view[start + n :]


def _check_tensor_meta(oid: str, meta: dict[str, Any], size: int) -> None:
    dtype, shape = meta.get("dtype"), meta.get("shape")
    ok = dtype in DTYPES and isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
    if not ok or element_count(tuple(shape)) * itemsize(dtype) != size:
        raise CorruptObjectError(oid, "tensor header does not match its size")


def default_chain(kind: str, meta: dict[str, Any]) -> list[Codec]:
    """How an object is stored when nothing better is known: byte planes + zstd for
    multi-byte floats, zstd otherwise (a higher level for small files and records).

    pcodec would store a base's float32 weights 1.3% smaller (74.7 instead of 75.7 MB for
    MiniLM) but encodes at ~200 MB/s per core against ~500: not worth halving the add speed
    of a model without parents. It is worth it for deltas (`delta_chains`)."""
    if kind == "tensor":
        dtype = meta["dtype"]
        if is_float(dtype) and itemsize(dtype) > 1:
            return [ByteplanesCodec(itemsize=itemsize(dtype)), ZstdCodec(level=1)]
        return [ZstdCodec(level=1)]
    return [ZstdCodec(level=3)]


def delta_chains(base: str, meta: dict[str, Any]) -> list[list[Codec]]:
    """Lossless encodings of a tensor against a base of the same dtype: XOR of the bit
    patterns (followed by the tensor's default chain), their zig-zag difference (followed by
    pcodec on those integers), and a patch of the items that differ (pruning, sparse updates)."""
    tail = default_chain("tensor", meta)
    chains: list[list[Codec]] = [[XorDeltaCodec(base=base), *tail]]
    size = itemsize(meta["dtype"])
    if size in (1, 2, 4, 8):
        # The difference goes to pcodec when it reads the numbers: byte planes + zstd never
        # stored one smaller (on the MiniLM family), and every candidate costs a sampled encode.
        tail = [PcoCodec(dtype=f"<u{size}")] if size > 1 else tail
        chains.append([SubDeltaCodec(base=base, itemsize=size), *tail])
        chains.append([PatchCodec(base=base, itemsize=size), ZstdCodec(level=1)])
    return chains


def derived_chains(base: str, base_meta: dict[str, Any], meta: dict[str, Any]) -> list[list[Codec]]:
    """Encodings of a tensor predicted from a base of another dtype or shape: the transpose
    of a matrix (any dtype); from a float32 base, a cast, a symmetric int8 quantization (per
    row of a matrix, or of the whole tensor) or that quantization's scales."""
    shape, base_shape, dtype = meta["shape"], base_meta["shape"], meta["dtype"]
    tail: list[Codec] = [ZstdCodec(level=1)]
    chains: list[list[Codec]] = []
    if (dtype == base_meta["dtype"] and len(shape) == 2 and shape == base_shape[::-1] and shape != base_shape
            and shape[0] > 0 and shape[1] > 0 and itemsize(dtype) in (1, 2, 4, 8)):  # fmt: skip
        chains.append([TransposeCodec(base=base, rows=base_shape[0], itemsize=itemsize(dtype)), *tail])
    if base_meta["dtype"] != "F32" or not element_count(tuple(base_shape)):
        return chains
    if dtype in ("BF16", "F16") and shape == base_shape:
        chains.append([CastCodec(base=base, to=dtype), *tail])
    if dtype == "I8" and shape == base_shape:
        if len(base_shape) == 2:
            chains.append([QuantizeInt8Codec(base=base, rows=base_shape[0]), *tail])
        chains.append([QuantizeInt8Codec(base=base, rows=1), *tail])  # one scale for the tensor
    if dtype == "F32" and len(base_shape) == 2 and shape == [base_shape[0]]:
        chains.append([AbsmaxScaleCodec(base=base, rows=base_shape[0]), *tail])
    if dtype == "F32" and shape in ([], [1]):
        chains.append([AbsmaxScaleCodec(base=base, rows=1), *tail])
    return chains


def _sample_slices(nbytes: int) -> list[slice]:
    """SAMPLES evenly spaced slices of SAMPLE_BYTES, at offsets aligned to 64 bytes."""
    step = (nbytes - SAMPLE_BYTES) // (SAMPLES - 1)
    return [slice(o, o + SAMPLE_BYTES) for o in (i * step // 64 * 64 for i in range(SAMPLES))]


class DecodedCache:
    """Decoded tensors by object id, within a byte budget, least recently used out first.

    An id is the hash of its content, so an entry never goes stale. Entries are read-only
    arrays shared by every caller. Decoding a delta decodes its base first; a checkout or an
    add that meets the same base again (an int8 copy's weights and their scales, the versions
    of one family checked out in turn) takes it from here instead. Safe across threads: two
    threads that need the same object at once decode it once (`get_or_decode`).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[ObjectHeader, np.ndarray]] = OrderedDict()
        self._pending: dict[str, Future[tuple[ObjectHeader, np.ndarray]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get_or_decode(self, oid: str, decode: Callable[[], tuple[ObjectHeader, np.ndarray]]
                      ) -> tuple[ObjectHeader, np.ndarray]:  # fmt: skip
        """The entry for `oid`, decoded by `decode()` and kept if it is not here. A thread
        that asks while another decodes it waits for that decode (and gets its error)."""
        with self._lock:
            found = self._hit(oid)
            if found is not None:
                return found
            pending = self._pending.get(oid)
            owner = pending is None
            if pending is None:
                pending = self._pending[oid] = Future()
                self.misses += 1
            else:
                self.hits += 1
        if not owner:
            return pending.result()
        try:
            found = decode()
            found[1].flags.writeable = False
            self.put(oid, *found)
        except BaseException as exc:
            with self._lock:
                del self._pending[oid]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._pending[oid]
        pending.set_result(found)
        return found

    def get(self, oid: str) -> tuple[ObjectHeader, np.ndarray] | None:
        with self._lock:
            found = self._hit(oid)
            self.misses += found is None
            return found

    def _hit(self, oid: str) -> tuple[ObjectHeader, np.ndarray] | None:
        """The entry, marked most recently used and counted, or None (under the lock)."""
        found = self._items.get(oid)
        if found is not None:
            self._items.move_to_end(oid)
            self.hits += 1
        return found

    def put(self, oid: str, header: ObjectHeader, arr: np.ndarray) -> None:
        if header.kind != "tensor" or arr.nbytes > self.max_bytes // 2:
            return  # one object may not push out everything else
        arr.flags.writeable = False
        with self._lock:
            if oid in self._items:
                return
            self._items[oid] = (header, arr)
            self._bytes += arr.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._items.popitem(last=False)[1][1].nbytes

    @property
    def nbytes(self) -> int:
        return self._bytes


class ObjectStore:
    """Encoding, hashing and verification shared by every backend."""

    # Decoded tensors kept for reuse (`Repo.caching`), or None: each get decodes afresh.
    cache: DecodedCache | None = None

    # --- backend primitives -------------------------------------------------------------
    def has(self, oid: str) -> bool:
        raise NotImplementedError

    def _write_record(self, oid: str, chunks: list[Any]) -> int:
        raise NotImplementedError

    def _read_record(self, oid: str) -> bytes | np.ndarray:
        raise NotImplementedError

    def delete(self, oid: str) -> None:
        raise NotImplementedError

    def ids(self) -> Iterator[str]:
        raise NotImplementedError

    def stored_size(self, oid: str) -> int:
        raise NotImplementedError

    def sync(self) -> None:
        """Make every object written so far durable (before a ref points to them)."""

    # --- writing ------------------------------------------------------------------------
    def put(self, kind: str, meta: dict[str, Any], data: Any, *, chain: list[Codec] | None = None,
            oid: str | None = None, bases: Sequence[str] = (), max_depth: int = DEFAULT_MAX_DEPTH,
            extra: Sequence[list[Codec]] = (), encoding: Encoding | None = None,
            memo: DecodedCache | None = None) -> PutResult:  # fmt: skip
        """Store `data` (bytes or a uint8 array) unless an object with its id exists.

        With `bases` (tensors this one probably derives from), the smallest of the standalone
        encoding and a delta against each base wins, bases already `max_depth` deltas deep
        excepted. `extra` chains (a quantized delta) compete too when every base they name
        is one of the usable `bases`. An `encoding` from `encode` is written as it is. `memo`
        keeps decoded bases for the next tensors that use them (an int8 copy's weight and
        its scales share one).
        """
        buf = byte_array(data)  # flat: a 2-D array would be measured by its rows
        if oid is None:
            hasher = object_hasher(kind, meta)
            hasher.update(buf)
            oid = hasher.hexdigest()
        if self.has(oid):
            return PutResult(oid, self.stored_size(oid), False, "", buf.nbytes)
        if encoding is None:
            encoding = Encoding(*self._encode(kind, meta, buf, chain, bases, max_depth, extra, memo))
        codecs, payload, depth = encoding.codecs, encoding.payload, encoding.depth
        header = ObjectHeader(kind, meta, buf.nbytes, chain_to_list(codecs), depth)
        stored = self._write_record(oid, [_header_bytes(header), payload])
        return PutResult(oid, stored, True, header.codec_names, buf.nbytes)

    def encode(self, kind: str, meta: dict[str, Any], data: Any, *, bases: Sequence[str] = (),
               max_depth: int = DEFAULT_MAX_DEPTH, extra: Sequence[list[Codec]] = (),
               memo: DecodedCache | None = None) -> Encoding:  # fmt: skip
        """What `put` would store for `data`, without writing it (pass it to `put` to write it)."""
        buf = byte_array(data)  # flat: a 2-D array would be measured by its rows
        return Encoding(*self._encode(kind, meta, buf, None, bases, max_depth, extra, memo))

    def _encode(self, kind: str, meta: dict[str, Any], buf: np.ndarray, chain: list[Codec] | None,
                bases: Sequence[str], max_depth: int, extra: Sequence[list[Codec]],
                memo: DecodedCache | None = None) -> tuple[list[Codec], Any, int]:  # fmt: skip
        """The smallest encoding of `buf` among the candidates, its payload and delta depth."""
        candidates = [default_chain(kind, meta) if chain is None else chain]
        exact: list[list[Codec]] = []  # transforms, tried in full: casts, quantizations, a merged adapter
        depths: dict[str, int] = {}
        matrix_bases: list[str] = []  # same-shape float32 matrices: a merged adapter's parent?
        for base in bases if kind == "tensor" else ():
            try:
                bh = self.header(base)
            except (CorruptObjectError, MissingObjectError):
                continue  # a damaged base is never used; fsck reports it
            if bh.kind != "tensor" or bh.depth > max_depth:
                continue
            leaf = bh.depth == max_depth  # only a leaf link may go one past the bound
            if leaf and (max_depth == 0 or bh.depth + 1 > MAX_DEPTH_LIMIT):
                continue
            depths[base] = bh.depth + 1
            if bh.meta["dtype"] == meta["dtype"]:
                candidates += [c for c in delta_chains(base, meta) if not leaf or c[0].name in LEAF_CODECS]
                if not leaf and meta["dtype"] == "F32" and len(meta["shape"]) == 2 and bh.meta["shape"] == meta["shape"]:
                    matrix_bases.append(base)
            exact += derived_chains(base, bh.meta, meta)
        candidates += [c for c in extra if all(b in depths for b in ObjectHeader(kind, meta, 0, chain_to_list(c)).bases)]
        loaded = memo if memo is not None else DecodedCache(UNBOUNDED)  # each base decoded once

        def load(base: str) -> np.ndarray:
            return self.get_memoized(base, loaded)[1]  # its own bases land in `loaded` too (often the same ones)

        for base in matrix_bases:
            rows = meta["shape"][0]
            if (rank := low_rank_of(buf, load(base), rows)) is not None:
                exact.append([LowRankCodec(base=base, rows=rows, rank=rank), PcoCodec(dtype="<u4")])

        codecs, payload = self._smallest(candidates, exact, buf, load)
        if any(c.name in PREDICTIVE_CODECS for c in codecs):
            # Never trust a prediction: what is written must decode to the content. (Deltas
            # and patches are exact bijections, property-tested; re-decoding them would cost
            # a third of an add.)
            decoded = decode_chain(codecs, payload, CodecContext(buf.nbytes, load))
            if not np.array_equal(byte_array(decoded), buf):
                codecs, payload = self._smallest(candidates[:1], [], buf, load)
        depth = max((depths[b] for b in ObjectHeader(kind, meta, 0, chain_to_list(codecs)).bases), default=0)
        return codecs, payload, depth

    @staticmethod
    def _smallest(candidates: list[list[Codec]], exact: list[list[Codec]], buf: np.ndarray, load: Any
                  ) -> tuple[list[Codec], Any]:  # fmt: skip
        """The chain with the smallest output, and that output (raw if nothing saves a byte).
        Large buffers choose among `candidates` on a few samples, then encode once; `exact`
        chains (their transforms need whole tensors) are always encoded in full, first: when
        one stores the tensor in under half of what the samples promise for the best
        candidate (a cast, a quantization, a merged adapter), that candidate is not encoded."""
        estimate = None
        if buf.nbytes > SAMPLE_FROM and (len(candidates) > 1 or exact):
            slices = _sample_slices(buf.nbytes)

            def sampled(chain: list[Codec]) -> int:
                return sum(len(encode_chain(chain, buf[s], CodecContext(s.stop - s.start, lambda o, s=s: load(o)[s])))
                           for s in slices)  # fmt: skip

            sizes = [sampled(c) for c in candidates]
            pick = min(range(len(candidates)), key=sizes.__getitem__)
            candidates = [candidates[pick]]
            estimate = sizes[pick] * buf.nbytes / sum(s.stop - s.start for s in slices)
        best: tuple[list[Codec], Any] = ([], buf)
        for chain in exact:
            if len(best[1]) * 64 < buf.nbytes:
                break  # a transform already explains it (per-row int8: no need to try per-tensor)
            payload = encode_chain(chain, buf, CodecContext(buf.nbytes, load))
            if len(payload) < len(best[1]):
                best = (chain, payload)
        for chain in candidates:
            if exact and estimate is not None and len(best[1]) < estimate / 2:
                break
            payload = encode_chain(chain, buf, CodecContext(buf.nbytes, load)) if chain else buf
            if len(payload) <= len(best[1]):
                best = (chain, payload)
        return best

    def put_tensor(self, dtype: str, shape: tuple[int, ...], data: np.ndarray, *, bases: Sequence[str] = (),
                   max_depth: int = DEFAULT_MAX_DEPTH, encoding: Encoding | None = None,
                   memo: DecodedCache | None = None) -> PutResult:  # fmt: skip
        return self.put("tensor", tensor_meta(dtype, shape), data, bases=bases, max_depth=max_depth, encoding=encoding,
                        memo=memo)  # fmt: skip

    def put_blob(self, data: Any) -> PutResult:
        return self.put("blob", {}, data)

    def put_record(self, kind: str, record: dict[str, Any]) -> PutResult:
        return self.put(kind, {}, canonical_json(record))

    # --- reading ------------------------------------------------------------------------
    def header(self, oid: str) -> ObjectHeader:
        return parse_record(oid, self._read_record(oid))[0]

    def get(self, oid: str, *, memo: DecodedCache | None = None) -> tuple[ObjectHeader, np.ndarray]:
        """Decode an object and check that its content hashes to its id. `memo` keeps the
        delta bases decoded on the way, for a caller that decodes several objects sharing
        bases. With a `cache`, decoded tensors come from it and go to it. Arrays from either
        are read-only."""
        cache = self.cache
        if cache is not None and (found := cache.get(oid)) is not None:
            return found
        header, payload = parse_record(oid, self._read_record(oid))

        def base(o: str) -> np.ndarray:
            return (self.get(o) if memo is None else self.get_memoized(o, memo))[1]

        try:
            chain = chain_from_list(header.codecs)
            data = decode_chain(chain, payload, CodecContext(size=header.size, load_object=base))
        except CodecError as exc:
            raise CorruptObjectError(oid, exc.message) from None
        arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8)
        hasher = object_hasher(header.kind, header.meta)
        hasher.update(arr)
        if hasher.hexdigest() != oid:
            raise CorruptObjectError(oid, "its content does not hash to its id")
        if cache is not None:
            cache.put(oid, header, arr)
        return header, arr

    def get_memoized(self, oid: str, memo: DecodedCache) -> tuple[ObjectHeader, np.ndarray]:
        """`get` through `memo`: from it, or decoded (its bases too) and kept there (read-only)."""
        return memo.get_or_decode(oid, lambda: self.get(oid, memo=memo))

    def get_record(self, oid: str, kind: str) -> dict[str, Any]:
        header, data = self.get(oid)
        if header.kind != kind:
            raise CorruptObjectError(oid, f"expected a {kind}, found a {header.kind}")
        try:
            record = json.loads(data.tobytes())
        except ValueError:
            raise CorruptObjectError(oid, f"{kind} is not valid JSON") from None
        if not isinstance(record, dict):
            raise CorruptObjectError(oid, f"{kind} is not a JSON object")
        return record


class LocalStore(ObjectStore):
    """Objects as read-only files under `root/ab/cdef...`, written atomically."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = root
        self.fsync = fsync
        self._dirty: set[Path] = set()
        self._lock = threading.Lock()

    def _path(self, oid: str) -> Path:
        if not OID_RE.match(oid):
            raise MissingObjectError(oid)
        return self.root / oid[:2] / oid[2:]

    def has(self, oid: str) -> bool:
        return self._path(oid).exists()

    def _write_record(self, oid: str, chunks: list[Any]) -> int:
        path = self._path(oid)
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self._dirty.add(self.root)
        size = write_atomic(path, chunks, fsync=self.fsync, mode=0o444, sync_dir=False)
        with self._lock:
            self._dirty.add(path.parent)
        return size

    def sync(self) -> None:
        # Flush under the lock: a thread must not return while another still flushes a folder
        # that both wrote into.
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if self.fsync:
                for d in sorted(dirty, key=lambda p: len(p.parts), reverse=True):
                    fsync_dir(d)

    def _read_record(self, oid: str) -> np.ndarray:
        try:
            with open(self._path(oid), "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                buf = np.empty(size, np.uint8)  # numpy rather than bytes: see ZstdCodec.decode
                if fh.readinto(buf) != size:
                    raise CorruptObjectError(oid, "the file changed size while it was read")
                return buf
        except FileNotFoundError:
            raise MissingObjectError(oid) from None

    def header(self, oid: str) -> ObjectHeader:
        """Read only the header (checking references must not read every tensor)."""
        try:
            with open(self._path(oid), "rb") as fh:
                head = fh.read(len(MAGIC) + 4)
                if len(head) == len(MAGIC) + 4:
                    (n,) = struct.unpack("<I", head[len(MAGIC) :])
                    head += fh.read(min(n, MAX_HEADER))
        except FileNotFoundError:
            raise MissingObjectError(oid) from None
        return parse_record(oid, head)[0]

    def delete(self, oid: str) -> None:
        self._path(oid).unlink(missing_ok=True)

    def stored_size(self, oid: str) -> int:
        try:
            return self._path(oid).stat().st_size
        except FileNotFoundError:
            raise MissingObjectError(oid) from None

    def ids(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for sub in sorted(self.root.iterdir()):
            if len(sub.name) == 2 and sub.is_dir():
                for f in sorted(sub.iterdir()):
                    oid = sub.name + f.name
                    if OID_RE.match(oid):
                        yield oid

    def temporary_files(self) -> list[Path]:
        """Leftovers of interrupted writes (only safe to remove with no writer running)."""
        if not self.root.is_dir():
            return []
        return [f for sub in self.root.iterdir() if sub.is_dir() for f in sub.glob(f"{TMP_PREFIX}*")]


class MemoryStore(ObjectStore):
    """Objects in a dict, in the same record format as on disk."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}

    def has(self, oid: str) -> bool:
        return oid in self.records

    def _write_record(self, oid: str, chunks: list[Any]) -> int:
        record = b"".join(bytes(byte_view(c)) for c in chunks)
        self.records[oid] = record
        return len(record)

    def _read_record(self, oid: str) -> bytes:
        try:
            return self.records[oid]
        except KeyError:
            raise MissingObjectError(oid) from None

    def delete(self, oid: str) -> None:
        self.records.pop(oid, None)

    def stored_size(self, oid: str) -> int:
        return len(self._read_record(oid))

    def ids(self) -> Iterator[str]:
        yield from sorted(self.records)


def remove_leftovers(paths: list[Path]) -> int:
    count = 0
    for p in paths:
        try:
            os.unlink(p)
            count += 1
        except FileNotFoundError:
            pass
    return count
