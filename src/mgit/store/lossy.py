"""Opt-in lossy storage: a float tensor kept as its parent plus a quantized change, within a
guaranteed error bound, and never silently.

Two bounds, either or both (every bound given holds for every element):

- absolute, `eps`: |recon - x| <= eps;
- relative to the change, `rel`: |recon - x| <= rel * rms(x - parent), per tensor. It follows
  the size of what the child changed, so a fine-tune whose changes are far below any useful
  absolute bound still compresses, and the fidelity guard holds by construction for rel up
  to about 0.18 at the default guard (rounding errs by at most half a step, rms about
  step / sqrt(12); finer steps are tried when the guard fails).

Tensors without a parent tensor are stored exactly: quantizing a base model would make every
exact derivative of it (a cast, a pruning, frozen layers) differ from its stored form, and
the guard could no longer tell a child's small changes from the parent's rounding.

For each float tensor (F16, BF16, F32, F64), `encode_lossy` quantizes `x - parent` with a
uniform step, rebuilds the values with the codec's own `reconstruct` and keeps that
reconstruction only if

- every element is within the bound (measured, not assumed; a finer step is tried before
  giving up), and
- the fidelity guard holds: ||recon - x|| <= guard * ||x - parent||, so that what the child
  changed survives (a change smaller than the step would otherwise round back to the parent).

A child most of whose values are within the bound of the parent's stored values (a pruned
copy of a lossily stored fine-tune) is instead *snapped* to the parent: those values take the
parent's, exact zeros stay, and an exact patch of the parent stores the rest.

Otherwise the tensor is stored losslessly. Tensors with NaN or infinity and integer tensors
are never touched. `verdict` then decides for the whole version: if the guard failed on more
than half of the changed parameters, the version is stored losslessly and the reason is
reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mgit.codecs import (
    Codec,
    CodecContext,
    PcoCodec,
    QuantizedDeltaCodec,
    byte_array,
)
from mgit.codecs.quantized_delta import (
    FLOAT_DTYPES,
    as_float64,
    int_bytes_for,
    quantize,
    reconstruct,
)
from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.store.base import ObjectStore
from mgit.store.cache import DecodedCache
from mgit.store.lossy_policy import LossyPolicy
from mgit.store.objects import object_id, tensor_meta

STEP_FACTORS = (1.9, 1.0, 0.5)  # step = factor * eps; rounding alone errs by at most step / 2
SNAP_SHARE = 0.5  # share of values within the bound of the parent's above which the child is snapped to it


@dataclass(frozen=True)
class LossyTensor:
    """What to store for one tensor: `data` (the reconstruction when `chain` is set, else the
    original bytes), the largest error, and how the tensor counts for the version's verdict."""

    data: np.ndarray
    chain: list[Codec] | None
    max_error: float
    changed_params: int
    guard_failed: bool = False


def _parent(store: ObjectStore, dtype: str, shape: tuple[int, ...], bases: Sequence[str], max_depth: int) -> str | None:
    """The closest base with this tensor's dtype and shape that can still take a delta."""
    meta = tensor_meta(dtype, shape)
    for base in bases:
        try:
            header = store.header(base)
        except (CorruptObjectError, MissingObjectError):
            continue
        if header.kind == "tensor" and header.meta == meta and header.depth < max_depth:
            return base
    return None


def _tail(int_bytes: int) -> list[Codec]:
    # pcodec codes the steps near their entropy (a few bits each); it reads 16 bits and wider.
    return [PcoCodec(dtype=f"<u{int_bytes}")]


def encode_lossy(
    store: ObjectStore,
    dtype: str,
    shape: tuple[int, ...],
    data: np.ndarray,
    bases: Sequence[str],
    policy: LossyPolicy,
    max_depth: int,
    reuse: DecodedCache | None = None,
) -> LossyTensor | None:
    """The lossy form of one tensor, or None when lossy storage does not apply to it."""
    if dtype not in FLOAT_DTYPES:
        return None
    raw = byte_array(data)
    if store.has(object_id("tensor", tensor_meta(dtype, shape), raw)):
        return None  # stored already, exactly: it costs nothing
    base = _parent(store, dtype, shape, bases, max_depth)
    if base is None:
        return None
    parent_bytes = store.load_base(base, reuse)
    if np.array_equal(parent_bytes, raw):
        return None  # the same object as the parent's: deduplicated
    x, b = as_float64(raw, dtype), as_float64(parent_bytes, dtype)
    lossless = LossyTensor(raw, None, 0.0, x.size)
    if not (np.isfinite(x).all() and np.isfinite(b).all()):
        return lossless  # NaN and infinity are kept exactly
    change = float(np.linalg.norm(x - b))
    bound = policy.bound(change / np.sqrt(x.size) if x.size else 0.0)
    if bound <= 0:
        return lossless
    snapped = _snap_to_parent(x, b, parent_bytes, raw, dtype, bound, policy.guard * change)
    if snapped is not None:
        return snapped
    ctx = CodecContext(raw.nbytes, lambda _: parent_bytes)
    guard_failed = False
    for factor in STEP_FACTORS:
        step = float(bound * factor)
        q = quantize(x, b, step)
        int_bytes = int_bytes_for(q)
        if int_bytes is not None:
            int_bytes = max(int_bytes, 2)  # pcodec's smallest number
        if int_bytes is None:
            return lossless  # the change is too large for 32-bit steps of this size
        recon = reconstruct(b, q, step, dtype)
        error = np.abs(as_float64(recon, dtype) - x)
        if not (error <= bound).all():
            continue  # the cast to the dtype added error: try a finer step
        codec = QuantizedDeltaCodec(base=base, step=step, dtype=dtype, int_bytes=int_bytes)
        if not np.array_equal(byte_array(codec.decode(codec.encode(recon, ctx), ctx)), recon):
            continue  # the reconstruction does not map back to itself: never store what would not decode
        if float(np.linalg.norm(as_float64(recon, dtype) - x)) > policy.guard * change:
            guard_failed = True
            continue  # a finer step may keep the change
        return LossyTensor(recon, [codec, *_tail(int_bytes)], float(error.max(initial=0.0)), x.size)
    return LossyTensor(raw, None, 0.0, x.size, guard_failed=True) if guard_failed else lossless


def _snap_to_parent(
    x: np.ndarray, b: np.ndarray, parent_bytes: np.ndarray, raw: np.ndarray, dtype: str, bound: float, guard_norm: float
) -> LossyTensor | None:
    """The child with every value within `bound` of the parent's stored value replaced by it,
    when that is most of them: a pruned copy of a lossily stored fine-tune then differs from
    its parent's reconstruction only where it was pruned, which an exact patch stores for
    little. Exact zeros are kept (a pruning's mask is structure, not noise). Both arrays'
    values are representable in the dtype, so the mix is taken bytewise."""
    close = (np.abs(x - b) <= bound) & (x != 0)
    if not close.any() or close.mean() < SNAP_SHARE:
        return None
    size = raw.size // x.size
    mask = np.repeat(close, size)
    recon = np.where(mask, parent_bytes[: raw.size], raw)
    error = np.abs(np.where(close, b, x) - x)
    if float(np.linalg.norm(error)) > guard_norm:
        return None
    return LossyTensor(recon, [], float(error.max(initial=0.0)), x.size)
