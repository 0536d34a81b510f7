"""The GGUF reader (`mgit.formats.gguf`) on files gguf's own writer makes and on forged ones:
an accepted file is exactly its skeleton plus its tensors, with the names, types and shapes
`gguf.GGUFReader` sees; truncated files and forged headers (huge counts and lengths, offsets
past the end, misaligned or overlapping tensors, unknown types) give a one-line InputError
before any allocation, and `mgit add` of one writes nothing (inside a folder it is kept as
an opaque file, with the reason in a note)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")

from conftest import one_line_error, run_cli  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.errors import InputError  # noqa: E402
from mgit.formats.dtypes import BLOCK_DTYPES, GGML_TYPES, value_shape  # noqa: E402
from mgit.formats.gguf import GgufLayout, dequantize, read_gguf  # noqa: E402
from mgit.store.objects import FileEntry, RecordError, TensorEntry  # noqa: E402


def _write(path: Path, tensors: dict[str, tuple[np.ndarray, str]], **kv: str) -> Path:
    """A small GGUF: each tensor quantized to its type with gguf.quants."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in kv.items():
        w.add_string(key, value)
    w.add_token_list(["a", "bb", "ccc"])
    for name, (values, qtype) in tensors.items():
        qt = gguf.GGMLQuantizationType[qtype]
        if qtype == "F32":
            w.add_tensor(name, values.astype(np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(values.astype(np.float32), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _sample(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    return _write(
        tmp_path / "m.gguf",
        {
            "norm.weight": (rng.normal(size=64), "F32"),
            "w.q8": (rng.normal(size=(8, 64)), "Q8_0"),
            "w.q4": (rng.normal(size=(4, 64)), "Q4_0"),
            "w.f16": (rng.normal(size=(3, 5)), "F16"),
        },
    )


def _rebuilt(path: Path, layout: GgufLayout) -> bytes:
    raw, out, taken = path.read_bytes(), bytearray(), 0
    for span in layout.tensors:
        gap = span.start - len(out)
        out += layout.header[taken : taken + gap] + raw[span.start : span.end]
        taken += gap
    return bytes(out + layout.header[taken:])


def test_a_written_file_is_its_skeleton_and_tensors_as_gguf_reads_them(tmp_path) -> None:
    path = _sample(tmp_path)
    layout = read_gguf(path)
    assert _rebuilt(path, layout) == path.read_bytes()
    reader = gguf.GGUFReader(str(path))
    ours = {t.name: t for t in layout.tensors}
    assert set(ours) == {t.name for t in reader.tensors}
    for t in reader.tensors:
        mine = ours[t.name]
        assert mine.dtype == t.tensor_type.name
        assert value_shape(mine.dtype, mine.shape) == tuple(int(d) for d in reversed(t.shape))
        assert mine.start == t.data_offset and path.read_bytes()[mine.start : mine.end] == t.data.tobytes()
    assert layout.metadata["general.architecture"] == "llama" and layout.alignment == 32
    q8 = ours["w.q8"]
    assert q8.shape == (8, 2, 34)  # rows, blocks a row, bytes a block
    values = dequantize(np.frombuffer(path.read_bytes()[q8.start : q8.end], np.uint8), "Q8_0")
    assert np.array_equal(
        values, gguf.quants.dequantize(reader.tensors[1].data, gguf.GGMLQuantizationType.Q8_0).ravel()
    )


def test_the_type_table_is_ggmls() -> None:
    for number, (name, block, size) in GGML_TYPES.items():
        qt = gguf.GGMLQuantizationType(number)
        assert qt.name == name and gguf.GGML_QUANT_SIZES[qt] == (block, size)
    assert "Q8_0" in BLOCK_DTYPES and "F16" not in BLOCK_DTYPES


def _header_end(path: Path) -> int:
    return min(s.start for s in read_gguf(path).tensors)


def _refused(path: Path, *fragments: str) -> str:
    with pytest.raises(InputError) as info:
        read_gguf(path)
    message = str(info.value)
    assert "\n" not in message and all(f in message for f in fragments), message
    return message


def test_every_truncation_of_the_header_is_refused(tmp_path) -> None:
    path = _sample(tmp_path)
    raw = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    last_byte = max(s.end for s in read_gguf(path).tensors)  # (the padding after it may go)
    for n in [*range(0, _header_end(path), 7), last_byte - 1]:
        cut.write_bytes(raw[:n])
        _refused(cut, "cut.gguf")


def _tiny(kv: bytes = b"", infos: bytes = b"", data: bytes = b"", *, n_kv: int = 0, n_tensors: int = 0) -> bytes:
    header = b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kv + infos
    return header + b"\0" * (-len(header) % 32) + data


def _string(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def _info(name: bytes, ne: list[int], kind: int, offset: int) -> bytes:
    return (
        _string(name) + struct.pack("<I", len(ne)) + struct.pack(f"<{len(ne)}Q", *ne) + struct.pack("<IQ", kind, offset)
    )


F32_8 = _info(b"t", [8], 0, 0)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"GGML" + bytes(20), "does not start with GGUF"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
        (b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0), "tensor count"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 2**60), "metadata count"),
        (_tiny(_string(b"k") + struct.pack("<I", 8) + struct.pack("<Q", 2**63), n_kv=1), "at most 67108864"),
        (_tiny(_string(b"k") + struct.pack("<I", 8) + struct.pack("<Q", 5000), n_kv=1), "runs past the end"),
        (_tiny(_string(b"k") + struct.pack("<IIQ", 9, 10, 2**61), n_kv=1), "cannot fit"),
        (_tiny(_string(b"k") + struct.pack("<IIQ", 9, 8, 2**61), n_kv=1), "cannot fit"),
        (_tiny(_string(b"k") + struct.pack("<I", 77) + bytes(8), n_kv=1), "unknown value type 77"),
        (_tiny(_string(b"k") + struct.pack("<II", 9, 99) + bytes(8), n_kv=1), "unknown type 99"),
        (_tiny(_string(b"general.alignment") + struct.pack("<II", 4, 48), n_kv=1), "power of two"),
        (_tiny(_string(b"k") + struct.pack("<IB", 0, 1) + _string(b"k") + struct.pack("<IB", 0, 1), n_kv=2), "twice"),
        (_tiny(infos=_string(b"x" * 2000), n_tensors=1), "at most 1024"),
        (_tiny(infos=_info(b"t", [8], 55, 0), data=bytes(32), n_tensors=1), "unknown ggml type 55"),
        (_tiny(infos=_info(b"t", [8, 1, 1, 1, 1], 0, 0), data=bytes(32), n_tensors=1), "5 dimensions"),
        (_tiny(infos=_info(b"t", [2**40, 2**40], 0, 0), data=bytes(32), n_tensors=1), "more than the file holds"),
        (_tiny(infos=_info(b"t", [40], 8, 0), data=bytes(64), n_tensors=1), "not a multiple of its Q8_0 block"),
        (_tiny(infos=F32_8, data=bytes(16), n_tensors=1), "past the end"),
        (_tiny(infos=_info(b"t", [8], 0, 2**40), data=bytes(32), n_tensors=1), "past the end"),
        (_tiny(infos=_info(b"t", [8], 0, 8), data=bytes(64), n_tensors=1), "not a multiple of the alignment"),
        (_tiny(infos=F32_8 + _info(b"u", [8], 0, 0), data=bytes(32), n_tensors=2), "overlaps"),
        (_tiny(infos=F32_8 + F32_8, data=bytes(64), n_tensors=2), "appears twice"),
    ],
)
def test_a_forged_header_is_refused_in_one_line(tmp_path, data: bytes, fragment: str) -> None:
    path = tmp_path / "forged.gguf"
    path.write_bytes(data)
    _refused(path, fragment)


def test_a_well_formed_tiny_file_is_accepted(tmp_path) -> None:
    path = tmp_path / "ok.gguf"
    path.write_bytes(_tiny(infos=F32_8 + _info(b"u", [8], 0, 32), data=bytes(64), n_tensors=2))
    layout = read_gguf(path)
    assert [(t.name, t.dtype, t.shape) for t in layout.tensors] == [("t", "F32", (8,)), ("u", "F32", (8,))]
    assert _rebuilt(path, layout) == path.read_bytes()


def test_adding_a_forged_gguf_is_one_line_and_writes_nothing(tmp_path) -> None:
    root = tmp_path / "r"
    repo = Repo.init(root)

    def stored() -> list[Path]:  # every object and ref file, and the models listed
        return [p for sub in ("objects", "refs") for p in sorted((repo.dir / sub).rglob("*")) if p.is_file()]

    before = stored()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(_tiny(infos=_info(b"t", [8], 0, 2**40), data=bytes(32), n_tensors=1))
    one_line_error(run_cli("add", str(bad), "--name", "bad", cwd=root), "bad.gguf", "past the end")
    assert stored() == before and Repo(root).ls() == []


def test_in_a_folder_a_file_that_is_no_gguf_is_kept_opaque_with_the_reason(tmp_path) -> None:
    """As a checkpoint a folder's reader cannot map: a Git LFS pointer named model.gguf, or a
    forged one, is the folder's file all the same."""
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**62, 0))
    (folder / "pointer.gguf").write_bytes(b"version https://git-lfs.github.com/spec/v1\noid sha256:00\n")
    repo = Repo.init(tmp_path / "r")
    result = repo.add(folder, name="m")
    assert any("model.gguf kept byte for byte as an opaque file" in n and "tensor count" in n for n in result.notes)
    assert any("pointer.gguf kept byte for byte" in n and "does not start with GGUF" in n for n in result.notes)
    assert {f.path: f.type for f in repo.manifest("m").files}["model.gguf"] == "blob"
    out = repo.checkout("m", tmp_path / "out").out_dir
    for name in ("model.gguf", "pointer.gguf", "config.json"):
        assert (Path(out) / name).read_bytes() == (folder / name).read_bytes()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_corruption_is_refused_in_one_line_or_read_exactly(tmp_path, data) -> None:
    """Bytes of the header overwritten at random (counts, lengths, types, offsets) and the file
    cut anywhere: the reader either refuses it with one line or reads a layout that is exactly
    the file, its tensors inside it, in order and disjoint."""
    path = tmp_path / "fuzz.gguf"
    if not path.with_name("orig.gguf").exists():
        _sample(tmp_path).rename(path.with_name("orig.gguf"))
    raw = bytearray(path.with_name("orig.gguf").read_bytes())
    end = _header_end(path.with_name("orig.gguf"))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, end - 1))
        width = data.draw(st.sampled_from([1, 4, 8]))
        raw[at : at + width] = data.draw(st.binary(min_size=width, max_size=width))
    raw = raw[: data.draw(st.integers(0, len(raw)))]
    path.write_bytes(bytes(raw))
    try:
        layout = read_gguf(path)
    except InputError as exc:
        assert "\n" not in str(exc) and "fuzz.gguf" in str(exc)
        return
    assert _rebuilt(path, layout) == bytes(raw)
    ends = [(s.start, s.end) for s in layout.tensors]
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:], strict=False)) and all(e <= len(raw) for _, e in ends)


