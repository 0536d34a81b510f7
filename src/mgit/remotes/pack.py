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

A reader never holds a pack's content: `read_entries` parses it as it decompresses (from a
file, bounded by a ratio of its size on the wire), and `PackSpool` keeps what it yields on
disk, where a fetch looks up the few entries its versions need.
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import sqlite3
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import blake3
import zstandard

from mgit.errors import ReceivedError
from mgit.store.objects import KINDS, OID_RE, canonical_json

PACK_FORMAT = 1
MAX_PACK = 1 << 30  # decompressed: a pack describes metadata, never tensors
PACK_RATIO = 32  # decompressed bytes per byte on the wire, at most (plus PACK_SLACK): no bomb
PACK_SLACK = 1 << 20
MAX_FETCH_PACKS = 4 << 30  # decompressed, every pack one fetch reads together
MAX_VALUE = 16 << 20  # one record or sketch in a pack; a larger one travels on its own
_CHUNK = 1 << 20
_JSON = json.JSONDecoder()


def decoded_limit(wire_size: int) -> int:
    """The most a pack of `wire_size` bytes may decompress to."""
    return min(MAX_PACK, PACK_RATIO * wire_size + PACK_SLACK)


class _Damaged(Exception):
    """Raised while parsing; the readers turn it into a ReceivedError naming the pack."""


ObjectInfo = tuple[str, str, int, int, str, tuple[str, ...]]  # id, kind, size, stored, codec, bases
Entry = tuple[str, str, Any]  # ("record" | "sketch", id, bytes) or ("object", id, ObjectInfo)


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

    def fits(self) -> bool:
        """Whether a reader takes this pack: it decodes within the ratio, every value within
        MAX_VALUE."""
        if any(len(v) > MAX_VALUE for d in (self.records, self.sketches) for v in d.values()):
            return False
        data = self.to_bytes()[1]
        return zstandard.frame_content_size(data) <= decoded_limit(len(data))


def _refused(pid: str, where: str, why: str) -> ReceivedError:
    return ReceivedError(f"metadata pack {pid[:16]} from {where} {why}", where=where)


def read_entries(pid: str, path: Path, *, where: str, budget: int) -> Iterator[Entry]:
    """The entries of the pack file at `path` (named `pid` on `where`), parsed as they
    decompress. The file must hash to its name and declare a decoded size within
    `decoded_limit` and `budget` (the caller checks `declared_size` first to skip a pack
    over its budget); anything else is a ReceivedError naming the pack."""
    hasher = blake3.blake3()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            hasher.update(chunk)
    if hasher.hexdigest() != pid:
        raise _refused(pid, where, "does not hash to its name")
    declared = declared_size(pid, path, where=where)
    if declared > budget:
        raise _refused(pid, where, f"decodes to {declared} bytes, more than the {budget} this fetch reads")
    try:
        with open(path, "rb") as fh, zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=False) as src:
            yield from _Parser(_Text(src, declared)).pack()
    except (_Damaged, zstandard.ZstdError, ValueError, binascii.Error) as exc:
        raise _refused(pid, where, f"is damaged ({exc})") from None


def declared_size(pid: str, path: Path, *, where: str) -> int:
    """What the pack file at `path` declares it decodes to, refused past `decoded_limit`."""
    wire = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(18)  # the longest zstd frame header
    try:
        declared = zstandard.frame_content_size(head)
    except zstandard.ZstdError as exc:
        raise _refused(pid, where, f"is damaged ({exc})") from None
    if declared < 0:
        raise _refused(pid, where, "does not declare its decoded size")
    if declared > decoded_limit(wire):
        raise _refused(
            pid,
            where,
            f"of {wire} bytes decodes to {declared}, more than the {decoded_limit(wire)} a pack of its size may",
        )
    return declared


