"""The stored form of an object: `MGITOBJ\\x01`, a u32 little-endian header length, a JSON
header (`kind`, `meta`, logical `size`, `codecs`: the chain that produced the payload,
`depth` for a delta, `blocks` for content coded in independent blocks), then the payload.
docs/format.md specifies it.

Every field read from a file is checked here before anything trusts it: the magic, the header
length against the bytes present, the kind, a tensor's size against its dtype and shape, the
delta depth, and a record's size against the largest record any writer makes; and, before
anything is decoded, the header against what the record that names the object expects of it
(`Expected`: the manifest for a file or a tensor, the child for a delta base).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mgit.errors import CorruptObjectError
from mgit.formats.dtypes import DTYPES, element_count, itemsize, shape_fits
from mgit.store.objects import KINDS, FileEntry, Manifest, TensorEntry, canonical_json, tensor_meta

MAGIC = b"MGITOBJ\x01"
PREFIX = len(MAGIC) + 4  # magic and the header length
MAX_HEADER = 1 << 20
MAX_RECORD = 256 << 20  # manifests and versions are small; refuse to decode a forged giant
MAX_DEPTH_LIMIT = 64  # no writer goes deeper; a header claiming more is forged
DEFAULT_MAX_DEPTH = 2  # writers cut longer chains: checkout decodes every link (benchmarks/chain_depth.py)
BLOCK_BYTES = 4 << 20  # writers code content larger than this in independent blocks of this size
MIN_BLOCK, MAX_BLOCK = 64 << 10, 256 << 20  # the block sizes a reader accepts (powers of two)
FRAME = struct.Struct("<I")  # before each block of a blocked payload: its stored length
MAX_BASES = 64  # delta bases one object may name (a merge of 64 models names 64)
READ_FACTOR, READ_FLOOR = 64, 256 << 20  # one read decodes at most 64 x its object's size + 256 MiB in all
MAX_READ_DECODES = 4096  # and at most this many objects (each base once): 64 bases x a chain of 64


@dataclass(frozen=True)
class ObjectHeader:
    """A stored object's header: kind, metadata, logical size, codec chain, delta depth, block size."""

    kind: str
    meta: dict[str, Any]
    size: int
    codecs: list[dict[str, Any]]
    depth: int = 0  # how many delta bases must be decoded before this object (0: none)
    blocks: int = 0  # the content's bytes per independently coded block (0: coded whole)

    @property
    def block_count(self) -> int:
        """How many blocks the payload holds (1 for an object coded whole)."""
        return max(1, -(-self.size // self.blocks)) if self.blocks else 1

    def block_span(self, k: int) -> tuple[int, int]:
        """The content's bytes [start, stop) that block k codes."""
        start = k * self.blocks
        return start, min(self.size, start + self.blocks)

    @property
    def codec_names(self) -> str:
        return "+".join(c["name"] for c in self.codecs) or "raw"

    @property
    def bases(self) -> list[str]:
        """Objects this one is encoded against (they must be kept while it is)."""
        out: list[str] = []
        for c in self.codecs:
            config = c.get("configuration")
            if not isinstance(config, dict):
                continue
            if isinstance(config.get("base"), str):
                out.append(config["base"])
            if isinstance(config.get("bases"), list):  # a codec of several bases (weighted_sum)
                out += [b for b in config["bases"] if isinstance(b, str) and b not in out]
        return out

    def to_bytes(self) -> bytes:
        """The magic, the header length and the header: what precedes the payload."""
        fields = {"kind": self.kind, "meta": self.meta, "size": self.size, "codecs": self.codecs}
        if self.depth:
            fields["depth"] = self.depth
        if self.blocks:
            fields["blocks"] = self.blocks
        body = canonical_json(fields)
        return MAGIC + struct.pack("<I", len(body)) + body


@dataclass(frozen=True)
class Expected:
    """What the record that names an object says of it, checked against the object's header
    before anything of it is decoded: a manifest gives a file's or a tensor's kind and exact
    size (and a tensor's dtype and shape); a delta gives its base's kind (a tensor) and the
    most bytes its read may decode."""

    by: str  # who expects it, for the error: "its manifest", "its child 0123abcd"
    kind: str | None = None
    size: int | None = None  # exactly this many bytes
    meta: dict[str, Any] | None = None
    max_size: int | None = None  # at most this many bytes

    @property
    def most(self) -> int | None:
        """The most bytes the object may hold (None: the expectation does not say)."""
        return self.size if self.size is not None else self.max_size

    def check(self, oid: str, header: ObjectHeader) -> None:
        if self.kind is not None and header.kind != self.kind:
            raise CorruptObjectError(oid, f"it is a {header.kind} where {self.by} names a {self.kind}")
        if self.meta is not None and header.meta != self.meta:
            raise CorruptObjectError(
                oid, f"it is a {_tensor(header.meta)} tensor where {self.by} names a {_tensor(self.meta)}"
            )
        if self.size is not None and header.size != self.size:
            raise CorruptObjectError(oid, f"it declares {header.size} bytes where {self.by} gives {self.size}")
        if self.max_size is not None and header.size > self.max_size:
            raise CorruptObjectError(
                oid, f"it declares {header.size} bytes, more than {self.by} allows ({self.max_size})"
            )


def expected_by(manifest: Manifest) -> dict[str, Expected]:
    """What a manifest expects of each object it names: a blob file's exact size, a
    safetensors header's (the file less its tensors), each tensor's dtype, shape and size."""
    out: dict[str, Expected] = {}
    for f in manifest.files:
        for oid, want in file_objects_expected(f).items():
            out.setdefault(oid, want)
    return out


def file_objects_expected(f: FileEntry) -> dict[str, Expected]:
    """What one file's manifest entry expects of each object it names: its own object
    (`file_expected`) and each of its tensors (`tensor_expected`)."""
    out = {f.object: file_expected(f)}
    for t in f.tensors:
        out.setdefault(t.object, tensor_expected(t))
    return out


def file_expected(f: FileEntry) -> Expected:
    """What a manifest entry expects of its file's object: the file's bytes less its tensors
    (a safetensors file's object is its header)."""
    return Expected("its manifest", "blob", max(f.size - sum(t.nbytes for t in f.tensors), 0))


def base_expected(child: str, header: ObjectHeader) -> Expected:
    """What a delta expects of each of its bases: a tensor that a read of the delta may
    decode (READ_FACTOR x its size + READ_FLOOR in all). (That the deepest is exactly one
    less deep than the delta is checked on the delta, which it is the fault of.)"""
    return Expected(f"its child {child[:16]}", "tensor", max_size=READ_FACTOR * header.size + READ_FLOOR)


def blob_expected(size: int) -> Expected:
    return Expected("its manifest", "blob", size)


def tensor_expected(t: TensorEntry) -> Expected:
    """What a manifest's tensor entry expects of its object: a tensor of that dtype and
    shape, and so of that many bytes. `Expected.check` is the one test of a stored tensor
    against its entry: a read (`ObjectStore.get`), a checkout and fsck all apply it."""
    return Expected("its manifest", "tensor", t.nbytes, tensor_meta(t.dtype, t.shape))


def _tensor(meta: dict[str, Any]) -> str:
    return f"{meta.get('dtype')}{meta.get('shape')}"


def header_length(oid: str, prefix: bytes) -> int:
    """The header length that the first PREFIX bytes of an object declare (checked)."""
    if len(prefix) < PREFIX or prefix[: len(MAGIC)] != MAGIC:
        raise CorruptObjectError(oid, "not an mgit object (bad magic bytes)")
    (n,) = struct.unpack("<I", prefix[len(MAGIC) : PREFIX])
    if n > MAX_HEADER:
        raise CorruptObjectError(oid, f"header length {n} is out of range")
    return n


def parse_record(oid: str, raw: Any) -> tuple[ObjectHeader, memoryview]:
    """Split a stored object into its validated header and its payload."""
    view = memoryview(raw)
    n = header_length(oid, bytes(view[:PREFIX]))
    if PREFIX + n > len(view):
        raise CorruptObjectError(oid, f"header length {n} is out of range")
    try:
        h = json.loads(bytes(view[PREFIX : PREFIX + n]))
        kind, meta, size, codecs, depth = h["kind"], h["meta"], h["size"], h["codecs"], h.get("depth", 0)
        blocks = h.get("blocks", 0)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptObjectError(oid, f"unreadable header ({exc})") from None
    if kind not in KINDS or not isinstance(meta, dict) or not isinstance(codecs, list):
        raise CorruptObjectError(oid, "malformed header")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise CorruptObjectError(oid, "malformed size")
    if not isinstance(depth, int) or not 0 <= depth <= MAX_DEPTH_LIMIT:
        raise CorruptObjectError(oid, f"malformed delta depth {depth!r}")
    if blocks != 0 and not (
        isinstance(blocks, int)
        and not isinstance(blocks, bool)
        and MIN_BLOCK <= blocks <= MAX_BLOCK
        and blocks & (blocks - 1) == 0
    ):
        raise CorruptObjectError(oid, f"malformed block size {blocks!r}")
    if kind == "tensor":
        _check_tensor_meta(oid, meta, size)
    elif kind in ("manifest", "version") and size > MAX_RECORD:
        raise CorruptObjectError(oid, f"a {kind} of {size} bytes is larger than any mgit writes")
    header = ObjectHeader(kind, meta, size, codecs, depth, blocks)
    bases = header.bases
    if bases and kind != "tensor":
        raise CorruptObjectError(oid, f"a {kind} names delta bases (only tensors are coded against others)")
    if len(bases) > MAX_BASES:
        raise CorruptObjectError(oid, f"it names {len(bases)} delta bases, more than {MAX_BASES}")
    if bool(bases) != bool(depth):
        raise CorruptObjectError(oid, f"its delta depth {depth} does not fit its {len(bases)} delta bases")
    return header, view[PREFIX + n :]


def frame_spans(
    oid: str, header: ObjectHeader, payload_size: int, read_at: Callable[[int, int], Any]
) -> list[tuple[int, int]]:
    """Where each stored block of a blocked payload lies: (start, length) from the payload's
    start, read through `read_at(offset, n)`, checked to be exactly as many as the content
    needs and to fill the payload."""
    spans, at = [], 0
    for _ in range(header.block_count):
        if at + FRAME.size > payload_size:
            raise CorruptObjectError(oid, "its payload ends inside a block's length")
        (n,) = FRAME.unpack(bytes(read_at(at, FRAME.size)))
        at += FRAME.size
        if at + n > payload_size:
            raise CorruptObjectError(oid, "a block runs past the end of its payload")
        spans.append((at, n))
        at += n
    if at != payload_size:
        raise CorruptObjectError(oid, f"{payload_size - at} bytes follow its last block")
    return spans


def _check_tensor_meta(oid: str, meta: dict[str, Any], size: int) -> None:
    dtype, shape = meta.get("dtype"), meta.get("shape")
    ok = dtype in DTYPES and isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
    if not ok or not shape_fits(tuple(shape), dtype) or element_count(tuple(shape)) * itemsize(dtype) != size:
        raise CorruptObjectError(oid, "tensor header does not match its size")
