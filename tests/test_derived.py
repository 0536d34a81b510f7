"""Derived tensors (casts, int8 quantization and its scales, pruning patches): near-free when
the transform explains the child, bit-exact always, and never trusted without a check."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit.codecs import (
    AbsmaxScaleCodec,
    CastCodec,
    CodecContext,
    CodecError,
    LowRankCodec,
    PatchCodec,
    PcoCodec,
    QuantizeInt8Codec,
    SubDeltaCodec,
    TransposeCodec,
)
from mgit.codecs.base import byte_array, encode_chain
from mgit.codecs.derived import _low_rank_prediction, low_rank_of
from mgit.store.memory import MemoryStore

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
        (CastCodec(base=BASE, to="BF16"), 2, n),
        (CastCodec(base=BASE, to="F16"), 2, n),
        (QuantizeInt8Codec(base=BASE, rows=rows), 1, n),
        (AbsmaxScaleCodec(base=BASE, rows=rows), 4, rows),
        (PatchCodec(base=BASE, itemsize=4), 4, data.draw(st.integers(0, n + 3))),
        (LowRankCodec(base=BASE, rows=rows, rank=data.draw(st.integers(1, min(rows, cols)))), 4, n),
        (TransposeCodec(base=BASE, rows=rows, itemsize=4), 4, n),
        (TransposeCodec(base=BASE, rows=rows, itemsize=2), 2, 2 * n),
    ]:
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


def merged_lora(rows: int = 256, cols: int = 192, rank: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A base matrix and the same with a trained-looking LoRA merged in by torch: W + (B @ A) * alpha / r."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=g) * 0.05
    a, b = torch.randn(rank, cols, generator=g) * 0.02, torch.randn(rows, rank, generator=g) * 0.01
    merged = w.clone()
    merged += (b @ a) * (16.0 / rank)
    return merged.numpy(), w.numpy()


@pytest.mark.parametrize("rank", [1, 4, 8])
def test_a_merged_lora_costs_little_more_than_its_factors(rank: int) -> None:
    merged, w = merged_lora(rank=rank)
    assert low_rank_of(merged, w, merged.shape[0]) == rank
    size, codec = stored_cost("F32", merged, w)
    factors = rank * sum(merged.shape) * 4
    ctx = CodecContext(merged.nbytes, lambda oid: w.reshape(-1).view(np.uint8))
    delta = len(encode_chain([SubDeltaCodec(base=BASE, itemsize=4), PcoCodec(dtype="<u4")], merged.view(np.uint8), ctx))
    assert codec.startswith("low_rank") and size < factors + merged.nbytes / 8, (size, factors)
    assert size < delta / 2, (size, delta)


def test_changes_of_full_rank_are_not_taken_for_an_adapter() -> None:
    w = np.random.default_rng(0).standard_normal((256, 192)).astype(np.float32)
    tuned = w + np.random.default_rng(1).standard_normal(w.shape).astype(np.float32) * 1e-3
    assert low_rank_of(tuned, w, 256) is None
    assert low_rank_of(w, w, 256) is None  # no change at all
    assert low_rank_of(w[:100], w[:100], 100) is None  # too small to judge
    size, codec = stored_cost("F32", tuned, w)
    assert not codec.startswith("low_rank")


def test_the_prediction_is_the_same_float_arithmetic_everywhere() -> None:
    """Decoding on another machine must give the same bits: the prediction is plain IEEE
    double arithmetic in a fixed order, which Python's floats reproduce one value at a time."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((5, 7)).astype(np.float32)
    u, v = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 7)).astype(np.float32)
    expected = np.empty_like(base)
    for i in range(5):
        for j in range(7):
            acc = float(base[i, j])
            for k in range(3):
                acc += float(u[i, k]) * float(v[k, j])
            expected[i, j] = np.float32(acc)
    assert _low_rank_prediction(base, u, v).tobytes() == expected.tobytes()


