"""Model diff: what changed between two models, tensor by tensor, layer by layer, file by file.

A side is a stored version (a ref: `NAME`, `NAME@N`, `NAME@HEX`) or a model folder or file
that need not be added: an argument that exists on disk is a path, anything else a ref (a
`Path` object is always a path). Tensors are matched by name: only in A, only in B, shape
changed, dtype changed, identical (same bytes), changed. The work goes only where they differ:

- tensors with the same object id are identical without comparing anything (each is read once,
  one side only, for its share of ||A||); a folder tensor is hashed (blake3, GB/s) and its id
  compared before the stored tensor is decoded;
- a tensor stored as a delta against the other side's tensor (a fine-tune against its parent)
  takes that base from memory instead of decoding it a second time;
- pairs that differ are compared in parallel on a thread pool, each in chunks
  (`mgit.tensorstats`), so memory stays near the two tensors of each pair in flight.

A changed tensor (and a dtype change of the same shape, compared by value) gets ||B-A||/||A||,
max |B-A|, cosine similarity, the fraction of values that differ and, for a matrix, the rank
of B-A. A model's (and a group's) figures have one denominator, every value both sides share
(same name and shape, unchanged tensors included): the values that changed among them, and
||B-A|| / ||A|| over all of them. Tensors are grouped by module prefix (`module_group`); text
files (config.json, tokenizer files) are compared as unified diffs.
"""

from __future__ import annotations

import difflib
import math
import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3
import numpy as np

from mgit.errors import InputError, MgitError, UnknownRefError
from mgit.formats.folder import SourceFile, scan_path
from mgit.formats.layers import layer_counts, layer_of
from mgit.formats.safetensors import DTYPES, element_count
from mgit.formats.tensors import TORCH_SUFFIXES
from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.store.cache import UNBOUNDED, DecodedCache
from mgit.store.objectformat import file_expected
from mgit.store.objects import Manifest, TensorEntry, object_id, tensor_meta
from mgit.store.reader import tensor_bytes
from mgit.tensorstats import TensorStats, sum_of_squares, tensor_stats
from mgit.util.parallel import StartProgress, default_jobs, one_blas_thread

MAX_TEXT_BYTES = 1 << 20  # larger text files are compared by digest only
STATUSES = ("changed", "dtype", "shape", "only_a", "only_b", "identical", "same")


# --- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorDiff(Report):
    name: str
    group: str
    status: str  # one of STATUSES
    dtype_a: str | None
    dtype_b: str | None
    shape_a: list[int] | None
    shape_b: list[int] | None
    stats: TensorStats | None = None


@dataclass(frozen=True)
class GroupDiff(Report):
    """The tensors under one module prefix (a layer): counts by status and their change."""

    name: str
    tensors: int
    counts: dict[str, int]
    params: int  # of B (of A for tensors only in A)
    changed_values: int
    rel_change: float | None  # ||B-A|| / ||A|| over the group's shared values
    max_abs: float | None
    min_cosine: float | None
    max_rank: int | None
    rank_capped: bool = False


@dataclass(frozen=True)
class FileDiff(Report):
    path: str
    status: str  # "identical", "changed", "only_a", "only_b"
    type: str  # "safetensors" (its tensors are compared above) or "blob"
    size_a: int | None
    size_b: int | None
    diff: list[str] | None = None  # unified diff lines of a changed text file
    note: str | None = None  # why a changed file has no diff


@dataclass(frozen=True)
class DiffSide(Report):
    label: str  # "NAME@N" for a ref, the path for a folder or file
    kind: str  # "ref" or "path"
    version: str | None = None


@dataclass(frozen=True)
class DiffSummary(Report):
    tensors_a: int
    tensors_b: int
    params_a: int
    params_b: int
    counts: dict[str, int]  # tensors by status
    compared_values: int  # every value both sides share (same name and shape), unchanged ones included
    changed_values: int
    rel_change: float | None  # ||B-A|| / ||A|| over every shared value
    max_abs: float | None
    files: dict[str, int]  # files by status
    decoded: int  # stored objects decoded (an identical tensor once, one side, for its norm)
    reused: int  # decodes saved by taking a delta base from the other side, already in memory


