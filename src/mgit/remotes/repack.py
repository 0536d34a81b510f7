"""Repacking a remote's data packs: many small packs (one per push) consolidated into few, and
objects no longer wanted left out, as git's `repack`. Remote gc calls it.

The contract, which keeps every reader safe without a lock:

- Only packs smaller than `small` bytes are read (whole, each checked against its name, every
  entry's header parsed); larger packs are left as they are.
- The objects of those packs that `keep` accepts (all, by default) are written once each into
  new packs of about `target` bytes, each pack before its index, as a push writes them.
- Nothing is deleted: the result names the keys (the old packs and their indexes) that the
  new packs supersede. The caller deletes them, indexes first (remote gc does so at once,
  under its lock): a reader whose pack went away lists the indexes again and finds the
  object in the new pack.
- A repack killed midway leaves new packs whose objects are also in the old ones: harmless
  duplicates, found in either; the next repack folds them together.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mgit.errors import CorruptObjectError, ReceivedError
from mgit.remotes import datapack
from mgit.remotes.repository import RemoteRepository
from mgit.reports import Report
from mgit.store.objectformat import parse_record

SMALL = datapack.PACK_TARGET // 2  # packs smaller than this are rewritten, larger ones left as they are


@dataclass
class RepackResult(Report):
    """Packs read, packs written (their ids), objects kept and left out, and the keys the new
    packs supersede (for the caller to delete after its grace period)."""

    packs_read: int = 0
    written: list[str] = field(default_factory=list)
    objects_kept: int = 0
    objects_dropped: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    superseded: list[str] = field(default_factory=list)


def repack(
    remote: RemoteRepository,
    *,
    keep: Callable[[str], bool] | None = None,
    small: int = SMALL,
    target: int = datapack.PACK_TARGET,
) -> RepackResult:
    """Consolidate the remote's data packs under `small` bytes; see the module docstring. Two
    or more such packs are needed (or one with objects to leave out), else nothing is done."""
    remote.packed(refresh=True)
    indexes = remote.pack_indexes()
    chosen = sorted(pid for pid, index in indexes.items() if index.size < small)
    wanted = {
        oid for pid in chosen for oid, _, _ in indexes[pid].entries if keep is None or keep(oid)
    }  # (an object in a pack left alone is still copied: its small pack goes away)
    total = sum(len(indexes[pid].entries) for pid in chosen)
    if len(chosen) < 2 and (not chosen or len(wanted) == total):
        return RepackResult()
    result = RepackResult(packs_read=len(chosen))
    with tempfile.TemporaryDirectory(prefix="mgit-repack-") as tmp:
        folder = Path(tmp)
        files: dict[str, tuple[Path, int]] = {}
        for pid in chosen:
            data = remote.backend.read(datapack.pack_key(pid), limit=indexes[pid].size)
            datapack.check_hash(pid, data, where=remote.url)
            result.bytes_read += len(data)
            for oid, offset, length in indexes[pid].entries:
                if oid in files or oid not in wanted:
                    continue
                body = data[offset : offset + length]
                _check_header(oid, body, pid, remote.url)
                path = folder / oid
                path.write_bytes(body)
                files[oid] = (path, length)
        for group in datapack.groups(((o, n) for o, (_, n) in sorted(files.items())), target):
            index, path = datapack.build([(o, files[o][0]) for o in group], folder)
            remote.backend.write(datapack.pack_key(index.pid), path)
            remote.backend.write(datapack.index_key(index.pid), index.to_bytes())
            result.written.append(index.pid)
            result.bytes_written += index.size
    result.objects_kept = len(files)
    result.objects_dropped = len({o for pid in chosen for o, _, _ in indexes[pid].entries} - set(files))
    result.superseded = sorted(
        key for pid in chosen if pid not in result.written for key in (datapack.pack_key(pid), datapack.index_key(pid))
    )
    return result


def _check_header(oid: str, body: bytes, pid: str, where: str) -> None:
    """An entry must at least be an object file (its bytes are verified by whoever reads it)."""
    try:
        parse_record(oid, body)
    except CorruptObjectError as exc:
        raise ReceivedError(
            f"object {oid[:16]} in data pack {pid[:16]} on {where} is not an object file ({exc.why})", where=where
        ) from None
