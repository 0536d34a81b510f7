"""A quantized side seen as floats: its packed layers (GPTQ's and AWQ's `qweight`, `qzeros`,
`scales`, `g_idx`; an FP8 or int8 `weight` with its `weight_scale`) become the float
`x.weight` each stands for, dequantized when compared (`mgit.formats.packed_quant`), so that a
quantized model against its float parent pairs weight with weight and the figures are the
quantization's error.

A side is dequantized only against a side holding float tensors under those names (across a
wrapper prefix): two quantized models are compared as they are stored. Layers whose tensors
do not fit their layout (a forged config, inconsistent shapes) are left as they are, and a
note says `cannot dequantize NAME: why`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from mgit.diff.sides import ModelSide, TensorRef
from mgit.formats.packed_quant import PackedTensor, Shapes, dequantize, packed_tensors
from mgit.formats.pairing import tensor_names
from mgit.formats.quant_config import QuantScheme, scheme_from_bytes
from mgit.formats.safetensors import is_float
from mgit.store.cache import DecodedCache

CONFIG_BYTES = 1 << 20  # a config.json larger than this is not read for its quantization
SHOWN = 3  # layers that cannot be dequantized, named in the notes


def side_scheme(side: ModelSide) -> QuantScheme | None:
    """What the side's config.json announces, if it has a readable one."""
    config = side.files.get("config.json")
    if config is None or config.size > CONFIG_BYTES:
        return None
    return scheme_from_bytes(config.content())


def _derive(
    packed: PackedTensor, shapes: Shapes, members: dict[str, TensorRef]
) -> Callable[[DecodedCache | None], np.ndarray]:
    """The layer's float32 bytes, its member tensors read (and decoded) only when asked."""

    def derive(cache: DecodedCache | None) -> np.ndarray:
        values = dequantize(packed, shapes, lambda name: np.asarray(members[name].raw(cache)).reshape(-1))
        return values.astype("<f4", copy=False).reshape(-1).view(np.uint8)

    return derive


def as_floats(side: ModelSide, other: ModelSide) -> ModelSide:
    """`side` with its packed layers as the float tensors they stand for, where `other` holds
    float tensors of those names; `side` as it is otherwise."""
    shapes = {name: (t.dtype, t.shape) for name, t in side.tensors.items()}
    scheme = side_scheme(side)
    found = packed_tensors(shapes, scheme)
    if not found:
        return side
    pairs = tensor_names(list(found), other.tensors)
    wanted = {
        name: p
        for name, p in found.items()
        if name in pairs and is_float(other.tensors[pairs[name]].dtype) and other.tensors[pairs[name]].dtype[:2] != "F8"
    }
    if not wanted:
        return side
    notes, failed = list(side.notes), []
    replaced: dict[str, TensorRef] = {}  # a member's name -> the float tensor it becomes part of
    for name, packed in wanted.items():
        if packed.problem:
            failed.append(f"cannot dequantize {name}: {packed.problem}")
            continue
        members = {m: side.tensors[m] for m in packed.tensors}
        ref = TensorRef(name, "F32", packed.shape, derive=_derive(packed, shapes, members))
        replaced |= dict.fromkeys(members, ref)
    tensors: dict[str, TensorRef] = {}
    for name, t in side.tensors.items():  # each float tensor where its first member was
        if name in replaced:
            tensors.setdefault(replaced[name].name, replaced[name])
        elif name not in tensors:
            tensors[name] = t
    done = len(set(t.name for t in replaced.values()))
    if done:
        how = scheme.label if scheme is not None else "packed"
        notes.append(f"{done} quantized layers of {side.side.label} ({how}) are compared dequantized to F32")
    if failed:
        more = f" (and {len(failed) - SHOWN} more)" if len(failed) > SHOWN else ""
        notes.append("; ".join(failed[:SHOWN]) + more)
    return replace(side, tensors=tensors, notes=notes)
