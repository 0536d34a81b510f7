"""Model heads: `refs/models/<name>` holds the id of the model's latest version.

The only mutable state besides the catalog. Every change is a compare-and-swap under the
model's lock file: read, compare with what the caller expects, write a temporary file, fsync,
rename. A killed writer leaves the old head in place.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Collection, Iterable
from contextlib import suppress
from pathlib import Path

from mgit.errors import (
    DamagedRefError,
    InvalidNameError,
    InvalidOptionError,
    ModelNameConflictError,
    RefConflictError,
)
from mgit.store.objects import OID_RE
from mgit.util.atomicfile import TMP_PREFIX, fsync_dir, remove_files, sync_files, write_atomic, write_fully
from mgit.util.locks import FileLock

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")
MAX_NAME = 128
MAX_REF_BYTES = 4096


def validate_model_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise InvalidNameError(str(name), "it is empty")
    if len(name) > MAX_NAME:
        raise InvalidNameError(name, f"longer than {MAX_NAME} characters")
    if not NAME_RE.match(name):
        raise InvalidNameError(name, "it has characters other than letters, digits, '.', '_', '-' and one '/'")
    if ".." in name or name.endswith((".lock", ".")):
        raise InvalidNameError(name, "it contains '..' or ends with '.' or '.lock'")
    return name


def is_model_name(name: str) -> bool:
    try:
        validate_model_name(name)
        return True
    except InvalidNameError:
        return False


def _read_head(path: str, name: str) -> str | None:
    """The version id a ref file holds; None if there is no such file (or `x/y` is asked under
    a model `x`, or `x` above `x/y`); DamagedRefError if it holds anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # (a fifo put there reads as damaged, never blocks)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        data = os.read(fd, MAX_REF_BYTES)  # (one read: a ref is an id and a newline; more is damage)
    except IsADirectoryError:
        return None
    finally:
        os.close(fd)
    value = data.decode(errors="replace").strip()
    if not OID_RE.match(value):
        raise DamagedRefError(name, value)
    return value


