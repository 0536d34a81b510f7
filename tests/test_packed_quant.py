"""Packed quantizations, piece by piece: the quantization_config a model announces, the
layouts of GPTQ, AWQ, pack-quantized, FP8 and int8 tensors and their dequantization (against
values computed here from the builders' integers), forged layouts refused with a reason, and
the FP8 cast codec (torch's rounding bit for bit, exact round trips)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import needs_torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit.codecs import CodecContext, CodecError, Fp8CastCodec, codec_from_dict, decode_chain, encode_chain
from mgit.codecs.fp8 import float8_e4m3_bits
from mgit.errors import DequantizeError
from mgit.formats.packed_quant import AWQ_ORDER, dequantize, packed_tensors, unpack
from mgit.formats.quant_config import scheme_from_bytes, scheme_from_config
from mgit.formats.safetensors import FP8_VALUES

quant_family = pytest.importorskip("quant_family")  # torch and safetensors.torch

BASE = "ab" * 32


def _ctx(base: np.ndarray, size: int) -> CodecContext:
    return CodecContext(size, lambda oid: base.view(np.uint8).tobytes())


def _layer(seed: int, out: int = 64, cols: int = 96) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal((out, cols)) * 0.05).astype(np.float32)


def _reader(arrays: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    return lambda name: np.ascontiguousarray(arrays[name]).reshape(-1).view(np.uint8)


def _shapes(arrays: dict[str, np.ndarray], dtypes: dict[str, str]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {n: (dtypes[n], tuple(a.shape)) for n, a in arrays.items()}


# --- the config ---------------------------------------------------------------------------------


def test_the_schemes_the_libraries_write_are_named_with_their_bits() -> None:
    gptq = scheme_from_config({"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}})
    assert gptq is not None and (gptq.method, gptq.bits, gptq.group_size, gptq.problem) == ("gptq", 4, 128, None)
    assert gptq.label == "gptq 4-bit, group size 128"
    awq = scheme_from_config({"quantization_config": {"quant_method": "awq", "w_bit": 4, "q_group_size": 64}})
    assert awq is not None and (awq.bits, awq.group_size) == (4, 64)
    ct = scheme_from_config(
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "format": "float-quantized",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}},
            }
        }
    )
    assert ct is not None and ct.label == "compressed-tensors float-quantized 8-bit float, per channel"
    fp8 = scheme_from_config({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}})
    assert fp8 is not None and (fp8.bits, fp8.strategy) == (8, "block")


@pytest.mark.parametrize(
    ("qc", "problem"),
    [
        ({"quant_method": "gptq", "bits": 3}, "3-bit values do not pack evenly into int32 words"),
        ({"quant_method": "gptq", "bits": 99}, "99 bits"),
        ({"quant_method": "awq", "bits": 4, "group_size": 0}, "group size 0"),
    ],
)
def test_a_forged_config_is_named_with_what_is_wrong(qc: dict, problem: str) -> None:
    scheme = scheme_from_config({"quantization_config": qc})
    assert scheme is not None and scheme.problem == problem and scheme.label.endswith(f"(invalid: {problem})")


@pytest.mark.parametrize(
    "data", [b"", b"{", b"[]", b'{"quantization_config": 3}', b'{"quantization_config": {"bits": "four"}}']
)
def test_a_config_that_is_not_one_announces_nothing_or_an_unknown_method(data: bytes) -> None:
    scheme = scheme_from_bytes(data)
    assert scheme is None or (scheme.method == "unknown" and scheme.bits is None)


# --- layouts ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("bits", "order"), [(2, None), (4, None), (8, None), (4, AWQ_ORDER)])
def test_unpack_inverts_the_builders_packing(bits: int, order: tuple[int, ...] | None) -> None:
    per = 32 // bits
    values = np.random.default_rng(bits).integers(0, 1 << bits, (5, 8 * per)).astype(np.int32)
    assert np.array_equal(unpack(quant_family.pack(values, bits, order), bits, order), values)


def test_gptq_dequantizes_to_its_integers_times_its_scales() -> None:
    w = _layer(0)
    q, zeros, scales = quant_family.rtn(w, 4, 32, sym=True)
    g = np.arange(96) // 32
    arrays = {
        "l.qweight": quant_family.pack(q.T, 4).T.copy(),
        "l.qzeros": quant_family.pack(zeros - 1, 4),
        "l.scales": scales,
        "l.g_idx": g.astype(np.int32),
    }
    shapes = _shapes(arrays, {"l.qweight": "I32", "l.qzeros": "I32", "l.scales": "F16", "l.g_idx": "I32"})
    found = packed_tensors(shapes)
    assert list(found) == ["l.weight"] and found["l.weight"].layout == "gptq" and found["l.weight"].shape == (64, 96)
    expected = ((q - zeros[g]).astype(np.float32) * scales[g].astype(np.float32)).T
    got = dequantize(found["l.weight"], shapes, _reader(arrays))
    assert np.array_equal(got, expected)
    assert np.abs(got - w).max() <= scales.astype(np.float32).max()  # round to nearest: within a step


def test_awq_dequantizes_in_its_packing_order() -> None:
    w = _layer(1)
    q, zeros, scales = quant_family.rtn(w, 4, 32, sym=False)
    arrays = {
        "l.qweight": quant_family.pack(q, 4, AWQ_ORDER),
        "l.qzeros": quant_family.pack(zeros, 4, AWQ_ORDER),
        "l.scales": scales,
    }
    shapes = _shapes(arrays, {"l.qweight": "I32", "l.qzeros": "I32", "l.scales": "F16"})
    found = packed_tensors(shapes)["l.weight"]
    assert found.layout == "awq" and found.bits == 4
    g = np.arange(96) // 32
    expected = ((q - zeros[g]).astype(np.float32) * scales[g].astype(np.float32)).T
    assert np.array_equal(dequantize(found, shapes, _reader(arrays)), expected)


def test_pack_quantized_and_int8_and_fp8_with_their_scales() -> None:
    q = np.random.default_rng(2).integers(-8, 8, (8, 16)).astype(np.int32)
    qf = q.astype(np.float32)
    scale = np.random.default_rng(3).random((8, 2)).astype(np.float32)  # groups of 8 columns
    arrays = {
        "p.weight_packed": quant_family.pack(q + 8, 4),
        "p.weight_scale": scale,
        "i.weight": q.astype(np.int8),
        "i.weight_scale": scale[:, :1].copy(),
        "f.weight": np.arange(128, dtype=np.uint8).reshape(8, 16),
        "f.weight_scale": np.array([0.5], np.float32),
    }
    dtypes = {"p.weight_packed": "I32", "i.weight": "I8", "f.weight": "F8_E4M3"} | {
        n: "F32" for n in arrays if n.endswith("scale")
    }
    shapes = _shapes(arrays, dtypes)
    found = packed_tensors(shapes)
    assert {n: p.layout for n, p in found.items()} == {"p.weight": "pack", "i.weight": "int8", "f.weight": "fp8"}
    read = _reader(arrays)
    assert np.array_equal(dequantize(found["p.weight"], shapes, read), qf * np.repeat(scale, 8, axis=1))
    assert np.array_equal(dequantize(found["i.weight"], shapes, read), qf * scale[:, :1])
    fp8 = FP8_VALUES["F8_E4M3"][np.arange(128)].astype(np.float32).reshape(8, 16)
    assert np.array_equal(dequantize(found["f.weight"], shapes, read), fp8 * np.float32(0.5), equal_nan=True)


def _gptq_shapes(**forged: tuple[str, tuple[int, ...]]) -> dict[str, tuple[str, tuple[int, ...]]]:
    shapes = {
        "l.qweight": ("I32", (12, 64)),
        "l.qzeros": ("I32", (3, 8)),
        "l.scales": ("F16", (3, 64)),
        "l.g_idx": ("I32", (96,)),
    }
    return shapes | {f"l.{k}": v for k, v in forged.items()}


@pytest.mark.parametrize(
    ("forged", "config", "why"),
    [
        ({}, {"quant_method": "gptq", "bits": 3}, "3-bit values do not pack evenly"),
        ({"scales": ("F16", (4, 64))}, None, "qzeros has 3 groups and scales 4"),
        ({"scales": ("F16", (7, 64)), "qzeros": ("I32", (7, 8))}, None, "7 groups do not divide 96 input columns"),
        ({}, {"quant_method": "gptq", "bits": 4, "group_size": 40}, "group size 40 does not give 3 groups"),
        ({"qweight": ("I32", (12, 60))}, None, "do not fit 4 bits"),
        ({"qzeros": ("I32", (3, 6))}, None, "3-bit values do not pack evenly"),
        ({"g_idx": ("I32", (95,))}, None, "g_idx is"),
        ({"qweight": ("F32", (12, 64))}, None, "not the dtypes and ranks"),
        ({"qzeros": ("I32", (3, 5))}, None, "does not hold 64 columns in whole int32 words"),
    ],
)
def test_a_forged_layout_is_refused_with_its_reason(forged: dict, config: dict | None, why: str) -> None:
    scheme = scheme_from_config({"quantization_config": config}) if config else None
    packed = packed_tensors(_gptq_shapes(**forged), scheme)["l.weight"]
    assert packed.problem is not None and why in packed.problem
    with pytest.raises(DequantizeError, match=f"cannot dequantize l.weight: .*{why}"):
        dequantize(packed, _gptq_shapes(**forged), lambda name: pytest.fail("nothing is read"))


def test_out_of_range_groups_and_short_tensors_are_refused_when_read() -> None:
    shapes = _gptq_shapes()
    arrays = {
        "l.qweight": np.zeros((12, 64), np.int32),
        "l.qzeros": np.zeros((3, 8), np.int32),
        "l.scales": np.ones((3, 64), np.float16),
        "l.g_idx": np.full(96, 3, np.int32),
    }
    packed = packed_tensors(shapes)["l.weight"]
    with pytest.raises(DequantizeError, match="g_idx names groups outside 0..2"):
        dequantize(packed, shapes, _reader(arrays))
    arrays["l.g_idx"] = np.zeros(95, np.int32)
    with pytest.raises(DequantizeError, match="holds 380 bytes, not a I32 \\[96\\]"):
        dequantize(packed, shapes, _reader(arrays))


# --- the FP8 cast codec ---------------------------------------------------------------------------


@needs_torch
def test_the_fp8_cast_rounds_as_torch_does_for_every_kind_of_float() -> None:
    import torch

    rng = np.random.default_rng(0)
    table = FP8_VALUES["F8_E4M3"]
    grid = np.unique(table[np.isfinite(table)]).astype(np.float32)
    mids = ((grid[1:].astype(np.float64) + grid[:-1]) / 2).astype(np.float32)  # ties: to even
    values = np.concatenate(
        [
            rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),  # any bits
            mids,
            np.nextafter(mids, np.float32(np.inf)),
            np.nextafter(mids, np.float32(-np.inf)),
            grid,
            np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 448, 464, 480, 1e-45, 2.0**-9], np.float32),
        ]
    )
    expected = torch.from_numpy(values.copy()).to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(float8_e4m3_bits(values), expected)


@needs_torch
@pytest.mark.parametrize("per_channel", [False, True])
def test_an_fp8_cast_of_its_parent_leaves_a_residual_of_zeros(per_channel: bool) -> None:
    import torch

    w = torch.from_numpy(_layer(4, 48, 80))
    amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
    child = (w / (amax / 448.0)).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8).numpy().reshape(-1)
    codec = Fp8CastCodec(base=BASE, rows=48 if per_channel else 1)
    ctx = _ctx(w.numpy(), child.size)
    residual = np.frombuffer(bytes(codec.encode(child, ctx)), np.uint8)
    assert residual.size == child.size and not residual.any()
    assert bytes(decode_chain([codec], residual.copy(), ctx)) == child.tobytes()


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 6),
    cols=st.integers(0, 9),
    seed=st.integers(0, 2**32 - 1),
    special=st.sampled_from([None, np.nan, np.inf, 0.0, 1e30]),
)
def test_any_content_round_trips_whatever_its_parent(rows: int, cols: int, seed: int, special: float | None) -> None:
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((rows, cols)).astype(np.float32)
    if special is not None and base.size:
        base.flat[rng.integers(base.size)] = special
    content = rng.integers(0, 256, base.size, dtype=np.uint8)
    for per_row in (rows, 1):
        chain = [Fp8CastCodec(base=BASE, rows=per_row)]
        ctx = _ctx(base, content.size)
        stored = encode_chain(chain, content, ctx)
        assert bytes(decode_chain(chain, stored, ctx)) == content.tobytes()


@pytest.mark.parametrize(
    "config", [{"base": BASE, "rows": 0}, {"base": BASE, "rows": True}, {"base": "x", "rows": 1}, {"base": BASE}]
)
def test_a_forged_fp8_cast_configuration_is_a_codec_error(config: dict) -> None:
    with pytest.raises(CodecError):
        codec_from_dict({"name": "fp8_cast", "configuration": config})


def test_a_base_that_is_not_float32_or_does_not_split_in_rows_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="base is not float32"):
        Fp8CastCodec(base=BASE, rows=1).decode(np.zeros(3, np.uint8), CodecContext(3, lambda o: b"\0" * 3))
    with pytest.raises(CodecError, match="no 4 equal rows"):
        Fp8CastCodec(base=BASE, rows=4).decode(np.zeros(6, np.uint8), CodecContext(6, lambda o: b"\0" * 24))


def test_the_fp8_cast_configuration_is_plain_data() -> None:
    codec = Fp8CastCodec(base=BASE, rows=7)
    assert codec_from_dict(json.loads(json.dumps(codec.to_dict()))) == codec


_DTYPES = ["I32", "I64", "I8", "F16", "F32", "BF16", "F8_E4M3", "U8"]
_MEMBERS = ["qweight", "qzeros", "scales", "g_idx", "weight", "weight_scale", "weight_zero_point", "weight_packed"]


@settings(max_examples=200, deadline=None)
@given(
    members=st.dictionaries(
        st.sampled_from(_MEMBERS),
        st.tuples(st.sampled_from(_DTYPES), st.lists(st.integers(0, 9), min_size=0, max_size=3)),
        min_size=1,
    ),
    bits=st.sampled_from([None, 1, 2, 3, 4, 8, 16, 33]),
    group_size=st.sampled_from([None, -1, 0, 3, 4, 7]),
    method=st.sampled_from(["gptq", "awq", "compressed-tensors", "fp8"]),
    seed=st.integers(0, 2**16),
)
def test_any_forged_layer_dequantizes_or_says_why(
    members: dict, bits: int | None, group_size: int | None, method: str, seed: int
) -> None:
    """Whatever the shapes, dtypes, bytes and config: a float32 matrix of the announced shape,
    or a DequantizeError; nothing else escapes."""
    from mgit.formats.safetensors import itemsize

    shapes = {f"l.{role}": (dtype, tuple(shape)) for role, (dtype, shape) in members.items()}
    config = {"quant_method": method, "bits": bits, "group_size": group_size}
    if method == "compressed-tensors":
        config["config_groups"] = {"g": {"weights": {"num_bits": bits, "group_size": group_size}}}
    scheme = scheme_from_config({"quantization_config": config})
    rng = np.random.default_rng(seed)
    data = {n: rng.integers(0, 256, int(np.prod(s)) * itemsize(d), dtype=np.uint8) for n, (d, s) in shapes.items()}
    for packed in packed_tensors(shapes, scheme).values():
        try:
            values = dequantize(packed, shapes, lambda name: data[name])
        except DequantizeError as exc:
            assert str(exc).startswith(f"cannot dequantize {packed.name}: ")
            continue
        assert values.dtype == np.float32 and values.shape == packed.shape
