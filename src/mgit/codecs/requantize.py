"""A ggml block-quantized tensor (a GGUF's Q8_0, Q4_0 ...) predicted by quantizing its float
parent again with gguf's reference quantizer, plus the exact residual.

`llama-quantize` and `convert_hf_to_gguf.py --outtype q8_0` (without an importance matrix)
quantize each row of 32 values with ggml's reference rules, which `gguf.quants` reproduces
bit for bit. A quantization ladder of a stored float model (Q8_0, Q5_0, Q4_0 ...) is then, for
each of its quantized tensors, the parent's tensor plus a residual of zeros: a ladder costs
its skeletons, its unpredicted types (the K-quants, the IQ types: stored as their blocks) and
almost nothing else. Like every prediction codec it is lossless whatever the prediction: a
file quantized otherwise (an imatrix, another tool) costs space, never correctness.

The prediction is made with the installed `gguf` package on encode and on every decode, so
decoding needs it (a missing package is a one-line error naming the extra). A gguf release
that changed a reference quantizer would make such objects fail their checks on checkout,
never decode to wrong bytes: every decode is verified against the object's id.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from mgit.codecs.base import CodecContext, CodecError, check_oid, load_base, register
from mgit.codecs.derived import PredictionCodec
from mgit.errors import MissingDependencyError

# ggml types gguf.quants quantizes with the reference rules: (values, bytes) per block
REQUANTIZABLE = {"Q8_0": (32, 34), "Q4_0": (32, 18), "Q4_1": (32, 20), "Q5_0": (32, 22), "Q5_1": (32, 24)}
FLOAT_BASES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}
# what a permuted tensor may be written as besides those (a llama GGUF's F16 q projection)
TARGETS = {**REQUANTIZABLE, "F32": (1, 4), "F16": (1, 2), "BF16": (1, 2)}


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether the `gguf` package is installed (found, not imported): without it no object is
    written with this codec, and a GGUF's quantized tensors are stored as their blocks."""
    try:
        return importlib.util.find_spec("gguf") is not None
    except (ImportError, ValueError):  # (ValueError: blocked in sys.modules)
        return False


def permute_heads(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert script's permutation of a llama q or k projection (Hugging Face's
    rotary halves to ggml's interleaved pairs): rows regrouped per head."""
    n = rows.shape[0]
    if heads < 1 or n % (2 * heads):
        raise CodecError(f"{n} rows cannot be split into {heads} heads of pairs")
    return rows.reshape(heads, 2, n // heads // 2, rows.shape[1]).swapaxes(1, 2).reshape(rows.shape)


@register
@dataclass(frozen=True)
class RequantizeCodec(PredictionCodec):
    """Predicts blocks of type `to` from a float base of dtype `base_dtype` read as rows of
    `row` values (a GGUF tensor's first dimension, `ne[0]`), its rows first permuted as
    llama.cpp's convert script permutes a llama q or k projection when `heads` is set (then
    `to` may also be F32, F16 or BF16: a permuted tensor is no cast of its parent)."""

    name = "ggml_requantize"
    base: str
    base_dtype: str
    to: str
    row: int
    heads: int = 0

    def __post_init__(self) -> None:
        check_oid(self.base)
        if self.base_dtype not in FLOAT_BASES:
            raise ValueError(f"base_dtype must be one of {', '.join(FLOAT_BASES)}, not {self.base_dtype!r}")
        if self.to not in (TARGETS if self.heads else REQUANTIZABLE):
            raise ValueError(f"to must be one of {', '.join(REQUANTIZABLE)}, not {self.to!r}")
        block = TARGETS[self.to][0]
        if not isinstance(self.row, int) or isinstance(self.row, bool) or self.row < block or self.row % block:
            raise ValueError(f"row must be a positive multiple of {block}, not {self.row!r}")
        if not isinstance(self.heads, int) or isinstance(self.heads, bool) or not 0 <= self.heads <= 1 << 16:
            raise ValueError(f"heads must be a count of attention heads, not {self.heads!r}")

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        try:
            from gguf.constants import GGMLQuantizationType
            from gguf.quants import quantize
        except ImportError:
            raise MissingDependencyError("gguf", "A GGUF tensor stored against its float parent", "gguf") from None
        raw = load_base(self.name, self.base, ctx)
        width = np.dtype(FLOAT_BASES[self.base_dtype]).itemsize
        if raw.size % (width * self.row):
            raise CodecError(f"{self.name}: a base of {raw.size} bytes is not rows of {self.row} {self.base_dtype}")
        values = raw.view(FLOAT_BASES[self.base_dtype])
        if self.base_dtype == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        rows = values.astype(np.float32, copy=False).reshape(-1, self.row)
        if self.heads:
            rows = permute_heads(rows, self.heads)
        block, type_size = TARGETS[self.to]
        if rows.size // block * type_size != ctx.size:
            raise CodecError(f"{self.name}: its base makes {rows.size // block * type_size} bytes for {ctx.size}")
        with np.errstate(all="ignore"):
            return np.ascontiguousarray(quantize(rows, GGMLQuantizationType[self.to]))
