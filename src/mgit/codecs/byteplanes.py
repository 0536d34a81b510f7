"""Byte-plane grouping: byte k of every element goes into plane k.

The bytes of a float differ wildly in entropy (the exponent byte is highly skewed, the low
mantissa bytes look random); grouped by plane, a general compressor finds the redundancy that
is invisible in the interleaved layout (about 1.2x instead of 1.09x on fp32 weights).

Two- and four-byte items (bf16, fp16, fp32) are split with whole-word shifts, which numpy
vectorizes, rather than by strided byte copies: 2-3x faster on a block (benchmarks in
docs/benchmarks.md, "Speed round three"); two-byte planes are joined the same way. The
bytes are those of the definition above either way (the words are read little-endian).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import Buffer, Codec, CodecContext, CodecError, byte_array, register
from mgit.codecs.buffers import scratch

SPLIT_BY_SHIFTS = (2, 4)  # item sizes whose planes are split from little-endian words
JOINED_BY_SHIFTS = (2,)  # and joined (four planes joined by shifts measured no faster)


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
        # (its own array, not a reused decode buffer: see SubDeltaCodec.encode)
        planes = np.empty((self.itemsize, u8.size // self.itemsize), np.uint8)
        if self.itemsize in SPLIT_BY_SHIFTS:
            words = u8.view(f"<u{self.itemsize}")
            np.copyto(planes[0], words, casting="unsafe")  # (an unsigned cast keeps the low byte)
            for k in range(1, self.itemsize):
                np.right_shift(words, 8 * k, out=planes[k], casting="unsafe")
        else:
            planes[...] = u8.reshape(-1, self.itemsize).T
        return planes

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        u8 = byte_array(data)
        if self.itemsize == 1:
            return u8
        if u8.size % self.itemsize:
            raise CodecError(f"{u8.size} bytes is not a whole number of {self.itemsize}-byte planes")
        planes = u8.reshape(self.itemsize, -1)
        out = scratch(u8.size)
        if self.itemsize in JOINED_BY_SHIFTS:
            words = out.view(f"<u{self.itemsize}")
            np.left_shift(planes[1], 8, out=words, dtype=words.dtype)
            np.bitwise_or(words, planes[0], out=words)
            return out
        items = out.reshape(planes.shape[1], self.itemsize)
        for k in range(self.itemsize):  # one plane at a time: ~3x faster than a 2-D transpose
            items[:, k] = planes[k]
        return out
