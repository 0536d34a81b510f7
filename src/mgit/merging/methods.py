"""Merge methods, one tensor at a time, with the semantics mergekit gives them.

Each method takes the inputs' values of one tensor (float32 arrays of one shape, in the
merge's input order), the per-input parameters and the method's parameters, and returns the
merged float32 array. Arithmetic is float32, in mergekit's order of operations, so that for
float32 models the results are the same bits as mergekit's (its reference docs:
docs/merge_methods.md in arcee-ai/mergekit):

- `linear`: sum of weight x tensor, divided by the sum of weights when `normalize` (default).
- `slerp`: spherical interpolation from the base (t = 0) to the other input (t = 1), each
  tensor as one vector; nearly colinear tensors (|cos| > 0.9995) are interpolated linearly.
  (mergekit computes the norms and the dot product with torch's reductions, summed in
  another order: results agree within a few float32 ulps, not bit for bit.)
- `task_arithmetic`: base + lambda x sum of weight x (input - base); `normalize` (default off)
  divides by the sum of weights.
- `ties`: each task vector keeps its `density` fraction of largest magnitudes; an element
  keeps the sign that has the larger weighted sum, and the task vectors that agree with it
  are summed, divided by their weights when `normalize` (default on).
- `dare_linear`, `dare_ties`: task vectors with each element kept with probability `density`
  (the rest set to 0) and rescaled to their former L1 norm (`rescale`, default on), then
  summed as task arithmetic or as TIES. The mask comes from a seeded generator per tensor and
  input, so the same seed gives the same bytes (not mergekit's bytes: its mask comes from
  torch's global generator).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mgit.codecs.buffers import scratch
from mgit.codecs.merged import linear_combination, task_vector_sum
from mgit.errors import InputError
from mgit.formats.safetensors import itemsize, to_float

F32 = np.float32


@dataclass(frozen=True)
class Method:
    name: str
    needs_base: bool
    parameters: dict[str, Any]  # the method's parameters and their defaults
    input_parameters: dict[str, Any]  # per input, with defaults (None: required)


METHODS: dict[str, Method] = {
    "linear": Method("linear", False, {"normalize": True}, {"weight": 1.0}),
    "slerp": Method("slerp", True, {"t": None}, {}),
    "task_arithmetic": Method(
        "task_arithmetic", True, {"normalize": False, "lambda": 1.0, "int8_mask": False}, {"weight": 1.0}
    ),
    "ties": Method(
        "ties",
        True,
        {"normalize": True, "lambda": 1.0, "int8_mask": False, "rescale": False},
        {"weight": 1.0, "density": 1.0},
    ),
    "dare_linear": Method(
        "dare_linear",
        True,
        {"normalize": False, "lambda": 1.0, "int8_mask": False, "rescale": True},
        {"weight": 1.0, "density": 1.0},
    ),
    "dare_ties": Method(
        "dare_ties",
        True,
        {"normalize": False, "lambda": 1.0, "int8_mask": False, "rescale": True},
        {"weight": 1.0, "density": 1.0},
    ),
}


def merge_tensor(
    method: str,
    name: str,
    values: Sequence[np.ndarray],
    base: int | None,
    inputs: Sequence[dict[str, Any]],
    params: dict[str, Any],
    seed: int,
    *,
    selections: dict[int, tuple[float, int]] | None = None,
    offset: int = 0,
) -> np.ndarray:
    """The merged value of tensor `name` (float32) from its value in each input. A TIES merge
    of a large tensor goes a flat chunk at a time (`values` from flat index `offset`) with
    each input's `selections` found beforehand over the whole tensor (`ties_selection`)."""
    if method == "linear":
        return linear_combination(values, [float(p["weight"]) for p in inputs], bool(params["normalize"]))
    assert base is not None
    if method == "slerp":
        other = next(i for i in range(len(values)) if i != base)
        return _slerp(float(params["t"]), values[base], values[other])
    return _task_arithmetic(method, name, values, base, inputs, params, seed, selections or {}, offset)


