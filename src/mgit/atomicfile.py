"""Atomic, durable file replacement: write a temporary file in the same folder, fsync it,
rename it over the target, fsync the folder. A reader sees the old file or the new one,
never a part; a crash leaves at most a temporary file that `gc` removes. A full disk is
one error (`StorageFullError`), raised here and nowhere else.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from mgit.errors import StorageFullError

TMP_PREFIX = ".tmp-"
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def temporary_sibling(path: Path) -> Path:
    """`.tmp-<pid>-<random>-<name>`, the name cut so that the whole stays a legal file name
    (255 bytes) when `path`'s own name is near that bound."""
    prefix = f"{TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}-"
    name = path.name.encode()[: 255 - len(prefix)].decode(errors="ignore")
    return path.with_name(prefix + name)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_writer(path: Path, *, fsync: bool = True, mode: int = 0o644, sync_dir: bool = True) -> Iterator[BinaryIO]:
    """`with atomic_writer(path) as fh:` writes `fh` to a temporary sibling that replaces
    `path` when the block ends, and is removed if it raises (as dulwich's GitFile does)."""
    tmp = temporary_sibling(path)
    try:
        with open(tmp, "xb") as fh:
            yield fh
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in DISK_FULL:
            raise StorageFullError(str(path)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync and sync_dir:
        fsync_dir(path.parent)


def write_atomic(path: Path, chunks: Iterable[bytes | memoryview], *, fsync: bool = True, mode: int = 0o644,
                 sync_dir: bool = True) -> int:  # fmt: skip
    """Replace `path` with the concatenated chunks; return the number of bytes written."""
    written = 0
    with atomic_writer(path, fsync=fsync, mode=mode, sync_dir=sync_dir) as fh:
        for chunk in chunks:
            written += fh.write(chunk)
    return written


MANY = 64  # from this many files on, one syncfs of their filesystem beats an fsync each


def sync_files(paths: list[Path]) -> None:
    """Make these files' data durable (before they are renamed into place): one `syncfs`
    of their filesystem for many small files (a fetch brings thousands of records), an
    fsync each otherwise or where syncfs is not available."""
    if len(paths) >= MANY and _syncfs(paths[0].parent):
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="mgit-fsync") as pool:
        list(pool.map(_fsync_file, paths))


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(folder: Path) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, AttributeError):
        return False
    try:
        return bool(hasattr(libc, "syncfs") and libc.syncfs(fd) == 0)
    finally:
        os.close(fd)


def remove_files(paths: Iterable[Path]) -> int:
    """Remove files that may already be gone; return how many were removed."""
    count = 0
    for p in paths:
        try:
            os.unlink(p)
            count += 1
        except FileNotFoundError:
            pass
    return count
