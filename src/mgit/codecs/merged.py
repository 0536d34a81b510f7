"""A merged tensor stored as what it is: a weighted combination of its parents' tensors.

`weighted_sum` predicts the content from its bases (the merge's inputs, by object id) with
the arithmetic `mgit merge` made it with (linear: the weighted sum, divided by the sum of
weights when normalizing; task arithmetic: the anchor plus the weighted sum of the others'
differences from it, normalized and scaled likewise), all in float32 in a fixed order, then
rounded to the content's dtype; it stores the XOR of the content with that prediction. Where
the merge is reproduced exactly the residual is zeros, which the zstd after it stores in
almost nothing; any other content still decodes exactly (a wrong prediction costs space).

The arithmetic lives here, below the merge porcelain, so that the merge and its storage are
one code: `mgit.merging.methods` calls `linear_combination` and `task_vector_sum`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import (
    Buffer,
    Codec,
    CodecContext,
    CodecError,
    byte_array,
    check_oid,
    register,
    writable,
)
from mgit.codecs.buffers import scratch
from mgit.codecs.derived import to_bfloat16_bits

F32 = np.float32
DTYPES = ("F32", "F16", "BF16")
MAX_BASES = 64
# Elements predicted at once: small enough that a chunk's float32 temporaries stay in the
# cores' caches (twice as fast as 4M-element chunks here); the values do not depend on it.
CHUNK = 256 << 10


def linear_combination(values: Sequence[np.ndarray], weights: Sequence[float], normalize: bool) -> np.ndarray:
    """sum of weight x value, in input order, divided by the sum of weights when `normalize`."""
    w = np.asarray(weights, F32)
    total = np.array(F32(w[0]) * values[0], F32, copy=True)
    for wi, v in zip(w[1:], values[1:], strict=True):
        total += F32(wi) * v
    return total / w.sum(dtype=F32) if normalize else total


def task_vector_sum(
    anchor: np.ndarray, others: Sequence[np.ndarray], weights: Sequence[float], *, normalize: bool, scale: float
) -> np.ndarray:
    """anchor + scale x sum of weight x (other - anchor), divided by the sum of weights when
    `normalize` (a sum under 1e-8 counts as 1)."""
    if not others:
        return anchor
    mixed = linear_combination([o - anchor for o in others], weights, normalize=False)
    if normalize:
        divisor = np.asarray(weights, F32).sum(dtype=F32)
        mixed = mixed / (F32(1) if np.abs(divisor) < 1e-8 else divisor)
    if scale != 1:
        mixed = mixed * F32(scale)
    return anchor + mixed


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Little-endian F32, F16 or BF16 bytes as float32 values."""
    if dtype == "F32":
        return raw.view("<f4")
    if dtype == "F16":
        return raw.view("<f2").astype(F32)
    return (raw.view("<u2").astype(np.uint32) << np.uint32(16)).view(F32)


def from_float32(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as `dtype`'s little-endian bytes' array (bfloat16 rounded to nearest even)."""
    if dtype == "F32":
        return values.astype("<f4")
    if dtype == "F16":
        return values.astype("<f2")
    if dtype == "BF16":
        return to_bfloat16_bits(values)
    raise ValueError(f"no float32 conversion to {dtype}")


@register
@dataclass(frozen=True)
class WeightedSumCodec(Codec):
    """See the module docstring. `anchor` is the position of the task-arithmetic base among
    `bases`, or -1 for a linear combination."""

    name = "weighted_sum"
    storage = "derived"
    predictive = True
    # One link past the depth bound is allowed (inputs are often deltas of deltas); nothing
    # is then coded against it, as for a cast or quantized copy.
    ends_family = True
    bases: list[str]
    weights: list[float]
    anchor: int
    normalize: bool
    scale: float
    dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.bases, list) or not 2 <= len(self.bases) <= MAX_BASES:
            raise ValueError(f"bases must be a list of 2 to {MAX_BASES} object ids")
        for oid in self.bases:
            check_oid(oid)
        expected = len(self.bases) - (self.anchor >= 0)
        if (
            not isinstance(self.weights, list)
            or len(self.weights) != expected
            or not all(
                isinstance(w, (int, float)) and not isinstance(w, bool) and math.isfinite(w) for w in self.weights
            )
        ):
            raise ValueError(f"weights must be {expected} finite numbers")
        if not isinstance(self.anchor, int) or isinstance(self.anchor, bool) or not -1 <= self.anchor < len(self.bases):
            raise ValueError(f"anchor must be -1 or a position among the bases, not {self.anchor!r}")
        if (
            not isinstance(self.normalize, bool)
            or isinstance(self.scale, bool)
            or not isinstance(self.scale, (int, float))
            or not math.isfinite(self.scale)
        ):
            raise ValueError("normalize must be true or false and scale a finite number")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, not {self.dtype!r}")

    @property
    def base(self) -> str:  # (one base as other codecs name theirs: the header lists all of `bases`)
        return self.bases[0]

    def predict(self, ctx: CodecContext, size: int) -> np.ndarray:
        if ctx.load_object is None:
            raise CodecError(f"{self.name} needs its bases")
        raws = [byte_array(ctx.load_object(b)) for b in self.bases]
        if any(r.size != size for r in raws):
            raise CodecError(f"{self.name}: a base's size differs from the content's {size} bytes")
        width = 4 if self.dtype == "F32" else 2
        if size % width:
            raise CodecError(f"{self.name}: {size} bytes are not {self.dtype} values")
        out = scratch(size)
        count = size // width

        def chunk(lo: int) -> None:
            hi = min(lo + CHUNK, count)
            values = [to_float32(r[lo * width : hi * width], self.dtype) for r in raws]
            if self.anchor < 0:
                merged = linear_combination(values, self.weights, self.normalize)
            else:
                others = [v for i, v in enumerate(values) if i != self.anchor]
                merged = task_vector_sum(
                    values[self.anchor], others, self.weights, normalize=self.normalize, scale=self.scale
                )
            out[lo * width : hi * width] = from_float32(np.asarray(merged, F32), self.dtype).view(np.uint8)

        starts = range(0, count, CHUNK)
        if len(starts) == 1:
            chunk(0)
        else:  # element-wise: the chunks of a large tensor on the cores (numpy releases the GIL)
            with ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="mgit-weighted-sum") as pool:
                list(pool.map(chunk, starts))
        return out

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raw = byte_array(data)
        return np.bitwise_xor(raw, self.predict(ctx, raw.size))

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        out = writable(data)
        np.bitwise_xor(out, self.predict(ctx, out.size), out=out)
        return out
