"""Every codec chain round-trips bit-exactly for every dtype, including NaN payloads, -0.0,
infinities and subnormals; malformed chains and forged data are refused."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit.codecs import (
    ByteplanesCodec,
    CodecContext,
    CodecError,
    PcoCodec,
    ZstdCodec,
    chain_from_list,
    chain_to_list,
    decode_chain,
    encode_chain,
)
from mgit.codecs.pco import PCO_DTYPES
from mgit.formats.safetensors import DTYPES
from mgit.store.codec_policy import default_chain

SPECIAL_F32 = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 1.17e-38, 3.4e38], dtype=np.float32)
# A NaN with a payload: the exact bits must survive, not just "some NaN".
NAN_PAYLOAD = np.array([0x7FC12345, 0xFFA00001], dtype=np.uint32).view(np.float32)


def roundtrip(chain: list, data: np.ndarray) -> bytes:
    raw = data.reshape(-1).view(np.uint8)
    ctx = CodecContext(size=raw.nbytes)
    encoded = encode_chain(chain, raw, ctx)
    decoded = decode_chain(chain_from_list(chain_to_list(chain)), encoded, ctx)
    return bytes(memoryview(decoded).cast("B"))


@st.composite
def raw_tensors(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    size = DTYPES[dtype][0]
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
    count = int(np.prod(shape)) if shape else 1
    data = draw(st.binary(min_size=count * size, max_size=count * size))
    return dtype, np.frombuffer(data, np.uint8)


@settings(max_examples=300, deadline=None)
@given(raw_tensors())
def test_default_chain_roundtrips_any_bytes_of_any_dtype(sample: tuple[str, np.ndarray]) -> None:
    dtype, data = sample
    chain = default_chain("tensor", {"dtype": dtype, "shape": [data.size // DTYPES[dtype][0]]})
    assert roundtrip(chain, data) == data.tobytes()


@st.composite
def pco_numbers(draw: st.DrawFn) -> tuple[str, np.ndarray]:
    """Numbers pcodec sees: random bit patterns, or weight-like values (a narrow normal
    distribution, which its float modes and binning are built for) with specials mixed in."""
    dtype = draw(st.sampled_from(PCO_DTYPES))
    count = draw(st.integers(0, 3000))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if draw(st.booleans()):
        return dtype, rng.integers(0, 256, count * np.dtype(dtype).itemsize, dtype=np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        values = (rng.normal(0, draw(st.sampled_from([1e-6, 0.02, 1e3])), count)).astype(dtype)
        if count and values.dtype.kind == "f":
            special = np.resize(SPECIAL_F32.astype(values.dtype), min(count, 10))
            values[rng.choice(count, special.size, replace=False)] = special
    return dtype, values.view(np.uint8)


@settings(max_examples=200, deadline=None)
@given(pco_numbers())
def test_pco_roundtrips_bit_exactly(sample: tuple[str, np.ndarray]) -> None:
    dtype, data = sample
    assert roundtrip([PcoCodec(dtype=dtype)], data) == data.tobytes()


@pytest.mark.parametrize("dtype", ["<f4", "<f2", "<f8"])
def test_pco_keeps_nan_payloads_and_signed_zeros(dtype: str) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        values = np.concatenate([SPECIAL_F32, NAN_PAYLOAD, np.linspace(-1, 1, 1000, dtype=np.float32)]).astype(dtype)
    if dtype == "<f4":
        assert values[10:12].view("<u4").tolist() == NAN_PAYLOAD.view("<u4").tolist()
    assert roundtrip([PcoCodec(dtype=dtype)], values) == values.tobytes()


def test_pco_codes_a_narrow_distribution_in_few_bits() -> None:
    deltas = np.random.default_rng(0).laplace(0, 300, 100_000).astype("<i4")  # a fine-tune's ~11-bit deltas
    encoded = encode_chain([PcoCodec(dtype="<i4")], deltas.view(np.uint8), CodecContext(deltas.nbytes))
    planes = encode_chain(
        [ByteplanesCodec(itemsize=4), ZstdCodec(level=1)], deltas.view(np.uint8), CodecContext(deltas.nbytes)
    )
    assert len(encoded) < 0.95 * len(planes)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "does not decode"),
        (lambda b: b"not pco at all, no", "does not decode"),
    ],
    ids=["truncated", "garbage"],
)
def test_damaged_pco_data_is_refused(damage, message: str) -> None:
    values = np.random.default_rng(1).normal(0, 0.02, 5000).astype("<f4")
    encoded = encode_chain([PcoCodec(dtype="<f4")], values.view(np.uint8), CodecContext(values.nbytes))
    with pytest.raises(CodecError, match=message):
        decode_chain([PcoCodec(dtype="<f4")], damage(encoded), CodecContext(values.nbytes))


def test_pco_data_of_another_count_or_type_is_refused() -> None:
    values = np.arange(1000, dtype="<u4")
    chain = [PcoCodec(dtype="<u4")]
    encoded = encode_chain(chain, values.view(np.uint8), CodecContext(values.nbytes))
    for size in (values.nbytes - 4, values.nbytes + 4):
        with pytest.raises(CodecError, match="bytes where"):
            decode_chain(chain, encoded, CodecContext(size))
    zeros = np.zeros(1_000_000, "<u4")
    bomb = encode_chain(chain, zeros.view(np.uint8), CodecContext(zeros.nbytes))
    assert len(bomb) < 1000
    with pytest.raises(CodecError, match="more numbers than the object can hold"):
        PcoCodec(dtype="<u4").decode(bomb, CodecContext(16))  # far more than 4 x 16 bytes + 64 KiB
    with pytest.raises(CodecError, match="does not decode"):
        PcoCodec(dtype="<f4").decode(encoded, CodecContext(values.nbytes))


@pytest.mark.parametrize("values", [SPECIAL_F32, NAN_PAYLOAD], ids=["specials", "nan-payload"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_special_floats_survive_bit_exactly(values: np.ndarray, dtype: type) -> None:
    with np.errstate(over="ignore", invalid="ignore"):
        data = values if dtype == np.float32 else values.astype(dtype)
    chain = [ByteplanesCodec(itemsize=data.itemsize), ZstdCodec(level=1)]
    assert roundtrip(chain, data) == data.tobytes()


def test_byteplanes_groups_bytes_by_position() -> None:
    data = np.array([0x04030201, 0x08070605], dtype="<u4").view(np.uint8)
    planes = ByteplanesCodec(itemsize=4).encode(data, CodecContext(size=8))
    assert bytes(planes.reshape(-1)) == bytes([1, 5, 2, 6, 3, 7, 4, 8])


@pytest.mark.parametrize("itemsize", [2, 3, 4, 8])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("items", [1, 999, 300_001])  # 300,001 x 2 bytes and more: a pooled buffer
def test_byteplanes_split_and_join_as_defined(itemsize: int, offset: int, items: int) -> None:
    """The word-shift paths (2 and 4 bytes) give the planes of the definition, byte k of every
    item in plane k, from a buffer at an odd address too (a tensor at an odd file offset)."""
    raw = np.random.default_rng(items).integers(0, 256, items * itemsize + offset, dtype=np.uint8)[offset:]
    codec = ByteplanesCodec(itemsize=itemsize)
    defined = raw.reshape(-1, itemsize).T.copy()
    planes = codec.encode(raw, CodecContext(size=raw.nbytes))
    assert bytes(np.asarray(planes).reshape(-1)) == defined.tobytes()
    assert bytes(codec.decode(defined.reshape(-1), CodecContext(size=raw.nbytes))) == raw.tobytes()


def test_byteplanes_rejects_partial_items() -> None:
    with pytest.raises(CodecError, match="whole number"):
        ByteplanesCodec(itemsize=4).decode(b"\x00" * 7, CodecContext(size=7))


def test_chain_is_recorded_as_data() -> None:
    chain = [ByteplanesCodec(itemsize=2), ZstdCodec(level=3)]
    assert chain_to_list(chain) == [
        {"name": "byteplanes", "configuration": {"itemsize": 2}},
        {"name": "zstd", "configuration": {"level": 3}},
    ]
    assert chain_from_list(chain_to_list(chain)) == chain


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ([{"name": "lzma9"}], "unknown codec 'lzma9'"),
        ([{"name": "zstd", "configuration": {"level": 99}}], "bad configuration"),
        ([{"name": "byteplanes", "configuration": {"itemsize": 0}}], "bad configuration"),
        ([{"name": "pco", "configuration": {"dtype": "<u1"}}], "bad configuration"),
        ([{"name": "pco", "configuration": {"dtype": "<f4", "level": 13}}], "bad configuration"),
        ([{"name": "zstd", "configuration": {"bogus": 1}}], "bad configuration"),
        ([{"nom": "zstd"}], "malformed codec entry"),
        ({"name": "zstd"}, "malformed codec chain"),
    ],
)
def test_malformed_chains_are_refused(spec: object, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        chain_from_list(spec)


def test_zstd_frame_claiming_more_than_the_object_is_refused() -> None:
    import zstandard

    bomb = zstandard.ZstdCompressor().compress(b"\x00" * 1_000_000)
    with pytest.raises(CodecError, match="more than the object can hold"):
        ZstdCodec().decode(bomb, CodecContext(size=16))


def test_garbage_is_not_zstd() -> None:
    with pytest.raises(CodecError, match="does not decode"):
        ZstdCodec().decode(b"definitely not zstd", CodecContext(size=16))


def test_decoded_size_must_match() -> None:
    chain = [ZstdCodec()]
    encoded = encode_chain(chain, b"12345678", CodecContext(size=8))
    with pytest.raises(CodecError, match="expected"):
        decode_chain(chain, encoded, CodecContext(size=4))


def test_pco_inside_a_chain_may_hold_more_numbers_than_the_object_has_bytes_for() -> None:
    """After a quantized delta of a float16 tensor in 4-byte steps, pcodec's numbers take
    twice the object's size: decoding makes room for them (within zstd's bound)."""
    steps = np.arange(1000, dtype="<u4")
    encoded = encode_chain([PcoCodec(dtype="<u4")], steps.view(np.uint8), CodecContext(steps.nbytes))
    out = PcoCodec(dtype="<u4").decode(encoded, CodecContext(steps.nbytes // 2))
    assert bytes(out) == steps.tobytes()
