"""Fetching a large object in byte ranges that a re-run resumes: a fetch or clone killed, or
cut off, in the middle of a large object fetches, when run again, only the ranges that had
not arrived.

The object's bytes go into a partial file of the transfer journal (mgit.remotes.journal),
chunk by chunk at their offsets (several chunks at once), and the journal records the
blake3 of each chunk as it arrived. A re-run fetches the chunks the journal does not list.
Once all are there, the whole file is hashed again, chunk by chunk, against the journal: a
partial file changed since (a damaged disk, a stray write) is refused there and fetched again
from its first byte, so it can never make a wrong object; and what arrives is then verified
against its id like any object (mgit.store.quarantine).
"""

from __future__ import annotations

import errno
import os
import re
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import blake3

from mgit.errors import MissingKeyError, RemoteError, RemoteTooLargeError, RemoteUnavailableError
from mgit.remotes.base import Backend
from mgit.remotes.journal import DOWNLOADS, TransferJournal
from mgit.util.atomicfile import disk_full_as_error, temporary_sibling

HASH_RE = re.compile(r"^[0-9a-f]{64}\Z")
WORKERS = 8  # ranges of one object in flight
ATTEMPTS = 2  # a partial file refused by its final check is fetched once more, whole


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
        chunk = max(1, backend.ranged_from // 2)
        for _attempt in range(ATTEMPTS):
            hashes = _fill(backend, journal, key, size, chunk, progress)
            if _intact(journal.path(DOWNLOADS, backend.url, key, ".part"), size, chunk, hashes):
                break
            journal.drop(DOWNLOADS, backend.url, key)  # not the bytes that arrived: from the start
        else:
            raise RemoteError(f"{backend.url}: {key} did not arrive intact in {ATTEMPTS} attempts")
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
) -> dict[int, str]:
    """Fetch the chunks the journal does not hold into the partial file; {chunk: blake3}."""
    url, count = backend.url, -(-size // chunk)
    part = journal.path(DOWNLOADS, url, key, ".part")
    entry = journal.load(DOWNLOADS, url, key)
    hashes = _recorded(entry, size, chunk, count) if part.is_file() else None
    if hashes is None or os.path.getsize(part) != size:
        journal.drop(DOWNLOADS, url, key)
        part.parent.mkdir(parents=True, exist_ok=True)
        with disk_full_as_error(part), open(part, "wb") as fh:
            fh.truncate(size)
        hashes = {}
    if progress and hashes:
        progress(sum(min(chunk, size - i * chunk) for i in hashes))
    missing = [i for i in range(count) if i not in hashes]
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
            digest = blake3.blake3(data).hexdigest()
            with lock:
                hashes[index] = digest
                journal.save(DOWNLOADS, url, key, {"size": size, "chunk": chunk, "hashes": _as_json(hashes)})
            if progress:
                progress(want)

        if missing:
            with ThreadPoolExecutor(max_workers=min(WORKERS, len(missing)), thread_name_prefix="mgit-range") as pool:
                for _ in pool.map(fetch, missing):
                    pass
    finally:
        os.close(fd)
    return hashes


def _pwrite(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, offset)
        if done <= 0:  # a write the disk cuts short: ENOSPC, as write_fully says it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        view, offset = view[done:], offset + done


def _recorded(entry: dict[str, Any] | None, size: int, chunk: int, count: int) -> dict[int, str] | None:
    """The chunks an entry says arrived, if it is an entry for this object as fetched now."""
    if entry is None or entry.get("size") != size or entry.get("chunk") != chunk:
        return None
    raw = entry.get("hashes")
    if not isinstance(raw, dict):
        return None
    out = {}
    for index, digest in raw.items():
        if not (isinstance(index, str) and index.isdigit() and int(index) < count and isinstance(digest, str)):
            return None
        if not HASH_RE.match(digest):
            return None
        out[int(index)] = digest
    return out


def _as_json(hashes: dict[int, str]) -> dict[str, str]:
    return {str(i): h for i, h in sorted(hashes.items())}


def _intact(part: Path, size: int, chunk: int, hashes: dict[int, str]) -> bool:
    """Whether the partial file holds, chunk by chunk, the bytes whose hashes the journal keeps."""
    if os.path.getsize(part) != size or len(hashes) != -(-size // chunk):
        return False
    with open(part, "rb") as fh:
        for index in range(len(hashes)):
            data = os.pread(fh.fileno(), chunk, index * chunk)
            if blake3.blake3(data).hexdigest() != hashes[index]:
                return False
    return True
