"""Two sides compared: tensors matched by name and compared in parallel, figures summed with
one denominator per model and per group (see `mgit.diff`).
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import replace
from typing import Any

import numpy as np

from mgit.diff.files import file_diffs
from mgit.diff.quantized import as_floats
from mgit.diff.results import STATUSES, DiffResult, DiffSummary, GroupDiff, TensorDiff
from mgit.diff.sides import ModelSide, TensorRef, open_side
from mgit.formats.dtypes import BLOCK_DTYPES, value_shape
from mgit.formats.gguf import converted_names, dequantize
from mgit.formats.layers import layer_counts, layer_of
from mgit.formats.pairing import tensor_names
from mgit.formats.safetensors import element_count
from mgit.store.cache import UNBOUNDED, DecodedCache
from mgit.tensorstats import TensorStats, sum_of_squares, tensor_stats
from mgit.util.parallel import StartProgress, default_jobs, one_blas_thread


def _compare(a: TensorRef, b: TensorRef, reuse: DecodedCache | None) -> tuple[str, TensorStats | None, int, int]:
    """(status, statistics, objects decoded, decodes saved) for two tensors of the same shape."""
    if a.dtype == b.dtype and a.derive is None and b.derive is None and a.object_id() == b.object_id():
        return "identical", None, 0, 0
    # What one side decodes is kept for the other: when one is stored as a delta against the
    # other (or both against a common base), that base is decoded once. Each decode verifies.
    cache = reuse if reuse is not None else DecodedCache(UNBOUNDED, keep_all=True)
    hits, misses = cache.hits, cache.misses
    (dtype_a, shape, raw_a), (dtype_b, _, raw_b) = _values(a, a.raw(cache)), _values(b, b.raw(cache))
    stats = tensor_stats((dtype_a, dtype_b), shape, raw_a, raw_b)
    status = "changed" if a.dtype == b.dtype else "dtype"
    return status, stats, cache.misses - misses, cache.hits - hits


def _unchanged(t: TensorRef, reuse: DecodedCache | None) -> tuple[float, int, int]:
    """(sum of squares, objects decoded, decodes saved) of a tensor both sides hold unchanged:
    its share of the model's ||A||, so that a relative change is over every shared value."""
    cache = reuse if reuse is not None else DecodedCache(UNBOUNDED, keep_all=True)
    hits, misses = cache.hits, cache.misses
    return sum_of_squares(*_values(t, t.raw(cache))), cache.misses - misses, cache.hits - hits


def _values(t: TensorRef, raw: np.ndarray) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(dtype, shape, raw bytes) of a tensor's values: a block-quantized one (a GGUF's Q8_0
    ...) dequantized to float32 with gguf's reference dequantizer, any other as it is."""
    if t.dtype not in BLOCK_DTYPES:
        return t.dtype, t.shape, raw
    return "F32", value_shape(t.dtype, t.shape), dequantize(raw, t.dtype).view(np.uint8)


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
    `reuse` (a session's cache) keeps what is decoded; by default each pair has its own.
    Tensors pair across a wrapper prefix (a task model's `bert.` against its base), as parent
    inference and storage pair them; rows then use A's names. A quantized side's packed layers
    (GPTQ, AWQ, FP8 with scales) are dequantized against the other side's float weights
    (`mgit.diff.quantized`), so the figures are the quantization's error."""
    if not structural:
        a, b = as_floats(a, b), as_floats(b, a)
    b = _named_as(b, a)
    names = list(dict.fromkeys([*a.tensors, *b.tensors]))
    status: dict[str, str] = {}
    work: list[str] = []
    for name in names:
        ta, tb = a.tensors.get(name), b.tensors.get(name)
        if ta is None or tb is None:
            status[name] = "only_b" if ta is None else "only_a"
        elif value_shape(ta.dtype, ta.shape) != value_shape(tb.dtype, tb.shape):
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
        params_a=sum(element_count(value_shape(t.dtype, t.shape)) for t in a.tensors.values()),
        params_b=sum(element_count(value_shape(t.dtype, t.shape)) for t in b.tensors.values()),
        counts=_counts(t.status for t in tensors),
        **_change(list(stats.values()), _shares(tensors, unchanged)),
        files=_counts(f.status for f in files),
        decoded=decoded,
        reused=reused,
    )
    return DiffResult(
        a.side, b.side, structural, summary, _groups(tensors, unchanged), tensors, files, layers, [*a.notes, *b.notes]
    )


def _named_as(b: ModelSide, a: ModelSide) -> ModelSide:
    """B with its tensors under A's names where the two differ by a wrapper prefix, or are a
    model and its GGUF (B as it is when they do not, or when a renamed tensor would meet
    another of B's)."""
    pairs = {mine: theirs for mine, theirs in tensor_names(b.tensors, a.tensors).items() if mine != theirs}
    how = "across a wrapper prefix"
    if not pairs and not set(a.tensors) & set(b.tensors):  # a model and its GGUF?
        pairs = {v: k for k, v in converted_names(a.tensors, b.tensors).items()} or converted_names(
            b.tensors, a.tensors
        )
        how = "as llama.cpp's convert script names them"
    renamed = {pairs.get(name, name): t for name, t in b.tensors.items()}
    if not pairs or len(renamed) != len(b.tensors):
        return b
    mine, theirs = next(iter(pairs.items()))
    note = f"{len(pairs)} of B's tensors are compared under A's names {how} ({mine} is {theirs})"
    return replace(b, tensors=renamed, notes=[*b.notes, note])


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