def test_a_gguf_manifest_entry_is_checked_as_strictly_as_a_checkpoints() -> None:
    tensor = {"name": "t", "dtype": "Q8_0", "shape": [2, 1, 34], "object": "a" * 64}
    entry = {"path": "m.gguf", "type": "gguf", "size": 200, "digest": "b" * 64, "object": "c" * 64}
    ok = FileEntry.from_json({**entry, "tensors": [tensor], "storage_offsets": [64]})
    assert ok.storage_offsets == (64,) and ok.tensors[0].params == 64 and ok.tensors[0].nbytes == 68
    assert FileEntry.from_json(ok.to_json()) == ok
    for bad, why in [
        ({"storage_offsets": [64], "views": []}, "views"),
        ({"storage_offsets": [150]}, "beyond the file"),
        ({"storage_offsets": []}, "one offset per tensor"),
        ({}, "one offset per tensor"),
    ]:
        with pytest.raises(RecordError, match=why):
            FileEntry.from_json({**entry, "tensors": [tensor], **bad})
    with pytest.raises(RecordError, match="overlaps"):
        FileEntry.from_json({**entry, "tensors": [tensor, {**tensor, "name": "u"}], "storage_offsets": [64, 100]})


def test_a_block_quantized_tensor_entry_must_end_in_its_block() -> None:
    for shape in ([68], [2, 1, 33], []):
        with pytest.raises(RecordError, match="block"):
            TensorEntry.from_json({"name": "t", "dtype": "Q8_0", "shape": shape, "object": "a" * 64})
    assert TensorEntry.from_json({"name": "t", "dtype": "F32", "shape": [68], "object": "a" * 64}).params == 68


def _sparse(path: Path, head: bytes, size: int) -> Path:
    with open(path, "wb") as fh:  # (a hole: no disk, and nothing may read it whole)
        fh.write(head)
        fh.truncate(size)
    return path


def test_what_no_tensor_holds_is_bounded_before_it_is_copied(tmp_path) -> None:
    big = 300 << 20
    path = _sparse(tmp_path / "gap.gguf", _tiny(infos=F32_8, data=bytes(32), n_tensors=1), big)
    _refused(path, "are no tensor's")
    value = _string(b"k") + struct.pack("<IQ", 8, 100 << 20)
    _refused(_sparse(tmp_path / "long.gguf", _tiny(value, n_kv=1), big), "at most 67108864")
    # A vocabulary's strings are walked, not read: an array of them is fine whatever they hold.
    vocab = _string(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 2) + _string(b"\xff\xfe") + _string(b"ok")
    assert read_gguf(_sparse(tmp_path / "v.gguf", _tiny(vocab, n_kv=1), 1024)).tensors == ()