def _slerp(t: float, v0: np.ndarray, v1: np.ndarray, colinear: float = 0.9995, eps: float = 1e-8) -> np.ndarray:
    d0, d1 = _direction(v0, eps), _direction(v1, eps)
    cos = np.clip(np.sum(d0 * d1), -1, 1)
    if np.abs(cos) > colinear:
        return F32(1 - t) * v0 + F32(t) * v1
    theta = np.arccos(cos)
    sin_theta = np.sin(theta)
    return (np.sin(F32(1 - t) * theta) / sin_theta) * v0 + (np.sin(F32(t) * theta) / sin_theta) * v1


def _direction(v: np.ndarray, eps: float) -> np.ndarray:
    norm = np.linalg.norm(v)
    return v / norm if norm > eps else v


def _task_arithmetic(
    method: str,
    name: str,
    values: Sequence[np.ndarray],
    base: int,
    inputs: Sequence[dict[str, Any]],
    params: dict[str, Any],
    seed: int,
    selections: dict[int, tuple[float, int]],
    offset: int,
) -> np.ndarray:
    b = values[base]
    others = [i for i in range(len(values)) if i != base]
    if not others:
        return b
    if method == "task_arithmetic":  # the arithmetic the stored merge re-derives its tensors with
        return task_vector_sum(
            b,
            [values[i] for i in others],
            [float(inputs[i]["weight"]) for i in others],
            normalize=bool(params["normalize"]),
            scale=float(params["lambda"]),
        )
    deltas, weights = [], []
    for i in others:
        delta = values[i] - b
        density = float(inputs[i].get("density", 1.0))
        if method == "ties" and i in selections:
            delta = delta * _selected(delta, *selections[i], offset)
        elif method == "ties":
            delta = _magnitude(delta, density, rescale=bool(params["rescale"]), name=name)
        elif method.startswith("dare_"):
            delta = _bernoulli(delta, density, rescale=bool(params["rescale"]), seed=(seed, name, i))
        deltas.append(delta)
        weights.append(F32(inputs[i]["weight"]))
    weighted = [w * d for w, d in zip(weights, deltas, strict=True)]
    if method in ("ties", "dare_ties"):
        majority = np.where(_sum0(weighted) >= 0, F32(1), F32(-1))
        masks = [(np.sign(x) == majority).astype(F32) for x in weighted]
        mixed = _sum0([x * m for x, m in zip(weighted, masks, strict=True)])
        divisor = _sum0([w * m for w, m in zip(weights, masks, strict=True)])
        divisor[divisor == 0] = 1
    else:
        mixed = _sum0(weighted)
        divisor = np.asarray(weights, F32).sum(dtype=F32)
        if np.abs(divisor) < 1e-8:
            divisor = F32(1)
    if params["normalize"]:
        mixed = mixed / divisor
    if float(params["lambda"]) != 1:
        mixed = mixed * F32(params["lambda"])
    return b + mixed


