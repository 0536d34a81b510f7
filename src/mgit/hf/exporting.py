"""`mgit export-hf`: a version written into the Hugging Face cache layout, so that
huggingface_hub and transformers load it offline
(`AutoModel.from_pretrained("org/name", local_files_only=True)`).

What is written, as huggingface_hub's `file_download` writes it:

    <cache>/models--org--name/blobs/<etag>                  a file's bytes, named as the hub names them
    <cache>/models--org--name/snapshots/<commit>/<path>     relative links to ../../blobs/<etag>
    <cache>/models--org--name/refs/main                     the commit hash (no newline)

- etag: the sha256 of the content for an LFS file, the git blob sha1 for any other. A file is
  LFS when the version's own `.gitattributes` says `filter=lfs` for it (the hub's default
  patterns when it has none), or when it holds 10 MiB or more (the hub keeps no larger file
  outside LFS).
- commit: an imported version goes back under the commit it came from (its `hf.commit` tag,
  if it is the first version of its model carrying that tag: versions added on top inherit
  tags); any other version gets sha1("mgit:" + version id). Exporting twice adds nothing.
- repo id: the one asked for, else the version's `hf.repo_id` tag, else its model name.
- order: blobs (renamed into place from a verified checkout), the snapshot (a new one renamed
  into place whole, or missing links added to one already there), then refs/main, written
  atomically: a reader never finds the ref naming a snapshot still being written.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

from mgit.errors import InvalidOptionError
from mgit.hf.cache import MAIN, default_cache_dir, load_hub
from mgit.hf.importing import COMMIT_TAG, REPO_ID_TAG
from mgit.repo.checkout import safe_join
from mgit.repo.repository import Repo
from mgit.reports import Report, VersionInfo
from mgit.util.atomicfile import disk_full_as_error, fsync_dir, write_atomic
from mgit.util.parallel import StartProgress

# The hub's default .gitattributes: what it stores in LFS when a repository says nothing else.
DEFAULT_LFS = (
    "*.7z",
    "*.arrow",
    "*.bin",
    "*.bz2",
    "*.ckpt",
    "*.ftz",
    "*.gz",
    "*.h5",
    "*.joblib",
    "*.lfs.*",
    "*.mlmodel",
    "*.model",
    "*.msgpack",
    "*.npy",
    "*.npz",
    "*.onnx",
    "*.ot",
    "*.parquet",
    "*.pb",
    "*.pickle",
    "*.pkl",
    "*.pt",
    "*.pth",
    "*.rar",
    "*.safetensors",
    "saved_model/**/*",
    "*.tar.*",
    "*.tar",
    "*.tflite",
    "*.tgz",
    "*.wasm",
    "*.xz",
    "*.zip",
    "*.zst",
    "*tfevents*",
)
LFS_MIN_BYTES = 10 * 1024 * 1024
COMMIT_RE = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True)
class ExportResult(Report):
    model: str
    seq: int
    version: str
    repo_id: str
    commit: str
    cache_dir: str
    snapshot: str  # <cache>/models--org--name/snapshots/<commit>
    files: int
    blobs_written: int  # blobs the cache did not have yet
    bytes_written: int
    notes: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


def export_to_cache(
    repo: Repo,
    ref: str,
    *,
    cache_dir: str | os.PathLike[str] | None = None,
    repo_id: str | None = None,
    progress: StartProgress | None = None,
) -> ExportResult:
    """Write the version `ref` names into a Hugging Face cache (default: huggingface_hub's)
    as `repo_id`'s `main` (see the module's docstring for the layout, the commit hash and the
    default repo id). `progress(total_bytes)` may return a callback for the checkout."""
    hub = load_hub()
    history = repo.log(ref)  # the version, then the versions of its model before it
    info = history[0]
    repo_id = repo_id or info.tags.get(REPO_ID_TAG) or info.model
    try:
        hub.utils.validate_repo_id(repo_id)
    except hub.errors.HFValidationError as exc:
        raise InvalidOptionError(
            f"{repo_id!r} cannot be a Hugging Face repository id: {exc}", hint="Give one with --repo-id ORG/NAME"
        ) from None
    commit = commit_for(history, repo_id)
    root = (Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()).resolve()
    storage = root / hub.file_download.repo_folder_name(repo_id=repo_id, repo_type="model")
    for folder in ("blobs", "snapshots", "refs"):
        (storage / folder).mkdir(parents=True, exist_ok=True)
    snapshot = storage / "snapshots" / commit
    with disk_full_as_error(snapshot):  # (a link, a folder, the ref: each can meet a full disk)
        tmp = Path(tempfile.mkdtemp(prefix=".mgit-export-", dir=storage))
    try:
        with disk_full_as_error(snapshot):
            files, written, written_bytes = _export(repo, info.id, storage, snapshot, tmp, commit, progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    notes = (
        []
        if "config.json" in files
        else ["it has no config.json: transformers cannot load it as a model, though its files are in the cache"]
    )
    return ExportResult(
        info.model,
        info.seq,
        info.id,
        repo_id,
        commit,
        str(root),
        str(snapshot),
        len(files),
        written,
        written_bytes,
        notes,
    )


def _export(
    repo: Repo, vid: str, storage: Path, snapshot: Path, tmp: Path, commit: str, progress: StartProgress | None
) -> tuple[dict[str, int], int, int]:
    """Blobs, snapshot and ref (see `export_to_cache`): (the files, blobs written, their bytes)."""
    checkout = repo.checkout(vid, tmp / "files", progress=progress)
    files = {f.path: f.size for f in checkout.files}
    attributes = tmp / "files" / ".gitattributes"
    patterns = lfs_patterns(attributes.read_text(errors="replace")) if ".gitattributes" in files else DEFAULT_LFS
    written = written_bytes = 0
    links: dict[str, str] = {}
    for path, size in files.items():
        src = tmp / "files" / path
        blob = storage / "blobs" / etag(src, size, lfs=is_lfs(path, size, patterns))
        if not blob.is_file():
            os.replace(src, blob)
            written, written_bytes = written + 1, written_bytes + size
        links[path] = os.path.relpath(blob, snapshot.joinpath(*path.split("/")).parent)
        staged = tmp / "snapshot" / path
        staged.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(links[path], staged)
    fsync_dir(storage / "blobs")
    _place_snapshot(tmp / "snapshot", snapshot, links)
    write_atomic(storage / "refs" / MAIN, [commit.encode()])
    return files, written, written_bytes


def commit_for(history: list[VersionInfo], repo_id: str) -> str:
    """The commit hash a version is exported under: the one it was imported from, else one
    made from its id (see the module's docstring). `history`: the version, then older ones."""
    version, older = history[0], history[1:]
    commit = version.tags.get(COMMIT_TAG, "")
    if (
        version.tags.get(REPO_ID_TAG) == repo_id
        and COMMIT_RE.fullmatch(commit)
        and not any(v.tags.get(COMMIT_TAG) == commit for v in older)
    ):
        return commit
    return hashlib.sha1(b"mgit:" + version.id.encode()).hexdigest()


def lfs_patterns(gitattributes: str) -> tuple[str, ...]:
    """The patterns a .gitattributes file stores in LFS (`filter=lfs`)."""
    found = []
    for line in gitattributes.splitlines():
        parts = line.split()
        if parts and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            found.append(parts[0].lstrip("/"))
    return tuple(found)


def is_lfs(path: str, size: int, patterns: tuple[str, ...]) -> bool:
    """Whether the hub keeps this file in LFS: a pattern matches it (a pattern without '/'
    matches the file's name in any folder, as in git) or it is too large for git."""
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_MIN_BYTES or any(fnmatchcase(path if "/" in p else name, p) for p in patterns)


def etag(path: Path, size: int, *, lfs: bool) -> str:
    """The name the hub gives a file's blob: the sha256 of an LFS file's bytes, else the id
    git gives the file (sha1 of "blob <size>\\0" and the bytes)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, hashlib.sha256 if lfs else lambda: hashlib.sha1(b"blob %d\0" % size)).hexdigest()


def _place_snapshot(staged: Path, snapshot: Path, links: dict[str, str]) -> None:
    """A new snapshot renamed into place whole; into one that exists (exported before, or
    the snapshot an import came from), the links it lacks, each replaced atomically."""
    try:
        os.rename(staged, snapshot)
        return
    except OSError:
        if not snapshot.is_dir():
            raise
    for rel, target in links.items():
        folder, _, name = rel.rpartition("/")
        dst = (safe_join(snapshot, folder) if folder else snapshot) / name  # the link itself is ours to replace
        if dst.is_symlink() and os.readlink(dst) == target:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged.joinpath(*rel.split("/")), dst)
    fsync_dir(snapshot)
