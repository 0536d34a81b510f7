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
    ZstdCodec,
    chain_from_list,
    chain_to_list,
    decode_chain,
    encode_chain,
)
from mgit.formats.safetensors import DTYPES
from mgit.store import default_chain

SPECIAL_F32 = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 1.17e-38, 3.4e38],
                       dtype=np.float32)  # fmt: skip
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
