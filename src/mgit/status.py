"""`mgit status`: where a work folder stands, read from what is here (the network only when
asked to fetch first): each model against its remote-tracking state from the last fetch
(ahead, behind, diverged, on one side only), what a lazy clone holds here and what it does
not, and what interrupted operations left to resume or collect, each with the command to
run next.

Locks are flocks, which the kernel drops when their holder dies: a lock cannot go stale, so
what is said of locks is which are held now (an mgit is running). A temporary file names the
process that writes it (`.tmp-<pid>-...`): one whose process still runs is a write under
way, not a leftover.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from mgit.remotes.config import remote_of, remotes_of, tracked_models
from mgit.repo.fsck import quarantine_folders, root_heads, walk
from mgit.repo.location import REPO_DIR
from mgit.repo.repository import Repo
from mgit.reports import Report
from mgit.store.objects import Version
from mgit.sync import fetch
from mgit.sync.connection import TRANSFERS
from mgit.util.atomicfile import TMP_PREFIX

TMP_NAME = re.compile(
    rf"{re.escape(TMP_PREFIX)}(\d+)-[0-9a-f]{{12}}-"
)  # atomicfile's: the writer's pid, 6 random bytes
STATES = ("up to date", "ahead", "behind", "diverged", "local only", "remote only", "no remote")


@dataclass(frozen=True)
class ModelState(Report):
    model: str
    state: str  # one of STATES
    remote: str | None  # the remote compared with (None: the repository has none)
    head: str | None  # here
    tracking: str | None  # the remote's head at the last fetch
    ahead: int = 0  # versions here that the remote did not have
    behind: int = 0  # versions on the remote not here
    next: str | None = None  # the command to run


@dataclass(frozen=True)
class LazyState(Report):
    remote: str
    versions: int  # every version this clone knows of (records are always here)
    versions_here: int  # those whose every object is here: they read offline
    objects: int
    objects_here: int
    bytes_here: int
    bytes_remote_only: int
    next: str | None


@dataclass(frozen=True)
class Leftover(Report):
    kind: str  # unreferenced objects, temporary files, killed fetch, killed checkout, lock held
    count: int
    bytes: int
    where: list[str]  # the files or folders, relative to the work folder
    message: str
    next: str


@dataclass(frozen=True)
class StatusReport(Report):
    root: str
    fetched: list[str]  # the remotes fetched first (status --fetch)
    models: list[ModelState]
    lazy: LazyState | None
    leftovers: list[Leftover] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """Nothing to push, pull or collect."""
        return not self.leftovers and all(m.next is None for m in self.models)


def status(repo: Repo, *, remote: str | None = None, fetch_first: bool = False) -> StatusReport:
    """The state of `repo` against `remote` (default: every named remote), after fetching
    from it when `fetch_first`; nothing else touches the network."""
    names = [remote] if remote is not None else list(remotes_of(repo.config))
    if remote is not None:
        remote_of(repo.config, remote)  # an unknown name: the error fetch and push give
    if fetch_first:
        for name in names:
            fetch(repo, name)
        repo = Repo(repo.dir)  # what the fetch brought, read afresh
    seen = walk(repo.store, root_heads(repo.refs), pins=repo.refs.pins())
    here = set(repo.store.ids())
    return StatusReport(
        str(repo.root),
        names if fetch_first else [],
        model_states(repo, names),
        _lazy(repo, seen.versions, seen.objects, here) if repo.lazy else None,
        _leftovers(repo, seen.objects, here),
    )


def model_states(repo: Repo, remotes: list[str]) -> list[ModelState]:
    """Each model against each remote's tracking refs (or alone, without a remote)."""
    mine = repo.refs.all()
    if not remotes:
        return [ModelState(name, "no remote", None, head, None) for name, head in sorted(mine.items())]
    tracked = tracked_models(repo.dir, repo.config)
    states = []
    for remote in remotes:
        theirs = tracked.get(remote, {})
        for name in sorted(set(mine) | set(theirs)):
            states.append(_compare(repo, name, remote, mine.get(name), theirs.get(name)))
    return states


def _compare(repo: Repo, name: str, remote: str, head: str | None, tracking: str | None) -> ModelState:
    if tracking is None:
        return ModelState(name, "local only", remote, head, None, next=f"mgit push {remote}")
    if head is None:
        return ModelState(name, "remote only", remote, None, tracking, next=f"mgit pull {remote}")
    if head == tracking:
        return ModelState(name, "up to date", remote, head, tracking)
    ours, theirs = repo.chain(head), repo.chain(tracking)
    ahead = len(set(ours) - set(theirs))
    behind = len(set(theirs) - set(ours))
    if not behind:
        return ModelState(name, "ahead", remote, head, tracking, ahead, 0, f"mgit push {remote}")
    if not ahead:
        return ModelState(name, "behind", remote, head, tracking, 0, behind, f"mgit pull {remote}")
    return ModelState(
        name,
        "diverged",
        remote,
        head,
        tracking,
        ahead,
        behind,
        f"mgit pull {remote} (rebases), then mgit push {remote}",
    )