@dataclass(frozen=True)
class DiffResult(Report):
    a: DiffSide
    b: DiffSide
    structural: bool
    summary: DiffSummary
    groups: list[GroupDiff]
    tensors: list[TensorDiff]
    files: list[FileDiff]
    layers: dict[str, list[int]]  # numbered blocks ("model.layers") -> [count in A, count in B]
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        same = {"identical", "same"}
        return all(t.status in same for t in self.tensors) and all(f.status == "identical" for f in self.files)


# --- sides -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TensorRef:
    """One tensor of a side: stored (`entry` in `store`) or from disk (`data`, raw bytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    entry: TensorEntry | None = None
    store: ObjectStore | None = None
    data: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return element_count(self.shape) * DTYPES[self.dtype][0]

    def object_id(self) -> str:
        """The stored id, or what the id of this content would be (a hash of its bytes)."""
        if self.entry is not None:
            return self.entry.object
        return object_id("tensor", tensor_meta(self.dtype, self.shape), self.data)


@dataclass(frozen=True)
class FileRef:
    path: str
    type: str
    size: int
    digest: Callable[[], str]  # blake3 of the file as checkout would write it
    content: Callable[[], bytes]


@dataclass
class ModelSide:
    side: DiffSide
    tensors: dict[str, TensorRef]
    files: dict[str, FileRef]
    notes: list[str] = field(default_factory=list)


Resolver = Callable[[str], tuple[str, str, Manifest]]  # ref -> (label, version id, manifest)


def open_side(
    arg: str | os.PathLike[str], *, store: ObjectStore | None = None, resolve: Resolver | None = None
) -> ModelSide:
    """One side of a diff: an existing file or folder is read from disk; anything else is a
    ref, resolved by `resolve` in `store` (without them, only paths can be compared)."""
    text = os.fspath(arg)
    if isinstance(arg, os.PathLike) or os.path.lexists(text):
        try:
            side = folder_side(Path(text))
        except InputError as exc:
            exc.hint = exc.hint or "mgit diff compares model folders, .safetensors files, PyTorch checkpoints or refs"
            raise
        if resolve is not None and not _looks_like_path(text):
            try:
                label = resolve(text)[0]
                side.notes.append(
                    f"{text!r} is a path here and also a model; the path was compared "
                    f"(name a version, such as {label}, to compare the model)"
                )
            except MgitError:
                pass
        return side
    if resolve is None or store is None:
        raise InputError(
            text,
            "no such file or folder (and no repository here to look it up as a ref)",
            hint="Run inside a repository (mgit init) to compare refs",
        )
    try:
        label, vid, manifest = resolve(text)
    except UnknownRefError:
        if _looks_like_path(text):
            raise InputError(
                text,
                "no such file or folder, and no model has that name",
                hint="Check the path; refs are NAME, NAME@N or NAME@HEX (see: mgit ls)",
            ) from None
        raise
    return stored_side(store, DiffSide(label, "ref", vid), manifest)


def _looks_like_path(text: str) -> bool:
    """Written as a path rather than a model name: it starts like one, ends like a model file,
    or has more than the one '/' a name may have."""
    return (
        text.startswith((".", "~", "/"))
        or text.count("/") > 1
        or (os.sep != "/" and os.sep in text)
        or Path(text).suffix in (".safetensors", *TORCH_SUFFIXES)
    )


def stored_side(store: ObjectStore, side: DiffSide, manifest: Manifest) -> ModelSide:
    tensors = [TensorRef(t.name, t.dtype, t.shape, entry=t, store=store) for t in manifest.tensors()]
    files = [
        FileRef(
            f.path,
            f.type,
            f.size,
            lambda f=f: f.digest,
            lambda f=f: store.get(f.object, expect=file_expected(f))[1].tobytes(),
        )
        for f in manifest.files
    ]
    return _side(side, tensors, files)


def folder_side(path: Path) -> ModelSide:
    source = scan_path(path)
    tensors = [
        TensorRef(span.name, span.dtype, span.shape, data=data)
        for f in source.files
        if f.is_safetensors
        for span, data in f.tensor_data()
    ]
    files = [
        FileRef(
            f.path,
            "safetensors" if f.is_safetensors else "blob",
            f.size,
            lambda f=f: _file_digest(f),
            lambda f=f: f.blob_data().tobytes(),
        )
        for f in source.files
    ]
    return _side(DiffSide(str(path), "path"), tensors, files, source.notes)


def _side(side: DiffSide, tensors: list[TensorRef], files: list[FileRef], notes: Iterable[str] = ()) -> ModelSide:
    """A side whose tensor names are unique and which holds at least one tensor."""
    by_name = {t.name: t for t in tensors}
    if len(by_name) < len(tensors):
        twice = Counter(t.name for t in tensors).most_common(1)[0][0]
        raise InputError(side.label, f"tensor {twice!r} appears in two files", hint="Compare the files one by one")
    if not by_name:
        pickles = [f.path for f in files if Path(f.path).suffix in TORCH_SUFFIXES]
        hint = (
            f"Its PyTorch checkpoint is not read inside a folder: give the file itself ({pickles[0]})"
            if pickles
            else "Compare model folders, .safetensors files, PyTorch checkpoints or refs"
        )
        raise InputError(side.label, "holds no tensors, so it is not a model to compare", hint=hint)
    return ModelSide(side, by_name, {f.path: f for f in files}, list(notes))


def _file_digest(f: SourceFile) -> str:
    hasher = blake3.blake3()
    if f.tensors is not None and f.layout is not None:  # a converted checkpoint, as it would be stored
        hasher.update(f.layout.header)
        for _, data in f.tensor_data():
            hasher.update(data)
    else:
        hasher.update(f.blob_data())
    return hasher.hexdigest()


# --- comparing -------------------------------------------------------------------------------


def _compare(a: TensorRef, b: TensorRef, reuse: DecodedCache | None) -> tuple[str, TensorStats | None, int, int]:
    """(status, statistics, objects decoded, decodes saved) for two tensors of the same shape."""
    if a.dtype == b.dtype and a.object_id() == b.object_id():
        return "identical", None, 0, 0
    # What one side decodes is kept for the other: when one is stored as a delta against the
    # other (or both against a common base), that base is decoded once. Each decode verifies.
    cache = reuse if reuse is not None else DecodedCache(UNBOUNDED, keep_all=True)
    hits, misses = cache.hits, cache.misses

    def raw(t: TensorRef) -> np.ndarray:
        if t.data is not None:
            return t.data
        assert t.store is not None and t.entry is not None
        return tensor_bytes(t.store, t.entry, reuse=cache)

    raw_a, raw_b = raw(a), raw(b)
    stats = tensor_stats((a.dtype, b.dtype), a.shape, raw_a, raw_b)
    status = "changed" if a.dtype == b.dtype else "dtype"
    return status, stats, cache.misses - misses, cache.hits - hits


def _unchanged(t: TensorRef, reuse: DecodedCache | None) -> tuple[float, int, int]:
    """(sum of squares, objects decoded, decodes saved) of a tensor both sides hold unchanged:
    its share of the model's ||A||, so that a relative change is over every shared value."""
    cache = reuse if reuse is not None else DecodedCache(UNBOUNDED, keep_all=True)
    hits, misses = cache.hits, cache.misses
    if t.data is not None:
        raw = t.data
    else:
        assert t.store is not None and t.entry is not None
        raw = tensor_bytes(t.store, t.entry, reuse=cache)
    return sum_of_squares(t.dtype, t.shape, raw), cache.misses - misses, cache.hits - hits


