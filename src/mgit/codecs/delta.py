"""Bitwise deltas against a base object: XOR, and integer difference with zig-zag.

A fine-tuned weight keeps the sign, the exponent and the high mantissa bits of its parent, so
its bit pattern XOR (or minus) the parent's is mostly zero bits, which byte planes + zstd
then store in a fraction of the space. Both codecs work on the common prefix of the two
buffers and leave the rest as it is, so a tensor that grew along its first dimension (an
embedding with added tokens) still deltas against the rows it shares with its parent.

The base is named by its object id in the configuration; decoding loads it through the
context, and the store verifies its hash like any other read.
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
    check_int_width,
    check_oid,
    load_base,
    register,
    writable,
)
from mgit.codecs.buffers import scratch

BLOCK = 1 << 20  # items per block of the elementwise passes


def _base(codec: XorDeltaCodec | SubDeltaCodec, ctx: CodecContext) -> np.ndarray:
    return load_base(codec.name, codec.base, ctx)


@register
@dataclass(frozen=True)
class XorDeltaCodec(Codec):
    name = "xor_delta"
    blockwise = True
    storage = "delta"
    base: str

    def __post_init__(self) -> None:
        check_oid(self.base)

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        return _xor(byte_array(data).copy(), _base(self, ctx))

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        return _xor(writable(data), _base(self, ctx))


def _xor(data: np.ndarray, base: np.ndarray) -> np.ndarray:
    out = data
    n = min(out.size, base.size)
    np.bitwise_xor(out[:n], base[:n], out=out[:n])
    return out


@register
@dataclass(frozen=True)
class SubDeltaCodec(Codec):
    """(value - base) modulo 2**bits on the bit patterns, zig-zag mapped so that small
    negative and positive differences both become small unsigned numbers."""

    name = "sub_delta"
    blockwise = True
    storage = "delta"
    base: str
    itemsize: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        check_int_width(self.itemsize)

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        src = byte_array(data)
        # Its own arrays, not mgit.codecs.buffers' reused ones: during an add those are held by
        # decoded bases, and each encode faulted in fresh pages (0.6 s more system time on 1 GB).
        out, base, n = self._views(np.empty(src.size, np.uint8), _base(self, ctx))
        values = src.view(out.dtype)  # (the source is read once: the difference is written to `out`)
        out[n:] = values[n:]
        signs = np.empty(min(n, BLOCK), f"<i{self.itemsize}")
        # Difference and zig-zag block by block: the temporaries stay small and in cache
        # (fresh pages for whole-tensor temporaries cost more than the arithmetic).
        for lo in range(0, n, BLOCK):
            u = out[lo : min(n, lo + BLOCK)]
            np.subtract(values[lo : lo + u.size], base[lo : lo + u.size], out=u)  # wraps modulo 2**bits
            sign = np.right_shift(u.view(signs.dtype), 8 * self.itemsize - 1, out=signs[: u.size])  # 0 or -1
            u <<= 1
            u ^= sign.view(u.dtype)
        return out.view(np.uint8)

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        out, base, n = self._views(writable(data), _base(self, ctx))
        signs = scratch(min(n, BLOCK) * self.itemsize).view(out.dtype)
        for lo in range(0, n, BLOCK):  # unzigzag and add in place, block by block (as encode)
            u = out[lo : min(n, lo + BLOCK)]
            sign = np.bitwise_and(u, 1, out=signs[: u.size])
            np.subtract(0, sign, out=sign, dtype=u.dtype)  # 1 -> all ones (wraps modulo 2**bits)
            u >>= 1
            u ^= sign
            u += base[lo : lo + u.size]  # wraps modulo 2**bits
        return out.view(np.uint8)

    def _views(self, data: np.ndarray, base: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        if data.size % self.itemsize:
            raise CodecError(f"{data.size} bytes is not a whole number of {self.itemsize}-byte items")
        unsigned = np.dtype(f"<u{self.itemsize}")
        whole = base.size - base.size % self.itemsize
        out, ref = data.view(unsigned), base[:whole].view(unsigned)
        return out, ref, min(out.size, ref.size)