class _Text:
    """The decompressed JSON as text, read in chunks, never past `declared` bytes."""

    def __init__(self, src: BinaryIO, declared: int) -> None:
        self.src = src
        self.left = declared
        self.utf8 = codecs.getincrementaldecoder("utf-8")()
        self.buf = ""
        self.pos = 0
        self.eof = False

    def more(self) -> bool:
        """Read the next chunk onto the buffer (dropping what was consumed); False at the end."""
        if self.eof:
            return False
        data = self.src.read(min(_CHUNK, self.left + 1))
        if len(data) > self.left:
            raise _Damaged("it decodes to more than it declares")
        self.left -= len(data)
        self.buf = self.buf[self.pos :] + self.utf8.decode(data, final=not data)
        self.pos = 0
        if not data:
            if self.left:
                raise _Damaged("it decodes to less than it declares")
            self.eof = True
        return True

    def peek(self) -> str:
        """The next character that is not white space ("" at the end)."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\n\r":
                self.pos += 1
            if self.pos < len(self.buf) or not self.more():
                return self.buf[self.pos : self.pos + 1]

    def expect(self, chars: str) -> str:
        ch = self.peek()
        if not ch or ch not in chars:
            raise _Damaged(f"expected {chars!r} at {ch!r}")
        self.pos += 1
        return ch

    def string(self, limit: int) -> str:
        """A JSON string of at most `limit` characters."""
        self.expect('"')
        scan = self.pos  # where the closing quote is looked for next
        while True:
            end = self.buf.find('"', scan)
            if end < 0:
                if len(self.buf) - self.pos > limit:
                    raise _Damaged(f"a string longer than {limit} characters")
                scan, shift = len(self.buf), self.pos
                if not self.more():
                    raise _Damaged("it ends inside a string")
                scan -= shift  # the string now starts the buffer
                continue
            slashes = 0
            while end - 1 - slashes >= self.pos and self.buf[end - 1 - slashes] == "\\":
                slashes += 1
            if slashes % 2 == 0:
                break
            scan = end + 1  # an escaped quote
        raw, self.pos = self.buf[self.pos : end], end + 1
        if len(raw) > limit:
            raise _Damaged(f"a string longer than {limit} characters")
        return raw if "\\" not in raw else str(json.loads(f'"{raw}"'))

    def value(self, limit: int) -> Any:
        """A small JSON value (a number, an object row) of at most `limit` characters."""
        self.peek()
        while True:
            try:
                value, end = _JSON.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                end = -1
            # A number may go on in the next chunk: only a value followed by something is whole.
            if end >= 0 and (end < len(self.buf) or self.eof):
                self.pos = end
                return value
            if len(self.buf) - self.pos > limit or not self.more():
                raise _Damaged("a value that does not parse")


class _Parser:
    """The pack's grammar: one object with the keys format, objects, records and sketches
    (in any order, each once), yielding entries as they are read."""

    def __init__(self, text: _Text) -> None:
        self.text = text

    def pack(self) -> Iterator[Entry]:
        t = self.text
        keys = ("format", "objects", "records", "sketches")
        seen: set[str] = set()
        t.expect("{")
        while t.peek() != "}":
            key = t.string(16)
            if key in seen or key not in keys:
                raise _Damaged(f"unexpected key {key!r}")
            seen.add(key)
            t.expect(":")
            if key == "format":
                if t.value(16) != PACK_FORMAT:
                    raise _Damaged("not a pack of format 1")
            elif key == "objects":
                yield from self.rows()
            else:
                yield from self.values("record" if key == "records" else "sketch")
            if t.peek() == ",":
                t.pos += 1
            elif t.peek() != "}":
                raise _Damaged(f"expected ',' or '}}' at {t.peek()!r}")
        t.pos += 1
        if seen != set(keys):
            raise _Damaged(f"no {', '.join(k for k in keys if k not in seen)}")
        if t.peek():
            raise _Damaged("trailing bytes")

    def rows(self) -> Iterator[Entry]:
        t = self.text
        t.expect("[")
        if t.peek() == "]":
            t.pos += 1
            return
        while True:
            row = _row(t.value(1 << 16))
            yield "object", row[0], row
            if t.expect(",]") == "]":
                return

    def values(self, kind: str) -> Iterator[Entry]:
        t = self.text
        t.expect("{")
        if t.peek() == "}":
            t.pos += 1
            return
        while True:
            key = t.string(64)
            if not OID_RE.match(key):
                raise _Damaged(f"bad {kind} id {key[:70]!r}")
            t.expect(":")
            encoded = t.string(4 * MAX_VALUE // 3 + 4)
            yield kind, key, base64.b64decode(encoded, validate=True)
            if t.expect(",}") == "}":
                return


def _row(value: Any) -> ObjectInfo:
    ok = isinstance(value, list) and len(value) == 6
    if ok:
        oid, kind, size, stored, codec, bases = value
        ok = (
            isinstance(oid, str)
            and bool(OID_RE.match(oid))
            and kind in KINDS
            and isinstance(codec, str)
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (size, stored))
            and isinstance(bases, list)
            and all(isinstance(b, str) and OID_RE.match(b) for b in bases)
        )
    if not ok:
        raise _Damaged(f"bad object row {value!r}"[:120])
    return oid, kind, size, stored, codec, tuple(bases)


class PackSpool:
    """The entries of the packs one fetch reads, on disk (a SQLite file in its quarantine):
    memory holds none of them; `records`, `rows` and `sketches` look up the few wanted."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=OFF")
        self.db.execute("PRAGMA synchronous=OFF")
        for table in ("record", "sketch"):
            self.db.execute(f"CREATE TABLE IF NOT EXISTS {table} (id TEXT PRIMARY KEY, data BLOB NOT NULL)")
        self.db.execute("CREATE TABLE IF NOT EXISTS object (id TEXT PRIMARY KEY, info TEXT NOT NULL)")

    def add(self, entries: Iterable[Entry]) -> None:
        """Keep these entries (one transaction; the first of an id wins)."""
        batch: dict[str, list[tuple[str, Any]]] = {"record": [], "sketch": [], "object": []}

        def flush() -> None:
            for kind, rows in batch.items():
                self.db.executemany(f"INSERT OR IGNORE INTO {kind} VALUES (?, ?)", rows)
                rows.clear()

        self.db.execute("BEGIN")
        try:
            for n, (kind, oid, value) in enumerate(entries, 1):  # (one statement a thousand entries)
                batch[kind].append((oid, json.dumps(value) if kind == "object" else value))
                if n % 1024 == 0:
                    flush()
            flush()
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _lookup(self, table: str, oids: Iterable[str]) -> list[tuple[str, Any]]:
        wanted = json.dumps(sorted(set(oids)))
        return list(
            self.db.execute(
                f"SELECT id, {'info' if table == 'object' else 'data'} FROM {table} "
                "WHERE id IN (SELECT value FROM json_each(?))",
                (wanted,),
            )
        )

    def records(self, oids: Iterable[str]) -> dict[str, bytes]:
        return {o: bytes(d) for o, d in self._lookup("record", oids)}

    def sketches(self, vids: Iterable[str]) -> dict[str, bytes]:
        return {v: bytes(d) for v, d in self._lookup("sketch", vids)}

    def rows(self, oids: Iterable[str]) -> dict[str, ObjectInfo]:
        out = {}
        for oid, info in self._lookup("object", oids):
            o, kind, size, stored, codec, bases = json.loads(info)
            out[oid] = (o, kind, size, stored, codec, tuple(bases))
        return out

    def close(self) -> None:
        self.db.close()
