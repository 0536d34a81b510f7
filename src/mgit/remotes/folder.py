"""A remote in a folder (a path, or `file://`): a bare repository that several people reach
through a shared disk. Keys are files under the folder, written atomically (temporary file,
full length checked, fsync, rename); a conditional write holds the key's lock file, the same
one a repository's RefStore takes for a ref, so a push and a local writer on that folder
exclude each other.

Whoever can write to a shared folder can plant things in it, so every key is reached from
the root one folder at a time, each opened without following a link (`openat` with
O_NOFOLLOW), and only regular files and folders are read or written: a link (which could lead
a push's writes or a clone's reads out of the remote), a FIFO or a device (which would block a
reader forever: files are opened non-blocking and checked with fstat before a byte is read)
or a socket is refused, naming its key (RemoteEntryError).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import suppress
from pathlib import Path

import blake3

from mgit.errors import (
    MissingKeyError,
    RemoteConflictError,
    RemoteEntryError,
    RemoteError,
    RemoteNotFoundError,
    RemoteTooLargeError,
)
from mgit.remotes.base import Backend, KeyInfo, check_key
from mgit.util.atomicfile import copy_fully, disk_full_as_error, replace_at, write_fully
from mgit.util.locks import FileLock

O_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
MAX_DEPTH = 16  # folders below the root a listing descends (keys are three or four deep)
KINDS = {
    stat.S_IFLNK: "a link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
    stat.S_IFDIR: "a folder",
    stat.S_IFREG: "a file",
}


def kind(mode: int) -> str:
    return KINDS.get(stat.S_IFMT(mode), "not a file")


class FolderBackend(Backend):
    def __init__(self, root: Path, *, url: str | None = None, fsync: bool = True) -> None:
        self.root = root
        self.url = url or str(root)
        self.fsync = fsync

    def check(self) -> None:
        if not self.root.is_dir():
            raise RemoteNotFoundError(f"no folder {self.url}", hint="Create a remote there with: mgit init --bare DIR")

    # --- reaching a key without following a link ---------------------------------------------
    def _refuse(self, folder: int, name: str, key: str) -> RemoteError:
        """What to say of `name` in `folder`, which could not be opened as it should."""
        try:
            mode = os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return MissingKeyError(self.url, key)
        return RemoteEntryError(self.url, key, kind(mode))

    def _folder(self, parts: list[str], *, create: bool) -> int | None:
        """A descriptor of the folder `parts` (a list of names) under the root, reached one
        folder at a time; None if it is absent (or a file: no key is under a file) and not
        to be created."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            for i, name in enumerate(parts):
                inner = self._subfolder(fd, name, "/".join(parts[: i + 1]), create)
                os.close(fd)
                if inner is None:
                    return None
                fd = inner
            return fd
        except BaseException:
            os.close(fd)
            raise

    def _subfolder(self, fd: int, name: str, key: str, create: bool) -> int | None:
        for _ in range(2):
            try:
                return os.open(name, O_FOLDER, dir_fd=fd)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    break
                if not create:
                    return None
                with disk_full_as_error(f"{self.url}/{key}"), suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
        try:
            mode = os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISREG(mode):
            if not create:
                return None
            raise RemoteEntryError(self.url, key, "a file", "a folder")
        raise RemoteEntryError(self.url, key, kind(mode))

    def _split(self, key: str) -> tuple[list[str], str]:
        parts = check_key(key).split("/")
        return parts[:-1], parts[-1]

    def _open(self, key: str, limit: int) -> tuple[int, int]:
        """A regular file's descriptor and size, checked against `limit` before any read."""
        parents, name = self._split(key)
        folder = self._folder(parents, create=False)
        if folder is None:
            raise MissingKeyError(self.url, key)
        try:
            try:
                fd = os.open(name, O_FILE, dir_fd=folder)  # a FIFO opens at once, non-blocking
            except OSError:
                raise self._refuse(folder, name, key) from None
        finally:
            os.close(folder)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):  # a folder of keys is not a key
                raise MissingKeyError(self.url, key)
            raise RemoteEntryError(self.url, key, kind(st.st_mode))
        if st.st_size > limit:
            os.close(fd)
            raise RemoteTooLargeError(self.url, key, st.st_size, limit)
        return fd, st.st_size

    # --- the contract ---------------------------------------------------------------------------
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
                with disk_full_as_error(path):
                    copied = copy_fully(src.fileno(), dst.fileno(), limit + 1)
                if copied > limit:  # it grew while copied: nothing past the limit is kept
                    raise RemoteTooLargeError(self.url, key, copied, limit)
                if copied < size:
                    raise RemoteError(
                        f"{key} on {self.url} shrank from {size} to {copied} bytes while it was read",
                        hint="Another process is changing the remote; try again",
                    )
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        return copied

    def read_range(self, key: str, start: int, length: int) -> bytes:
        fd, size = self._open(key, 1 << 62)
        try:
            if start < 0 or length < 0 or start + length > size:
                raise RemoteError(f"{key} on {self.url} has {size} bytes, not the range {start}+{length}")
            data = os.pread(fd, length, start)
            while len(data) < length and (more := os.pread(fd, length - len(data), start + len(data))):
                data += more
        finally:
            os.close(fd)
        if len(data) != length:
            raise RemoteError(f"{key} on {self.url} shrank while it was read", hint="Try again")
        return data

    def write(self, key: str, data: bytes | Path) -> None:
        parents, name = self._split(key)
        mode = 0o444 if key.startswith("objects/") else 0o644  # objects never change
        folder = self._folder(parents, create=True)
        assert folder is not None
        try:
            if isinstance(data, Path):
                with open(data, "rb") as src:
                    size = os.fstat(src.fileno()).st_size
                    self._replace(folder, name, key, lambda fd: copy_fully(src.fileno(), fd, size), size, mode)
            else:
                self._replace(folder, name, key, lambda fd: write_fully(fd, data), len(data), mode)
        finally:
            os.close(folder)

    def _replace(self, folder: int, name: str, key: str, fill: Callable[[int], int], size: int, mode: int) -> None:
        try:
            replace_at(folder, name, fill, size=size, where=f"{self.url}/{key}", fsync=self.fsync, mode=mode)
        except (IsADirectoryError, NotADirectoryError):  # a folder (of files) where the key should be
            raise RemoteEntryError(self.url, key, "a folder") from None

    def size(self, key: str) -> int | None:
        parents, name = self._split(key)
        folder = self._folder(parents, create=False)
        if folder is None:
            return None
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        finally:
            os.close(folder)
        return st.st_size if stat.S_ISREG(st.st_mode) else None

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def list_info(self, prefix: str) -> Iterator[KeyInfo]:
        top = prefix.rpartition("/")[0]
        folder = self._folder(top.split("/") if top else [], create=False)
        if folder is None:
            return
        keys: list[KeyInfo] = []
        stack = [(folder, top, 0)]
        try:
            while stack:
                fd, rel, depth = stack.pop()
                try:
                    with os.scandir(fd) as entries:
                        for entry in entries:
                            key = f"{rel}/{entry.name}" if rel else entry.name
                            # Hidden names (temporary files) and the lock files are the folder's own.
                            if entry.name.startswith(".") or key == "locks":
                                continue
                            if entry.is_dir(follow_symlinks=False):
                                if depth < MAX_DEPTH and (f"{key}/".startswith(prefix) or prefix.startswith(f"{key}/")):
                                    try:
                                        stack.append((os.open(entry.name, O_FOLDER, dir_fd=fd), key, depth + 1))
                                    except OSError:
                                        raise self._refuse(fd, entry.name, key) from None
                            elif not key.startswith(prefix):
                                continue
                            elif entry.is_file(follow_symlinks=False):
                                st = entry.stat(follow_symlinks=False)
                                keys.append(KeyInfo(key, st.st_size, st.st_mtime))
                            else:
                                raise RemoteEntryError(self.url, key, kind(entry.stat(follow_symlinks=False).st_mode))
                finally:
                    os.close(fd)
        finally:
            for fd, _, _ in stack:
                os.close(fd)
        yield from sorted(keys)

    def delete(self, key: str) -> None:
        parents, name = self._split(key)
        folder = self._folder(parents, create=False)
        if folder is None:
            return
        try:
            st = os.stat(name, dir_fd=folder, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                raise RemoteEntryError(self.url, key, kind(st.st_mode))
            os.unlink(name, dir_fd=folder)
        except FileNotFoundError:
            pass
        finally:
            os.close(folder)

    def _lock(self, key: str) -> FileLock:
        # refs/models/NAME shares its lock with RefStore (locks/refs/NAME.lock).
        name = key.replace("refs/models/", "refs/", 1) if key.startswith("refs/models/") else key
        lock_key = f"locks/{name}.lock"
        parents, file = lock_key.split("/")[:-1], lock_key.rpartition("/")[2]
        folder = self._folder(parents, create=True)  # no link on the way to the lock file
        assert folder is not None
        try:
            mode = os.stat(file, dir_fd=folder, follow_symlinks=False).st_mode
            if not stat.S_ISREG(mode):
                raise RemoteEntryError(self.url, lock_key, kind(mode))
        except FileNotFoundError:
            pass
        finally:
            os.close(folder)
        return FileLock(self.root.joinpath(*lock_key.split("/")), what=f"{key} on {self.url}")

    def read_versioned(self, key: str, *, limit: int) -> tuple[bytes | None, str | None]:
        try:
            data = self.read(key, limit=limit)
        except MissingKeyError:
            return None, None
        return data, blake3.blake3(data).hexdigest()

    def write_if(self, key: str, data: bytes, *, token: str | None) -> str | None:
        with self._lock(key):
            try:
                _, current = self.read_versioned(key, limit=max(len(data), 64 << 20))
            except RemoteTooLargeError:  # not what the caller read: it cannot match its token
                raise RemoteConflictError(self.url, key) from None
            if current != token:
                raise RemoteConflictError(self.url, key)
            self.write(key, data)
        return blake3.blake3(data).hexdigest()
