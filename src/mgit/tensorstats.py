"""How much one tensor changed into another: norms, cosine, changed values, and the rank of
the difference (a merged LoRA shows a low rank, a full fine-tune a high one).

Tensors come as raw little-endian bytes with their safetensors dtype; every dtype is read as
float values here (bfloat16 and fp8 decoded without ml_dtypes, integers and bools cast,
complex as pairs of reals) in chunks of CHUNK values, so a comparison needs the two tensors
and a few MB, never float64 copies of them. Non-finite values are counted per side and left
out of the sums and the rank.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mgit.formats.safetensors import DTYPES, element_count, to_float
from mgit.reports import Report

CHUNK = 1 << 18  # values per step: 2 MB of float64 per operand
SMALL_MATRIX = 1 << 18  # matrices up to this many values are handled in float64, larger in float32
RANK_CAP = 64  # larger ranks are reported as ">= RANK_CAP"
OVERSAMPLE = 8
RANK_RTOL = 1e-4  # singular values below this fraction of the largest do not count
# Unit roundoff of each float dtype: rounding a value x to it moves x by at most UNIT * |x|.
UNIT = {
    "F64": 2.0**-53,
    "F32": 2.0**-24,
    "C64": 2.0**-24,
    "F16": 2.0**-11,
    "BF16": 2.0**-8,
    "F8_E4M3": 2.0**-4,
    "F8_E5M2": 2.0**-3,
    "F8_E8M0": 2.0**-1,
}


@dataclass(frozen=True)
class TensorStats(Report):
    """How one tensor changed. Norms are Frobenius norms over the finite values."""

    values: int
    changed: int  # values that differ (NaN against NaN counts as equal)
    changed_fraction: float
    norm_a: float | None
    norm_b: float | None
    norm_diff: float | None
    rel_change: float | None  # ||B-A|| / ||A||; None when A is all zeros
    max_abs: float | None  # max |B-A|
    cosine: float | None  # None when either side is all zeros
    nonfinite_a: int = 0
    nonfinite_b: int = 0
    rank: int | None = None  # of B-A, for matrices; with rank_capped it means "at least"
    rank_capped: bool = False
    rank_of: int | None = None  # the full rank of a matrix of this shape: min(rows, columns)


def _values(raw: np.ndarray, dtype: str, lo: int, hi: int, out: Any = np.float64) -> np.ndarray:
    size = DTYPES[dtype][0]
    return to_float(raw[lo * size : hi * size], dtype, out)


def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _columns(raw: np.ndarray, dtype: str, shape: tuple[int, ...], lo: int, hi: int, out: Any) -> np.ndarray:
    """Columns lo:hi of a row-major matrix as float values, transposed: (hi - lo, rows)."""
    m, n = shape
    size = DTYPES[dtype][0]
    block = np.ascontiguousarray(raw.reshape(m, n * size)[:, lo * size : hi * size]).reshape(-1)
    return to_float(block, dtype, out).reshape(m, hi - lo).T


def _dots(x: np.ndarray, y: np.ndarray, d: np.ndarray) -> np.ndarray:
    # einsum rather than `@`: OpenBLAS threads its dot products, and on a busy machine its
    # spinning threads cost ten times the work itself.
    return np.array([np.einsum("i,i", x, x), np.einsum("i,i", y, y), np.einsum("i,i", x, y), np.einsum("i,i", d, d)])


def sum_of_squares(dtype: str, shape: tuple[int, ...], raw: np.ndarray) -> float:
    """Sum of the squares of a tensor's finite values (what an unchanged tensor adds to the
    denominator of a model's relative change)."""
    n, total = element_count(shape), 0.0
    for lo in range(0, n, CHUNK):
        x = _values(raw, dtype, lo, min(n, lo + CHUNK))
        part = float(np.einsum("i,i", x, x))
        total += part if math.isfinite(part) else float(np.einsum("i,i", x[np.isfinite(x)], x[np.isfinite(x)]))
    return total


