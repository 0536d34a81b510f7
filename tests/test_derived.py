"""Derived tensors (casts, int8 quantization and its scales, pruning patches): near-free when
the transform explains the child, bit-exact always, and never trusted without a check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit.codecs import AbsmaxScaleCodec, CastCodec, CodecContext, PatchCodec, QuantizeInt8Codec
from mgit.store import MemoryStore

BASE = "cd" * 32


def roundtrip(codec, data: np.ndarray, base: np.ndarray) -> bytes:
    ctx = CodecContext(data.nbytes, lambda oid: base.view(np.uint8))
    return bytes(np.asarray(codec.decode(codec.encode(data.view(np.uint8), ctx), ctx)))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.data())
def test_every_derived_codec_roundtrips_any_child(rows: int, cols: int, data: st.DataObject) -> None:
    n = rows * cols
    base = np.frombuffer(data.draw(st.binary(min_size=4 * n, max_size=4 * n)), "<f4")
    for codec, itemsize, count in [
        (CastCodec(base=BASE, to="BF16"), 2, n), (CastCodec(base=BASE, to="F16"), 2, n),
        (QuantizeInt8Codec(base=BASE, rows=rows), 1, n), (AbsmaxScaleCodec(base=BASE, rows=rows), 4, rows),
        (PatchCodec(base=BASE, itemsize=4), 4, data.draw(st.integers(0, n + 3))),
    ]:  # fmt: skip
        child = np.frombuffer(data.draw(st.binary(min_size=itemsize * count, max_size=itemsize * count)), np.uint8)
        assert roundtrip(codec, child, base) == child.tobytes()


def weights(rows: int = 96, cols: int = 80, seed: int = 0) -> np.ndarray:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    w[0, :3] = [np.nan, np.inf, -0.0]
    return w


def stored_cost(dtype: str, child: np.ndarray, base: np.ndarray, base_dtype: str = "F32") -> tuple[int, str]:
    store = MemoryStore()
    b = store.put_tensor(base_dtype, base.shape, base.reshape(-1).view(np.uint8))
    res = store.put_tensor(dtype, child.shape, np.ascontiguousarray(child).reshape(-1).view(np.uint8), bases=[b.oid])
    assert store.get(res.oid)[1].tobytes() == np.ascontiguousarray(child).tobytes()
    return res.stored_size, res.codec


@pytest.mark.parametrize("target", [torch.bfloat16, torch.float16])
def test_a_torch_cast_costs_almost_nothing(target: torch.dtype) -> None:
    w = weights()
    cast = torch.from_numpy(w).to(target).view(torch.int16).numpy()
    size, codec = stored_cost("BF16" if target == torch.bfloat16 else "F16", cast, w)
    assert codec.startswith("cast") and size < cast.nbytes / 20


def test_per_row_int8_quantization_and_its_scales_cost_almost_nothing() -> None:
    w = np.nan_to_num(weights(), nan=0.0, posinf=0.0)
    t = torch.from_numpy(w)
    scale = t.abs().amax(dim=1) / 127
    q = torch.clamp(torch.round(t / scale[:, None]), -127, 127).to(torch.int8).numpy()
    size, codec = stored_cost("I8", q, w)
    assert codec.startswith("quantize_int8") and size < q.nbytes / 20
    tall = np.random.default_rng(1).standard_normal((8192, 4)).astype(np.float32)
    scales = (torch.from_numpy(tall).abs().amax(dim=1) / 127).numpy()
    size, codec = stored_cost("F32", scales, tall)
    assert codec.startswith("absmax_scale") and size < scales.nbytes / 20


def test_magnitude_pruning_is_a_small_patch() -> None:
    w = np.nan_to_num(weights(256, 256), nan=0.0, posinf=0.0)
    pruned = np.where(np.abs(w) >= np.median(np.abs(w)), w, np.float32(0))
    size, codec = stored_cost("F32", pruned, w)
    assert codec.startswith("patch") and size < pruned.nbytes / 16


def test_a_quantization_that_does_not_match_is_still_exact() -> None:
    w = np.nan_to_num(weights(), nan=0.0, posinf=0.0)
    other = np.clip(np.floor(w / (np.abs(w).max() / 127)), -127, 127).astype(np.int8)  # per tensor, floor
    size, _ = stored_cost("I8", other, w)
    assert size <= other.nbytes + 200


def test_a_prediction_that_does_not_decode_is_never_written(monkeypatch: pytest.MonkeyPatch) -> None:
    w = weights()
    cast = torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy()

    def broken(self, data, ctx):  # a codec bug: decoding gives something else
        out = np.array(np.frombuffer(bytes(data), np.uint8))
        out[0] ^= 1
        return out

    monkeypatch.setattr(CastCodec, "decode", broken)
    size, codec = stored_cost("BF16", cast, w)
    assert not codec.startswith("cast")
