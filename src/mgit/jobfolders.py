"""The folders jobs read: each version checked out once for all the jobs of one executor and
shared between them read-only.

A cascade's step used to check out its parents into a temporary folder, run the recipe, add
its output, then check the new version out again for each of its tests; its children checked
it out once more. Here a version is checked out once per executor (a cascade, a test run), the
parents of every step and the folders tests run on alike, and a recipe's output becomes the new
version's folder without a second checkout when the add stored exactly its bytes. The add
hashed every file as it read it and recorded the digests in the manifest (which a checkout
verifies), so the folder needs no second read: it holds what the add stored when it holds the
manifest's paths and sizes and nothing more, no file was converted nor the version stored
lossily, and no file changed while the add read it (its signature, below, taken before the add,
is the same after it; the recipe's process has ended by then).

A shared folder is sealed (files 0444, folders 0555) and its files' sizes, times and inodes
are checked after each job that read it: a job that changed it anyway (after a chmod) is told
so, and the folder is dropped, so that the next job gets a fresh checkout.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import threading
from pathlib import Path

from mgit.repo.repository import Repo
from mgit.reports import AddResult

Signature = dict[str, tuple[int, int, int, int]]  # path -> (size, mtime_ns, inode, mode)


class JobFolders:
    """Versions checked out for an executor's jobs, read-only, until `close`."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self.root = Path(tempfile.mkdtemp(prefix="mgit-versions-"))
        self._folders: dict[str, tuple[Path, Signature]] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self._count = 0

    def folder(self, vid: str) -> Path:
        """The folder holding version `vid`, checked out on first use."""
        with self._lock_of(vid):
            found = self._folders.get(vid)
            if found is not None:
                return found[0]
            folder = self._fresh()
            self.repo.checkout(vid, folder)
            self._folders[vid] = (folder, seal(folder))
            return folder

    def adopt(self, added: AddResult, folder: Path, read: Signature) -> bool:
        """Make `folder` (a recipe's output, just added as `added`) the new version's folder if
        it holds exactly the bytes the add stored; `read` is its signature taken before the add
        (see the module's docstring). It is moved here. False (and `folder` left where it is)
        when it does not."""
        vid = added.version
        if added.lossy is not None or not holds_exactly(self.repo, vid, folder, read):
            return False
        with self._lock_of(vid):
            if vid in self._folders:
                return True
            target = self._fresh()
            _unseal(folder)  # a recipe may have copied a sealed parent's modes
            folder.rename(target)
            self._folders[vid] = (target, seal(target))
            return True

    def changed(self, vids: list[str]) -> list[str]:
        """The versions among `vids` whose folders a job changed: each is dropped (the next job
        checks it out anew). An empty list when none was."""
        changed = []
        for vid in vids:
            with self._lock_of(vid):
                found = self._folders.get(vid)
                if found is not None and signature(found[0]) != found[1]:
                    changed.append(vid)
                    del self._folders[vid]
                    _remove(found[0])
        return changed

    def close(self) -> None:
        with self._lock:
            self._folders.clear()
        _remove(self.root)

    def _fresh(self) -> Path:
        with self._lock:
            self._count += 1
            return self.root / f"v{self._count}"

    def _lock_of(self, vid: str) -> threading.Lock:
        with self._lock:
            return self._locks.setdefault(vid, threading.Lock())


def holds_exactly(repo: Repo, vid: str, folder: Path, read: Signature) -> bool:
    """Whether `folder`, whose signature was `read` when the add of version `vid` read it,
    still holds exactly the files the add stored: the same paths and sizes as the manifest
    records, none converted, nothing more. The digests are the add's own (it hashed the bytes
    as it read them), so no file is read again; an unchanged signature vouches for the bytes."""
    try:
        files = {f.path: f for f in repo.manifest(vid).files}
        if any(f.converted_from for f in files.values()):
            return False  # stored in another form than it was written
        now = signature(folder)
    except OSError:
        return False
    found = {p: v for p, v in now.items() if not p.endswith("/")}
    return now == read and set(found) == set(files) and all(found[p][0] == f.size for p, f in files.items())


def signature(folder: Path) -> Signature:
    """Every file below `folder` (relative POSIX path) with its size, time, inode and mode;
    folders with a `/` after their path, links (never followed) and the like with size -1."""
    out: Signature = {}
    for here, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            path = Path(here) / name
            st = path.lstat()
            key = path.relative_to(folder).as_posix()
            if stat.S_ISDIR(st.st_mode):  # its time moves with its files', which are here already
                out[key + "/"] = (0, 0, st.st_ino, st.st_mode)
            else:  # a link or anything else is never a file a checkout writes: its size is -1
                size = st.st_size if stat.S_ISREG(st.st_mode) else -1
                out[key] = (size, st.st_mtime_ns, st.st_ino, st.st_mode)
    return out


def seal(folder: Path) -> Signature:
    """Make `folder` read-only (files 0444, folders 0555) and return its signature."""
    for here, dirs, files in os.walk(folder, topdown=False):
        for name in files:
            os.chmod(Path(here) / name, 0o444)
        for name in dirs:
            os.chmod(Path(here) / name, 0o555)
    os.chmod(folder, 0o555)
    return signature(folder)


def _unseal(folder: Path) -> None:
    os.chmod(folder, 0o755)
    for here, dirs, files in os.walk(folder):
        for name in dirs:
            os.chmod(Path(here) / name, 0o755)
        for name in files:
            os.chmod(Path(here) / name, 0o644)


def _remove(folder: Path) -> None:
    if folder.exists():
        _unseal(folder)
        shutil.rmtree(folder, ignore_errors=True)
