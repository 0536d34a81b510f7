"""The PyTorch checkpoint reader (`mgit.formats.torch_zip`) on hostile input: pickles that name
anything but tensor rebuilds are refused without running a thing, truncated and forged zips
and spans give one-line reasons (a folder then keeps the file opaque), any file it accepts is
exactly its skeleton plus its storages; and the torch-zip manifest entry is validated as
strictly as every record."""

from __future__ import annotations

import collections
import io
import os
import pickle
import random
import struct
import zipfile
from pathlib import Path

import pytest
from conftest import needs_torch, sha256_tree

from mgit import Repo
from mgit.formats.torch_zip import NotTorchZip, TorchZipLayout, read_torch_zip
from mgit.store.objects import FileEntry, RecordError


def _zip(path: Path, entries: list[tuple[str, bytes]], compress: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression=compress) as z:
        for name, data in entries:
            z.writestr(zipfile.ZipInfo(name), data, compress_type=compress)
    return path


def _rebuilt(path: Path, layout: TorchZipLayout) -> bytes:
    """The file as a checkout writes it: the skeleton's pieces between the storages."""
    raw, out, taken = path.read_bytes(), bytearray(), 0
    for span in layout.tensors:
        gap = span.start - len(out)
        out += layout.header[taken : taken + gap] + raw[span.start : span.end]
        taken += gap
    return bytes(out + layout.header[taken:])


def _refused(path: Path, *fragments: str) -> str:
    with pytest.raises(NotTorchZip) as info:
        read_torch_zip(path)
    message = str(info.value)
    assert "\n" not in message and all(f in message for f in fragments), message
    return message


class _Evil:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_naming_os_system_is_refused_without_running_it(tmp_path) -> None:
    marker = tmp_path / "ran"
    for payload in ({"w": _Evil(marker)}, _Evil(marker), collections.OrderedDict(w=[_Evil(marker)])):
        pkl = pickle.dumps(payload, protocol=2)
        path = _zip(tmp_path / "pytorch_model.bin", [("archive/data.pkl", pkl), ("archive/version", b"3\n")])
        _refused(path, "its pickle names", "system")
        assert not marker.exists()
    folder = tmp_path / "m"
    folder.mkdir()
    path.rename(folder / "pytorch_model.bin")
    repo = Repo.init(tmp_path / "r")
    result = repo.add(folder, name="m")
    assert any("pytorch_model.bin kept byte for byte as an opaque file: its pickle names" in n for n in result.notes)
    assert not marker.exists()
    repo.checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(folder)


def test_what_is_not_a_zip_checkpoint_says_so(tmp_path) -> None:
    (tmp_path / "a.bin").write_bytes(b"\x80\x02}q\x00.")  # a bare pickle
    _refused(tmp_path / "a.bin", "not a zip checkpoint")
    (tmp_path / "b.bin").write_bytes(b"PK\x03\x04" + b"\x00" * 40)
    _refused(tmp_path / "b.bin", "not a zip checkpoint")
    _refused(_zip(tmp_path / "c.bin", [("archive/version", b"3\n")]), "no single PREFIX/data.pkl")
    pkl = pickle.dumps({"w": 1}, protocol=2)
    _refused(_zip(tmp_path / "d.bin", [("archive/data.pkl", pkl)]), "'w' is not a tensor")
    _refused(_zip(tmp_path / "e.bin", [("archive/data.pkl", b"\x80\x02}q\x00(")]), "its pickle cannot be read")


# --- forged checkpoints, made with torch's own pickling of what we say ---------------------------
class _FakeStorage:
    def __init__(self, key: str, numel: int, marker: str = "FloatStorage") -> None:
        self.key, self.numel, self.marker = key, numel, marker


class _FakeTensor:
    def __init__(self, storage: _FakeStorage, offset: int, shape: tuple, stride: tuple) -> None:
        self.storage, self.offset, self.shape, self.stride = storage, offset, shape, stride


def _forged_pickle(state: dict) -> bytes:
    import torch

    class Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _FakeStorage):
                return ("storage", getattr(torch, obj.marker), obj.key, "cpu", obj.numel)
            return None

        def reducer_override(self, obj):
            if isinstance(obj, _FakeTensor):
                args = (obj.storage, obj.offset, obj.shape, obj.stride, False, collections.OrderedDict())
                return torch._utils._rebuild_tensor_v2, args
            return NotImplemented

    buf = io.BytesIO()
    Pickler(buf, protocol=2).dump(collections.OrderedDict(state))
    return buf.getvalue()