def test_low_rank_data_of_the_wrong_size_or_rank_is_refused() -> None:
    merged, w = merged_lora()
    codec = LowRankCodec(base=BASE, rows=256, rank=8)
    ctx = CodecContext(merged.nbytes, lambda oid: w.reshape(-1).view(np.uint8))
    encoded = byte_array(codec.encode(merged.reshape(-1).view(np.uint8), ctx))
    with pytest.raises(CodecError, match="bytes where"):
        codec.decode(encoded[:-4], ctx)
    with pytest.raises(CodecError, match="does not match"):
        LowRankCodec(base=BASE, rows=256, rank=8).decode(encoded, CodecContext(merged.nbytes - 4, ctx.load_object))
    for bad in (0, 65, True):
        with pytest.raises(ValueError, match="rank"):
            LowRankCodec(base=BASE, rows=256, rank=bad)


def test_show_and_du_count_a_merged_adapter_as_derived(tmp_path) -> None:
    from mgit import Repo

    merged, w = merged_lora()
    repo = Repo.init(tmp_path)
    repo.add({"q.weight": w, "norm": np.ones(192, np.float32)}, name="base")
    repo.add(
        {"q.weight": merged, "norm": np.ones(192, np.float32)}, name="base-lora", parent=["base"], relation="adapter"
    )
    assert repo.show("base-lora").tensor_storage == {"deduplicated": 1, "derived": 1}


@pytest.mark.parametrize("dtype", ["F32", "BF16", "I8"])
def test_a_transposed_matrix_costs_almost_nothing(dtype: str) -> None:
    """A checkpoint converted between layouts (a linear layer stored in x out, or out x in)."""
    w = np.nan_to_num(weights(96, 80), nan=0.0, posinf=0.0)
    base = {
        "F32": w,
        "BF16": torch.from_numpy(w).to(torch.bfloat16).view(torch.int16).numpy(),
        "I8": np.clip(np.rint(w * 1000), -127, 127).astype(np.int8),
    }[dtype]
    size, codec = stored_cost(dtype, np.ascontiguousarray(base.T), base, base_dtype=dtype)
    assert codec.startswith("transpose") and size < base.nbytes / 20


def test_per_tensor_int8_quantization_and_its_scale_cost_almost_nothing() -> None:
    w = np.nan_to_num(weights(), nan=0.0, posinf=0.0)
    t = torch.from_numpy(w)
    scale = t.abs().max() / 127  # one scale for the whole tensor, as torch's per-tensor symmetric scheme
    q = torch.clamp(torch.round(t / scale), -127, 127).to(torch.int8).numpy()
    size, codec = stored_cost("I8", q, w)
    assert codec.startswith("quantize_int8") and size < q.nbytes / 20
    s = np.array([scale.item()], np.float32)  # 4 bytes: stored raw, but the transform explains it exactly
    ctx = CodecContext(4, lambda oid: w.reshape(-1).view(np.uint8))
    assert not np.any(byte_array(AbsmaxScaleCodec(base=BASE, rows=1).encode(s.view(np.uint8), ctx)))


@pytest.mark.parametrize("low_rank", [True, False])
def test_a_matrix_over_a_block_is_probed_for_a_low_rank_in_its_base_first_block(
    low_rank: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float32 matrix larger than a block, against a base coded in blocks: the probe for a
    merged adapter's low rank reads the base's first block, so a fine-tune (no low rank) is
    coded block by block without its base ever decoded whole; a merged adapter is still found
    and stored as the base plus the adapter's product; both read back bit for bit."""
    store = MemoryStore()
    store.block_bytes = 64 << 10  # 128 rows of 128 float32 per block, 8 blocks
    rng = np.random.default_rng(5)
    base = rng.standard_normal((1024, 128)).astype("<f4")
    base_oid = store.put_tensor("F32", base.shape, base).oid
    assert store.header(base_oid).blocks == store.block_bytes
    if low_rank:
        child = (base + rng.standard_normal((1024, 4)) @ rng.standard_normal((4, 128)) * 0.01).astype("<f4")
    else:
        child = (base + rng.standard_normal(base.shape).astype("<f4") * 1e-3).astype("<f4")
    store.forget(base_oid)
    whole: list[str] = []
    load_base = store.load_base
    monkeypatch.setattr(store, "load_base", lambda oid, *a, **k: whole.append(oid) or load_base(oid, *a, **k))
    result = store.put_tensor("F32", child.shape, child, bases=[base_oid])
    assert result.codec.startswith("low_rank") == low_rank
    assert (base_oid in whole) == low_rank  # encoding the product needs the whole base; a delta does not
    assert store.get(result.oid)[1].tobytes() == child.tobytes()
