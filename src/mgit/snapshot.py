"""Model files -> objects + manifest: what `add` writes.

Files stream tensor by tensor through a thread pool with a bounded window of bytes in flight
(`mgit.parallel`), so memory stays near a few tensors whatever the size of the model. Each
tensor is offered its parents' matching tensors as delta bases (`DeltaPlan`), and in a lossy
add a quantized step too (`mgit.lossy`).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np

from mgit.cache import CHECKOUT_BASES, DecodedCache
from mgit.formats.folder import ModelSource, SourceFile
from mgit.lossy import LossyTensor, encode_lossy
from mgit.lossypolicy import LossyPolicy, LossyTally
from mgit.objectformat import DEFAULT_MAX_DEPTH
from mgit.objects import FileEntry, Manifest, TensorEntry, tensor_meta
from mgit.parallel import Progress, one_blas_thread, ordered_map
from mgit.store import ObjectStore, PutResult


@dataclass
class SnapshotStats:
    tensors: int = 0
    tensors_new: int = 0
    files: int = 0
    new_objects: list[PutResult] = field(default_factory=list)
    lossy: LossyTally = field(default_factory=LossyTally)

    def record(self, result: PutResult) -> None:
        if result.new:
            self.new_objects.append(result)


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


def write_snapshot(store: ObjectStore, source: ModelSource, *, jobs: int, progress: Progress | None = None,
                   plan: DeltaPlan | None = None, reuse: DecodedCache | None = None
                   ) -> tuple[Manifest, SnapshotStats]:  # fmt: skip
    """Store every file of `source`; return its manifest and what was new. `reuse` keeps the
    parent tensors decoded as delta bases (by default for this add alone)."""
    stats = SnapshotStats()
    entries: list[FileEntry] = []
    cache = reuse if reuse is not None else DecodedCache(CHECKOUT_BASES)
    with one_blas_thread(), ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-add") as pool:
        for f in source.files:
            entries.append(_write_file(store, f, pool, jobs, stats, progress, plan or DeltaPlan(), cache))
    return Manifest(tuple(entries)), stats


def _write_file(store: ObjectStore, f: SourceFile, pool: ThreadPoolExecutor, jobs: int,
                stats: SnapshotStats, progress: Progress | None, plan: DeltaPlan, reuse: DecodedCache) -> FileEntry:  # fmt: skip
    stats.files += 1
    if not f.is_safetensors:
        data = f.blob_data()
        digest = pool.submit(_digest, [data])
        result = store.put_blob(data)
        stats.record(result)
        if progress:
            progress(f.size)
        return FileEntry(f.path, "blob", f.size, digest.result(), result.oid)

    assert f.layout is not None
    header = store.put_blob(f.layout.header)
    stats.record(header)
    # The file digest is taken in file order as tensors come back, so that each tensor's pages
    # can be released right after: resident memory stays a few tensors, not the file.
    digest = blake3.blake3()
    digest.update(f.layout.header)

    def put(span: Any, data: np.ndarray) -> tuple[Any, np.ndarray, LossyTensor | None, PutResult]:
        bases = plan.candidates(span.name)
        lossy, encoding = None, None
        if plan.lossy is not None:
            lossy = encode_lossy(store, span.dtype, span.shape, data, bases, plan.lossy, plan.max_depth, reuse)
        if lossy is not None and lossy.chain is not None:
            # Lossy storage is only worth its error where it stores less than the exact tensor
            # (a pruning patch, say, beats any quantization step). Both are encoded once; the
            # smaller is written as it is.
            meta = tensor_meta(span.dtype, span.shape)
            exact = store.encode("tensor", meta, data, bases=bases, max_depth=plan.max_depth, reuse=reuse)
            approx = store.encode("tensor", meta, lossy.data, bases=bases, max_depth=plan.max_depth,
                                  extra=[lossy.chain], reuse=reuse)  # fmt: skip
            if len(exact.payload) <= len(approx.payload):
                lossy, encoding = LossyTensor(data, None, 0.0, lossy.changed_params), exact
            else:
                data, encoding = lossy.data, approx  # the version stores, and its digest covers, the reconstruction
        return span, data, lossy, store.put_tensor(span.dtype, span.shape, data, bases=bases, max_depth=plan.max_depth,
                                                   encoding=encoding, reuse=reuse)  # fmt: skip

    entries = []
    for span, data, lossy, result in ordered_map(pool, put, f.tensor_data(), jobs=jobs,
                                                 size=lambda item: item[0].nbytes):  # fmt: skip
        digest.update(data)
        f.release(span)
        stats.lossy.record(lossy)
        entries.append(TensorEntry(span.name, span.dtype, span.shape, result.oid))
        stats.tensors += 1
        stats.tensors_new += result.new
        stats.record(result)
        if progress:
            progress(span.nbytes)
    return FileEntry(f.path, "safetensors", f.size, digest.hexdigest(), header.oid, tuple(entries), f.converted_from)
