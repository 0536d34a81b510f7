"""The Hugging Face hub cache as an import reads it: its model repositories, their revisions
in commit order, and what cannot be imported, each named with the reason.

huggingface_hub's `scan_cache_dir` does the reading. It drops a whole repository when one
snapshot link dangles or a ref names a commit without a snapshot (what an interrupted
download or a blob deleted by hand leaves); such a model repository is read again here one
revision at a time, so that its complete revisions still count. Nothing here writes to the
cache.

A cache is read as huggingface_hub lays it out, and nothing else: its repository folders,
their `blobs/`, `snapshots/` and `refs/`, and every folder inside a snapshot are real folders
(a link among them refuses the whole cache before anything is read: `check_layout`); a ref
is a small regular file; a snapshot's file is a link to a regular file of its repository's
`blobs/` or one hop further into the cache's shared blob store (`<cache>/blobs/<2 hex>/<hash>`),
each hop resolved against the real cache root (`blob_of`), else its revision is skipped.
No file outside the cache root is ever opened.

The cache records no commit dates. Commit order is therefore: revisions that `refs/main`
does not name, oldest first by their blobs' modification time (when they were downloaded;
ties by commit hash), then the revision `refs/main` names.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from mgit.errors import InputError, MissingDependencyError
from mgit.reports import human_size

MAIN = "main"
REPO_PREFIXES = ("models--", "datasets--", "spaces--", "kernels--")
MAX_REF_BYTES = 4096  # a ref holds a 40-hex commit; a larger one is not a ref huggingface_hub wrote
SHARED_BLOBS = "blobs"  # <cache>/blobs: huggingface_hub's cache-wide store of Xet files
SHARED_MARKER = ".huggingface-shared-blobs"
_UNREAD = (".locks", "CACHEDIR.TAG", ".DS_Store")  # top-level entries scan_cache_dir does not read
_XET_HASH = re.compile(r"[0-9a-f]{64}")


def load_hub() -> ModuleType:
    """huggingface_hub, imported when a verb needs it (an optional dependency), with the
    submodules used here (it loads its own attributes lazily)."""
    try:
        import huggingface_hub
        import huggingface_hub.constants
        import huggingface_hub.errors
        import huggingface_hub.file_download
        import huggingface_hub.utils  # noqa: F401
    except ImportError:
        raise MissingDependencyError("huggingface_hub", "Reading and writing the Hugging Face cache", "hf") from None
    return huggingface_hub


def default_cache_dir() -> Path:
    """The folder huggingface_hub downloads into: $HF_HUB_CACHE, else $HF_HOME/hub, else
    ~/.cache/huggingface/hub (as huggingface_hub read the environment when it was imported)."""
    return Path(load_hub().constants.HF_HUB_CACHE)


@dataclass(frozen=True)
class CachedRevision:
    """One snapshot of a cached model repository: a commit and the files downloaded of it."""

    commit: str
    snapshot: Path  # snapshots/<commit>: links into ../../blobs
    refs: tuple[str, ...]  # the refs naming it ("main", "pr/1"); none for a detached revision
    last_modified: float  # newest modification time of its blobs
    files: tuple[str, ...]  # paths inside the snapshot, "/"-separated


@dataclass(frozen=True)
class CachedModel:
    repo_id: str  # "org/name" as the cache folder spells it
    path: Path  # <cache>/models--org--name
    size_on_disk: int
    revisions: tuple[CachedRevision, ...]  # importable ones, in commit order


@dataclass(frozen=True)
class CacheListing:
    path: Path
    size_on_disk: int  # every blob of the cache, counted once
    models: list[CachedModel]
    skipped: list[str] = field(default_factory=list)  # what cannot be imported, and why


def read_cache(cache_dir: str | os.PathLike[str] | None = None) -> CacheListing:
    """The model repositories of a Hugging Face cache (default: huggingface_hub's) with their
    importable revisions; everything else (datasets, spaces, interrupted downloads, dangling
    links, empty snapshots) is listed in `skipped`."""
    hub = load_hub()
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    hint = (
        "Give the folder huggingface_hub downloads into (default: $HF_HUB_CACHE, else $HF_HOME/hub, "
        "else ~/.cache/huggingface/hub)"
    )
    if not root.exists():
        raise InputError(str(root), "no such folder, so no Hugging Face cache", hint=hint)
    if not root.is_dir():
        raise InputError(str(root), "a file, not a Hugging Face cache folder", hint=hint)
    root = root.resolve()
    check_layout(root)
    info = hub.scan_cache_dir(root)
    entries = [p for p in info.cache_dir.iterdir() if not p.name.startswith(".") and p.name != "CACHEDIR.TAG"]
    if entries and not any(p.name.startswith(REPO_PREFIXES) for p in entries):
        raise InputError(str(root), "not a Hugging Face cache (no models--ORG--NAME folders in it)", hint=hint)
    skipped: list[str] = []
    models: list[CachedModel] = []
    read = set()
    for repo in sorted(info.repos, key=lambda r: r.repo_path.name):
        read.add(repo.repo_path)
        if repo.repo_type != "model":
            skipped.append(f"{repo.repo_path.name}: a {repo.repo_type} repository (only models are imported)")
            continue
        revisions = [_revision(r) for r in repo.revisions]
        models.append(_model(repo.repo_id, repo.repo_path, repo.size_on_disk, revisions, skipped))
    size = info.size_on_disk
    reread = sorted(p for p in entries if p.name.startswith("models--") and p.is_dir() and p not in read)
    for path in reread:
        repo_id = path.name.split("--", 1)[1].replace("--", "/")
        revisions, blob_bytes = _read_revisions(path, repo_id, skipped)
        models.append(_model(repo_id, path, blob_bytes, revisions, skipped))
        size += blob_bytes
    skipped += [str(w) for w in info.warnings if not any(str(p) in str(w) for p in reread)]
    for f in sorted(info.incomplete_files, key=lambda f: str(f.file_path)):
        skipped.append(
            f"{f.file_path.relative_to(info.cache_dir)}: an interrupted download "
            f"({human_size(f.size_on_disk)}) that no snapshot links to"
        )
    return CacheListing(info.cache_dir, size, [m for m in models if m.revisions], skipped)


def commit_order(revisions: list[CachedRevision]) -> list[CachedRevision]:
    """Detached and other revisions oldest first, the one `refs/main` names last (see the
    module's docstring: the cache keeps no commit dates)."""
    return sorted(revisions, key=lambda r: (MAIN in r.refs, r.last_modified, r.commit))


def _revision(rev: Any) -> CachedRevision:
    """A revision as huggingface_hub's CachedRevisionInfo describes it."""
    files = sorted(f.file_path.relative_to(rev.snapshot_path).as_posix() for f in rev.files)
    return CachedRevision(rev.commit_hash, rev.snapshot_path, tuple(sorted(rev.refs)), rev.last_modified, tuple(files))


def check_layout(root: Path) -> None:
    """Refuse a cache (InputError) in which a folder of huggingface_hub's layout is a link
    (it could lead anywhere: a linked `blobs/` makes every snapshot link "resolve inside
    blobs") or a ref is not a small regular file (a link to a key, a FIFO): such a cache
    was not written by huggingface_hub, and reading it would read files outside `root`
    (which is already resolved). Nothing is opened here but folders."""
    hint = "A Hugging Face cache holds no such entry; remove it (or import the folder it points to as a cache)"
    for entry in sorted(root.iterdir()):
        if entry.name in _UNREAD:
            continue
        mode = entry.lstat().st_mode
        if stat.S_ISLNK(mode):
            raise InputError(str(entry), "a link, not a folder of the Hugging Face cache; nothing imported", hint=hint)
        if not stat.S_ISDIR(mode):
            continue  # scan_cache_dir names it, unread
        for part in ("blobs", "snapshots", "refs"):
            if (entry / part).is_symlink():
                raise InputError(
                    str(entry / part), "a link, not a folder of the Hugging Face cache; nothing imported", hint=hint
                )
        for dirpath, dirs, _names in os.walk(entry / "snapshots"):
            for d in dirs:
                if (Path(dirpath) / d).is_symlink():
                    raise InputError(
                        str(Path(dirpath) / d),
                        "a link, not a folder of the Hugging Face cache; nothing imported",
                        hint=hint,
                    )
        for dirpath, dirs, names in os.walk(entry / "refs"):
            for name in [*dirs, *names]:
                ref = Path(dirpath) / name
                info = ref.lstat()
                if stat.S_ISLNK(info.st_mode):
                    raise InputError(
                        str(ref), "a link, not a ref of the Hugging Face cache; nothing imported", hint=hint
                    )
                if stat.S_ISDIR(info.st_mode):
                    continue
                if not stat.S_ISREG(info.st_mode):
                    raise InputError(
                        str(ref),
                        "not a regular file, so not a ref of the Hugging Face cache; nothing imported",
                        hint=hint,
                    )
                if info.st_size > MAX_REF_BYTES:
                    raise InputError(
                        str(ref),
                        f"{info.st_size} bytes, not a ref of the Hugging Face cache (a commit "
                        f"hash; at most {MAX_REF_BYTES} bytes); nothing imported",
                        hint=hint,
                    )


def blob_of(root: Path, repo_path: Path, snapshot_file: Path) -> Path | None:
    """The regular file of the cache that a snapshot's file is, hop by hop as huggingface_hub
    links it (see the module's docstring), or None if it leads anywhere else. `root` is the
    real cache root and `repo_path` a real folder in it (`check_layout`)."""
    blobs = repo_path / "blobs"
    try:
        here = snapshot_file
        if stat.S_ISREG(here.lstat().st_mode):  # a snapshot of copies (where links are not supported)
            return here if Path(os.path.realpath(here)).is_relative_to(repo_path / "snapshots") else None
        hop = _hop(here)
        if hop is None or Path(os.path.realpath(hop.parent)) != blobs:
            return None
        hop = blobs / hop.name
        info = hop.lstat()
        if stat.S_ISREG(info.st_mode):
            return hop
        store = root / SHARED_BLOBS
        second = _hop(hop) if stat.S_ISLNK(info.st_mode) else None
        if second is None or not _is_shared_store(store) or not _XET_HASH.fullmatch(second.name):
            return None
        if Path(os.path.realpath(second.parent)) != store / second.name[:2]:
            return None
        final = store / second.name[:2] / second.name
        return final if stat.S_ISREG(final.lstat().st_mode) else None
    except OSError:
        return None


def astray_files(root: Path, repo_path: Path, rev: CachedRevision) -> list[str]:
    """The files of a revision's snapshot, as it is now, that are not the cache's own
    (`blob_of`), and its folders that are links: none for a revision that may be imported.
    An import asks again right before it reads a revision, so that a cache changed since it
    was listed is not read through a link planted meanwhile."""
    found = []
    for dirpath, dirs, names in os.walk(rev.snapshot):
        here = Path(dirpath)
        found += [(here / d).relative_to(rev.snapshot).as_posix() for d in dirs if (here / d).is_symlink()]
        found += [
            (here / n).relative_to(rev.snapshot).as_posix() for n in names if blob_of(root, repo_path, here / n) is None
        ]
    return sorted(found)


def _hop(link: Path) -> Path | None:
    """Where one link points (made absolute, not resolved further), or None for a non-link."""
    try:
        target = os.readlink(link)
    except OSError:
        return None
    hop = Path(os.path.normpath(link.parent / target))
    return hop if hop.name not in ("", ".", "..") else None


def _is_shared_store(store: Path) -> bool:
    try:
        return stat.S_ISDIR(store.lstat().st_mode) and stat.S_ISREG((store / SHARED_MARKER).lstat().st_mode)
    except OSError:
        return False


def _model(repo_id: str, path: Path, size: int, revisions: list[CachedRevision], skipped: list[str]) -> CachedModel:
    kept = []
    root = path.parent
    for rev in revisions:
        # huggingface_hub links a snapshot's files into ../../blobs; a link elsewhere (another
        # repository's files, a file of the user's) is not the cache's to import.
        astray = astray_files(root, path, rev)
        if not rev.files:
            skipped.append(f"{repo_id} revision {rev.commit[:12]}: an empty snapshot (nothing of it downloaded)")
        elif astray:
            skipped.append(
                f"{repo_id} revision {rev.commit[:12]}: {astray[0]} links outside the repository's "
                "blobs (not a file huggingface_hub downloaded)"
            )
        else:
            kept.append(rev)
    return CachedModel(repo_id, path, size, tuple(commit_order(kept)))


def _read_revisions(path: Path, repo_id: str, skipped: list[str]) -> tuple[list[CachedRevision], int]:
    """The revisions of a model repository that scan_cache_dir refused as a whole, read one
    at a time: complete ones kept, the others named in `skipped`; and its blobs' size."""
    refs: dict[str, list[str]] = {}
    if (path / "refs").is_dir():
        for ref in sorted((path / "refs").rglob("*")):
            if ref.is_file():
                refs.setdefault(ref.read_text(errors="replace").strip(), []).append(
                    ref.relative_to(path / "refs").as_posix()
                )
    snapshots = path / "snapshots"
    found: dict[str, Path] = (
        {p.name: p for p in sorted(snapshots.iterdir()) if p.is_dir()} if snapshots.is_dir() else {}
    )
    for commit, names in sorted(refs.items()):
        if commit not in found:
            skipped.append(
                f"{repo_id}: {', '.join(f'refs/{n}' for n in names)} names commit {commit[:12]}, "
                "which has no snapshot (an interrupted download?)"
            )
    revisions = []
    for commit, snap in found.items():
        files, missing, mtimes = [], [], []
        for dirpath, _, names in os.walk(snap):
            for name in names:
                full = Path(dirpath) / name
                rel = full.relative_to(snap).as_posix()
                if full.exists():
                    files.append(rel)
                    mtimes.append(full.stat().st_mtime)
                else:
                    missing.append(rel)
        if missing:
            links = "links to a missing blob" if len(missing) == 1 else "link to missing blobs"
            skipped.append(
                f"{repo_id} revision {commit[:12]}: {', '.join(sorted(missing))} {links} (an interrupted download?)"
            )
            continue
        last = max(mtimes) if mtimes else snap.stat().st_mtime
        revisions.append(CachedRevision(commit, snap, tuple(refs.get(commit, ())), last, tuple(sorted(files))))
    blobs = path / "blobs"
    size = (
        sum(p.stat().st_size for p in blobs.iterdir() if p.is_file() and not p.name.endswith(".incomplete"))
        if blobs.is_dir()
        else 0
    )
    return revisions, size
