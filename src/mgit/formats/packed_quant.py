"""Packed quantized tensors in a safetensors model, and their dequantization: the one place
that knows the layouts, used by diff (a quantized model against its float parent) and by
parent inference (sketches of the dequantized values).

A quantized linear layer `x` stands for the float matrix `x.weight` (out x in) and is stored as:

- GPTQ (AutoGPTQ, v1 checkpoint format): `x.qweight` I32 [in*bits/32, out], values packed
  32/bits per word along the input dimension, value j of a word in bits [j*bits, (j+1)*bits);
  `x.qzeros` I32 [groups, out*bits/32], packed the same way along the output dimension and
  stored minus one (`gptq_v2` stores them as they are); `x.scales` F16 [groups, out]; `x.g_idx`
  I32 [in], the group of each input column (i // group_size unless desc_act reordered them).
  w[o, i] = (q[i, o] - z[g_idx[i], o]) * s[g_idx[i], o].
- AWQ (AutoAWQ, GEMM): `x.qweight` I32 [in, out*bits/32], `x.qzeros` I32 [groups, out*bits/32],
  both packed along the output dimension in the order [0, 2, 4, 6, 1, 3, 5, 7] (the value of
  column 8c + ORDER[j] in bits [4j, 4j+4) of word c); `x.scales` F16 [groups, out]; group
  g = i // group_size; zeros stored as they are.
- compressed-tensors pack-quantized: `x.weight_packed` I32 [out, in*bits/32], packed along the
  input dimension as GPTQ's qweight is, values offset by 2**(bits-1) (symmetric);
  `x.weight_scale` [out, groups]; `x.weight_shape` I64 [2].
- FP8 (compressed-tensors float-quantized, fine-grained FP8): `x.weight` F8_E4M3 (or E5M2) and
  `x.weight_scale` (or `x.weight_scale_inv`), F32 or BF16: one scale, one per row ([out, 1]),
  one per group of columns ([out, in/group]) or one per block ([ceil(out/b), ceil(in/b)]).
  Naive int8 (naive-quantized) is the same with `x.weight` I8 and an optional `x.weight_zero_point`.

Every shape and dtype is checked before a byte is read: a forged model gives a
`DequantizeError` saying why, never a crash.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from mgit.errors import DequantizeError
from mgit.formats.quant_config import PACKED_BITS, QuantScheme
from mgit.formats.safetensors import FP8_VALUES, itemsize, to_float

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ's GEMM packing: value of column 8c + ORDER[j] in slot j
SCALE_DTYPES = ("F32", "F16", "BF16")
Shapes = Mapping[str, tuple[str, tuple[int, ...]]]  # tensor name -> (dtype, shape)


@dataclass(frozen=True)
class PackedTensor:
    """One quantized matrix: the float tensor it stands for (`name`, `shape` out x in), its
    layout (`gptq`, `awq`, `pack`, `fp8`, `int8`), the tensors that hold it by role
    (`qweight`, `qzeros`, `scales`, `g_idx`, `weight`, `scale`, `zero_point`, `weight_shape`)
    and its bits. `problem` says why it cannot be dequantized, if it cannot."""

    name: str
    layout: str
    members: dict[str, str]
    shape: tuple[int, int]
    bits: int
    problem: str | None = None
    zeros_minus_one: bool = False  # AutoGPTQ's v1 checkpoints store each zero point minus one

    @property
    def tensors(self) -> list[str]:
        return list(self.members.values())


def _words(bits: int) -> int:
    return 32 // bits


def _bits_of(scheme: QuantScheme | None) -> int | None:
    return scheme.bits if scheme is not None else None


def _int_packed(base: str, shapes: Shapes, scheme: QuantScheme | None) -> PackedTensor | None:
    """A GPTQ or AWQ layer `base` (`base.qweight` present), or None when it is not one."""
    members = {r: f"{base}.{r}" for r in ("qweight", "qzeros", "scales", "g_idx") if f"{base}.{r}" in shapes}
    name = base + ".weight"
    if "scales" not in members or "qzeros" not in members:
        return PackedTensor(name, "gptq", members, (0, 0), 0, "it has no scales or no qzeros")
    (qd, qs), (zd, zs), (sd, ss) = (shapes[members[r]] for r in ("qweight", "qzeros", "scales"))
    if qd != "I32" or zd != "I32" or sd not in SCALE_DTYPES or len(qs) != 2 or len(zs) != 2 or len(ss) != 2:
        return PackedTensor(name, "gptq", members, (0, 0), 0, "its tensors are not the dtypes and ranks of a layout")
    groups, out = ss
    awq = scheme.method == "awq" if scheme is not None and scheme.method in ("gptq", "awq") else qs[1] != out
    layout = "awq" if awq else "gptq"
    bits = _bits_of(scheme) or (32 * zs[1] // out if out and (32 * zs[1]) % out == 0 else 0)
    if not bits:
        why = f"qzeros {list(zs)} does not hold {out} columns in whole int32 words"
        return PackedTensor(name, layout, members, (0, 0), bits, why)
    if bits not in PACKED_BITS:
        return PackedTensor(name, layout, members, (0, 0), bits, f"{bits}-bit values do not pack evenly into int32")
    per = _words(bits)
    rows_in = qs[0] if awq else qs[0] * per
    shape = (out, rows_in)
    problem = None
    if (qs[1] * per if awq else qs[1]) != out or zs[1] * per != out:
        problem = f"qweight {list(qs)}, qzeros {list(zs)} and scales {list(ss)} do not fit {bits} bits"
    elif groups < 1 or rows_in % groups:
        problem = f"{groups} groups do not divide {rows_in} input columns"
    elif zs[0] != groups:
        problem = f"qzeros has {zs[0]} groups and scales {groups}"
    elif scheme is not None and scheme.group_size not in (None, -1) and scheme.group_size * groups != rows_in:
        problem = f"group size {scheme.group_size} does not give {groups} groups of {rows_in} columns"
    elif "g_idx" in members and shapes[members["g_idx"]] != ("I32", (rows_in,)):
        problem = f"g_idx is {shapes[members['g_idx']]} where I32 [{rows_in}] was expected"
    v1 = layout == "gptq" and (scheme is None or scheme.format != "gptq_v2")
    return PackedTensor(name, layout, members, shape, bits, problem, zeros_minus_one=v1)


def _scaled(base: str, shapes: Shapes, scheme: QuantScheme | None) -> PackedTensor | None:
    """An FP8 or int8 `base.weight` with its scale (compressed-tensors, fine-grained FP8), or
    a pack-quantized `base.weight_packed`; None when there is no such pair."""
    name = base + ".weight"
    scale = next((f"{base}.{s}" for s in ("weight_scale", "weight_scale_inv") if f"{base}.{s}" in shapes), None)
    if scale is None:
        return None
    members = {"scale": scale}
    if f"{base}.weight_zero_point" in shapes:
        members["zero_point"] = f"{base}.weight_zero_point"
    if f"{base}.weight_packed" in shapes:
        members |= {"weight": f"{base}.weight_packed"}
        if f"{base}.weight_shape" in shapes:
            members["weight_shape"] = f"{base}.weight_shape"
        bits = _bits_of(scheme) or 4
        dtype, packed = shapes[members["weight"]]
        problem = None
        if bits not in PACKED_BITS:
            problem = f"{bits}-bit values do not pack evenly into int32"
        elif dtype != "I32" or len(packed) != 2:
            problem = f"weight_packed is {dtype} {list(packed)}, not an I32 matrix"
        elif "zero_point" in members:
            problem = "asymmetric pack-quantized weights (with zero points) are not read yet"
        shape = (packed[0], packed[1] * _words(bits)) if problem is None else (0, 0)
        return PackedTensor(name, "pack", members, shape, bits, problem or _scale_problem(shape, shapes[scale]))
    if name not in shapes:
        return None
    members["weight"] = name
    dtype, shape = shapes[name]
    if dtype not in (*FP8_VALUES, "I8") or len(shape) != 2:
        return None  # a float weight beside a scale: not quantized (or not a matrix)
    layout = "int8" if dtype == "I8" else "fp8"
    return PackedTensor(name, layout, members, (shape[0], shape[1]), 8, _scale_problem(shape, shapes[scale]))


def _scale_problem(shape: tuple[int, ...], scale: tuple[str, tuple[int, ...]]) -> str | None:
    dtype, sshape = scale
    if dtype not in SCALE_DTYPES:
        return f"its scale is {dtype}, not a float"
    if _scale_index(shape, sshape) is None:
        return f"a scale of shape {list(sshape)} does not fit a {list(shape)} matrix"
    return None


def _scale_index(shape: tuple[int, ...], sshape: tuple[int, ...]) -> tuple[int, int] | None:
    """(rows, columns) of the matrix each scale covers, or None when the shapes do not fit:
    one scale, one per row, one per group of columns, or one per block."""
    rows, cols = shape
    count = math.prod(sshape)
    if count == 1:
        return max(rows, 1), max(cols, 1)
    if len(sshape) == 1 or (len(sshape) == 2 and sshape[1] == 1):
        return (1, max(cols, 1)) if count == rows else None
    if len(sshape) != 2 or not sshape[0] or not sshape[1]:
        return None
    br, bc = -(-rows // sshape[0]), -(-cols // sshape[1])
    if -(-rows // br) == sshape[0] and -(-cols // bc) == sshape[1]:
        return br, bc
    return None


def packed_tensors(shapes: Shapes, scheme: QuantScheme | None = None) -> dict[str, PackedTensor]:
    """The quantized matrices among a model's tensors, by the float name each stands for."""
    found: dict[str, PackedTensor] = {}
    for tensor in shapes:
        for suffix, read in ((".qweight", _int_packed), (".weight_scale", _scaled), (".weight_scale_inv", _scaled)):
            if tensor.endswith(suffix):
                packed = read(tensor.removesuffix(suffix), shapes, scheme)
                if packed is not None:
                    found.setdefault(packed.name, packed)
    return found