def diff_models(
    a: ModelSide,
    b: ModelSide,
    *,
    structural: bool = False,
    jobs: int | None = None,
    progress: StartProgress | None = None,
    reuse: DecodedCache | None = None,
) -> DiffResult:
    """Compare two sides. `structural` compares only names, shapes, dtypes and layer counts
    (no tensor data and no files are read). `progress(total_bytes)` may return a callback.
    `reuse` (a session's cache) keeps what is decoded; by default each pair has its own."""
    names = list(dict.fromkeys([*a.tensors, *b.tensors]))
    status: dict[str, str] = {}
    work: list[str] = []
    for name in names:
        ta, tb = a.tensors.get(name), b.tensors.get(name)
        if ta is None or tb is None:
            status[name] = "only_b" if ta is None else "only_a"
        elif ta.shape != tb.shape:
            status[name] = "shape"
        elif structural:
            status[name] = "same" if ta.dtype == tb.dtype else "dtype"
        elif ta.dtype != tb.dtype and "C64" in (ta.dtype, tb.dtype):  # complex against real: no statistics
            status[name] = "dtype"
        elif ta.entry is not None and tb.entry is not None and ta.entry.object == tb.entry.object:
            status[name] = "identical"
        else:
            work.append(name)
    stats: dict[str, TensorStats] = {}
    unchanged: dict[str, float] = {}  # sum of squares of each tensor both sides hold unchanged
    decoded = reused = 0
    same = [k for k in names if status.get(k) == "identical"]
    counted = set(same)  # in the progress total; those found identical by hashing were counted as pairs
    if work or same:
        work.sort(key=lambda k: a.tensors[k].nbytes + b.tensors[k].nbytes, reverse=True)
        total = sum(a.tensors[k].nbytes + b.tensors[k].nbytes for k in work) + sum(a.tensors[k].nbytes for k in same)
        tick = progress(total) if progress else None
        with (
            one_blas_thread(),
            ThreadPoolExecutor(max_workers=jobs or default_jobs(), thread_name_prefix="mgit-diff") as pool,
        ):
            try:
                futures = {pool.submit(_compare, a.tensors[k], b.tensors[k], reuse): k for k in work}
                for future in as_completed(futures):
                    k = futures[future]
                    status[k], found, dec, reu = future.result()
                    decoded, reused = decoded + dec, reused + reu
                    if found is not None:
                        stats[k] = found
                    else:
                        same.append(k)  # the same bytes, found by hashing a file's tensor
                    if tick:
                        tick(a.tensors[k].nbytes + b.tensors[k].nbytes)
                norms = {pool.submit(_unchanged, a.tensors[k], reuse): k for k in same}
                for future in as_completed(norms):
                    k = norms[future]
                    unchanged[k], dec, reu = future.result()
                    decoded, reused = decoded + dec, reused + reu
                    if tick and k in counted:
                        tick(a.tensors[k].nbytes)
            except BaseException:  # a corrupt object or ^C: do not compare the rest first
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    tensors = []
    for k in names:
        ta, tb = a.tensors.get(k), b.tensors.get(k)
        tensors.append(
            TensorDiff(
                k,
                module_group(k),
                status[k],
                ta and ta.dtype,
                tb and tb.dtype,
                ta and list(ta.shape),
                tb and list(tb.shape),
                stats.get(k),
            )
        )
    files = [] if structural else file_diffs(a.files, b.files)
    layers_a, layers_b = layer_counts(a.tensors), layer_counts(b.tensors)
    layers = {k: [layers_a.get(k, 0), layers_b.get(k, 0)] for k in dict.fromkeys([*layers_a, *layers_b])}
    summary = DiffSummary(
        tensors_a=len(a.tensors),
        tensors_b=len(b.tensors),
        params_a=sum(element_count(t.shape) for t in a.tensors.values()),
        params_b=sum(element_count(t.shape) for t in b.tensors.values()),
        counts=_counts(t.status for t in tensors),
        **_change(list(stats.values()), _shares(tensors, unchanged)),
        files=_counts(f.status for f in files),
        decoded=decoded,
        reused=reused,
    )
    return DiffResult(
        a.side, b.side, structural, summary, _groups(tensors, unchanged), tensors, files, layers, [*a.notes, *b.notes]
    )


