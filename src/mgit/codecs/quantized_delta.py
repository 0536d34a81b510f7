"""Quantized delta: a float tensor as integer multiples of a step added to a base tensor.

This is the codec behind lossy storage, yet it is lossless on what it is given: the object it
stores is the *reconstruction* `b + q * step` (its id is the hash of those bytes), and the
codec maps a reconstruction back to the same integers q. `reconstruct()` is the one function
that turns (base, q, step) into floats; the lossy policy (`mgit.store.lossy`) uses it to build the
content and the decoder uses it to rebuild it, so the two cannot disagree.

Arithmetic is fixed: base and q in float64, `b + q * step` in float64, then one conversion to
the tensor's dtype (round to nearest even; BF16 through float32). The integers are zig-zag
mapped to unsigned integers of 1, 2 or 4 bytes, little-endian.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import (
    Buffer,
    Codec,
    CodecContext,
    CodecError,
    byte_array,
    check_oid,
    load_base,
    register,
    unzigzag,
    zigzag,
)
from mgit.codecs.derived import to_bfloat16_bits

FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_STORAGE = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8"}


def as_float64(data: Buffer, dtype: str) -> np.ndarray:
    """The elements of a float tensor (its raw bytes) as float64, exactly."""
    raw = byte_array(data)
    if raw.size % np.dtype(_STORAGE[dtype]).itemsize:
        raise CodecError(f"{raw.size} bytes is not a whole number of {dtype} elements")
    values = raw.view(_STORAGE[dtype])
    if dtype == "BF16":
        return (values.astype("<u4") << 16).view("<f4").astype("<f8")
    return values.astype("<f8")


def from_float64(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values as the raw bytes of `dtype`, rounding to nearest even."""
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "BF16":
            return to_bfloat16_bits(values.astype("<f4")).view(np.uint8)
        return values.astype(_STORAGE[dtype]).view(np.uint8)


def reconstruct(base: np.ndarray, q: np.ndarray, step: float, dtype: str) -> np.ndarray:
    """`base + q * step` (base as float64, q integers) as the raw bytes of `dtype`."""
    return from_float64(base + q.astype("<f8") * np.float64(step), dtype)


def quantize(values: np.ndarray, base: np.ndarray, step: float) -> np.ndarray:
    """round((values - base) / step) in float64 (ties to even); not yet range-checked."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.rint((values - base) / np.float64(step))


def int_bytes_for(q: np.ndarray) -> int | None:
    """The smallest of 1, 2, 4 bytes whose signed range holds every q (None: none does)."""
    if not q.size:
        return 1
    if not np.isfinite(q).all():
        return None
    largest = float(np.abs(q).max())
    for n in (1, 2, 4):
        if largest <= 2 ** (8 * n - 1) - 1:
            return n
    return None


@register
@dataclass(frozen=True)
class QuantizedDeltaCodec(Codec):
    name = "quantized_delta"
    blockwise = True
    storage = "delta"
    predictive = True
    base: str
    step: float
    dtype: str
    int_bytes: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        if self.dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, not {self.dtype!r}")
        if not isinstance(self.step, float) or not (np.isfinite(self.step) and self.step > 0):
            raise ValueError(f"step must be a positive finite number, not {self.step!r}")
        if self.int_bytes not in (1, 2, 4):
            raise ValueError(f"int_bytes must be 1, 2 or 4, not {self.int_bytes!r}")

    def max_decoded(self, n: int) -> int:
        return n // self.int_bytes * np.dtype(_STORAGE[self.dtype]).itemsize

    def _base(self, ctx: CodecContext, count: int) -> np.ndarray:
        base = as_float64(load_base(self.name, self.base, ctx), self.dtype)
        if base.size < count:
            raise CodecError(f"quantized_delta base has {base.size} elements for {count}")
        return base[:count]

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        values = as_float64(data, self.dtype)
        q = quantize(values, self._base(ctx, values.size), self.step)
        needed = int_bytes_for(q)
        if needed is None or needed > self.int_bytes:
            raise CodecError(f"quantized values do not fit in {self.int_bytes} bytes")
        return zigzag(q.astype(f"<i{self.int_bytes}")).view(np.uint8)

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raw = byte_array(data)
        if raw.size % self.int_bytes:
            raise CodecError(f"{raw.size} bytes is not a whole number of {self.int_bytes}-byte integers")
        q = unzigzag(raw.view(f"<u{self.int_bytes}"))
        return reconstruct(self._base(ctx, q.size), q, self.step, self.dtype)
