"""The tensor dtypes of safetensors, as MGit names them: bytes per element, the numpy dtype
that views their raw bytes, and whether they are floating point; and ggml's block-quantized
types (a GGUF file's Q8_0, Q4_K ...). Kept apart from the parsers and decoders so that what
only needs the table (records, object headers, every command that never touches a tensor)
does not import numpy.

A block-quantized tensor is stored as bytes with its blocks made visible in its shape: a
Q8_0 matrix of 384 x 1536 values (32 values in a 34-byte block) is dtype "Q8_0", shape
[384, 48, 34], one byte an item. Its logical content stays (dtype, shape, bytes), so one
tensor in two GGUF files is one object, and a GGUF's F32 and F16 tensors (norms, embeddings)
are the same objects as in any other file that holds them."""

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
SAFETENSORS_DTYPES = frozenset(DTYPES)  # what a safetensors header may name

# ggml's tensor types (gguf.GGMLQuantizationType): number -> (name, values per block, bytes per
# block). Those of one value a block are the dtypes above; the others are block-quantized.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17),
}  # fmt: skip
# block dtype -> (values per block, bytes per block)
BLOCK_DTYPES: dict[str, tuple[int, int]] = {n: (b, t) for n, b, t in GGML_TYPES.values() if b > 1}
DTYPES.update({name: (1, "u1", False) for name in BLOCK_DTYPES})


def blocks_fit(dtype: str, shape: tuple[int, ...] | list[int]) -> bool:
    """Whether a shape can be a tensor of this dtype's: a block dtype's ends in its bytes a
    block, after at least a count of blocks (any other dtype: any shape)."""
    return dtype not in BLOCK_DTYPES or (len(shape) >= 2 and shape[-1] == BLOCK_DTYPES[dtype][1])


def value_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape in values of a tensor stored with this shape: a block dtype's
    [..., blocks, bytes per block] is [..., blocks * values per block]; any other, itself."""
    if dtype not in BLOCK_DTYPES or len(shape) < 2:
        return shape
    return (*shape[:-2], shape[-2] * BLOCK_DTYPES[dtype][0])


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
    return math.prod(d for d in shape if d) * itemsize(dtype) <= MAX_TENSOR_BYTES and blocks_fit(dtype, shape)