def diff_paths(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    *,
    structural: bool = False,
    jobs: int | None = None,
    progress: StartProgress | None = None,
) -> DiffResult:
    """Compare two models on disk, no repository needed."""
    return diff_models(open_side(a), open_side(b), structural=structural, jobs=jobs, progress=progress)


def _counts(statuses: Iterable[str]) -> dict[str, int]:
    found = Counter(statuses)
    return {s: found[s] for s in STATUSES if found[s]}


def _shares(tensors: list[TensorDiff], unchanged: dict[str, float]) -> list[tuple[int, float]]:
    """(values, sum of squares) of each tensor among `tensors` that both sides hold unchanged."""
    return [(element_count(tuple(t.shape_a or ())), unchanged[t.name]) for t in tensors if t.name in unchanged]


def _change(stats: list[TensorStats], same: list[tuple[int, float]]) -> dict[str, Any]:
    """Change over several tensors, every value both sides share in the denominator (the
    compared tensors' and the unchanged ones', `same`): the relative change of their
    concatenation, the values that changed among them, the largest |B-A|."""
    sa = sum((s.norm_a or 0.0) ** 2 for s in stats) + sum(ss for _, ss in same)
    sd = sum((s.norm_diff or 0.0) ** 2 for s in stats)
    return {
        "compared_values": sum(s.values for s in stats) + sum(n for n, _ in same),
        "changed_values": sum(s.changed for s in stats),
        "rel_change": math.sqrt(sd / sa) if (stats or same) and sa > 0 else None,
        "max_abs": max((s.max_abs for s in stats if s.max_abs is not None), default=0.0 if same else None),
    }


