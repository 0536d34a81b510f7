"""Model files -> objects + manifest: what `add` writes.

Files stream tensor by tensor through a thread pool with a bounded window of bytes in flight
(`mgit.util.parallel`), so memory stays near a few blocks whatever the size of the model. Each
tensor is offered its parents' matching tensors as delta bases (`DeltaPlan`), and in a lossy
add a quantized step too (`mgit.store.lossy`). A tensor larger than a block is hashed and its chain
chosen first (on samples, in file order), then its blocks are coded by the pool and written
in order by a writer thread as they come, which also waits for the disk (fsync) off the
workers.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np

from mgit.codecs import Codec
from mgit.formats.folder import ModelSource, SourceFile
from mgit.store.base import ObjectStore, PutResult
from mgit.store.cache import CHECKOUT_BASES, DecodedCache
from mgit.store.codec_policy import Encoding, exact_encoding
from mgit.store.decoding import BaseReader
from mgit.store.lossy import LossyTensor, encode_lossy
from mgit.store.lossy_policy import LossyPolicy, LossyTally
from mgit.store.objectformat import DEFAULT_MAX_DEPTH
from mgit.store.objects import FileEntry, Manifest, TensorEntry, object_hasher, tensor_meta
from mgit.util.parallel import ChunkQueue, Progress, one_blas_thread, ordered_map


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
    derived: dict[str, list[Codec]] = field(default_factory=dict)  # by tensor name: a chain that predicts it
    # By tensor name: a chain whose predictor made the tensor (a merge's weighted sum of its
    # inputs), written as it is: its residual zeros, nothing tried against it, no second decode
    # (tried as a `derived` one when its bases may not be coded against).
    exact: dict[str, list[Codec]] = field(default_factory=dict)

    def extra(self, name: str) -> list[list[Codec]]:
        """Chains a tensor may also be coded with (a merge's weighted sum of its inputs)."""
        chain = self.derived.get(name) or self.exact.get(name)
        return [chain] if chain else []

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
    with one_blas_thread(), ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-add") as pool, \
            ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="mgit-write") as writers:  # fmt: skip
        for f in source.files:
            entries.append(_write_file(store, f, (pool, writers), jobs, stats, progress, plan or DeltaPlan(), cache))
    return Manifest(tuple(entries)), stats


WRITERS = 4  # threads writing blocked objects (mostly waiting for the disk)


@dataclass
class _Prepared:
    """An object over a block, hashed and its encoding chosen. One coded already (a whole
    chain, or blocks coded to be measured) is for a worker to write; one to be coded in blocks
    has a `queue` whose writer writes its blocks as the pool codes them."""

    oid: str
    kind: str
    meta: dict[str, Any]
    encoding: Encoding
    bases: BaseReader
    queue: ChunkQueue | None = None

    def write(self, store: ObjectStore, data: np.ndarray) -> PutResult:
        """Write one coded already (not hashed again: its id is known)."""
        return store.put_encoded(self.oid, self.kind, self.meta, data.nbytes, self.encoding)


def _prepare(store: ObjectStore, kind: str, meta: dict[str, Any], data: np.ndarray, plan: DeltaPlan, name: str,
             reuse: DecodedCache, writers: ThreadPoolExecutor) -> _Prepared | PutResult:  # fmt: skip
    """For an object over a block, in file order: the stored object if it exists, else its
    id and encoding; one to be coded in blocks gets its writer started."""
    hasher = object_hasher(kind, meta)
    hasher.update(data)
    oid = hasher.hexdigest()
    found = store.existing(oid, kind, data.nbytes)
    if found is not None:
        return found
    bases = BaseReader(store, reuse)
    tensor = kind == "tensor"
    exact = exact_encoding(kind, meta, data.nbytes, plan.exact[name], max_depth=plan.max_depth,
                           header=store.header) if tensor and name in plan.exact else None  # fmt: skip
    if exact is not None:
        return _Prepared(oid, kind, meta, exact, bases)
    encoding = store.encode(kind, meta, data, bases=plan.candidates(name) if tensor else (), max_depth=plan.max_depth,
                            reuse=bases, extra=plan.extra(name) if tensor else ())  # fmt: skip
    job = _Prepared(oid, kind, meta, encoding, bases)
    if encoding.blocks and encoding.payload is None:
        job.queue = ChunkQueue()
        job.queue.start(writers, lambda frames: store.put_encoded(oid, kind, meta, data.nbytes, encoding, frames))
    return job


def _put_large_blob(store: ObjectStore, data: np.ndarray, pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor],
                    jobs: int, reuse: DecodedCache) -> PutResult:  # fmt: skip
    """A file that is not safetensors, over a block: its blocks coded by the pool."""
    pool, writers = pools
    found = _prepare(store, "blob", {}, data, DeltaPlan(), "", reuse, writers)
    if isinstance(found, PutResult):
        return found
    if found.queue is None:
        return found.write(store, data)
    queue, count = found.queue, -(-data.nbytes // found.encoding.blocks)
    try:
        for frame in ordered_map(pool, lambda k: store.encode_block(found.encoding, data, k, found.bases),
                                 ((k,) for k in range(count)), jobs=jobs, size=lambda _: found.encoding.blocks):  # fmt: skip
            queue.put(frame)
        queue.close()
    except BaseException as exc:
        queue.fail(exc)
        raise
    assert queue.writer is not None
    return queue.writer.result()


def _write_file(store: ObjectStore, f: SourceFile, pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor], jobs: int,
                stats: SnapshotStats, progress: Progress | None, plan: DeltaPlan, reuse: DecodedCache) -> FileEntry:  # fmt: skip
    pool, writers = pools
    stats.files += 1
    if not f.is_safetensors:
        data = f.blob_data()
        digest = pool.submit(_digest, [data])
        result = _put_large_blob(store, data, pools, jobs, reuse) if data.nbytes > store.block_bytes else store.put_blob(data)
        stats.record(result)
        if progress:
            progress(f.size)
        return FileEntry(f.path, "blob", f.size, digest.result(), result.oid)

    assert f.layout is not None
    header = store.put_blob(f.layout.header)
    stats.record(header)
    if progress:
        progress(len(f.layout.header))  # (so that the bar ends at the files' size)
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
            exact = store.encode("tensor", meta, data, bases=bases, max_depth=plan.max_depth, reuse=reuse, blocks=False)
            approx = store.encode("tensor", meta, lossy.data, bases=bases, max_depth=plan.max_depth,
                                  extra=[lossy.chain], reuse=reuse, blocks=False)  # fmt: skip
            if len(exact.payload) <= len(approx.payload):
                lossy, encoding = LossyTensor(data, None, 0.0, lossy.changed_params), exact
            else:
                data, encoding = lossy.data, approx  # the version stores, and its digest covers, the reconstruction
        if encoding is None and span.name in plan.exact:
            encoding = exact_encoding("tensor", tensor_meta(span.dtype, span.shape), data.nbytes,
                                      plan.exact[span.name], max_depth=plan.max_depth, header=store.header)  # fmt: skip
        if encoding is None and plan.extra(span.name):
            encoding = store.encode("tensor", tensor_meta(span.dtype, span.shape), data, bases=bases,
                                    max_depth=plan.max_depth, reuse=reuse, extra=plan.extra(span.name))  # fmt: skip
        return span, data, lossy, store.put_tensor(span.dtype, span.shape, data, bases=bases, max_depth=plan.max_depth,
                                                   encoding=encoding, reuse=reuse)  # fmt: skip

    started: list[_Prepared] = []

    def work() -> Iterator[tuple[Any, ...]]:
        """What the pool does, in file order: a tensor to put, one known already or coded
        already (to write), or each block of one coded in blocks."""
        for span, data in f.tensor_data():
            found = None
            if plan.lossy is None and data.nbytes > store.block_bytes:
                found = _prepare(store, "tensor", tensor_meta(span.dtype, span.shape), data, plan, span.name, reuse,
                                 writers)  # fmt: skip
            if isinstance(found, _Prepared) and found.queue is not None:
                started.append(found)
                count = -(-data.nbytes // found.encoding.blocks)
                yield from ((span, data, found, k, count) for k in range(count))
            else:
                yield (span, data, found)

    def run(span: Any, data: np.ndarray, found: Any, *block: int) -> tuple[Any, ...]:
        if block:  # (k, count): block k of a blocked tensor, coded
            return (span, data, found, *block, store.encode_block(found.encoding, data, block[0], found.bases))
        if isinstance(found, PutResult):
            return (span, data, None, found)
        if isinstance(found, _Prepared):
            return (span, data, None, found.write(store, data))
        return put(span, data)

    def size(item: tuple[Any, ...]) -> int:
        return min(item[1].nbytes, item[2].encoding.blocks) if len(item) == 5 else item[1].nbytes

    entries, written = [], []
    try:
        for item in ordered_map(pool, run, work(), jobs=jobs, size=size):
            span, data = item[0], item[1]
            if len(item) == 6:  # a block, to its writer; after the last, its tensor is done
                job, k, count, frame = item[2:]
                if k == 0:
                    digest.update(data)
                job.queue.put(frame)
                if k < count - 1:
                    continue
                job.queue.close()
                started.remove(job)
                written.append(job.queue.writer)  # its result is recorded once it is written
                lossy, oid = None, job.oid
            else:
                span, data, lossy, result = item
                digest.update(data)
                stats.tensors_new += result.new
                stats.record(result)
                oid = result.oid
            f.release(span)
            stats.lossy.record(lossy)
            entries.append(TensorEntry(span.name, span.dtype, span.shape, oid))
            stats.tensors += 1
            if progress:
                progress(span.nbytes)
        for writer in written:  # the blocked objects, written and synced
            result = writer.result()
            stats.tensors_new += result.new
            stats.record(result)
    except BaseException as exc:
        for job in started:  # writers still waiting for blocks stop, dropping their files
            job.queue.fail(exc)
        raise
    return FileEntry(f.path, "safetensors", f.size, digest.hexdigest(), header.oid, tuple(entries), f.converted_from)
