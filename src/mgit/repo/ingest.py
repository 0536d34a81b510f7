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

from collections.abc import Callable, Collection, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import blake3
import numpy as np

from mgit.codecs import Codec
from mgit.formats.dtypes import element_count
from mgit.formats.folder import ModelSource, SourceFile
from mgit.formats.gguf import GgufLayout
from mgit.formats.pairing import tensor_names
from mgit.formats.safetensors import TensorSpan
from mgit.formats.torch_zip import TorchZipLayout
from mgit.repo.file_digest import FileDigest, hash_pieces
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
    matching tensors of the parents, closest parent first, across a wrapper prefix), how deep chains may go, and
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
    def from_parents(
        cls,
        manifests: Iterable[Manifest],
        *,
        max_depth: int,
        names: Collection[str] = (),
        rename: Callable[[Collection[str]], dict[str, str]] | None = None,
    ) -> DeltaPlan:
        """Bases from the parents' tensors, by name; `names`, the new model's tensor names, pair
        across the wrapper prefix a parent's names differ by (a task model's `bert.` against
        its `AutoModel` base: `mgit.formats.pairing.tensor_names`). `rename` maps a parent's
        names to the new model's naming (a GGUF's, from a Hugging Face parent's)."""
        bases: dict[str, list[str]] = {}
        for manifest in manifests:
            tensors = manifest.tensors()
            by_name = {t.name: t.object for t in tensors}
            pairs = [(t.name, t.object) for t in tensors]
            if rename is not None:
                pairs += [(new, by_name[old]) for old, new in rename(list(by_name)).items()]
            if names:
                pairs += [(mine, by_name[theirs]) for mine, theirs in tensor_names(names, by_name).items()]
            for name, oid in pairs:
                found = bases.setdefault(name, [])
                if oid not in found:
                    found.append(oid)
        return cls(bases, max_depth)


def write_snapshot(
    store: ObjectStore,
    source: ModelSource,
    *,
    jobs: int,
    progress: Progress | None = None,
    plan: DeltaPlan | None = None,
    reuse: DecodedCache | None = None,
) -> tuple[Manifest, SnapshotStats]:
    """Store every file of `source`; return its manifest and what was new. `reuse` keeps the
    parent tensors decoded as delta bases (by default for this add alone)."""
    stats = SnapshotStats()
    cache = reuse if reuse is not None else DecodedCache(CHECKOUT_BASES)
    with (
        one_blas_thread(),
        ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-add") as pool,
        ThreadPoolExecutor(max_workers=WRITERS, thread_name_prefix="mgit-write") as writers,
    ):
        writer = _SnapshotWriter(store, plan or DeltaPlan(), cache, pool, writers, jobs, stats, progress)
        entries = [writer.file(f) for f in source.files]
    return Manifest(tuple(entries)), stats


WRITERS = 4  # threads writing blocked objects (mostly waiting for the disk)