def _sum0(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """Element-wise sum in input order (as a reduction over the first axis of their stack)."""
    out = np.array(arrays[0], F32, copy=True)
    for a in arrays[1:]:
        out += a
    return out


def _magnitude(delta: np.ndarray, density: float, *, rescale: bool, name: str) -> np.ndarray:
    """Keep the `density` fraction of largest magnitudes (equal ones: the first by position)."""
    if density >= 1:
        return delta
    mask = _selected(delta, *ties_selection(delta, density, name), 0)
    return _rescaled(delta, mask, rescale)


def ties_selections(
    raws: Sequence[np.ndarray],
    dtypes: Sequence[str],
    base: int,
    densities: Sequence[float],
    name: str,
    *,
    chunk: int,
    pmap: Callable[..., Iterable[Any]] = map,
) -> dict[int, tuple[float, int]]:
    """What TIES keeps of each input's task vector (`ties_selection`), by input, found over
    the whole tensor from the inputs' raw bytes, so that the merge itself can go a chunk at
    a time: the float32 magnitudes of one task vector at a time, filled `chunk` elements at
    a time (by `pmap`: a pool's threads) and scanned there too."""
    count = raws[base].nbytes // itemsize(dtypes[base])
    magnitudes = scratch(count * 4).view(F32)

    def floats(i: int, lo: int, hi: int) -> np.ndarray:
        return to_float(raws[i][lo * itemsize(dtypes[i]) : hi * itemsize(dtypes[i])], dtypes[i], F32)

    out = {}
    for i, density in enumerate(densities):
        if i == base or density >= 1:
            continue

        def fill(lo: int, i: int = i) -> None:
            hi = min(lo + chunk, count)
            np.abs(np.subtract(floats(i, lo, hi), floats(base, lo, hi), out=magnitudes[lo:hi]), out=magnitudes[lo:hi])

        list(pmap(fill, range(0, count, chunk)))
        out[i] = ties_selection(magnitudes, density, name, magnitudes=magnitudes, pmap=pmap)
    return out


def ties_selection(
    delta: np.ndarray,
    density: float,
    name: str,
    *,
    magnitudes: np.ndarray | None = None,
    pmap: Callable[..., Iterable[Any]] = map,
) -> tuple[float, int]:
    """(threshold, last index): the `density` fraction of largest magnitudes of `delta` are
    those above the threshold, and those equal to it up to that flat index (what a stable
    sort by decreasing magnitude keeps). Linear time. `magnitudes` (|delta|, flat float32)
    may be given instead of `delta`; `pmap` (a pool's `map`) scans its pieces in parallel."""
    flat = np.abs(delta.reshape(-1)) if magnitudes is None else magnitudes
    k = int(density * flat.size)
    if k <= 0:
        raise InputError(
            name, f"has {flat.size} elements: density {density:g} keeps none of them", hint="Raise --density"
        )
    threshold, above = _kth_largest_and_above(flat, k, pmap)
    need = k - above
    if need <= 0:
        return float(threshold), -1
    equal_counts = list(pmap(lambda part: int(np.count_nonzero(part == threshold)), _chunks(flat)))
    seen = 0
    for start, part, count in zip(range(0, flat.size, SCAN), _chunks(flat), equal_counts, strict=True):
        if seen + count >= need:  # the piece that holds it: only its equal values are listed
            equal = np.flatnonzero(part == threshold)
            return float(threshold), start + int(equal[need - seen - 1])
        seen += count
    raise AssertionError("the k-th largest value was not found again")


SCAN = 1 << 20  # elements looked at at once when scanning magnitudes (its temporaries stay in cache)
SAMPLED = 1 << 14  # magnitudes sampled to bracket the k-th largest before counting exactly


def _chunks(flat: np.ndarray) -> list[np.ndarray]:
    return [flat[i : i + SCAN] for i in range(0, flat.size, SCAN)]


def _kth_largest_and_above(
    flat: np.ndarray, k: int, pmap: Callable[..., Iterable[Any]] = map
) -> tuple[np.float32, int]:
    """The k-th largest of non-negative float32 values and how many are larger than it.

    A strided sample, sorted, brackets it between two of its values [lo, hi]; one counting
    pass says whether it lies there (fewer than k above hi, at least k from lo up): then it
    is lo when lo == hi (a bfloat16 model's task vector keeps many equal magnitudes, zero
    most of all), else the k-th largest of the few values in the bracket. When the sample
    misses (an adversarial order), the exact histograms over all values decide. Either way
    the answer is the exact k-th largest: the sample only decides how much is scanned."""
    n = flat.size
    if n > 4 * SAMPLED:
        sample = np.sort(flat[:: n // SAMPLED])
        at = (n - k) * sample.size // n  # where the k-th largest sits in the sample, ascending
        margin = 4 * int(np.sqrt(sample.size)) + 8
        lo, hi = sample[max(0, at - margin)], sample[min(sample.size - 1, at + margin)]
        if not (np.isnan(lo) or np.isnan(hi)):
            found = _bracketed(flat, k, lo, hi, pmap)
            if found is not None:
                return found
    threshold = _kth_largest(flat, k)  # (NaN magnitudes rank above inf, as their bit patterns do)
    return threshold, sum(pmap(lambda p: int(np.count_nonzero(p > threshold)), _chunks(flat)))


def _bracketed(
    flat: np.ndarray, k: int, lo: np.float32, hi: np.float32, pmap: Callable[..., Iterable[Any]]
) -> tuple[np.float32, int] | None:
    """`_kth_largest_and_above` when the k-th largest lies in [lo, hi], else None. NaN
    magnitudes are never above a threshold but count among the largest (the histograms'
    order): they are what neither `p > hi` nor `p <= hi` counts."""

    def counts(p: np.ndarray) -> tuple[int, int, int]:
        return int(np.count_nonzero(p > hi)), int(np.count_nonzero(p <= hi)), int(np.count_nonzero(p >= lo))

    found = list(pmap(counts, _chunks(flat)))
    above_hi, nans = sum(c[0] for c in found), flat.size - sum(c[0] + c[1] for c in found)
    from_lo = sum(c[2] for c in found)
    if not above_hi + nans < k <= from_lo + nans:
        return None
    if lo == hi:
        return lo, above_hi
    band = np.concatenate(list(pmap(lambda p: p[(p >= lo) & (p <= hi)], _chunks(flat))))
    threshold = _kth_largest(band, k - nans - above_hi)
    return threshold, above_hi + int(np.count_nonzero(band > threshold))


def _kth_largest(magnitudes: np.ndarray, k: int) -> np.float32:
    """The k-th largest of non-negative float32 values, by their bit patterns (which sort as
    the values do): a histogram of the high 16 bits, then of the low 16 bits inside the bin
    that holds it, a chunk at a time. Linear time, where a partition of weights with many
    equal values (a bfloat16 model's) is slow."""
    bits = np.ascontiguousarray(magnitudes, F32).view(np.uint32)
    counts = np.zeros(1 << 16, np.int64)
    for part in _chunks(bits):
        counts += np.bincount(part >> np.uint32(16), minlength=1 << 16)
    from_top = np.cumsum(counts[::-1])
    at = int(np.searchsorted(from_top, k))
    above = int(from_top[at - 1]) if at else 0
    bin_ = (1 << 16) - 1 - at
    low_counts = np.zeros(1 << 16, np.int64)
    for part in _chunks(bits):
        low_counts += np.bincount(part[(part >> np.uint32(16)) == bin_] & np.uint32(0xFFFF), minlength=1 << 16)
    within = np.cumsum(low_counts[::-1])
    at_low = int(np.searchsorted(within, k - above))
    return np.array([(bin_ << 16) | ((1 << 16) - 1 - at_low)], np.uint32).view(F32)[0]


def _selected(delta: np.ndarray, threshold: float, last: int, offset: int) -> np.ndarray:
    """The 0/1 mask of a selection over `delta`, a chunk starting at flat index `offset`."""
    magnitude = np.abs(delta)
    mask = magnitude > F32(threshold)
    if last >= offset:  # equal ones up to flat index `last`: those of this chunk's first elements
        equal = magnitude == F32(threshold)
        equal.reshape(-1)[last - offset + 1 :] = False
        mask |= equal
    return mask.astype(F32)


def _bernoulli(delta: np.ndarray, density: float, *, rescale: bool, seed: tuple[int, str, int]) -> np.ndarray:
    if density >= 1:
        return delta
    rng = np.random.default_rng([seed[0] & 0xFFFFFFFF, zlib.crc32(seed[1].encode()), seed[2]])
    mask = (rng.random(delta.shape, dtype=F32) < F32(density)).astype(F32)
    return _rescaled(delta, mask, rescale)


def _rescaled(delta: np.ndarray, mask: np.ndarray, rescale: bool, eps: float = 1e-7) -> np.ndarray:
    """The masked delta, scaled back to the L1 norm it had (when `rescale`)."""
    masked = delta * mask
    if not rescale:
        return masked
    before, after = np.abs(delta).sum(dtype=F32), np.abs(masked).sum(dtype=F32)
    if before < eps or after < eps:
        return masked
    return masked * (before / after)
