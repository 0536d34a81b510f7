"""Model files -> objects + manifest (add), and manifest -> files or tensors (checkout, open).

Both directions stream tensor by tensor through a thread pool (blake3, zstd and numpy release
the GIL) with a bounded window of work in flight, so memory stays near a few tensors whatever
the size of the model, and files are written in order while later tensors are being decoded.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import blake3
import numpy as np
from threadpoolctl import threadpool_limits

from mgit.atomicfile import temporary_sibling
from mgit.catalog import ObjectRow
from mgit.errors import CorruptObjectError, MgitError, StorageFullError, UnsafePathError
from mgit.formats.folder import ModelSource, SourceFile
from mgit.formats.safetensors import numpy_view
from mgit.formats.tensors import to_torch
from mgit.lossy import LossyPolicy, LossyTally, LossyTensor, encode_lossy
from mgit.objects import FileEntry, Manifest, TensorEntry, tensor_meta
from mgit.store import CHECKOUT_BASES, DEFAULT_MAX_DEPTH, DecodedCache, ObjectStore, PutResult

Progress = Callable[[int], None]  # called with a number of bytes just processed
T = TypeVar("T")


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


@dataclass
class SnapshotStats:
    tensors: int = 0
    tensors_new: int = 0
    files: int = 0
    new_objects: list[ObjectRow] = field(default_factory=list)
    lossy: LossyTally = field(default_factory=LossyTally)

    def record(self, kind: str, result: PutResult) -> None:
        if result.new:
            self.new_objects.append(ObjectRow(result.oid, kind, result.size, result.stored_size, result.codec))


READ_AHEAD_BYTES = 64 << 20


def ordered_map(pool: ThreadPoolExecutor, fn: Callable[..., T], items: Iterable[tuple[Any, ...]], *, jobs: int,
                size: Callable[[tuple[Any, ...]], int]) -> Iterator[T]:  # fmt: skip
    """`pool.map` in order, bounded: every worker gets work, and more is queued only while
    the queued items stay under READ_AHEAD_BYTES (so memory is a few tensors, whatever the
    model, and a large tensor does not leave the other workers idle)."""
    pending: deque[tuple[Future[T], int]] = deque()
    in_flight = 0
    for item in items:
        n = size(item)
        while pending and len(pending) >= jobs and in_flight + n > READ_AHEAD_BYTES:
            future, done = pending.popleft()
            in_flight -= done
            yield future.result()
        pending.append((pool.submit(fn, *item), n))
        in_flight += n
    while pending:
        yield pending.popleft()[0].result()


def _digest(chunks: Iterable[Any]) -> str:
    hasher = blake3.blake3()
    for c in chunks:
        hasher.update(c)
    return hasher.hexdigest()


@dataclass(frozen=True)
class DeltaPlan:
    """Which stored tensors each new tensor may be encoded against, by tensor name (the
    matching tensors of the parents, closest parent first), how deep chains may go, and
    whether float tensors may be stored lossily against those bases."""

    bases: dict[str, list[str]] = field(default_factory=dict)
    max_depth: int = DEFAULT_MAX_DEPTH
    lossy: LossyPolicy | None = None

    def candidates(self, name: str) -> list[str]:
        """Bases for a tensor: the same name in a parent, or for a quantization scale
        (`X.weight_scale`, `X.scale`) the tensor it was computed from."""
        for key in (name, name.removesuffix("_scale"), name.removesuffix(".scale") + ".weight"):
            if key in self.bases:
                return self.bases[key]
        return []

    @classmethod
    def from_parents(cls, manifests: Iterable[Manifest], *, max_depth: int) -> DeltaPlan:
        bases: dict[str, list[str]] = {}
        for manifest in manifests:
            for t in manifest.tensors():
                found = bases.setdefault(t.name, [])
                if t.object not in found:
                    found.append(t.object)
        return cls(bases, max_depth)


def one_blas_thread() -> AbstractContextManager[Any]:
    """For a pool that already runs one task per core: BLAS threads inside each (a low-rank
    factorization, a rank estimate) would oversubscribe the cores, and OpenBLAS's threads
    spin while they wait (measured: 10x the CPU time of the work on a busy 2-core machine)."""
    return threadpool_limits(1, "blas")


def write_snapshot(store: ObjectStore, source: ModelSource, *, jobs: int, progress: Progress | None = None,
                   plan: DeltaPlan | None = None) -> tuple[Manifest, SnapshotStats]:  # fmt: skip
    """Store every file of `source`; return its manifest and what was new."""
    stats = SnapshotStats()
    entries: list[FileEntry] = []
    memo = DecodedCache(CHECKOUT_BASES)  # parent tensors decoded as delta bases, for the next that need them
    with one_blas_thread(), ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-add") as pool:
        for f in source.files:
            entries.append(_write_file(store, f, pool, jobs, stats, progress, plan or DeltaPlan(), memo))
    return Manifest(tuple(entries)), stats


def _write_file(store: ObjectStore, f: SourceFile, pool: ThreadPoolExecutor, jobs: int,
                stats: SnapshotStats, progress: Progress | None, plan: DeltaPlan, memo: DecodedCache) -> FileEntry:  # fmt: skip
    stats.files += 1
    if not f.is_safetensors:
        data = f.blob_data()
        digest = pool.submit(_digest, [data])
        result = store.put_blob(data)
        stats.record("blob", result)
        if progress:
            progress(f.size)
        return FileEntry(f.path, "blob", f.size, digest.result(), result.oid)

    assert f.layout is not None
    header = store.put_blob(f.layout.header)
    stats.record("blob", header)
    # The file digest is taken in file order as tensors come back, so that each tensor's pages
    # can be released right after: resident memory stays a few tensors, not the file.
    digest = blake3.blake3()
    digest.update(f.layout.header)

    def put(span: Any, data: np.ndarray) -> tuple[Any, np.ndarray, LossyTensor | None, PutResult]:
        bases = plan.candidates(span.name)
        lossy, encoding = None, None
        if plan.lossy is not None:
            lossy = encode_lossy(store, span.dtype, span.shape, data, bases, plan.lossy, plan.max_depth, memo)
        if lossy is not None and lossy.chain is not None:
            # Lossy storage is only worth its error where it stores less than the exact tensor
            # (a pruning patch, say, beats any quantization step). Both are encoded once; the
            # smaller is written as it is.
            meta = tensor_meta(span.dtype, span.shape)
            exact = store.encode("tensor", meta, data, bases=bases, max_depth=plan.max_depth, memo=memo)
            approx = store.encode("tensor", meta, lossy.data, bases=bases, max_depth=plan.max_depth,
                                  extra=[lossy.chain], memo=memo)  # fmt: skip
            if len(exact.payload) <= len(approx.payload):
                lossy, encoding = LossyTensor(data, None, 0.0, lossy.changed_params), exact
            else:
                data, encoding = lossy.data, approx  # the version stores, and its digest covers, the reconstruction
        return span, data, lossy, store.put_tensor(span.dtype, span.shape, data, bases=bases, max_depth=plan.max_depth,
                                                   encoding=encoding, memo=memo)  # fmt: skip

    entries = []
    for span, data, lossy, result in ordered_map(pool, put, f.tensor_data(), jobs=jobs,
                                                 size=lambda item: item[0].nbytes):  # fmt: skip
        digest.update(data)
        f.release(span)
        stats.lossy.record(lossy)
        entries.append(TensorEntry(span.name, span.dtype, span.shape, result.oid))
        stats.tensors += 1
        stats.tensors_new += result.new
        stats.record("tensor", result)
        if progress:
            progress(span.nbytes)
    return FileEntry(f.path, "safetensors", f.size, digest.hexdigest(), header.oid, tuple(entries), f.converted_from)


def safe_join(root: Path, rel: str) -> Path:
    """`root/rel`, refusing anything that could land outside `root`."""
    parts = rel.split("/")
    if (
        not rel
        or rel.startswith("/")
        or "\\" in rel
        or "\x00" in rel
        or any(p in ("", ".", "..") for p in parts)
        or os.path.isabs(rel)
    ):
        raise UnsafePathError(rel, "it is absolute or climbs out of the output folder")
    target = root.joinpath(*parts)
    # A link anywhere on the way (planted in the output folder) could redirect the write.
    probe = root
    for p in parts:
        probe = probe / p
        if probe.is_symlink():
            raise UnsafePathError(rel, f"{probe} is a link")
    return target


def tensor_bytes(store: ObjectStore, entry: TensorEntry, *, memo: DecodedCache | None = None,
                 keep: bool = False) -> np.ndarray:  # fmt: skip
    """A stored tensor's bytes, checked against its entry. `memo` keeps the delta bases
    decoded on the way and, with `keep`, the tensor itself (read-only)."""
    header, data = store.get_memoized(entry.object, memo) if keep and memo is not None else store.get(entry.object, memo=memo)
    if header.kind != "tensor" or header.meta != {"dtype": entry.dtype, "shape": list(entry.shape)}:
        raise CorruptObjectError(entry.object, f"is not the {entry.dtype}{list(entry.shape)} tensor {entry.name!r}")
    return data


def iter_file_chunks(store: ObjectStore, entry: FileEntry, pool: ThreadPoolExecutor, jobs: int,
                     memo: DecodedCache) -> Iterator[np.ndarray]:  # fmt: skip
    """The bytes of a file, in order, decoding tensors ahead on the pool (delta bases that
    several tensors share decoded once, in `memo`)."""
    yield store.get(entry.object)[1]
    yield from ordered_map(pool, lambda t: tensor_bytes(store, t, memo=memo), ((t,) for t in entry.tensors),
                           jobs=jobs, size=lambda item: item[0].nbytes)  # fmt: skip


def restore_file(store: ObjectStore, entry: FileEntry, out_dir: Path, *, pool: ThreadPoolExecutor, jobs: int,
                 memo: DecodedCache, progress: Progress | None = None) -> Path:  # fmt: skip
    """Rebuild one file under `out_dir` atomically and check its size and digest."""
    target = safe_join(out_dir, entry.path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target)
    hasher, size = blake3.blake3(), 0
    try:
        with open(tmp, "xb") as fh:
            for chunk in iter_file_chunks(store, entry, pool, jobs, memo):
                hasher.update(chunk)
                size += fh.write(chunk)
                if progress:
                    progress(chunk.nbytes)
        if size != entry.size or hasher.hexdigest() != entry.digest:
            raise MgitError(f"rebuilt {entry.path} does not match the digest recorded at add time",
                            hint="Run: mgit fsck")  # fmt: skip
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.errno in (28, 122):  # ENOSPC, EDQUOT
            raise StorageFullError(str(target)) from None
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def restore_manifest(store: ObjectStore, manifest: Manifest, out_dir: Path, *, jobs: int) -> None:
    """Rebuild every file of a manifest under `out_dir` (a version need not exist yet)."""
    memo = DecodedCache(CHECKOUT_BASES)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-restore") as pool:
        for f in manifest.files:
            restore_file(store, f, out_dir, pool=pool, jobs=jobs, memo=memo)


def as_array(store: ObjectStore, entry: TensorEntry) -> np.ndarray:
    """A tensor as a numpy array of its own dtype and shape (writable: a cached one is copied)."""
    data = tensor_bytes(store, entry)
    return numpy_view(data if data.flags.writeable else data.copy(), entry.dtype, entry.shape)


def as_torch(store: ObjectStore, entry: TensorEntry) -> Any:
    return to_torch(tensor_bytes(store, entry), entry.dtype, entry.shape)
