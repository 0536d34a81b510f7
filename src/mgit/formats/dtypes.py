"""The tensor dtypes of safetensors, as MGit names them: bytes per element, the numpy dtype
that views their raw bytes, and whether they are floating point. Kept apart from the
parsers and decoders so that what only needs the table (records, object headers, every
command that never touches a tensor) does not import numpy."""

from __future__ import annotations

import math

# name -> (bytes per element, numpy dtype used to view the raw bytes, is floating point)
DTYPES: dict[str, tuple[int, str, bool]] = {
    "BOOL": (1, "u1", False),
    "U8": (1, "u1", False),
    "I8": (1, "i1", False),
    "F8_E4M3": (1, "u1", True),
    "F8_E5M2": (1, "u1", True),
    "F8_E8M0": (1, "u1", True),
    "I16": (2, "<i2", False),
    "U16": (2, "<u2", False),
    "F16": (2, "<f2", True),
    "BF16": (2, "<u2", True),
    "I32": (4, "<i4", False),
    "U32": (4, "<u4", False),
    "F32": (4, "<f4", True),
    "I64": (8, "<i8", False),
    "U64": (8, "<u8", False),
    "F64": (8, "<f8", True),
    "C64": (8, "<c8", True),
}


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][0]


def is_float(dtype: str) -> bool:
    return DTYPES[dtype][2]


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


MAX_TENSOR_BYTES = (1 << 63) - 1  # numpy's bound: the product of the nonzero dimensions times the itemsize


def shape_fits(shape: tuple[int, ...], dtype: str) -> bool:
    """Whether a tensor of this shape can exist in memory at all: the product of its nonzero
    dimensions, times the itemsize, within MAX_TENSOR_BYTES (a shape like [2**70, 0] holds
    no byte, yet no array can have it)."""
    return math.prod(d for d in shape if d) * itemsize(dtype) <= MAX_TENSOR_BYTES
