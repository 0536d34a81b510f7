"""A remote in a folder (a path, or `file://`): a bare repository that several people reach
through a shared disk. Keys are files under the folder, written atomically (temporary file,
fsync, rename); a conditional write holds the key's lock file, the same one a repository's
RefStore takes for a ref, so a push and a local writer on that folder exclude each other."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import blake3

from mgit.atomicfile import TMP_PREFIX, atomic_writer, write_atomic
from mgit.errors import (
    MissingKeyError,
    RemoteConflictError,
    RemoteNotFoundError,
    RemoteTooLargeError,
)
from mgit.locks import FileLock
from mgit.remotes.base import Backend, check_key

CHUNK = 8 << 20


class FolderBackend(Backend):
    def __init__(self, root: Path, *, url: str | None = None, fsync: bool = True) -> None:
        self.root = root
        self.url = url or str(root)
        self.fsync = fsync

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def check(self) -> None:
        if not self.root.is_dir():
            raise RemoteNotFoundError(f"no folder {self.url}", hint="Create a remote there with: mgit init --bare DIR")

    def _open(self, key: str, limit: int) -> tuple[int, int]:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            raise MissingKeyError(self.url, key) from None
        size = os.fstat(fd).st_size
        if size > limit:
            os.close(fd)
            raise RemoteTooLargeError(self.url, key, size, limit)
        return fd, size

    def read(self, key: str, *, limit: int) -> bytes:
        fd, size = self._open(key, limit)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(min(size, limit) + 1)
        if len(data) > limit:  # it grew while read: never more than the limit
            raise RemoteTooLargeError(self.url, key, len(data), limit)
        return data

    def read_into(self, key: str, path: Path, *, limit: int) -> int:
        fd, size = self._open(key, limit)
        with os.fdopen(fd, "rb") as src, open(path, "xb") as dst:
            try:
                copied = _copy(src.fileno(), dst.fileno(), limit + 1)
                if copied > limit:  # it grew while copied: nothing past the limit is kept
                    raise RemoteTooLargeError(self.url, key, copied, limit)
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        return copied

    def write(self, key: str, data: bytes | Path) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o444 if key.startswith("objects/") else 0o644  # objects never change
        if isinstance(data, Path):
            with atomic_writer(path, fsync=self.fsync, mode=mode) as dst, open(data, "rb") as src:
                dst.flush()
                _copy(src.fileno(), dst.fileno(), os.fstat(src.fileno()).st_size)
        else:
            write_atomic(path, [data], fsync=self.fsync, mode=mode)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> Iterator[str]:
        top = prefix.rpartition("/")[0]
        base = self._path(top) if top else self.root
        if not base.is_dir():
            return
        keys = []
        for dirpath, dirs, files in os.walk(base):
            # Hidden folders and the lock files are the folder's own, not keys.
            dirs[:] = [d for d in dirs if not d.startswith(".") and not (d == "locks" and Path(dirpath) == self.root)]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            for f in files:
                key = f if rel == "." else f"{rel}/{f}"
                if not f.startswith((TMP_PREFIX, ".")) and key.startswith(prefix):
                    keys.append(key)
        yield from sorted(keys)

    def _lock(self, key: str) -> FileLock:
        # refs/models/NAME shares its lock with RefStore (locks/refs/NAME.lock).
        name = key.replace("refs/models/", "refs/", 1) if key.startswith("refs/models/") else key
        return FileLock(self.root / "locks" / f"{name}.lock", what=f"{key} on {self.url}")

    def read_versioned(self, key: str, *, limit: int) -> tuple[bytes | None, str | None]:
        try:
            data = self.read(key, limit=limit)
        except MissingKeyError:
            return None, None
        return data, blake3.blake3(data).hexdigest()

    def write_if(self, key: str, data: bytes, *, token: str | None) -> None:
        with self._lock(key):
            try:
                _, current = self.read_versioned(key, limit=max(len(data), 64 << 20))
            except RemoteTooLargeError:  # not what the caller read: it cannot match its token
                raise RemoteConflictError(self.url, key) from None
            if current != token:
                raise RemoteConflictError(self.url, key)
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, [data], fsync=self.fsync)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)


def _copy(src: int, dst: int, most: int) -> int:
    """Copy up to `most` bytes between file descriptors in the kernel (copy_file_range: no
    trip through Python, a reflink where the filesystem has them); bytes copied."""
    copied = 0
    while copied < most:
        try:
            n = os.copy_file_range(src, dst, min(CHUNK, most - copied))
        except OSError:  # across filesystems on old kernels, or not supported: read and write
            chunk = os.read(src, min(CHUNK, most - copied))
            n = os.write(dst, chunk) if chunk else 0
        if n == 0:
            break
        copied += n
    return copied
