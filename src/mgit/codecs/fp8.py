"""FP8 casts: a child predicted as its float32 parent scaled and cast to F8_E4M3, plus an
exact residual (XOR), as `mgit.codecs.derived`'s casts are.

compressed-tensors' FP8 (float-quantized, symmetric, per tensor or per channel) and the
libraries that write the same layout compute `scale = absmax / 448` in float32 (over the
tensor, or over each row) and `(w / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`. The
cast rounds to nearest even (`float8_e4m3fn_bits` follows torch's conversion bit for bit);
a zero row's scale divides as 1 (its values are zeros either way). The scale tensor itself is
small and stored as it is. Whatever a writer did differently (another scale, a stochastic
rounding) is in the residual: it costs bytes, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import CodecContext, CodecError, check_oid, load_base, register
from mgit.codecs.derived import PredictionCodec

E4M3_MAX = np.float32(448.0)
_MAX_BITS = np.uint32(0x43E00000)  # 448.0
_INF_BITS = np.uint32(0x7F800000)
_NORMAL_FROM = np.uint32(121 << 23)  # 2**-6, the smallest normal E4M3 number
_DENORM = np.uint32(141 << 23)
_REBIAS = np.uint32(((7 - 127) << 23) & 0xFFFFFFFF)  # exponent bias 127 -> 7, wrapping as uint32


def float8_e4m3_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> F8_E4M3 (e4m3fn) codes, rounding to nearest even, as torch's
    `.to(torch.float8_e4m3fn)` does: magnitudes from 448 up and infinities saturate to 448
    (torch 2.13; older versions made those from 480 up NaN, which no clamped input reaches),
    NaN stays NaN (0x7F, sign kept)."""
    bits = np.ascontiguousarray(values, dtype="<f4").reshape(-1).view("<u4")
    sign = (bits >> np.uint32(24)).astype(np.uint8) & np.uint8(0x80)
    mag = bits & np.uint32(0x7FFFFFFF)
    out = np.empty(mag.shape, np.uint8)
    small = mag < _NORMAL_FROM
    # Below 2**-6: adding 2**-6 * 2**8 in float32 rounds the mantissa to E4M3's subnormal grid.
    sub = (mag[small].view("<f4") + _DENORM.view("<f4")).view("<u4") - _DENORM
    out[small] = sub.astype(np.uint8)
    normal = ~small
    m = mag[normal]
    m = m + _REBIAS + np.uint32(0x7FFFF) + ((m >> np.uint32(20)) & np.uint32(1))
    out[normal] = (m >> np.uint32(20)).astype(np.uint8)
    out[(mag >= _MAX_BITS) & (mag <= _INF_BITS)] = 0x7E
    out[mag > _INF_BITS] = 0x7F
    return out | sign


@register
@dataclass(frozen=True)
class Fp8CastCodec(PredictionCodec):
    """A float32 parent read as `rows` rows (1: one scale for the tensor; the matrix's rows:
    one per output channel), each divided by its absmax / 448 and cast to F8_E4M3."""

    name = "fp8_cast"
    base: str
    rows: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        if not isinstance(self.rows, int) or isinstance(self.rows, bool) or self.rows < 1:
            raise ValueError(f"rows must be a positive integer, not {self.rows!r}")

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        raw = load_base(self.name, self.base, ctx)
        if raw.size % 4:
            raise CodecError(f"{self.name}: base is not float32")
        base = raw.view("<f4")
        if base.size % self.rows:
            raise CodecError(f"{self.name}: base of {base.size} values has no {self.rows} equal rows")
        matrix = base.reshape(self.rows, -1)
        if not matrix.size:
            return np.zeros(0, np.uint8)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            scale = np.abs(matrix).max(axis=1) / E4M3_MAX
            scale[scale == 0] = 1
            scaled = matrix / scale[:, None]
            np.clip(scaled, -E4M3_MAX, E4M3_MAX, out=scaled)
        return float8_e4m3_bits(scaled)