def unpack(words: np.ndarray, bits: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Unsigned `bits`-wide values from int32 words, 32/bits per word along the last axis
    (slot j of a word in bits [j*bits, (j+1)*bits)), in `order` of slots when given."""
    per = _words(bits)
    u = words.view("<u4")[..., None] >> (np.arange(per, dtype=np.uint32) * bits)
    values = (u & np.uint32((1 << bits) - 1)).astype(np.int32)
    if order is not None:
        values = values[..., np.argsort(order)]
    return values.reshape(*words.shape[:-1], words.shape[-1] * per)


def _matrix(read: Callable[[str], np.ndarray], name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    raw = read(name)
    if raw.size != math.prod(shape) * itemsize(dtype):
        raise DequantizeError(name, f"it holds {raw.size} bytes, not a {dtype} {list(shape)}")
    if dtype in _VIEW:
        return raw.view(_VIEW[dtype]).reshape(shape)
    return to_float(raw, dtype, np.float32).reshape(shape)


_VIEW = {"I32": "<i4", "I64": "<i8", "I8": "i1"}


def dequantize(packed: PackedTensor, shapes: Shapes, read: Callable[[str], np.ndarray]) -> np.ndarray:
    """The float32 matrix (out x in) a quantized layer stands for; `read(name)` gives a member
    tensor's raw bytes (uint8). Raises `DequantizeError` for a layout that does not fit."""
    if packed.problem:
        raise DequantizeError(packed.name, packed.problem)

    def get(role: str) -> np.ndarray:
        name = packed.members[role]
        dtype, shape = shapes[name]
        return _matrix(read, name, dtype, shape)

    out, cols = packed.shape
    with np.errstate(over="ignore", invalid="ignore"):
        if packed.layout in ("gptq", "awq"):
            return _dequantize_int(packed, get, out, cols)
        scale = get("scale").astype(np.float32)
        if packed.layout == "pack":
            values = unpack(get("weight"), packed.bits).astype(np.float32) - np.float32(1 << (packed.bits - 1))
        else:
            values = get("weight").astype(np.float32)
            if "zero_point" in packed.members:
                zp = get("zero_point").astype(np.float32)
                values = values - _broadcast(zp, out, cols, packed)
        return values * _broadcast(scale, out, cols, packed)


def _broadcast(per: np.ndarray, rows: int, cols: int, packed: PackedTensor) -> np.ndarray:
    """A scale (or zero point) spread over the out x in matrix it covers."""
    block = _scale_index((rows, cols), per.shape)
    if block is None:
        raise DequantizeError(packed.name, f"a scale of shape {list(per.shape)} does not fit {rows} x {cols}")
    grid = per.reshape(-(-rows // block[0]), -(-cols // block[1]))
    return np.repeat(np.repeat(grid, block[0], axis=0)[:rows], block[1], axis=1)[:, :cols]


def _dequantize_int(packed: PackedTensor, get: Callable[[str], np.ndarray], out: int, cols: int) -> np.ndarray:
    awq = packed.layout == "awq"
    order = AWQ_ORDER if awq and packed.bits == 4 else None
    scales = get("scales").astype(np.float32)  # [groups, out]
    zeros = unpack(get("qzeros"), packed.bits, order)  # [groups, out]
    if packed.zeros_minus_one:
        zeros = zeros + 1
    # [in, out]; GPTQ packs along the input dimension
    q = unpack(get("qweight"), packed.bits, order) if awq else unpack(get("qweight").T.copy(), packed.bits).T
    groups = scales.shape[0]
    if "g_idx" in packed.members:
        g_idx = get("g_idx")
        if g_idx.size and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            raise DequantizeError(packed.name, f"g_idx names groups outside 0..{groups - 1}")
    else:
        g_idx = np.arange(cols) // (cols // groups)
    w = (q - zeros[g_idx]).astype(np.float32) * scales[g_idx]  # [in, out]
    return np.ascontiguousarray(w.T)