class RefStore:
    """Heads of models under `<repo>/refs/models`, locks under `<repo>/locks/refs`.

    Other namespaces hold other heads: `remotes/<remote>` the heads a remote had when last
    fetched from (remote-tracking refs, as git's `refs/remotes/origin`). `refs/pins/<id>`
    keeps an object that no version names (a test's recorded source) from gc."""

    def __init__(self, root: Path, *, fsync: bool = True, namespace: str = "models") -> None:
        self.root = root
        self.namespace = namespace
        self.dir = root / "refs" / namespace
        self.lock_dir = root / "locks" / "refs" / ("" if namespace == "models" else namespace)
        self.fsync = fsync

    def _path(self, name: str) -> Path:
        return self.dir / validate_model_name(name)

    def lock(self, name: str) -> FileLock:
        what = f"model {name!r}" if self.namespace == "models" else f"{self.namespace}/{name}"
        return FileLock(self.lock_dir / f"{validate_model_name(name)}.lock", what=what)

    def get(self, name: str) -> str | None:
        return _read_head(str(self._path(name)), name)

    def all(self) -> dict[str, str]:
        """Every model and its head, by name."""
        heads: dict[str, str] = {}
        if not self.dir.is_dir():
            return heads
        top = str(self.dir)
        for dirpath, _dirs, files in os.walk(top):
            folder = dirpath[len(top) + 1 :].replace(os.sep, "/")  # (relpath costs more than the read)
            for f in files:
                if f.startswith(TMP_PREFIX):
                    continue
                name = validate_model_name(f"{folder}/{f}" if folder else f)
                head = _read_head(os.path.join(dirpath, f), name)  # (a thousand refs: no Path, no text layer)
                if head:
                    heads[name] = head
        return dict(sorted(heads.items()))

    def conflict(self, name: str, *, also: Collection[str] = ()) -> str | None:
        """A model here (or among `also`) whose name is above `name` or under it, if any: names
        are lists of path segments, and `x` cannot be a model and a folder of models at once."""
        parts = validate_model_name(name).split("/")
        for i in range(1, len(parts)):
            above = "/".join(parts[:i])
            if above in also or (self.dir / above).is_file():
                return above
        if under := _first_under(name, also):
            return under
        if (self.dir / name).is_dir():
            for dirpath, _dirs, files in os.walk(self.dir / name):
                for f in sorted(files):
                    if not f.startswith(TMP_PREFIX):
                        return os.path.relpath(os.path.join(dirpath, f), self.dir).replace(os.sep, "/")
        return None

    def _check_new(self, name: str, also: Collection[str] = ()) -> None:
        other = self.conflict(name, also=also)
        if other is not None:
            raise ModelNameConflictError(name, other)

    def temporary_files(self) -> list[Path]:
        """Leftovers of ref writes that were interrupted (safe to remove with no writer running)."""
        return list(self.dir.rglob(f"{TMP_PREFIX}*")) if self.dir.is_dir() else []

    def set_locked(self, name: str, new: str | None, *, expected: str | None, sync_dir: bool = True) -> None:
        """Compare-and-swap; the caller holds `lock(name)`. `new=None` deletes the ref."""
        self._expect(name, expected)
        path = self._path(name)
        if new is None:
            path.unlink(missing_ok=True)
            return
        if not OID_RE.match(new):
            raise InvalidOptionError(f"a ref must name a version id, not {new!r}")
        if expected is None:
            self._check_new(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, [f"{new}\n".encode()], fsync=self.fsync, sync_dir=sync_dir)

    def _expect(self, name: str, expected: str | None) -> None:
        """The compare of a compare-and-swap (the caller holds the ref's lock)."""
        current = self.get(name)
        if current != expected:
            raise RefConflictError(name, expected, current)

    def update(self, name: str, new: str | None, *, expected: str | None) -> None:
        with self.lock(name):
            self.set_locked(name, new, expected=expected)

    def update_many(self, changes: dict[str, tuple[str | None, str | None]]) -> None:
        """`update` for many models ({name: (new, expected)}), each a compare-and-swap under
        its lock: the new values are written to temporary files and made durable at once,
        then each ref is compared and renamed into place (a clone of a thousand models: no
        Path in the loops, one mkdir a folder)."""
        staged: dict[str, tuple[str | None, str | None]] = {}
        created = {name for name, (new, expected) in changes.items() if new is not None and expected is None}
        also = _SortedNames(created)  # (a thousand new names: each looked for by bisection)
        top, token, folders = str(self.dir), f"{TMP_PREFIX}{os.getpid()}-{os.urandom(6).hex()}-", set()
        try:
            for name, (new, expected) in changes.items():
                if new is not None and not OID_RE.match(new):
                    raise InvalidOptionError(f"a ref must name a version id, not {new!r}")
                if name in created:
                    self._check_new(name, also=also)
                tmp = None
                if new is not None:
                    folder, _, leaf = f"{top}/{validate_model_name(name)}".rpartition("/")
                    if folder not in folders:
                        os.makedirs(folder, exist_ok=True)
                        folders.add(folder)
                    tmp = f"{folder}/{token}{leaf}"
                    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
                    staged[name] = (tmp, expected)
                    try:
                        write_fully(fd, f"{new}\n".encode())
                    finally:
                        os.close(fd)
                staged[name] = (tmp, expected)
            if self.fsync:
                sync_files([t for t, _ in staged.values() if t is not None])
            for name, (tmp, expected) in staged.items():
                with self.lock(name):
                    self._expect(name, expected)
                    path = f"{top}/{name}"
                    if tmp is None:
                        with suppress(FileNotFoundError):
                            os.unlink(path)
                    else:
                        os.replace(tmp, path)
                        staged[name] = (None, expected)  # (renamed: nothing to remove)
                    folders.add(path.rpartition("/")[0])
            if self.fsync:
                for folder in folders:
                    fsync_dir(Path(folder))
        finally:
            remove_files(Path(t) for t, _ in staged.values() if t is not None)

    # --- pins: objects kept without a version naming them -----------------------------------
    def pin(self, oid: str) -> None:
        """Keep object `oid` through gc (idempotent)."""
        if not OID_RE.match(oid):
            raise InvalidOptionError(f"a pin must name an object id, not {oid!r}")
        path = self.root / "refs" / "pins" / oid
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, [b""], fsync=self.fsync)

    def pins(self) -> set[str]:
        folder = self.root / "refs" / "pins"
        return {p.name for p in folder.iterdir() if OID_RE.match(p.name)} if folder.is_dir() else set()


class _SortedNames(frozenset):
    """Names, with the sorted list that finds those under a name by bisection."""

    def __init__(self, names: Iterable[str]) -> None:
        self.ordered = sorted(self)


def _first_under(name: str, names: Collection[str]) -> str | None:
    """The first of `names` under `name` (`name/...`), if any."""
    prefix = f"{name}/"
    if isinstance(names, _SortedNames):
        at = bisect.bisect_left(names.ordered, prefix)
        return names.ordered[at] if at < len(names.ordered) and names.ordered[at].startswith(prefix) else None
    return next((o for o in sorted(names) if o.startswith(prefix)), None)
