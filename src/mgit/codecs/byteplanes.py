"""Byte-plane grouping: byte k of every element goes into plane k.

The bytes of a float differ wildly in entropy (the exponent byte is highly skewed, the low
mantissa bytes look random); grouped by plane, a general compressor finds the redundancy that
is invisible in the interleaved layout (about 1.2x instead of 1.09x on fp32 weights).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import Buffer, Codec, CodecContext, CodecError, byte_array, register
from mgit.codecs.buffers import scratch


@register
@dataclass(frozen=True)
class ByteplanesCodec(Codec):
    name = "byteplanes"
    blockwise = True
    itemsize: int

    def __post_init__(self) -> None:
        if not isinstance(self.itemsize, int) or not 1 <= self.itemsize <= 16:
            raise ValueError(f"itemsize must be an integer from 1 to 16, not {self.itemsize!r}")

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        u8 = byte_array(data)
        if self.itemsize == 1:
            return u8
        if u8.size % self.itemsize:
            raise CodecError(f"{u8.size} bytes is not a whole number of {self.itemsize}-byte items")
        planes = np.empty((self.itemsize, u8.size // self.itemsize), np.uint8)
        planes[...] = u8.reshape(-1, self.itemsize).T
        return planes

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        u8 = byte_array(data)
        if self.itemsize == 1:
            return u8
        if u8.size % self.itemsize:
            raise CodecError(f"{u8.size} bytes is not a whole number of {self.itemsize}-byte planes")
        planes = u8.reshape(self.itemsize, -1)
        out = scratch(u8.size).reshape(planes.shape[1], self.itemsize)
        for k in range(self.itemsize):  # one plane at a time: ~3x faster than a 2-D transpose
            out[:, k] = planes[k]
        return out.reshape(-1)