def _groups(tensors: list[TensorDiff], unchanged: dict[str, float]) -> list[GroupDiff]:
    members: dict[str, list[TensorDiff]] = {}
    for t in tensors:
        members.setdefault(t.group, []).append(t)
    out = []
    for name, group in members.items():
        stats = [t.stats for t in group if t.stats is not None]
        change = _change(stats, _shares(group, unchanged))
        ranked = [s for s in stats if s.rank is not None]
        top = max(ranked, key=lambda s: (s.rank, s.rank_capped), default=None)
        params = sum(element_count(tuple(t.shape_b if t.shape_b is not None else t.shape_a or ())) for t in group)
        out.append(
            GroupDiff(
                name,
                len(group),
                _counts(t.status for t in group),
                params,
                change["changed_values"],
                change["rel_change"],
                change["max_abs"],
                min((s.cosine for s in stats if s.cosine is not None), default=None),
                top.rank if top else None,
                top.rank_capped if top else False,
            )
        )
    return out


def module_group(name: str) -> str:
    """The module a tensor belongs to, for grouping: its layer, if it is in one
    (`model.layers.3.mlp.up_proj.weight` -> `model.layers.3`, `mgit.formats.layers`), else its
    module (`model.embed_tokens.weight` -> `model.embed_tokens`), else the name itself."""
    layer = layer_of(name)
    if layer is None:
        return name.rpartition(".")[0] or name
    return ".".join(name.split(".")[: layer[0].count(".") + 2])


# --- files -----------------------------------------------------------------------------------


def file_diffs(a: Mapping[str, FileRef], b: Mapping[str, FileRef]) -> list[FileDiff]:
    """Every file of either side by digest; changed text files as unified diffs."""
    out = []
    for path in dict.fromkeys([*a, *b]):
        fa, fb = a.get(path), b.get(path)
        if fa is None or fb is None:
            f = fa or fb
            assert f is not None
            out.append(
                FileDiff(
                    path, "only_b" if fa is None else "only_a", f.type, fa.size if fa else None, fb.size if fb else None
                )
            )
            continue
        kind = "safetensors" if "safetensors" in (fa.type, fb.type) else "blob"
        if fa.type == fb.type and fa.digest() == fb.digest():
            out.append(FileDiff(path, "identical", kind, fa.size, fb.size))
            continue
        diff, note = None, None
        if kind == "safetensors":
            note = "tensors compared above"
        elif max(fa.size, fb.size) > MAX_TEXT_BYTES:
            note = f"larger than {MAX_TEXT_BYTES >> 20} MiB: compared by digest only"
        else:
            diff = text_diff(path, fa.content(), fb.content())
            note = None if diff is not None else "binary files differ"
        out.append(FileDiff(path, "changed", kind, fa.size, fb.size, diff, note))
    return out


def text_diff(path: str, a: bytes, b: bytes) -> list[str] | None:
    """A unified diff of two texts (lines without their line ends), or None for binary data."""
    try:
        if b"\x00" in a or b"\x00" in b:
            return None
        old, new = a.decode("utf-8").splitlines(), b.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
    return list(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", lineterm=""))
