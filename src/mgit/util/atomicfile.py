"""Atomic, durable file replacement: write a temporary file in the same folder, fsync it,
rename it over the target, fsync the folder. A reader sees the old file or the new one,
never a part; a crash leaves at most a temporary file that `gc` removes. A full disk is
one error (`StorageFullError`), raised here and nowhere else.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
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
def disk_full_as_error(where: str | Path) -> Iterator[None]:
    """A full disk or quota (ENOSPC, EDQUOT) met inside the block, as StorageFullError(where)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in DISK_FULL:
            raise StorageFullError(str(where)) from None
        raise


def check_size(fd: int, size: int) -> None:
    """A file written to the end must hold `size` bytes: fewer is a write the disk cut short
    (a kernel copy that stops at a full disk says so only by copying less)."""
    if (found := os.fstat(fd).st_size) != size:
        raise OSError(errno.ENOSPC, f"{found} of {size} bytes written")


@contextmanager
def atomic_writer(
    path: Path, *, fsync: bool = True, mode: int = 0o644, sync_dir: bool = True, size: int | None = None
) -> Iterator[BinaryIO]:
    """`with atomic_writer(path) as fh:` writes `fh` to a temporary sibling that replaces
    `path` when the block ends, and is removed if it raises (as dulwich's GitFile does).
    `size`: how many bytes the file must hold then (else StorageFullError: a short write)."""
    tmp = temporary_sibling(path)
    try:
        with disk_full_as_error(path):
            with open(tmp, "xb") as fh:
                yield fh
                fh.flush()
                if size is not None:
                    check_size(fh.fileno(), size)
                if fsync:
                    os.fsync(fh.fileno())
            os.chmod(tmp, mode)
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync and sync_dir:
        fsync_dir(path.parent)


def write_atomic(
    path: Path, chunks: Iterable[bytes | memoryview], *, fsync: bool = True, mode: int = 0o644, sync_dir: bool = True
) -> int:
    """Replace `path` with the concatenated chunks; return the number of bytes written."""
    written = 0
    with atomic_writer(path, fsync=fsync, mode=mode, sync_dir=sync_dir) as fh:
        for chunk in chunks:
            written += fh.write(chunk)
        fh.flush()
        check_size(fh.fileno(), written)
    return written


CHUNK = 8 << 20
NO_KERNEL_COPY = (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EBADF, errno.EPERM)


def write_fully(fd: int, data: bytes | memoryview) -> int:
    """Write all of `data` to `fd` (a write the disk cuts short is ENOSPC); bytes written."""
    view, done = memoryview(data).cast("B"), 0
    while done < len(view):
        n = os.write(fd, view[done:])
        if n <= 0:
            raise OSError(errno.ENOSPC, "the disk took no more bytes")
        done += n
    return done


def copy_fully(src: int, dst: int, most: int) -> int:
    """Copy up to `most` bytes between file descriptors, in the kernel where it can
    (copy_file_range: a reflink where the filesystem has them), and return how many: fewer
    only where the source ended. A destination that takes fewer is ENOSPC, never a short
    count (copy_file_range reports a full disk by copying nothing)."""
    copied, kernel = 0, True
    while copied < most:
        want = min(CHUNK, most - copied)
        if kernel:
            try:
                n = os.copy_file_range(src, dst, want)
                if n > 0:
                    copied += n
                    continue
            except OSError as exc:
                if exc.errno not in NO_KERNEL_COPY:
                    raise
            kernel = False  # it copied nothing: see, by reading, whether the source ended
        chunk = os.read(src, want)
        if not chunk:
            break
        copied += write_fully(dst, chunk)
    return copied


def replace_at(
    folder: int, name: str, fill: Callable[[int], int], *, size: int, where: str, fsync: bool = True, mode: int = 0o644
) -> None:
    """`atomic_writer` for a file named `name` in the folder open as `folder` (a descriptor:
    nothing on the way is looked up again, so no link planted meanwhile is followed):
    `fill(fd)` writes the temporary file and returns its byte count, which, like the file,
    must be `size`. `where` names the file in a StorageFullError."""
    tmp = f"{TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}-{name}"
    with disk_full_as_error(where):
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
        try:
            try:
                written = fill(fd)
                check_size(fd, written)
                if written != size:
                    raise OSError(errno.EIO, f"{where}: its source ended after {written} of {size} bytes")
                if fsync:
                    os.fsync(fd)
                os.fchmod(fd, mode)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=folder, dst_dir_fd=folder)
        except BaseException:
            with suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)
            raise
        if fsync:
            os.fsync(folder)


MANY = 64  # from this many files on, one syncfs of their filesystem beats an fsync each


def sync_files(paths: Sequence[Path | str]) -> None:
    """Make these files' data durable (before they are renamed into place): one `syncfs`
    of their filesystem for many small files (a fetch brings thousands of records), an
    fsync each otherwise or where syncfs is not available."""
    if len(paths) >= MANY and _syncfs(os.path.dirname(paths[0])):
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="mgit-fsync") as pool:
        list(pool.map(_fsync_file, paths))


def _fsync_file(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _syncfs(folder: Path | str) -> bool:
    import ctypes  # (here: every command imports this module, few sync a whole file system)

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
