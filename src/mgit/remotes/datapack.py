"""Data packs: the small objects a push sends, many in one remote object with an index, so that
a push of N small objects makes O(N / pack size) requests and a read takes one of them out
with a ranged GET (docs/format.md, "Data packs"):

    packs/<id>.objpack   object files one after the other, byte for byte as stored; <id> is
                         the blake3 of the pack's bytes
    packs/<id>.objidx    {"format": 1, "pack": "<id>", "size": N,
                          "objects": [["<object id>", offset, length], ...]}   (by offset)

A pusher writes the pack, then its index: a push killed between the two leaves a pack that
no index names (remote gc removes it), never an index naming bytes that are not there. Each
index is immutable and speaks of its own pack only, so the remote's index of which pack holds
which object is the union of the index files: two pushes at once write different files and
no entry is ever lost (there is nothing shared to compare-and-swap); an object two pushes
packed is found in either pack.

Nothing an index says is trusted: it is refused whole, in one line naming it, when it is not
the index of the pack its name says, when an entry lies outside the pack, overlaps another,
or is longer than the object may be (the reader's limit, checked before a byte is asked for).
What a range brings is an object file like any other, verified against its id before use;
a reader that takes a whole pack checks that it hashes to its name.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import blake3

from mgit.errors import ReceivedError
from mgit.store.objects import OID_RE

INDEX_FORMAT = 1
PACK_THRESHOLD = 4 << 20  # objects stored smaller than this travel in packs (a remote's config may say otherwise)
PACK_TARGET = 64 << 20  # a pack is closed once it holds this much (Xet's xorbs are 64 MB)
MAX_PACK = 1 << 32  # what an index may say its pack holds
MAX_INDEX = 64 << 20  # an index's own size: ~100 bytes an entry
GAP = 256 << 10  # wanted entries this close in one pack are read in one range, the bytes between thrown away
MAX_RANGE = 64 << 20  # the most one ranged read brings
_CHUNK = 1 << 20

Location = tuple[str, int, int]  # (pack id, offset, length)


def pack_key(pid: str) -> str:
    return f"packs/{pid}.objpack"


def index_key(pid: str) -> str:
    return f"packs/{pid}.objidx"


def pack_of_index(key: str) -> str | None:
    """The pack id an index key names, or None if `key` is not a data pack's index."""
    name = key.removeprefix("packs/")
    if name == key or not name.endswith(".objidx"):
        return None
    pid = name.removesuffix(".objidx")
    return pid if OID_RE.match(pid) else None


@dataclass
class PackIndex:
    """What a pack holds: `entries` of (object id, offset, length), by offset."""

    pid: str
    size: int
    entries: list[tuple[str, int, int]] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        body = {"format": INDEX_FORMAT, "pack": self.pid, "size": self.size, "objects": [list(e) for e in self.entries]}
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def parse(cls, pid: str, data: bytes, *, where: str) -> PackIndex:
        """The index of pack `pid` read from `where`, checked whole (a ReceivedError naming it)."""

        def refuse(why: str) -> ReceivedError:
            return ReceivedError(f"the index of data pack {pid[:16]} on {where} {why}", where=where)

        try:
            body = json.loads(data)
        except (ValueError, UnicodeDecodeError):
            raise refuse("is not JSON") from None
        if not isinstance(body, dict) or set(body) != {"format", "pack", "size", "objects"}:
            raise refuse("is not an index")
        if body["format"] != INDEX_FORMAT:
            raise refuse(f"has format {body['format']!r}, not {INDEX_FORMAT}")
        if body["pack"] != pid:
            raise refuse(f"names another pack ({str(body['pack'])[:16]!r})")
        size, rows = body["size"], body["objects"]
        if not _count(size) or size > MAX_PACK or not isinstance(rows, list):
            raise refuse(f"says its pack holds {str(size)[:20]} bytes")
        entries, end = [], 0
        for row in rows:
            ok = isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and bool(OID_RE.match(row[0]))
            if not ok or not _count(row[1]) or not _count(row[2]):
                raise refuse(f"has a bad entry {str(row)[:80]!r}")
            oid, offset, length = row
            if offset < end:
                raise refuse(f"has entries that overlap or are out of order (at {oid[:16]})")
            end = offset + length
            if end > size:
                raise refuse(f"puts {oid[:16]} at {offset}+{length}, past the pack's {size} bytes")
            entries.append((oid, offset, length))
        return cls(pid, size, entries)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def groups(items: Iterable[tuple[str, int]], target: int = PACK_TARGET) -> list[list[str]]:
    """Object ids ({id, stored size}) in packs of about `target` bytes each (in the order given)."""
    out: list[list[str]] = [[]]
    filled = 0
    for oid, size in items:
        if out[-1] and filled + size > target:
            out.append([])
            filled = 0
        out[-1].append(oid)
        filled += size
    return [g for g in out if g]


def build(files: Iterable[tuple[str, Path]], folder: Path) -> tuple[PackIndex, Path]:
    """A pack of these object files written into `folder` (named by its id) and its index."""
    hasher = blake3.blake3()
    entries = []
    fd, name = tempfile.mkstemp(dir=folder, suffix=".objpack")
    try:
        with os.fdopen(fd, "wb") as out:
            for oid, path in files:
                offset = out.tell()
                with open(path, "rb") as src:
                    while chunk := src.read(_CHUNK):
                        hasher.update(chunk)
                        out.write(chunk)
                entries.append((oid, offset, out.tell() - offset))
            size = out.tell()
        pid = hasher.hexdigest()
        final = folder / f"{pid}.objpack"
        os.replace(name, final)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return PackIndex(pid, size, entries), final


@dataclass(frozen=True)
class Span:
    """One read of a pack: bytes [start, end) and the entries (id, offset, length) in them."""

    pid: str
    start: int
    end: int
    entries: tuple[tuple[str, int, int], ...]


def spans(wanted: dict[str, Location]) -> list[Span]:
    """The reads that bring these objects: per pack, entries closer than GAP joined in one
    range of at most MAX_RANGE bytes."""
    by_pack: dict[str, list[tuple[str, int, int]]] = {}
    for oid, (pid, offset, length) in wanted.items():
        by_pack.setdefault(pid, []).append((oid, offset, length))
    out = []
    for pid, entries in sorted(by_pack.items()):
        entries.sort(key=lambda e: e[1])
        run: list[tuple[str, int, int]] = []
        for entry in entries:
            if run and (entry[1] - (run[-1][1] + run[-1][2]) > GAP or entry[1] + entry[2] - run[0][1] > MAX_RANGE):
                out.append(Span(pid, run[0][1], run[-1][1] + run[-1][2], tuple(run)))
                run = []
            run.append(entry)
        if run:
            out.append(Span(pid, run[0][1], run[-1][1] + run[-1][2], tuple(run)))
    return out


def check_hash(pid: str, data: bytes, *, where: str) -> None:
    """Refuse a whole pack that does not hash to its name."""
    if blake3.blake3(data).hexdigest() != pid:
        raise ReceivedError(f"data pack {pid[:16]} on {where} does not hash to its name", where=where)


def slices(span: Span, data: bytes) -> Iterator[tuple[str, memoryview]]:
    """The objects of `span` out of its bytes."""
    view = memoryview(data)
    for oid, offset, length in span.entries:
        yield oid, view[offset - span.start : offset - span.start + length]