def tensor_stats(dtypes: tuple[str, str], shape: tuple[int, ...], raw_a: np.ndarray, raw_b: np.ndarray) -> TensorStats:
    """The statistics of B against A, two tensors of one shape given as raw little-endian
    bytes of their dtypes (which may differ), in chunks of float64."""
    (dtype_a, dtype_b), n = dtypes, element_count(shape)
    sums = np.zeros(4)  # a.a, b.b, a.b, d.d
    max_abs, changed, values, bad_a, bad_b = 0.0, 0, 0, 0, 0
    for lo in range(0, n, CHUNK):
        x, y = _values(raw_a, dtype_a, lo, min(n, lo + CHUNK)), _values(raw_b, dtype_b, lo, min(n, lo + CHUNK))
        values += x.size
        d = y - x
        part = _dots(x, y, d)
        if not np.isfinite(part).all():  # rare: leave non-finite values out, count them
            fa, fb = np.isfinite(x), np.isfinite(y)
            bad_a, bad_b = bad_a + x.size - int(fa.sum()), bad_b + y.size - int(fb.sum())
            changed += int(np.count_nonzero((x != y) & ~(np.isnan(x) & np.isnan(y)) & ~(fa & fb)))
            x, y = x[fa & fb], y[fa & fb]
            d = y - x
            part = _dots(x, y, d)
        sums += part
        if d.size:
            max_abs = max(max_abs, float(np.abs(d).max()))
            changed += int(np.count_nonzero(d))
    na, nb, nd = (math.sqrt(s) for s in (sums[0], sums[1], sums[3]))
    rank, capped, rank_of = None, False, None
    if len(shape) == 2 and "C64" not in dtypes and min(shape) > 0:
        rms = math.sqrt(max(sums[0], sums[1]) / max(values - max(bad_a, bad_b), 1))
        rank_of = min(shape)
        rank, capped = (
            estimate_rank(dtypes, shape, raw_a, raw_b, rms=rms, clean=bool(bad_a or bad_b)) if nd > 0 else (0, False)
        )
    return TensorStats(
        values=values,
        changed=changed,
        changed_fraction=changed / values if values else 0.0,
        norm_a=_num(na),
        norm_b=_num(nb),
        norm_diff=_num(nd),
        rel_change=_num(nd / na) if na > 0 else None,
        max_abs=_num(max_abs),
        cosine=_num(sums[2] / (na * nb)) if na > 0 and nb > 0 else None,
        nonfinite_a=bad_a,
        nonfinite_b=bad_b,
        rank=rank,
        rank_capped=capped,
        rank_of=rank_of,
    )


def estimate_rank(
    dtypes: tuple[str, str],
    shape: tuple[int, ...],
    raw_a: np.ndarray,
    raw_b: np.ndarray,
    *,
    rms: float,
    clean: bool = False,
) -> tuple[int, bool]:
    """The numerical rank of D = B - A for a matrix, and whether it is only a lower bound.

    A singular value counts when it exceeds RANK_RTOL times the largest and what rounding
    every value to the stored dtype could produce (unit roundoff * rms * (sqrt(m) + sqrt(n)),
    about twice the spectral norm of such rounding errors), so that a LoRA merged into
    float16 weights shows its own rank, not full rank. D is read in row blocks (column blocks
    when it is wide), in float64 up to SMALL_MATRIX values and float32 above. With at most
    RANK_CAP + OVERSAMPLE columns, the singular values come from D's small Gram matrix
    (exact). Otherwise a randomized range finder: Y = D @ Omega with that many Gaussian
    columns, orthonormalized through its small Gram matrix, and the singular values of
    Q^T D; a rank of RANK_CAP or more is reported as (RANK_CAP, True). Only gemm and
    eigendecompositions of at most 72 x 72 run in LAPACK, which stays fast when the machine is
    busy (a QR or SVD of a tall matrix does not: OpenBLAS's threads spin).
    """
    (dtype_a, dtype_b), tall = dtypes, shape[0] >= shape[1]
    rows, cols = shape if tall else shape[::-1]
    work = np.float64 if rows * cols <= SMALL_MATRIX else np.float32
    step = max(1, CHUNK // cols)

    def blocks() -> Iterable[tuple[int, np.ndarray]]:
        for r in range(0, rows, step):
            hi = min(rows, r + step)
            if tall:
                d = _values(raw_b, dtype_b, r * cols, hi * cols, work) - _values(
                    raw_a, dtype_a, r * cols, hi * cols, work
                )
                d = d.reshape(-1, cols)
            else:
                d = _columns(raw_b, dtype_b, shape, r, hi, work) - _columns(raw_a, dtype_a, shape, r, hi, work)
            if clean:
                d[~np.isfinite(d)] = 0
            yield r, d

    width = min(RANK_CAP + OVERSAMPLE, cols)
    gram = np.zeros((width, width))
    if width == cols:
        for _, d in blocks():
            d64 = d.astype(np.float64)
            gram += d64.T @ d64
    else:
        omega = np.random.default_rng(0).standard_normal((cols, width)).astype(work)
        y = np.empty((rows, width), work)
        for r, d in blocks():
            y[r : r + len(d)] = d @ omega
            gram += y[r : r + len(d)].T.astype(np.float64) @ y[r : r + len(d)]
        lam, vec = np.linalg.eigh(gram)
        keep = lam > lam[-1] * 1e-10  # directions of the sketch above 1e-5 of its largest
        basis = vec[:, keep] / np.sqrt(lam[keep])  # Q = Y @ basis is orthonormal
        z = np.zeros((width, cols))
        for r, d in blocks():
            z += y[r : r + len(d)].T @ d
        projected = basis.T @ z  # Q^T D
        gram = projected @ projected.T
    s = np.sqrt(np.clip(np.linalg.eigvalsh(gram)[::-1], 0, None))
    if not s.size or s[0] == 0:
        return 0, False
    floor = max(UNIT.get(dtype_a, 0.0), UNIT.get(dtype_b, 0.0)) * rms * (math.sqrt(rows) + math.sqrt(cols))
    rank = int(np.count_nonzero(s > max(s[0] * RANK_RTOL, floor)))
    if width == cols or rank < RANK_CAP:
        return rank, False
    return RANK_CAP, True
