"""mgit.formats.safetensors: strict parsing of real and hostile files, and header building.

Valid files come from the reference library; broken ones are built by hand with struct+json
so that each breaks exactly one rule, and each must raise InputError with a message naming
the file and the rule.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
import safetensors.numpy
from conftest import st_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from mgit.errors import InputError
from mgit.formats.safetensors import (
    DTYPES,
    MAX_HEADER_BYTES,
    build_header,
    parse_header,
    read_layout,
)

# --- builders ------------------------------------------------------------------------------


def entry(dtype: str, shape: list, offsets: list) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": offsets}


def write(tmp_path: Path, raw: bytes, name: str = "model.safetensors") -> Path:
    path = tmp_path / name
    path.write_bytes(raw)
    return path


def reference_state() -> dict[str, np.ndarray]:
    """Several dtypes and alignments, so the reference writer reorders them by alignment."""
    rng = np.random.default_rng(7)
    return {
        "z.bias": rng.standard_normal(3).astype(np.float16),
        "a.weight": rng.standard_normal((4, 3)).astype(np.float32),
        "ids": np.arange(5, dtype=np.int64),
        "mask": np.array([True, False, True]),
        "bytes": np.arange(7, dtype=np.uint8),
        "empty": np.zeros((0, 4), np.float32),
    }


# --- valid files --------------------------------------------------------------------------


def test_reference_file_header_is_kept_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(reference_state(), str(path), metadata={"format": "pt", "note": "x"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])

    layout = read_layout(path)

    assert layout.header == raw[: 8 + n]
    assert layout.data_start == 8 + n
    assert layout.metadata == {"format": "pt", "note": "x"}


def test_reference_file_tensors_come_in_data_order_with_dtype_shape_offsets(tmp_path: Path) -> None:
    state = reference_state()
    path = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(state, str(path))
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    expected = sorted(
        ((name, e["dtype"], tuple(e["shape"]), *e["data_offsets"]) for name, e in header.items()),
        key=lambda t: (t[3], t[4]),
    )

    layout = read_layout(path)

    assert [(s.name, s.dtype, s.shape, s.start, s.end) for s in layout.tensors] == expected
    assert {s.name for s in layout.tensors} == set(state)
    data = raw[8 + n :]
    for span in layout.tensors:
        assert np.array_equal(
            np.frombuffer(data[span.start : span.end], dtype=state[span.name].dtype).reshape(span.shape),
            state[span.name],
        )


def test_parse_header_of_memory_prefix_matches_read_layout(tmp_path: Path) -> None:
    path = tmp_path / "ref.safetensors"
    safetensors.numpy.save_file(reference_state(), str(path))
    raw = path.read_bytes()

    assert parse_header(str(path), raw, len(raw)) == read_layout(path)


def test_file_with_no_tensors_is_valid(tmp_path: Path) -> None:
    layout = read_layout(write(tmp_path, st_bytes({"__metadata__": {"k": "v"}})))

    assert layout.tensors == ()
    assert layout.metadata == {"k": "v"}


# --- build_header -------------------------------------------------------------------------

ROUND_TRIP_ARRAYS = {
    "F32": np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4),
    "F16": np.array([0.5, -1.25, 65504.0], dtype=np.float16),
    "F64": np.array([[np.pi, -np.e]], dtype=np.float64),
    "I8": np.array([-128, 0, 127], dtype=np.int8),
    "I16": np.array([-3, 30000], dtype=np.int16),
    "I32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
    "I64": np.array([-(2**62), 2**62], dtype=np.int64),
    "U8": np.arange(5, dtype=np.uint8),
    "U16": np.array([65535], dtype=np.uint16),
    "U32": np.array([2**32 - 1], dtype=np.uint32),
    "U64": np.array([2**64 - 1], dtype=np.uint64),
    "BOOL": np.array([True, False, False]),
    "C64": np.array([1 + 2j, -3j], dtype=np.complex64),
    "scalar": np.array(3.5, dtype=np.float32),
    "empty": np.zeros((2, 0), dtype=np.float32),
}


def _build_file(arrays: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    dtype_of = {
        np.dtype(v): k
        for k, v in {
            "F32": np.float32,
            "F16": np.float16,
            "F64": np.float64,
            "I8": np.int8,
            "I16": np.int16,
            "I32": np.int32,
            "I64": np.int64,
            "U8": np.uint8,
            "U16": np.uint16,
            "U32": np.uint32,
            "U64": np.uint64,
            "BOOL": np.bool_,
            "C64": np.complex64,
        }.items()
    }
    specs = [(name, dtype_of[a.dtype], a.shape) for name, a in arrays.items()]
    header, spans = build_header(specs, metadata)
    assert [s.name for s in spans] == list(arrays)
    return header + b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())


@pytest.mark.parametrize("name", list(ROUND_TRIP_ARRAYS))
def test_build_header_is_readable_by_reference_library(name: str) -> None:
    array = ROUND_TRIP_ARRAYS[name]

    loaded = safetensors.numpy.load(_build_file({name: array}))

    assert loaded[name].dtype == array.dtype
    assert loaded[name].shape == array.shape
    assert np.array_equal(loaded[name], array)


def test_build_header_with_many_dtypes_round_trips_through_reference_library() -> None:
    loaded = safetensors.numpy.load(_build_file(ROUND_TRIP_ARRAYS))

    assert set(loaded) == set(ROUND_TRIP_ARRAYS)
    for name, array in ROUND_TRIP_ARRAYS.items():
        assert np.array_equal(loaded[name], array), name


def test_build_header_bf16_is_readable_by_reference_torch_loader() -> None:
    torch = pytest.importorskip("torch")
    import safetensors.torch

    t = torch.tensor([[1.5, -2.0], [3.25, 1e30]], dtype=torch.bfloat16)
    header, _ = build_header([("w", "BF16", (2, 2))])

    loaded = safetensors.torch.load(header + t.view(torch.uint8).numpy().tobytes())

    assert loaded["w"].dtype == torch.bfloat16
    assert torch.equal(loaded["w"], t)


def test_build_header_metadata_and_padding(tmp_path: Path) -> None:
    raw = _build_file({"w": np.ones(3, np.float32)}, {"format": "pt", "epoch": "3"})
    path = write(tmp_path, raw)

    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"format": "pt", "epoch": "3"}
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0  # padded like the reference writer


def test_build_header_parses_back_to_the_same_spans() -> None:
    specs = [("b", "F32", (2, 3)), ("a", "I64", (4,)), ("c", "U8", (0,)), ("d", "F16", (5,))]
    header, spans = build_header(specs)
    data = b"\x01" * sum(s.nbytes for s in spans)

    layout = parse_header("built", header + data, len(header) + len(data))

    assert layout.header == header
    assert layout.tensors == spans
    assert [(s.name, s.dtype, s.shape) for s in spans] == specs


# --- broken and hostile files ------------------------------------------------------------

F32x2 = entry("F32", [2], [0, 8])

MALFORMED = [
    pytest.param(b"", "truncated safetensors file", id="empty"),
    pytest.param(b"\x08\x00\x00", "truncated safetensors file", id="shorter-than-8"),
    pytest.param(
        struct.pack("<Q", 1000) + b"{}",
        "header length 1000 goes beyond the end of the file (10 bytes)",
        id="header-beyond-file",
    ),
    pytest.param(struct.pack("<Q", 2**64 - 1), f"above the {MAX_HEADER_BYTES}-byte limit", id="header-u64-max"),
    pytest.param(st_bytes(b"{not json"), "header is not valid JSON", id="invalid-json"),
    pytest.param(st_bytes(b'{"w": {"dtype": "F32",'), "header is not valid JSON", id="cut-json"),
    pytest.param(st_bytes(b"[]"), "header is not a JSON object", id="json-list"),
    pytest.param(st_bytes(b'"w"'), "header is not a JSON object", id="json-string"),
    pytest.param(st_bytes(b'{"w\xff\xfe": 1}'), "header is not valid JSON", id="not-utf8"),
    pytest.param(
        st_bytes(b'{"w": ' + json.dumps(F32x2).encode() + b', "w": ' + json.dumps(F32x2).encode() + b"}", b"\0" * 8),
        "duplicate key 'w'",
        id="duplicate-keys",
    ),
    pytest.param(st_bytes({"w": 5}), "tensor 'w': header entry is not an object", id="entry-not-object"),
    pytest.param(
        st_bytes({"w": entry("F128", [2], [0, 32])}, b"\0" * 32),
        "tensor 'w' has unknown dtype 'F128'",
        id="unknown-dtype",
    ),
    pytest.param(
        st_bytes({"w": {"shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        "tensor 'w' has no dtype",
        id="missing-dtype",
    ),
    pytest.param(
        st_bytes({"w": entry("F32", 2, [0, 8])}, b"\0" * 8), "tensor 'w' has an invalid shape 2", id="shape-not-list"
    ),
    pytest.param(st_bytes({"w": entry("F32", [-2], [0, 8])}, b"\0" * 8), "invalid shape [-2]", id="shape-negative"),
    pytest.param(
        st_bytes({"w": entry("F32", [2, -1], [0, 8])}, b"\0" * 8),
        "invalid shape [2, -1]",
        id="shape-negative-second-dim",
    ),
    pytest.param(st_bytes({"w": entry("F32", [2.0], [0, 8])}, b"\0" * 8), "invalid shape [2.0]", id="shape-float"),
    pytest.param(st_bytes({"w": entry("F32", [True], [0, 4])}, b"\0" * 4), "invalid shape [True]", id="shape-bool"),
    pytest.param(st_bytes({"w": entry("F32", [1] * 65, [0, 4])}, b"\0" * 4), "invalid shape", id="shape-65-dims"),
    pytest.param(st_bytes({"w": entry("F32", [2], [0])}, b"\0" * 8), "invalid data_offsets [0]", id="offsets-one"),
    pytest.param(
        st_bytes({"w": entry("F32", [2], [0, 8, 16])}, b"\0" * 16),
        "invalid data_offsets [0, 8, 16]",
        id="offsets-three",
    ),
    pytest.param(st_bytes({"w": entry("F32", [2], 8)}, b"\0" * 8), "invalid data_offsets 8", id="offsets-not-list"),
    pytest.param(
        st_bytes({"w": entry("F32", [2], [-8, 0])}, b"\0" * 8), "invalid data_offsets [-8, 0]", id="offsets-negative"
    ),
    pytest.param(
        st_bytes({"w": entry("F32", [2], [8, 0])}, b"\0" * 8), "invalid data_offsets [8, 0]", id="offsets-reversed"
    ),
    pytest.param(
        st_bytes({"w": entry("F32", [2], ["0", "8"])}, b"\0" * 8),
        "invalid data_offsets ['0', '8']",
        id="offsets-strings",
    ),
    pytest.param(
        st_bytes({"w": entry("F32", [2], [0, 4])}, b"\0" * 4),
        "tensor 'w': data_offsets span 4 bytes but F32[2] needs 8",
        id="span-too-short",
    ),
    pytest.param(
        st_bytes({"w": entry("I64", [3, 2], [0, 24])}, b"\0" * 24),
        "data_offsets span 24 bytes but I64[3, 2] needs 48",
        id="span-wrong-for-dtype",
    ),
    pytest.param(
        st_bytes({"w": entry("U8", [2**62, 2**62], [0, 16])}, b"\0" * 16),
        "that no array can have",
        id="span-huge-shape",
    ),
    pytest.param(
        st_bytes({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [4, 12])}, b"\0" * 12),
        "tensor 'b' overlaps the tensor before it",
        id="overlap",
    ),
    pytest.param(
        st_bytes({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [0, 8])}, b"\0" * 8),
        "overlaps the tensor before it",
        id="same-offsets",
    ),
    pytest.param(
        st_bytes({"a": entry("F32", [1], [0, 4]), "b": entry("F32", [1], [8, 12])}, b"\0" * 12),
        "gap before tensor 'b' (bytes 4-8 belong to no tensor)",
        id="gap-between",
    ),
    pytest.param(
        st_bytes({"a": entry("F32", [1], [4, 8])}, b"\0" * 8), "gap before tensor 'a' (bytes 0-4", id="gap-at-start"
    ),
    pytest.param(
        st_bytes({"a": entry("F32", [1], [0, 4])}, b"\0" * 6),
        "2 bytes after the last tensor belong to no tensor",
        id="trailing-bytes",
    ),
    pytest.param(st_bytes({}, b"\0" * 3), "3 bytes after the last tensor", id="data-without-tensors"),
    pytest.param(
        st_bytes({"a": entry("F32", [2], [0, 8])}, b"\0" * 5),
        "tensor 'a' ends at byte 8 of the data, beyond its end (5 bytes): the file is truncated",
        id="data-truncated",
    ),
    pytest.param(
        st_bytes({"a": entry("F32", [2], [0, 8]), "b": entry("F32", [2], [8, 16])}, b"\0" * 12),
        "tensor 'b' ends at byte 16",
        id="last-tensor-truncated",
    ),
    pytest.param(
        st_bytes({"__metadata__": {"epoch": 3}}), "__metadata__ must map strings to strings", id="metadata-int-value"
    ),
    pytest.param(
        st_bytes({"__metadata__": {"nested": {"a": "b"}}}),
        "__metadata__ must map strings to strings",
        id="metadata-dict-value",
    ),
    pytest.param(
        st_bytes({"__metadata__": ["format", "pt"]}), "__metadata__ must map strings to strings", id="metadata-list"
    ),
    pytest.param(st_bytes(b"[" * 100_000), "header JSON is nested too deeply", id="deeply-nested-list"),
    pytest.param(st_bytes(b'{"a":' * 100_000), "header JSON is nested too deeply", id="deeply-nested-object"),
]


@pytest.mark.parametrize(("raw", "fragment"), MALFORMED)
def test_malformed_file_raises_input_error_naming_file_and_rule(tmp_path: Path, raw: bytes, fragment: str) -> None:
    path = write(tmp_path, raw)

    with pytest.raises(InputError) as info:
        read_layout(path)

    assert info.value.path == str(path)
    assert str(info.value).startswith(f"{path}: ")
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("raw", "fragment"), MALFORMED)
def test_malformed_prefix_in_memory_raises_the_same_error(raw: bytes, fragment: str) -> None:
    with pytest.raises(InputError) as info:
        parse_header("mem.safetensors", raw, len(raw))

    assert fragment in str(info.value)


def test_header_length_above_limit_is_refused_without_reading_it(tmp_path: Path) -> None:
    # A sparse file long enough to hold the claimed header: only the limit can refuse it.
    n = MAX_HEADER_BYTES + 1
    path = tmp_path / "huge.safetensors"
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", n))
        fh.truncate(8 + n)

    with pytest.raises(InputError, match=f"header length {n} is above the {MAX_HEADER_BYTES}-byte limit"):
        read_layout(path)


def test_header_length_limit_is_checked_on_an_8_byte_prefix() -> None:
    # parse_header is handed only the length: it must not need (or allocate) the rest.
    with pytest.raises(InputError, match="above the"):
        parse_header("x", struct.pack("<Q", 2**40), 2**41)


def test_metadata_named_tensor_is_not_a_tensor(tmp_path: Path) -> None:
    raw = st_bytes({"__metadata__": {"a": "b"}, "w": F32x2}, b"\0" * 8)

    layout = read_layout(write(tmp_path, raw))

    assert [s.name for s in layout.tensors] == ["w"]
    assert layout.metadata == {"a": "b"}


def test_unreadable_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read file"):
        read_layout(tmp_path / "missing.safetensors")


# --- property: mutated headers either parse consistently or raise InputError ----------------


def _valid_file() -> bytes:
    state = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.arange(3, dtype=np.int64),
        "c": np.ones(2, np.float16),
    }
    return safetensors.numpy.save(state, metadata={"format": "pt"})


VALID = _valid_file()
HEADER_END = 8 + struct.unpack("<Q", VALID[:8])[0]


def _assert_consistent(raw: bytes) -> None:
    try:
        layout = parse_header("fuzz", raw, len(raw))
    except InputError as exc:
        assert str(exc).startswith("fuzz: ")
        return
    assert raw.startswith(layout.header)
    assert len(layout.header) == 8 + struct.unpack("<Q", raw[:8])[0]
    cursor = 0
    for span in layout.tensors:
        assert span.dtype in DTYPES
        assert span.start == cursor
        assert span.nbytes == math.prod(span.shape) * DTYPES[span.dtype][0]
        cursor = span.end
    assert layout.data_start + cursor == len(raw)


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, HEADER_END - 1), st.integers(1, 255)),
    st.tuples(st.just("insert"), st.integers(0, HEADER_END), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("cut"), st.integers(0, HEADER_END - 1), st.integers(1, 16)),
    st.tuples(st.just("append"), st.just(0), st.binary(min_size=1, max_size=16)),
    st.tuples(st.just("truncate"), st.integers(0, len(VALID) - 1), st.just(0)),
)


def _mutate(raw: bytes, op: tuple) -> bytes:
    kind, pos, arg = op
    pos = min(pos, len(raw))  # earlier mutations may have shortened the file
    if kind == "flip":
        if pos == len(raw):
            return raw
        return raw[:pos] + bytes([raw[pos] ^ arg]) + raw[pos + 1 :]
    if kind == "insert":
        return raw[:pos] + arg + raw[pos:]
    if kind == "cut":
        return raw[:pos] + raw[pos + arg :]
    if kind == "append":
        return raw + arg
    return raw[:pos]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mutation, min_size=1, max_size=4))
def test_mutated_header_parses_consistently_or_raises_input_error(ops: list[tuple]) -> None:
    raw = VALID
    for op in ops:
        raw = _mutate(raw, op)

    _assert_consistent(raw)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.text(max_size=5),
        st.one_of(
            st.integers(-5, 40),
            st.text(max_size=5),
            st.lists(st.integers(-5, 40), max_size=3),
            st.fixed_dictionaries(
                {
                    "dtype": st.sampled_from([*DTYPES, "X"]),
                    "shape": st.lists(st.integers(-1, 4), max_size=3),
                    "data_offsets": st.lists(st.integers(-1, 40), max_size=3),
                }
            ),
        ),
        max_size=4,
    ),
    st.integers(0, 40),
)
def test_random_json_header_parses_consistently_or_raises_input_error(header: dict, data_len: int) -> None:
    _assert_consistent(st_bytes(header, b"\0" * data_len))


def test_unmutated_fuzz_seed_parses() -> None:
    # The property tests start from this file: it must parse, or they would only see errors.
    layout = parse_header("fuzz", VALID, len(VALID))

    assert [s.name for s in layout.tensors] and layout.data_start == HEADER_END
