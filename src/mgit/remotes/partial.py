"""Fetching a large object in byte ranges that a re-run resumes: a fetch or clone killed, or
cut off, in the middle of a large object fetches, when run again, only the ranges that had
not arrived.

The object's bytes go into a partial file of the transfer journal (mgit.remotes.journal),
chunk by chunk at their offsets (several chunks at once), and the journal lists each chunk
once it is written. A re-run fetches the chunks the journal does not list. Nothing is hashed
here: what arrives is verified against its id like any object (mgit.store.quarantine), which
is the guarantee. A partial file changed between two runs (a damaged disk, a stray write, a
crash that lost unsynced bytes) therefore makes an object that fails that check: the fetch
stops with a one-line error and keeps nothing, and as the file left the journal when it
was complete, the next run fetches the object from its first byte.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mgit.errors import MissingKeyError, RemoteTooLargeError, RemoteUnavailableError
from mgit.remotes.base import Backend
from mgit.remotes.journal import DOWNLOADS, TransferJournal
from mgit.util.atomicfile import disk_full_as_error, temporary_sibling

WORKERS = 8  # ranges of one object in flight


def ranged(backend: Backend, limit: int) -> bool:
    """Whether an object of at most `limit` bytes may be large enough to fetch in ranges."""
    return backend.journal is not None and backend.ranged_from is not None and limit >= backend.ranged_from


def download(
    backend: Backend, key: str, path: Path, *, limit: int, progress: Callable[[int], None] | None = None
) -> int:
    """Fetch `key` into the new file `path`, resuming what the journal holds of it if it is
    large enough to go in ranges; return its size. `progress` gets bytes as they arrive."""
    size = backend.size(key)
    if size is None:
        raise MissingKeyError(backend.url, key)
    if size > limit:
        raise RemoteTooLargeError(backend.url, key, size, limit)
    journal = backend.journal
    if journal is None or backend.ranged_from is None or size < backend.ranged_from:
        return whole(backend, key, path, limit=limit, progress=progress)
    with journal.claim(DOWNLOADS, backend.url, key) as mine:
        if not mine:  # another fetch of this repository is at it: not through the journal
            return whole(backend, key, path, limit=limit, progress=progress)
        _fill(backend, journal, key, size, max(1, backend.ranged_from // 2), progress)
        part = journal.path(DOWNLOADS, backend.url, key, ".part")
        if path.exists():  # as read_into: an existing file is refused, and kept
            raise FileExistsError(path)
        os.replace(part, path)
        journal.drop(DOWNLOADS, backend.url, key)
    return size


def whole(backend: Backend, key: str, path: Path, *, limit: int, progress: Callable[[int], None] | None = None) -> int:
    """Fetch `key` whole into the new file `path`, renamed into place once complete: a file
    under an object's name is never a part of it (the next fetch takes up what a killed one
    left whole, mgit.store.quarantine)."""
    tmp = temporary_sibling(path)
    try:
        size = backend.read_into(key, tmp, limit=limit)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if progress:
        progress(size)
    return size


def _fill(
    backend: Backend,
    journal: TransferJournal,
    key: str,
    size: int,
    chunk: int,
    progress: Callable[[int], None] | None,
) -> None:
    """Fetch the chunks the journal does not list into the partial file."""
    url, count = backend.url, -(-size // chunk)
    part = journal.path(DOWNLOADS, url, key, ".part")
    entry = journal.load(DOWNLOADS, url, key)
    arrived = _recorded(entry, size, chunk, count) if part.is_file() else None
    if arrived is None or os.path.getsize(part) != size:
        journal.drop(DOWNLOADS, url, key)
        part.parent.mkdir(parents=True, exist_ok=True)
        with disk_full_as_error(part), open(part, "wb") as fh:
            fh.truncate(size)
        arrived = set()
    if progress and arrived:
        progress(sum(min(chunk, size - i * chunk) for i in arrived))
    missing = [i for i in range(count) if i not in arrived]
    lock = threading.Lock()
    fd = os.open(part, os.O_WRONLY | os.O_CLOEXEC)
    try:

        def fetch(index: int) -> None:
            start = index * chunk
            want = min(chunk, size - start)
            data = backend.read_range(key, start, want)
            if len(data) != want:
                raise RemoteUnavailableError(url, f"reading {key}: {len(data)} of {want} bytes arrived")
            with disk_full_as_error(part):
                _pwrite(fd, data, start)
            with lock:
                arrived.add(index)
                journal.save(DOWNLOADS, url, key, {"size": size, "chunk": chunk, "chunks": sorted(arrived)})
            if progress:
                progress(want)

        if missing:
            with ThreadPoolExecutor(max_workers=min(WORKERS, len(missing)), thread_name_prefix="mgit-range") as pool:
                for _ in pool.map(fetch, missing):
                    pass
    finally:
        os.close(fd)


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        if done <= 0:  # a write the disk cuts short: ENOSPC, as write_fully says it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[done:], offset + done


def _recorded(entry: dict[str, Any] | None, size: int, chunk: int, count: int) -> set[int] | None:
    """The chunks an entry says arrived, if it is an entry for this object as fetched now (an
    entry of another shape, such as one that listed chunk hashes, is not: it starts again)."""
    if entry is None or entry.get("size") != size or entry.get("chunk") != chunk:
        return None
    listed = entry.get("chunks")
    if not isinstance(listed, list) or not all(type(i) is int and 0 <= i < count for i in listed):
        return None
    return set(listed)