@dataclass(frozen=True, eq=False)
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

    def block_count(self, data: np.ndarray) -> int:
        return -(-data.nbytes // self.encoding.blocks)


# What the pool is given for a safetensors file, in file order: a whole tensor, or each block of
# one coded in blocks; and what it gives back for each.


@dataclass(frozen=True)
class _WholeTensor:
    """A tensor to store whole. `found` is what `_SnapshotWriter.prepare` found for one over a
    block: stored already, or hashed and coded (to write); None: to encode and put."""

    span: TensorSpan
    data: np.ndarray
    found: PutResult | _Prepared | None = None

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class _TensorBlock:
    """Block `k` of `count` of a tensor whose writer takes its blocks in order from `queue`."""

    span: TensorSpan
    data: np.ndarray
    job: _Prepared
    queue: ChunkQueue  # (the job's)
    k: int
    count: int

    @property
    def nbytes(self) -> int:
        return min(self.data.nbytes, self.job.encoding.blocks)

    @property
    def last(self) -> bool:
        return self.k == self.count - 1


@dataclass(frozen=True)
class _StoredTensor:
    """A whole tensor written (or found): `data` is what the file digest covers (in a lossy add,
    the reconstruction), `lossy` its lossy outcome."""

    span: TensorSpan
    data: np.ndarray
    lossy: LossyTensor | None
    result: PutResult


@dataclass(frozen=True)
class _CodedBlock:
    """A block coded by the pool, for its writer."""

    block: _TensorBlock
    frame: bytes


@dataclass
class _SnapshotWriter:
    """What every file of one snapshot is written with, and the steps that write one."""

    store: ObjectStore
    plan: DeltaPlan
    reuse: DecodedCache
    pool: ThreadPoolExecutor  # codes tensors and blocks
    writers: ThreadPoolExecutor  # writes blocked objects as their blocks come
    jobs: int
    stats: SnapshotStats
    progress: Progress | None

    def file(self, f: SourceFile) -> FileEntry:
        self.stats.files += 1
        return self.tensors_file(f) if f.is_safetensors else self.opaque_file(f)

    def opaque_file(self, f: SourceFile) -> FileEntry:
        """Any file but safetensors, as one blob (its blocks coded by the pool when it is over one)."""
        data = f.blob_data()
        digest = self.pool.submit(_digest, [data])
        result = self.large_blob(data) if data.nbytes > self.store.block_bytes else self.store.put_blob(data)
        self.stats.record(result)
        if self.progress:
            self.progress(f.size)
        return FileEntry(f.path, "blob", f.size, digest.result(), result.oid)

    def large_blob(self, data: np.ndarray) -> PutResult:
        """A file's bytes over a block: when coded in blocks, the pool codes them in order for its writer."""
        found = self.prepare("blob", {}, data, "")
        if isinstance(found, PutResult):
            return found
        if found.queue is None:
            return found.write(self.store, data)
        queue = found.queue
        try:
            for frame in ordered_map(
                self.pool,
                lambda k: self.store.encode_block(found.encoding, data, k, found.bases),
                ((k,) for k in range(found.block_count(data))),
                jobs=self.jobs,
                size=lambda _: found.encoding.blocks,
            ):
                queue.put(frame)
            queue.close()
        except BaseException as exc:
            queue.fail(exc)
            raise
        assert queue.writer is not None
        return queue.writer.result()

    def prepare(
        self, kind: str, meta: dict[str, Any], data: np.ndarray, name: str, digest: Any = None
    ) -> _Prepared | PutResult:
        """For an object over a block, in file order: the stored object if it exists, else its
        id and encoding; one to be coded in blocks gets its writer started. `digest`, the file
        digest's hasher, takes the same bytes in the same pass."""
        store, plan = self.store, self.plan
        hasher = object_hasher(kind, meta)
        hash_pieces(data, hasher, digest)
        oid = hasher.hexdigest()
        found = store.existing(oid, kind, data.nbytes)
        if found is not None:
            return found
        bases = BaseReader(store, self.reuse)
        tensor = kind == "tensor"
        exact = (
            exact_encoding(kind, meta, data.nbytes, plan.exact[name], max_depth=plan.max_depth, header=store.header)
            if tensor and name in plan.exact
            else None
        )
        if exact is not None:
            return _Prepared(oid, kind, meta, exact, bases)
        encoding = store.encode(
            kind,
            meta,
            data,
            bases=plan.candidates(name) if tensor else (),
            reuse=bases,
            max_depth=plan.max_depth,
            extra=plan.extra(name) if tensor else (),
        )
        queue = None
        if encoding.deferred:
            queue = ChunkQueue()
            queue.start(self.writers, lambda frames: store.put_encoded(oid, kind, meta, data.nbytes, encoding, frames))
        return _Prepared(oid, kind, meta, encoding, bases, queue)

    def tensors_file(self, f: SourceFile) -> FileEntry:
        """A safetensors file, a PyTorch checkpoint or a GGUF: its header (a checkpoint's or a
        GGUF's skeleton: the file less its tensors' bytes) as a blob, then its tensors through
        the pool in file order. The file digest is taken in that order as tensors come back,
        the skeleton's bytes between them, so that each tensor's pages can be released right
        after: resident memory stays a few tensors, not the file."""
        assert f.layout is not None
        skeleton, data_start = f.layout.header, f.layout.data_start
        header = self.store.put_blob(skeleton)
        self.stats.record(header)
        if self.progress:
            self.progress(len(skeleton))  # (so that the bar ends at the files' size)
        digest = FileDigest(skeleton, data_start)
        started: list[ChunkQueue] = []  # of blocked tensors whose writers wait for blocks
        written: list[Future[PutResult]] = []  # their writers, all blocks given
        entries = []
        try:
            for done in ordered_map(
                self.pool,
                self.run,
                ((item,) for item in self.tensor_work(f, started, digest)),
                jobs=self.jobs,
                size=lambda item: item[0].nbytes,
            ):
                if isinstance(done, _CodedBlock):
                    if done.block.k == 0 and digest.count == len(entries):  # (not taken as it was read)
                        digest.take(done.block.span, done.block.data.nbytes).update(done.block.data)
                    if not self.hand_over(done, started, written):
                        continue
                    span, lossy, oid = done.block.span, None, done.block.job.oid
                else:
                    if digest.count == len(entries):
                        digest.take(done.span, done.data.nbytes).update(done.data)
                    self.stats.tensors_new += done.result.new
                    self.stats.record(done.result)
                    span, lossy, oid = done.span, done.lossy, done.result.oid
                f.release(span)
                self.stats.lossy.record(lossy)
                entries.append(TensorEntry(span.name, span.dtype, span.shape, oid))
                self.stats.tensors += 1
                if self.progress:
                    self.progress(span.nbytes)
            for writer in written:  # the blocked objects, written and synced
                result = writer.result()
                self.stats.tensors_new += result.new
                self.stats.record(result)
        except BaseException as exc:
            for queue in started:  # writers still waiting for blocks stop, dropping their files
                queue.fail(exc)
            raise
        digest.hasher.update(skeleton[digest.taken :])
        if isinstance(f.layout, TorchZipLayout | GgufLayout):  # (its spans are offsets in the file)
            offsets = tuple(s.start for s in f.layout.tensors)
            return FileEntry(
                f.path,
                f.kind,
                f.size,
                digest.hasher.hexdigest(),
                header.oid,
                tuple(entries),
                None,
                offsets,
                f.layout.views,
            )
        return FileEntry(
            f.path, "safetensors", f.size, digest.hasher.hexdigest(), header.oid, tuple(entries), f.converted_from
        )

    @staticmethod
    def hand_over(done: _CodedBlock, started: list[ChunkQueue], written: list[Future[PutResult]]) -> bool:
        """Give a coded block to its tensor's writer; after the last one, the writer moves from
        `started` to `written` (its result is recorded once it is written) and the tensor is done."""
        queue = done.block.queue
        queue.put(done.frame)
        if not done.block.last:
            return False
        queue.close()
        started.remove(queue)
        assert queue.writer is not None
        written.append(queue.writer)
        return True

    def tensor_work(
        self, f: SourceFile, started: list[ChunkQueue], digest: FileDigest
    ) -> Iterator[_WholeTensor | _TensorBlock]:
        """What the pool does, in file order: a tensor to put, one known already or coded
        already (to write), or each block of one coded in blocks (whose writer joins `started`).
        A tensor whose bytes the file digest may take as it is read (`FileDigest.early`) gives
        them to it here, a large one in the same pass as its id."""
        for i, (span, data) in enumerate(f.tensor_data()):
            exact = not self.lossy(span)
            large = exact and data.nbytes > self.store.block_bytes
            hasher = None
            if exact and digest.early(i, data, large):
                hasher = digest.take(span, data.nbytes)
            found = None
            if large:
                found = self.prepare("tensor", tensor_meta(span.dtype, span.shape), data, span.name, hasher)
            elif hasher is not None:
                hasher.update(data)
            if isinstance(found, _Prepared) and found.queue is not None:
                started.append(found.queue)
                count = found.block_count(data)
                yield from (_TensorBlock(span, data, found, found.queue, k, count) for k in range(count))
            else:
                yield _WholeTensor(span, data, found)

    def lossy(self, span: TensorSpan) -> bool:
        """Whether a tensor may be stored lossily: within the policy's scope, and for a scoped
        policy never a one-element tensor (an optimizer's step count, which Adam's bias
        correction reads exactly)."""
        policy = self.plan.lossy
        if policy is None or not policy.covers(span.name):
            return False
        return policy.scope is None or element_count(span.shape) > 1

    def run(self, item: _WholeTensor | _TensorBlock) -> _StoredTensor | _CodedBlock:
        """One item of `tensor_work`, in a worker."""
        if isinstance(item, _TensorBlock):
            return _CodedBlock(item, self.store.encode_block(item.job.encoding, item.data, item.k, item.job.bases))
        if isinstance(item.found, PutResult):
            return _StoredTensor(item.span, item.data, None, item.found)
        if isinstance(item.found, _Prepared):
            return _StoredTensor(item.span, item.data, None, item.found.write(self.store, item.data))
        return self.put(item.span, item.data)

    def put(self, span: TensorSpan, data: np.ndarray) -> _StoredTensor:
        """A tensor encoded and written whole: lossily when that stores less, as a chain that
        predicts it when the plan has one, else as `put` chooses."""
        store, plan, bases = self.store, self.plan, self.plan.candidates(span.name)
        meta = tensor_meta(span.dtype, span.shape)
        lossy, encoding = None, None
        if plan.lossy is not None and self.lossy(span):
            lossy = encode_lossy(store, span.dtype, span.shape, data, bases, plan.lossy, plan.max_depth, self.reuse)
        if lossy is not None and lossy.chain is not None:
            data, lossy, encoding = self.lossy_or_exact(meta, data, lossy, bases)
        if encoding is None and span.name in plan.exact:
            encoding = exact_encoding(
                "tensor", meta, data.nbytes, plan.exact[span.name], max_depth=plan.max_depth, header=store.header
            )
        if encoding is None and plan.extra(span.name):
            encoding = store.encode(
                "tensor",
                meta,
                data,
                bases=bases,
                max_depth=plan.max_depth,
                reuse=self.reuse,
                extra=plan.extra(span.name),
            )
        result = store.put_tensor(
            span.dtype, span.shape, data, bases=bases, max_depth=plan.max_depth, encoding=encoding, reuse=self.reuse
        )
        return _StoredTensor(span, data, lossy, result)

    def lossy_or_exact(
        self, meta: dict[str, Any], data: np.ndarray, lossy: LossyTensor, bases: list[str]
    ) -> tuple[np.ndarray, LossyTensor, Encoding]:
        """Lossy storage is only worth its error where it stores less than the exact tensor (a
        pruning patch, say, beats any quantization step). Both are encoded once; the smaller is
        written as it is: the data to write (the reconstruction, which the version stores and its
        digest covers, or the original), the lossy outcome, and the encoding."""
        assert lossy.chain is not None
        store, max_depth = self.store, self.plan.max_depth
        exact = store.encode("tensor", meta, data, bases=bases, max_depth=max_depth, reuse=self.reuse, blocks=False)
        approx = store.encode(
            "tensor",
            meta,
            lossy.data,
            bases=bases,
            max_depth=max_depth,
            extra=[lossy.chain],
            reuse=self.reuse,
            blocks=False,
        )
        if len(exact.payload) <= len(approx.payload):
            return data, LossyTensor(data, None, 0.0, lossy.changed_params), exact
        return lossy.data, lossy, approx
