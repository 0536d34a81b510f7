"""Metadata packs: what a push tells a remote about the versions it sent, in one file, so
that a clone learns a repository's history in a few requests instead of one per record.

A pack is zstd-compressed canonical JSON (docs/format.md, "Metadata packs"):

    {"format": 1,
     "records":  {"<id>": "<base64 of the object file>", ...},   version and manifest records
     "objects":  [["<id>", kind, size, stored_size, codec, ["<base id>", ...]], ...],
     "sketches": {"<version id>": "<base64 of its parent-inference sketch>", ...}}

`records` hold object files byte for byte, so they are verified against their ids like any
object that arrives; `objects` describe every object the sent versions need (for `du` of a
lazy clone, and to fetch a version's objects with their bases without reading them first);
`sketches` spare a lazy clone decoding tensors it does not have for `lineage suggest`.
The rows and sketches are hints, never trusted with data: a wrong row costs a refused
fetch, never a wrong byte. A pack's name is the blake3 of its bytes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import blake3
import zstandard

from mgit.errors import RemoteError
from mgit.objects import KINDS, OID_RE, canonical_json

PACK_FORMAT = 1
MAX_PACK = 1 << 30  # decompressed: a pack describes metadata, never tensors

class _Damaged(Exception):
    """Raised while parsing; `from_bytes` turns it into a RemoteError naming the pack."""


ObjectInfo = tuple[str, str, int, int, str, tuple[str, ...]]  # id, kind, size, stored, codec, bases


@dataclass
class MetadataPack:
    records: dict[str, bytes] = field(default_factory=dict)
    objects: list[ObjectInfo] = field(default_factory=list)
    sketches: dict[str, bytes] = field(default_factory=dict)

    def to_bytes(self) -> tuple[str, bytes]:
        """(its id, its bytes)."""
        body = {
            "format": PACK_FORMAT,
            "records": {k: base64.b64encode(v).decode() for k, v in sorted(self.records.items())},
            "objects": [[o, k, s, st, c, list(b)] for o, k, s, st, c, b in sorted(self.objects)],
            "sketches": {k: base64.b64encode(v).decode() for k, v in sorted(self.sketches.items())},
        }
        data = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(canonical_json(body))
        return blake3.blake3(data).hexdigest(), data

    @classmethod
    def from_bytes(cls, pid: str, data: bytes, *, where: str) -> MetadataPack:
        """Parse and check a pack read from `where`; a damaged one is a RemoteError."""
        if blake3.blake3(data).hexdigest() != pid:
            raise RemoteError(f"pack {pid[:16]} on {where} does not hash to its name")
        try:
            declared = zstandard.frame_content_size(data)
            if declared < 0 or declared > MAX_PACK:
                raise RemoteError(f"pack {pid[:16]} on {where} declares {declared} bytes")
            body = json.loads(zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_PACK))
            if not isinstance(body, dict) or body.get("format") != PACK_FORMAT:
                raise _Damaged("not a pack of format 1")
            return cls(_records(body["records"]), [_row(r) for r in body["objects"]], _records(body["sketches"]))
        except RemoteError:
            raise
        except (_Damaged, zstandard.ZstdError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RemoteError(f"pack {pid[:16]} on {where} is damaged ({exc})") from None


def _records(value: Any) -> dict[str, bytes]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and OID_RE.match(k) for k in value):
        raise _Damaged("bad record map")
    return {k: base64.b64decode(v, validate=True) for k, v in value.items()}


def _row(value: Any) -> ObjectInfo:
    oid, kind, size, stored, codec, bases = value
    ok = (isinstance(oid, str) and OID_RE.match(oid) and kind in KINDS and isinstance(codec, str)
          and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (size, stored))
          and isinstance(bases, list) and all(isinstance(b, str) and OID_RE.match(b) for b in bases))  # fmt: skip
    if not ok:
        raise _Damaged(f"bad object row {value!r}"[:120])
    return oid, kind, size, stored, codec, tuple(bases)
