"""Pcodec: entropy coding of a buffer read as numbers.

Byte planes + zstd code each byte of a number apart from the others, with Huffman tables that
cannot go below one bit per byte. Pcodec (`pcodec`) reads the buffer as numbers of one
type, bins their distribution and codes the bins with tANS, so a fine-tune's delta (zig-zag
integers of ~11 significant bits) costs close to its entropy: 11% less than byte planes +
zstd on the MiniLM fine-tunes' deltas (benchmarks/storage.py), and it decodes faster. It
encodes at ~200-300 MB/s per core, so the store uses it for deltas and quantized steps, not
for a base's own weights (1.3% smaller, at half the add speed). It releases the GIL, so
tensors encode in parallel.

The configuration names the numeric type (`<u4`, `<f2` ...) so that decoding needs nothing but
the object; the standalone format of pcodec 1.x is stable across its releases.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pcodec import ChunkConfig, DeltaSpec, ModeSpec, standalone

from mgit.codecs.base import Buffer, Codec, CodecContext, CodecError, byte_array, register
from mgit.codecs.buffers import scratch

# Pcodec's number types (8-bit ones it advises against: zstd does better on bytes).
PCO_DTYPES = ("<u2", "<i2", "<f2", "<u4", "<i4", "<f4", "<u8", "<i8", "<f8")


@register
@dataclass(frozen=True)
class PcoCodec(Codec):
    name = "pco"
    blockwise = True
    dtype: str
    level: int = 8

    def __post_init__(self) -> None:
        if self.dtype not in PCO_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(PCO_DTYPES)}, not {self.dtype!r}")
        if not isinstance(self.level, int) or isinstance(self.level, bool) or not 0 <= self.level <= 12:
            raise ValueError(f"level must be an integer from 0 to 12, not {self.level!r}")

    def _config(self) -> ChunkConfig:
        # No delta along the sequence: neighbouring weights are not ordered values.
        return ChunkConfig(compression_level=self.level, delta_spec=DeltaSpec.no_op(), mode_spec=ModeSpec.auto())

    def max_decoded(self, n: int) -> int:
        # A constant chunk of 2**18 numbers takes ~16 bytes (measured: 8-byte numbers
        # 117,000x at 4 Mi numbers); allow 16 bytes per chunk and one chunk more.
        chunk = (1 << 18) * np.dtype(self.dtype).itemsize
        return (n // 16 + 1) * chunk

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raw = byte_array(data)
        size = np.dtype(self.dtype).itemsize
        if raw.size % size:
            raise CodecError(f"{raw.size} bytes is not a whole number of {self.dtype} numbers")
        numbers = raw.view(self.dtype)
        if not numbers.flags.aligned:  # a tensor at an odd offset of its file
            numbers = numbers.copy()
        try:
            return standalone.simple_compress(numbers, self._config())
        except RuntimeError as exc:
            raise CodecError(f"pco cannot encode this buffer: {exc}") from None

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        # pcodec writes no total count up front, and inside a chain (after a quantized delta)
        # the numbers need not fill the object's size: decode into room for the object's size
        # (where pcodec is the whole chain, exactly its numbers), then, only if more numbers
        # follow, into room for as much as zstd may produce, and refuse data that needs more.
        size = np.dtype(self.dtype).itemsize
        src = data if isinstance(data, bytes) else bytes(byte_array(data))
        for room in (ctx.size // size, (4 * ctx.size + 65536) // size):
            out = scratch(room * size).view(self.dtype)
            try:
                progress = standalone.simple_decompress_into(src, out)
            except (RuntimeError, TypeError) as exc:
                raise CodecError(f"pco data does not decode: {str(exc).splitlines()[0]}") from None
            if progress.finished:
                return out[: progress.n_processed].view(np.uint8)
        raise CodecError("pco data holds more numbers than the object can hold")
