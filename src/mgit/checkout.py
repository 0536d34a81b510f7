"""Manifest -> files: rebuild each file of a version under an output folder, atomically,
decoding its tensors ahead on a thread pool while earlier ones are written, and check every
rebuilt file against the digest recorded when it was added."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
import numpy as np

from mgit.atomicfile import atomic_writer
from mgit.cache import CHECKOUT_BASES, DecodedCache
from mgit.errors import ChecksumMismatchError, UnsafePathError
from mgit.objects import FileEntry, Manifest, check_relative_path
from mgit.parallel import Progress, ordered_map
from mgit.reader import tensor_bytes
from mgit.store import ObjectStore


class _Mismatch(Exception):
    """Raised inside the writer so that the temporary file is removed."""


def safe_join(root: Path, rel: str) -> Path:
    """`root/rel`, refusing anything that could land outside `root`: a path a manifest could
    not hold, or a link planted anywhere on the way in the output folder."""
    check_relative_path(rel)
    parts = rel.split("/")
    target = root.joinpath(*parts)
    probe = root
    for p in parts:
        probe = probe / p
        if probe.is_symlink():
            raise UnsafePathError(rel, f"{probe} is a link")
    return target


def iter_file_chunks(store: ObjectStore, entry: FileEntry, pool: ThreadPoolExecutor, jobs: int,
                     reuse: DecodedCache) -> Iterator[np.ndarray]:  # fmt: skip
    """The bytes of a file, in order, decoding tensors ahead on the pool (delta bases that
    several tensors share decoded once, in `reuse`)."""
    yield store.get(entry.object)[1]
    yield from ordered_map(pool, lambda t: tensor_bytes(store, t, reuse=reuse), ((t,) for t in entry.tensors),
                           jobs=jobs, size=lambda item: item[0].nbytes)  # fmt: skip


def restore_file(store: ObjectStore, entry: FileEntry, out_dir: Path, *, pool: ThreadPoolExecutor, jobs: int,
                 reuse: DecodedCache, progress: Progress | None = None) -> Path:  # fmt: skip
    """Rebuild one file under `out_dir` atomically and check its size and digest."""
    target = safe_join(out_dir, entry.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    hasher, size = blake3.blake3(), 0
    try:
        with atomic_writer(target, fsync=False, sync_dir=False) as fh:
            for chunk in iter_file_chunks(store, entry, pool, jobs, reuse):
                hasher.update(chunk)
                size += fh.write(chunk)
                if progress:
                    progress(chunk.nbytes)
            if size != entry.size or hasher.hexdigest() != entry.digest:
                raise _Mismatch
    except _Mismatch:
        raise ChecksumMismatchError(entry.path) from None
    return target


def restore_manifest(store: ObjectStore, manifest: Manifest, out_dir: Path, *, jobs: int,
                     reuse: DecodedCache | None = None, progress: Progress | None = None) -> None:  # fmt: skip
    """Rebuild every file of a manifest under `out_dir` (a version need not exist yet)."""
    paths = [f.path for f in manifest.files]
    for p in paths:
        safe_join(out_dir, p)  # refuse before writing anything
    cache = reuse if reuse is not None else DecodedCache(CHECKOUT_BASES)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-restore") as pool:
        for f in manifest.files:
            restore_file(store, f, out_dir, pool=pool, jobs=jobs, reuse=cache, progress=progress)


def is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(os.scandir(path))
