"""Objects as read-only files under `root/ab/cdef...`, written atomically (temporary file,
fsync, rename; the touched folders fsynced by `sync`)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.store.base import ObjectStore
from mgit.store.objectformat import PREFIX, ObjectHeader, header_length, parse_record
from mgit.store.objects import OID_RE
from mgit.util.atomicfile import TMP_PREFIX, disk_full_as_error, fsync_dir, remove_files, write_atomic, write_fully
from mgit.util.faults import crash_point
from mgit.util.locks import FileLock

_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC


class LocalStore(ObjectStore):
    """A folder of object files. `lock_path` is the writers' lock (see `ObjectStore.lock`)."""

    def __init__(self, root: Path, *, fsync: bool = True, lock_path: Path | None = None) -> None:
        super().__init__()
        self.root = root
        self.fsync = fsync
        self.lock_path = lock_path
        self._dirty: set[Path] = set()
        self._lock = threading.Lock()
        self._fanout: dict[str, Path] = {}
        self._root = os.fspath(root)
        self._made: set[str] = set()  # fan-out folders known to exist

    def path_of(self, oid: str) -> Path:
        """The file that holds (or would hold) an object."""
        if not OID_RE.match(oid):
            raise MissingObjectError(oid)
        fanout = self._fanout.get(oid[:2])
        if fanout is None:  # 256 folders at most: joined once (pathlib is slow in walks of thousands)
            fanout = self._fanout[oid[:2]] = self.root / oid[:2]
        return fanout / oid[2:]

    def has(self, oid: str) -> bool:
        if not OID_RE.match(oid):
            raise MissingObjectError(oid)
        return os.path.exists(f"{self._root}/{oid[:2]}/{oid[2:]}")  # (a fetch asks ten thousand times: no Path)

    def write_record(self, oid: str, chunks: list[Any]) -> int:
        path = self.path_of(oid)
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self._dirty.add(self.root)
        size = write_atomic(path, chunks, fsync=self.fsync, mode=0o444, sync_dir=False)
        with self._lock:
            self._dirty.add(path.parent)
        crash_point("object-written")
        return size

    def adopt(self, oid: str, path: Path) -> None:
        """Move a verified object file (written elsewhere in this repository, as a fetch's
        quarantine does) into place, read-only. Durable at the next `sync`."""
        target = self.path_of(oid)
        if not target.parent.is_dir():
            target.parent.mkdir(parents=True, exist_ok=True)
            with self._lock:
                self._dirty.add(self.root)
        os.chmod(path, 0o444)
        os.replace(path, target)
        with self._lock:
            self._dirty.add(target.parent)

    def stage(self, records: Mapping[str, bytes]) -> list[str]:
        """Write records held in memory (verified: a fetch's, from metadata packs) under
        temporary names beside where they go, read-only, neither durable nor visible yet: the
        caller makes them durable (`sync_files`), then `place` renames them in. One create
        and one rename a record, where a quarantine file costs two of each and two chmods.
        Their temporary paths, in order; on an error none is left."""
        token, pid = os.urandom(6).hex(), os.getpid()
        paths: list[str] = []
        try:
            with disk_full_as_error(self.root):
                for oid, raw in records.items():
                    tmp = f"{self._folder(oid)}/{TMP_PREFIX}{pid}-{token}-{oid[2:]}"
                    try:
                        fd = os.open(tmp, _NEW, 0o444)
                    except FileNotFoundError:  # (its folder removed since this store saw it)
                        self._made.discard(oid[:2])
                        self._folder(oid)
                        fd = os.open(tmp, _NEW, 0o444)
                    paths.append(tmp)
                    try:
                        write_fully(fd, raw)
                    finally:
                        os.close(fd)
        except BaseException:
            remove_files(paths)
            raise
        return paths

    def place(self, oid: str, staged: str) -> None:
        """Rename a record `stage` wrote (and the caller made durable) into place; durable at
        the next `sync`."""
        os.replace(staged, f"{self._root}/{oid[:2]}/{oid[2:]}")
        with self._lock:
            self._dirty.add(self._fanout.get(oid[:2]) or self.path_of(oid).parent)

    def _folder(self, oid: str) -> str:
        """The fan-out folder of `oid` as a string, created if needed (checked once a folder)."""
        if not OID_RE.match(oid):
            raise MissingObjectError(oid)
        folder = f"{self._root}/{oid[:2]}"
        if oid[:2] not in self._made:
            try:
                os.makedirs(folder)
                with self._lock:
                    self._dirty.add(self.root)
            except FileExistsError:
                pass
            self._made.add(oid[:2])
        return folder

    def sync(self) -> None:
        # Flush under the lock: a thread must not return while another still flushes a folder
        # that both wrote into.
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            if self.fsync:
                for d in sorted(dirty, key=lambda p: len(p.parts), reverse=True):
                    fsync_dir(d)

    def lock(self, *, exclusive: bool = False) -> FileLock:
        path = self.lock_path or self.root.parent / "locks" / "repo.lock"
        return FileLock(path, what="the repository", shared=not exclusive)

    def read_record(self, oid: str) -> Any:
        import numpy as np  # (here: reading headers and records needs no numpy)

        try:
            with open(self.path_of(oid), "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                buf = np.empty(size, np.uint8)  # numpy rather than bytes: see ZstdCodec.decode
                if fh.readinto(buf) != size:
                    raise CorruptObjectError(oid, "the file changed size while it was read")
                return buf
        except FileNotFoundError:
            raise MissingObjectError(oid) from None

    def read_range(self, oid: str, offset: int, length: int) -> Any:
        from mgit.codecs.buffers import POOLED_MIN, scratch  # (only readers of blocks come here)

        if not OID_RE.match(oid):
            raise MissingObjectError(oid)
        try:  # (a string path: a checkout reads a few blocks per object, and pathlib costs more than the read)
            fd = os.open(f"{self._root}/{oid[:2]}/{oid[2:]}", os.O_RDONLY)
        except FileNotFoundError:
            raise MissingObjectError(oid) from None
        try:
            if length < POOLED_MIN:
                got: Any = os.pread(fd, length, offset)
                n = len(got)
            else:  # a block: into a reused buffer (fresh pages cost more than the read)
                got = scratch(length)
                n = os.preadv(fd, [got], offset)
        finally:
            os.close(fd)
        if n != length:
            raise CorruptObjectError(oid, f"the file ends {length - n} bytes before the block it declares")
        return got

    def read_bytes(self, oid: str) -> bytes:
        try:
            return self.path_of(oid).read_bytes()
        except FileNotFoundError:
            raise MissingObjectError(oid) from None

    def header(self, oid: str) -> ObjectHeader:
        """Read only the header (checking references must not read every tensor)."""
        try:
            with open(self.path_of(oid), "rb") as fh:
                head = fh.read(PREFIX)
                head += fh.read(header_length(oid, head))
        except FileNotFoundError:
            raise MissingObjectError(oid) from None
        return parse_record(oid, head)[0]

    def delete(self, oid: str) -> None:
        self.forget(oid)
        self.path_of(oid).unlink(missing_ok=True)

    def stored_size(self, oid: str) -> int:
        try:
            return self.path_of(oid).stat().st_size
        except FileNotFoundError:
            raise MissingObjectError(oid) from None

    def ids(self) -> Iterator[str]:
        if not self.root.is_dir():
            return
        for sub in sorted(self.root.iterdir()):
            if len(sub.name) == 2 and sub.is_dir():
                for f in sorted(sub.iterdir()):
                    oid = sub.name + f.name
                    if OID_RE.match(oid):
                        yield oid

    def temporary_files(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [f for sub in self.root.iterdir() if sub.is_dir() for f in sub.glob(f"{TMP_PREFIX}*")]
