"""zstd compression of the whole buffer (blocks that do not compress are stored raw by zstd)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import zstandard

from mgit.codecs.base import Buffer, Codec, CodecContext, CodecError, byte_view, register
from mgit.codecs.buffers import scratch

_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    # Compressor objects are not thread-safe; one per thread and level is cheap and reusable.
    key = f"c{level}"
    comp = getattr(_local, key, None)
    if comp is None:
        comp = zstandard.ZstdCompressor(level=level, write_content_size=True)
        setattr(_local, key, comp)
    return comp


def _decompressor() -> zstandard.ZstdDecompressor:
    dec = getattr(_local, "d", None)
    if dec is None:
        dec = _local.d = zstandard.ZstdDecompressor()
    return dec


@register
@dataclass(frozen=True)
class ZstdCodec(Codec):
    name = "zstd"
    blockwise = True
    level: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.level, int) or not -7 <= self.level <= 22:
            raise ValueError(f"level must be an integer from -7 to 22, not {self.level!r}")

    def max_decoded(self, n: int) -> int:
        # An RLE block: 4 bytes for up to 128 KiB (the largest block); a frame header.
        return n * 32768 + (128 << 10)

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        return _compressor(self.level).compress(byte_view(data))

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        # A forged frame must not make us allocate more than the object can hold.
        limit = 4 * ctx.size + 65536
        try:
            declared = zstandard.frame_content_size(data)
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd data does not decode: {exc}") from None
        if declared < 0 or declared > limit:
            raise CodecError(f"zstd frame declares {declared} bytes, more than the object can hold")
        # Into a reused buffer rather than a new `bytes`: fresh pages cost more than decoding.
        out = scratch(declared)
        filled = 0
        try:
            with _decompressor().stream_reader(byte_view(data), read_across_frames=False) as reader:
                while filled < declared:
                    n = reader.readinto(out[filled:])
                    if n == 0:
                        break
                    filled += n
                if reader.read(1):
                    raise CodecError("zstd frame holds more bytes than it declares")
        except zstandard.ZstdError as exc:
            raise CodecError(f"zstd data does not decode: {exc}") from None
        if filled != declared:
            raise CodecError(f"zstd frame ends after {filled} of the {declared} bytes it declares")
        return out
