"""The Hugging Face hub cache as an import reads it: its model repositories, their revisions
in commit order, and what cannot be imported, each named with the reason.

huggingface_hub's `scan_cache_dir` does the reading. It drops a whole repository when one
snapshot link dangles or a ref names a commit without a snapshot (what an interrupted
download or a blob deleted by hand leaves); such a model repository is read again here one
revision at a time, so that its complete revisions still count. Nothing here writes to the
cache.

The cache records no commit dates. Commit order is therefore: revisions that `refs/main`
does not name, oldest first by their blobs' modification time (when they were downloaded;
ties by commit hash), then the revision `refs/main` names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from mgit.errors import InputError, MissingDependencyError
from mgit.reports import human_size

MAIN = "main"
REPO_PREFIXES = ("models--", "datasets--", "spaces--", "kernels--")


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
    hint = ("Give the folder huggingface_hub downloads into (default: $HF_HUB_CACHE, else $HF_HOME/hub, "
            "else ~/.cache/huggingface/hub)")  # fmt: skip
    if not root.exists():
        raise InputError(str(root), "no such folder, so no Hugging Face cache", hint=hint)
    if not root.is_dir():
        raise InputError(str(root), "a file, not a Hugging Face cache folder", hint=hint)
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
        skipped.append(f"{f.file_path.relative_to(info.cache_dir)}: an interrupted download "
                       f"({human_size(f.size_on_disk)}) that no snapshot links to")  # fmt: skip
    return CacheListing(info.cache_dir, size, [m for m in models if m.revisions], skipped)


def commit_order(revisions: list[CachedRevision]) -> list[CachedRevision]:
    """Detached and other revisions oldest first, the one `refs/main` names last (see the
    module's docstring: the cache keeps no commit dates)."""
    return sorted(revisions, key=lambda r: (MAIN in r.refs, r.last_modified, r.commit))


def _revision(rev: Any) -> CachedRevision:
    """A revision as huggingface_hub's CachedRevisionInfo describes it."""
    files = sorted(f.file_path.relative_to(rev.snapshot_path).as_posix() for f in rev.files)
    return CachedRevision(rev.commit_hash, rev.snapshot_path, tuple(sorted(rev.refs)), rev.last_modified, tuple(files))


def _model(repo_id: str, path: Path, size: int, revisions: list[CachedRevision], skipped: list[str]) -> CachedModel:
    kept = []
    blobs = (path / "blobs").resolve()
    for rev in revisions:
        # huggingface_hub links a snapshot's files into ../../blobs; a link elsewhere (another
        # repository's files, a file of the user's) is not the cache's to import.
        astray = [f for f in rev.files if not (rev.snapshot / f).resolve().is_relative_to(blobs)]
        if not rev.files:
            skipped.append(f"{repo_id} revision {rev.commit[:12]}: an empty snapshot (nothing of it downloaded)")
        elif astray:
            skipped.append(f"{repo_id} revision {rev.commit[:12]}: {astray[0]} links outside the repository's "
                           "blobs (not a file huggingface_hub downloaded)")  # fmt: skip
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
                refs.setdefault(ref.read_text(errors="replace").strip(), []).append(ref.relative_to(path / "refs").as_posix())
    snapshots = path / "snapshots"
    found: dict[str, Path] = {p.name: p for p in sorted(snapshots.iterdir()) if p.is_dir()} if snapshots.is_dir() else {}
    for commit, names in sorted(refs.items()):
        if commit not in found:
            skipped.append(f"{repo_id}: {', '.join(f'refs/{n}' for n in names)} names commit {commit[:12]}, "
                           "which has no snapshot (an interrupted download?)")  # fmt: skip
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
            skipped.append(f"{repo_id} revision {commit[:12]}: {', '.join(sorted(missing))} {links} "
                           "(an interrupted download?)")  # fmt: skip
            continue
        last = max(mtimes) if mtimes else snap.stat().st_mtime
        revisions.append(CachedRevision(commit, snap, tuple(refs.get(commit, ())), last, tuple(sorted(files))))
    blobs = path / "blobs"
    size = sum(p.stat().st_size for p in blobs.iterdir() if p.is_file() and not p.name.endswith(".incomplete")) \
        if blobs.is_dir() else 0  # fmt: skip
    return revisions, size
