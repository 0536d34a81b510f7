"""A LoRA adapter merged into its base, stored as what it is: the base's tensor plus
scale x B A, where B and A are the adapter's own stored tensors.

`lora_merge` predicts the content from three bases (the base weight W, the adapter's B, out x
rank, and A, rank x in, by object id) with the arithmetic peft's `merge_and_unload` runs on a
CPU: B A accumulated over the rank in float32, one fused multiply-add per step (emulated
exactly: each product of two float32 numbers is exact in float64, then the sum is rounded to
float32), times scale in float32, transposed when the layer stores its weight in x out (GPT-2's
Conv1D, an embedding), added to W widened to float32, rounded to W's dtype. The stored payload
is the XOR of the content with that prediction, zeros where it reproduces the merge (on the
machines measured, everywhere), which the zstd after it stores in almost nothing: the merged
model then costs nothing beyond the adapter it shares B and A with. Any other content still
decodes exactly (a wrong prediction costs space, never correctness).

The arithmetic lives here, below the porcelain, so that the adapter merge
(mgit.merging.adapters) and its storage are one code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import CodecContext, CodecError, byte_array, check_oid, register
from mgit.codecs.derived import PredictionCodec
from mgit.codecs.merged import from_float32, to_float32

DTYPES = ("F32", "F16", "BF16")
MAX_RANK = 1 << 16
ROWS_AT_ONCE = 256 << 10  # elements of the product made at once (its float64 temporaries stay small)


def lora_product(b: np.ndarray, a: np.ndarray, scale: float) -> np.ndarray:
    """scale x B A in float32, as a CPU's float32 GEMM of a small inner dimension makes it:
    for k in order, acc = fma(B[:, k], A[k, :], acc) (float32 rounding once per step)."""
    out = np.empty((b.shape[0], a.shape[1]), np.float32)
    step = max(1, ROWS_AT_ONCE // max(1, a.shape[1]))
    a64 = a.astype(np.float64)
    for lo in range(0, b.shape[0], step):
        part = b[lo : lo + step].astype(np.float64)
        acc = np.zeros((part.shape[0], a.shape[1]), np.float32)
        for k in range(a.shape[0]):
            acc = (acc + np.multiply.outer(part[:, k], a64[k])).astype(np.float32)
        out[lo : lo + step] = acc
    with np.errstate(over="ignore", invalid="ignore"):
        return out * np.float32(scale)


def merged_lora(weight: np.ndarray, b: np.ndarray, a: np.ndarray, scale: float, *, transpose: bool) -> np.ndarray:
    """float32 W + scale x B A (its transpose with `transpose`): the merged weight before
    rounding to W's dtype."""
    delta = lora_product(b, a, scale)
    with np.errstate(over="ignore", invalid="ignore"):
        return weight + (delta.T if transpose else delta)


@register
@dataclass(frozen=True)
class LoraMergeCodec(PredictionCodec):
    """See the module docstring. `bases` are W, B, A; `rank` B's columns; `dtype` W's (and the
    content's), `factor_dtype` B's and A's; `transpose` when W is in x out."""

    name = "lora_merge"
    bases: list[str]
    rank: int
    scale: float
    transpose: bool
    dtype: str
    factor_dtype: str

    def __post_init__(self) -> None:
        if not isinstance(self.bases, list) or len(self.bases) != 3:
            raise ValueError("bases must be three object ids: the weight, B and A")
        for oid in self.bases:
            check_oid(oid)
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or not 1 <= self.rank <= MAX_RANK:
            raise ValueError(f"rank must be an integer from 1 to {MAX_RANK}, not {self.rank!r}")
        if isinstance(self.scale, bool) or not isinstance(self.scale, int | float) or not math.isfinite(self.scale):
            raise ValueError("scale must be a finite number")
        if not isinstance(self.transpose, bool):
            raise ValueError("transpose must be true or false")
        if self.dtype not in DTYPES or self.factor_dtype not in DTYPES:
            raise ValueError(f"dtype and factor_dtype must be among {', '.join(DTYPES)}")

    @property
    def base(self) -> str:  # (the weight, as other codecs name their base: the header lists all of `bases`)
        return self.bases[0]

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        size = ctx.size
        if ctx.load_object is None:
            raise CodecError(f"{self.name} needs its bases")
        raw_w, raw_b, raw_a = (byte_array(ctx.load_object(b)) for b in self.bases)
        width, fwidth = (4 if d == "F32" else 2 for d in (self.dtype, self.factor_dtype))
        if raw_w.size != size or size % width or raw_b.size % (fwidth * self.rank) or raw_a.size % (fwidth * self.rank):
            raise CodecError(f"{self.name}: bases of {raw_w.size}, {raw_b.size}, {raw_a.size} bytes do not fit")
        out_dim, in_dim = raw_b.size // (fwidth * self.rank), raw_a.size // (fwidth * self.rank)
        if out_dim * in_dim * width != size:
            raise CodecError(f"{self.name}: a {out_dim} x {in_dim} product does not fit {size} bytes")
        b = to_float32(raw_b, self.factor_dtype).reshape(out_dim, self.rank)
        a = to_float32(raw_a, self.factor_dtype).reshape(self.rank, in_dim)
        w = to_float32(raw_w, self.dtype).reshape((in_dim, out_dim) if self.transpose else (out_dim, in_dim))
        merged = merged_lora(w, b, a, self.scale, transpose=self.transpose)
        return from_float32(np.ascontiguousarray(merged), self.dtype).reshape(-1).view(np.uint8)
