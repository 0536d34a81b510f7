"""Atomic, durable file replacement: write a temporary file in the same folder, fsync it,
rename it over the target, fsync the folder. A reader sees the old file or the new one,
never a part; a crash leaves at most a temporary file that `gc` removes."""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

from mgit.errors import StorageFullError

TMP_PREFIX = ".tmp-"


def temporary_sibling(path: Path) -> Path:
    return path.with_name(f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}-{path.name}")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(
    path: Path, chunks: Iterable[bytes | memoryview], *, fsync: bool = True, mode: int = 0o644, sync_dir: bool = True
) -> int:
    """Replace `path` with the concatenated chunks; return the number of bytes written."""
    tmp = temporary_sibling(path)
    written = 0
    try:
        with open(tmp, "xb") as fh:
            for chunk in chunks:
                written += fh.write(chunk)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFullError(str(path)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync and sync_dir:
        fsync_dir(path.parent)
    return written