def _forged(path: Path, state: dict, data: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> Path:
    entries = [("archive/data.pkl", _forged_pickle(state))]
    entries += [(f"archive/data/{k}", v) for k, v in data.items()]
    return _zip(path, [*entries, ("archive/version", b"3\n")], compress)


@needs_torch
def test_forged_sizes_offsets_and_spans_are_refused(tmp_path) -> None:
    s = _FakeStorage("0", 3)
    good = _forged(tmp_path / "good.bin", {"w": _FakeTensor(s, 0, (3,), (1,))}, {"0": b"\x00" * 12})
    layout = read_torch_zip(good)
    assert [(t.name, t.dtype, t.shape) for t in layout.tensors] == [("w", "F32", (3,))]
    assert _rebuilt(good, layout) == good.read_bytes()

    huge = _FakeStorage("0", 2**40)
    _refused(_forged(tmp_path / "a.bin", {"w": _FakeTensor(huge, 0, (2**40,), (1,))}, {"0": b"\x00" * 12}), "declares")
    _refused(
        _forged(tmp_path / "b.bin", {"w": _FakeTensor(s, 1, (3,), (1,))}, {"0": b"\x00" * 12}), "beyond its storage"
    )
    _refused(_forged(tmp_path / "c.bin", {"w": _FakeTensor(s, 0, (2, 2), (2, 1))}, {"0": b"\x00" * 12}), "beyond")
    _refused(_forged(tmp_path / "d.bin", {"w": _FakeTensor(s, 0, (3,), (1,))}, {}), "storage 0 has no data entry")
    _refused(
        _forged(tmp_path / "e.bin", {"w": _FakeTensor(s, 0, (3,), (1,))}, {"0": b"\x00" * 12}, zipfile.ZIP_DEFLATED),
        "compressed",
    )
    _refused(_forged(tmp_path / "f.bin", {"w": _FakeTensor(s, -1, (3,), (1,))}, {"0": b"\x00" * 12}), "not a count")
    other = _FakeStorage("0", 3, "LongStorage")
    both = {"w": _FakeTensor(s, 0, (3,), (1,)), "v": _FakeTensor(other, 0, (3,), (1,))}
    _refused(_forged(tmp_path / "g.bin", both, {"0": b"\x00" * 24}), "named twice")

    raw = good.read_bytes()
    forged = bytearray(raw)
    entry = raw.index(b"PK\x01\x02", raw.index(b"PK\x01\x02") + 4)  # the second central record: data/0's
    struct.pack_into("<II", forged, entry + 20, 2**31, 2**31)  # its sizes: beyond the file
    (tmp_path / "h.bin").write_bytes(forged)
    _refused(tmp_path / "h.bin")
    forged = bytearray(raw)
    struct.pack_into("<I", forged, entry + 42, 0)  # its local header offset: data.pkl's
    (tmp_path / "i.bin").write_bytes(forged)
    _refused(tmp_path / "i.bin")
    with pytest.warns(UserWarning, match="Duplicate name"):
        _zip(tmp_path / "j.bin", [("archive/data.pkl", _forged_pickle({})), ("archive/data.pkl", b"")])
    _refused(tmp_path / "j.bin", "names an entry twice")


@needs_torch
def test_truncated_and_bit_flipped_checkpoints_are_refused_or_read_exactly(tmp_path) -> None:
    import torch

    path = tmp_path / "m.bin"
    torch.save({"a": torch.arange(12, dtype=torch.float32), "b": torch.ones(2, 3).t(), "c": torch.tensor(True)}, path)
    raw = path.read_bytes()
    assert _rebuilt(path, read_torch_zip(path)) == raw
    for cut in [*range(0, len(raw), 23), *range(len(raw) - 30, len(raw))]:
        path.write_bytes(raw[:cut])
        _refused(path)
    rng = random.Random(0)
    accepted = 0
    for _ in range(400):
        forged = bytearray(raw)
        forged[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        path.write_bytes(forged)
        try:
            layout = read_torch_zip(path)
        except NotTorchZip as exc:
            assert "\n" not in str(exc)
            continue
        accepted += 1
        assert _rebuilt(path, layout) == bytes(forged)  # whatever is accepted is rebuilt exactly
    assert accepted > 0  # (a flip in a storage's bytes is just other values)


def _entry(**changes) -> dict:
    d = {
        "path": "pytorch_model.bin",
        "type": "torch-zip",
        "size": 100,
        "digest": "0" * 64,
        "object": "1" * 64,
        "tensors": [{"name": "w", "dtype": "F32", "shape": [2, 3], "object": "2" * 64}],
        "storage_offsets": [40],
        "views": [
            {"name": "w", "storage": 0, "offset": 0, "shape": [2, 3], "stride": [3, 1]},
            {"name": "w_t", "storage": 0, "offset": 0, "shape": [3, 2], "stride": [1, 3]},
        ],
    }
    d.update(changes)
    return d


def test_a_torch_zip_entry_round_trips_and_forged_ones_are_refused() -> None:
    entry = FileEntry.from_json(_entry())
    assert FileEntry.from_json(entry.to_json()) == entry and entry.storage_offsets == (40,)
    view = {"name": "x", "storage": 0, "offset": 0, "shape": [2, 3], "stride": [3, 1]}
    forged = {
        "views beyond the storage": {"views": [{**view, "offset": 1}]},
        "a view of a storage that is not there": {"views": [{**view, "storage": 1}]},
        "a view whose stride has another length": {"views": [{**view, "stride": [1]}]},
        "a view named twice": {"views": [view, view]},
        "an offset beyond the file": {"storage_offsets": [90]},
        "no offset": {"storage_offsets": []},
        "a negative offset": {"storage_offsets": [-1]},
        "no views": {"views": None},
        "tensors beyond the file": {"size": 10},
    }
    for what, change in forged.items():
        with pytest.raises(RecordError):
            FileEntry.from_json(_entry(**change))
            pytest.fail(what)
    two = _entry(
        tensors=[_entry()["tensors"][0], {"name": "v", "dtype": "F32", "shape": [2], "object": "3" * 64}],
        storage_offsets=[40, 70],
    )
    assert len(FileEntry.from_json(two).tensors) == 2
    with pytest.raises(RecordError, match="overlaps"):
        FileEntry.from_json({**two, "storage_offsets": [40, 50]})
    safetensors = {k: v for k, v in _entry(type="safetensors").items()}
    with pytest.raises(RecordError, match="only a torch-zip file has views"):
        FileEntry.from_json(safetensors)