def _lazy(repo: Repo, versions: dict[str, Version], objects: set[str], here: set[str]) -> LazyState:
    whole = 0
    for version in versions.values():
        needed = repo.store.get_manifest(version.manifest).object_ids()
        whole += needed <= here
    rows = repo.catalog.object_rows(objects - here)  # stored sizes as the remote's packs said, else logical
    missing = len(versions) - whole
    return LazyState(
        str(repo.config.get("lazy")),
        len(versions),
        whole,
        len(objects),
        len(objects & here),
        sum(repo.store.stored_size(o) for o in objects & here),
        sum(r.stored_size or r.logical_size for r in rows.values()),
        "mgit fetch --objects REF (a version's objects, for work offline)" if missing else None,
    )


def _leftovers(repo: Repo, reachable: set[str], here: set[str]) -> list[Leftover]:
    found = []
    held = _held_locks(repo.dir / "locks")
    garbage = sorted(here - reachable)
    if garbage and not held:  # while an mgit runs, they may be the objects of its add under way
        size = sum(repo.store.stored_size(o) for o in garbage)
        found.append(
            Leftover(
                "unreferenced objects",
                len(garbage),
                size,
                [],
                "written by an interrupted add (or left by a removed model)",
                "run the add again (it reuses them), or mgit gc to remove them",
            )
        )
    temporary = [p for p in repo.store.temporary_files() + repo.refs.temporary_files() if not _writing(p)]
    if temporary:
        found.append(
            Leftover(
                "temporary files",
                len(temporary),
                sum(_size(p) for p in temporary),
                [_rel(repo, p) for p in temporary],
                "half-written objects or refs of a killed write",
                "mgit gc",
            )
        )
    quarantines = quarantine_folders(repo.store)
    if quarantines:
        found.append(
            Leftover(
                "killed fetch",
                len(quarantines),
                sum(_size(f) for q in quarantines for f in q.rglob("*")),
                [_rel(repo, q) for q in quarantines],
                "what a killed fetch received; none of it was kept yet",
                "mgit fetch again (it takes up what arrived whole), or mgit gc to remove them",
            )
        )
    found += _killed_checkouts(repo)
    found += _interrupted_transfers(repo)
    if held:
        found.append(
            Leftover(
                "lock held",
                len(held),
                0,
                [_rel(repo, p) for p in held],
                "an mgit is running here now (objects no ref names yet may be its own: not counted)",
                "wait for it to finish, then mgit status again",
            )
        )
    return found


def _interrupted_transfers(repo: Repo) -> list[Leftover]:
    """What the transfer journal holds: large objects a killed or cut-off push or fetch was
    sending or fetching (bytes: what arrived of the downloads, the chunks their entries list;
    a partial file's blocks lag its writes, and read low)."""
    root = repo.dir / TRANSFERS
    entries = sorted(root.glob("*/*.json")) if root.is_dir() else []
    if not entries:
        return []
    arrived = sum(_arrived(p) for p in entries if p.parent.name == "downloads")
    return [
        Leftover(
            "interrupted transfer",
            len(entries),
            arrived,
            [_rel(repo, p) for p in entries],
            "large objects a killed or cut-off push or fetch was sending or fetching",
            "run the push or fetch again: each resumes where it stopped",
        )
    ]


def _killed_checkouts(repo: Repo) -> list[Leftover]:
    """Temporary files of killed checkouts in the work folder (outside the repository)."""
    if repo.bare:
        return []
    folders: dict[Path, list[Path]] = {}
    for dirpath, dirs, names in os.walk(repo.root):
        dirs[:] = [d for d in dirs if d != REPO_DIR and not (Path(dirpath) / d).is_symlink()]
        for name in names:
            path = Path(dirpath) / name
            if TMP_NAME.match(name) and not _writing(path):  # another tool's `.tmp-x` is not ours
                folders.setdefault(Path(dirpath), []).append(path)
    models = set(repo.refs.all())
    found = []
    for folder, files in sorted(folders.items()):
        where = _rel(repo, folder)
        ref = folder.name if folder.name in models else "REF"
        found.append(
            Leftover(
                "killed checkout",
                len(files),
                sum(_size(p) for p in files),
                [_rel(repo, p) for p in files],
                f"half-written files of a checkout into {where} that was killed",
                f"mgit checkout {ref} -o {where} --force, then remove {where}/{TMP_PREFIX}*",
            )
        )
    return found


def _writing(path: Path) -> bool:
    """Whether the process that names itself in a temporary file's name still runs."""
    named = TMP_NAME.match(path.name)
    pid = int(named[1]) if named else os.getpid()
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _held_locks(folder: Path) -> list[Path]:
    """The lock files under `folder` that a process holds now (tried without waiting)."""
    held = []
    for path in sorted(folder.rglob("*.lock")) if folder.is_dir() else []:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while anyone holds it, shared or not
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                held.append(path)
        finally:
            os.close(fd)
    return held


def _size(path: Path) -> int:
    try:
        return path.lstat().st_size if path.is_file() else 0
    except OSError:
        return 0


def _rel(repo: Repo, path: Path) -> str:
    try:
        return path.relative_to(repo.root).as_posix()
    except ValueError:
        return str(path)


def _arrived(entry: Path) -> int:
    """The bytes a download's journal entry lists as arrived (0 for one that reads otherwise)."""
    import json

    try:
        with open(entry, "rb") as fh:
            value = json.loads(fh.read(1 << 20))  # (an entry is a few hundred bytes)
        size, chunk, chunks = value["size"], value["chunk"], value["chunks"]
        return sum(max(0, min(chunk, size - i * chunk)) for i in set(chunks) if type(i) is int and i >= 0)
    except (OSError, ValueError, KeyError, TypeError):
        return 0
