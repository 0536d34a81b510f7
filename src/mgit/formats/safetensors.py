"""Safetensors files: strict parsing that keeps the header bytes, and header building.

A safetensors file is `u64 little-endian N`, then N bytes of JSON (padded with spaces), then
the tensors' bytes. MGit keeps the first 8 + N bytes verbatim and each tensor's bytes as an
object, so the file is rebuilt byte for byte. Every length and offset read from the file is
checked before use: the data must be exactly the tensors, in offset order, with no gap,
overlap or trailing byte (the rules the reference implementation enforces).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mgit.errors import InputError
from mgit.formats.dtypes import (
    DTYPES,
    MAX_TENSOR_BYTES,
    SAFETENSORS_DTYPES,
    element_count,
    is_float,
    itemsize,
    shape_fits,
)

__all__ = ["DTYPES", "element_count", "is_float", "itemsize"]  # (the table lives in dtypes.py)

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's limit
MAX_DIMS = 64


@dataclass(frozen=True)
class TensorSpan:
    """One tensor of a parsed file: where its bytes are, relative to the start of the data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsLayout:
    """A validated safetensors file: its header bytes verbatim and its tensors in data order."""

    header: bytes
    tensors: tuple[TensorSpan, ...]
    metadata: dict[str, str] | None

    @property
    def data_start(self) -> int:
        return len(self.header)


def _fp8_values() -> dict[str, np.ndarray]:
    """The value of each of the 256 codes of the fp8 formats (OCP E4M3FN, E5M2, E8M0)."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    e, m = (b >> 3) & 0xF, b & 7
    e4m3 = sign * np.where(e == 0, m / 8 * 2.0**-6, (1 + m / 8) * 2.0 ** (e - 7))
    e4m3[(b & 0x7F) == 0x7F] = np.nan
    e5m2 = (b.astype(np.uint16) << 8).view(np.float16).astype(np.float64)  # the top byte of a float16
    e8m0 = 2.0 ** (b - 127.0)
    e8m0[255] = np.nan
    return {"F8_E4M3": e4m3, "F8_E5M2": e5m2, "F8_E8M0": e8m0}


FP8_VALUES = _fp8_values()


def to_float(raw: np.ndarray, dtype: str, out: Any = np.float64) -> np.ndarray:
    """A tensor's raw little-endian bytes as float values, flat: bfloat16 and fp8 decoded,
    integers and bools cast, complex as pairs of reals. The one decoder of every dtype
    (diff's statistics and parent inference's sketches both use it)."""
    if dtype == "BF16":
        return (raw.view("<u2").astype(np.uint32) << 16).view(np.float32).astype(out, copy=False)
    if dtype in FP8_VALUES:
        with np.errstate(over="ignore", invalid="ignore"):  # E8M0's 2**128 is inf in float32
            table = FP8_VALUES[dtype].astype(out, copy=False)
        return table[raw.view(np.uint8)]
    if dtype == "C64":
        return raw.view("<f4").astype(out)
    if dtype == "BOOL":
        return (raw != 0).astype(out)
    return raw.view(DTYPES[dtype][1]).astype(out, copy=False)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_header(path: str, prefix: bytes, file_size: int) -> SafetensorsLayout:
    """Validate a safetensors header. `prefix` holds at least the first 8 + N bytes."""
    if file_size < 8 or len(prefix) < 8:
        raise InputError(path, "truncated safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise InputError(path, f"safetensors header length {n} is above the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        raise InputError(path, f"safetensors header length {n} goes beyond the end of the file ({file_size} bytes)")
    raw = prefix[8 : 8 + n]
    if len(raw) != n:
        raise InputError(path, "truncated safetensors header")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InputError(path, f"safetensors header is not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError(path, "safetensors header JSON is nested too deeply") from None
    if not isinstance(header, dict):
        raise InputError(path, "safetensors header is not a JSON object")

    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())):
        raise InputError(path, "safetensors __metadata__ must map strings to strings")

    spans = [_parse_entry(path, name, entry) for name, entry in header.items()]
    spans.sort(key=lambda s: (s.start, s.end))
    data_size = file_size - 8 - n
    cursor = 0
    for span in spans:
        if span.start < cursor:
            raise InputError(path, f"tensor {span.name!r} overlaps the tensor before it")
        if span.start > cursor:
            raise InputError(path, f"gap before tensor {span.name!r} (bytes {cursor}-{span.start} belong to no tensor)")
        if span.end > data_size:
            raise InputError(
                path,
                f"tensor {span.name!r} ends at byte {span.end} of the data, "
                f"beyond its end ({data_size} bytes): the file is truncated",
            )
        cursor = span.end
    if cursor != data_size:
        raise InputError(path, f"{data_size - cursor} bytes after the last tensor belong to no tensor")
    return SafetensorsLayout(header=bytes(prefix[: 8 + n]), tensors=tuple(spans), metadata=metadata)


def _parse_entry(path: str, name: str, entry: object) -> TensorSpan:
    if not isinstance(entry, dict):
        raise InputError(path, f"tensor {name!r}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype is None:
        raise InputError(path, f"tensor {name!r} has no dtype")
    if not isinstance(dtype, str) or dtype not in SAFETENSORS_DTYPES:
        raise InputError(path, f"tensor {name!r} has unknown dtype {dtype!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise InputError(path, f"tensor {name!r} has an invalid shape {shape!r}")
    if not shape_fits(tuple(shape), dtype):
        raise InputError(
            path,
            f"tensor {name!r} has a shape {shape!r} that no array can have "
            f"(its nonzero dimensions hold over {MAX_TENSOR_BYTES} bytes)",
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise InputError(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
    expected = element_count(tuple(shape)) * itemsize(dtype)
    if offsets[1] - offsets[0] != expected:
        raise InputError(
            path,
            f"tensor {name!r}: data_offsets span {offsets[1] - offsets[0]} bytes but {dtype}{shape} needs {expected}",
        )
    return TensorSpan(name, dtype, tuple(shape), offsets[0], offsets[1])


def read_layout(path: Path) -> SafetensorsLayout:
    """Open and validate a safetensors file on disk (reads only its header)."""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            head = fh.read(8)
            if len(head) == 8:
                (n,) = struct.unpack("<Q", head)
                if n <= MAX_HEADER_BYTES and 8 + n <= size:
                    head += fh.read(n)
            return parse_header(str(path), head, size)
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None


def build_header(
    tensors: list[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None = None
) -> tuple[bytes, tuple[TensorSpan, ...]]:
    """Header bytes for tensors laid out in the given order, padded to 8 bytes like the
    reference writer, and the spans they describe."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    spans, offset = [], 0
    for name, dtype, shape in tensors:
        size = element_count(shape) * itemsize(dtype)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        spans.append(TensorSpan(name, dtype, shape, offset, offset + size))
        offset += size
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body, tuple(spans)


def numpy_view(data: np.ndarray, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """View raw little-endian bytes as an array (bf16 and fp8 as their own dtype if ml_dtypes
    is installed, else as unsigned integers of the same width)."""
    np_dtype: object = DTYPES[dtype][1]
    if dtype in ("BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0"):
        try:
            import ml_dtypes

            np_dtype = {
                "BF16": ml_dtypes.bfloat16,
                "F8_E4M3": ml_dtypes.float8_e4m3fn,
                "F8_E5M2": ml_dtypes.float8_e5m2,
                "F8_E8M0": getattr(ml_dtypes, "float8_e8m0fnu", np.uint8),
            }[dtype]
        except ImportError:
            pass
    if dtype == "BOOL":
        np_dtype = np.bool_
    return data.view(np_dtype).reshape(shape)
