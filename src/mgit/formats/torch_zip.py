"""PyTorch checkpoints (`torch.save`'s zip container) read without executing anything.

A checkpoint is a zip of stored (uncompressed) entries: `PREFIX/data.pkl`, a pickle of the
state dict whose tensors name their storages by key, and `PREFIX/data/KEY`, each storage's raw
little-endian bytes, plus small entries (version, byteorder). MGit keeps every byte that is not
a storage's data (zip headers, the pickle, padding) as one small "skeleton" blob, and each
storage as a tensor object, so the file is rebuilt byte for byte and its tensors deduplicate
and delta against a safetensors parent's.

The pickle is read by an unpickler whose `find_class` knows only what a state dict needs
(`_rebuild_tensor_v2`, `_rebuild_parameter`, `OrderedDict`, the storage type markers), each
mapped to an inert stand-in here: nothing of torch is imported, nothing is called that the
file names. A file that needs anything else, or whose zip is not plainly laid out, raises
`NotTorchZip` with the reason in one line; a folder then keeps it as an opaque file.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import struct
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mgit.formats.dtypes import itemsize
from mgit.formats.safetensors import TensorSpan
from mgit.formats.tensor_views import MAX_DIMS, TensorView

MAX_PICKLE_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 1_000_000
LOCAL_HEADER = struct.Struct("<IHHHHHIIIHH")  # zip local file header, 30 bytes
LOCAL_MAGIC = 0x04034B50

# torch's storage type markers (`torch.FloatStorage`, ...) -> MGit's dtype names
STORAGE_DTYPES = {
    "FloatStorage": "F32",
    "DoubleStorage": "F64",
    "HalfStorage": "F16",
    "BFloat16Storage": "BF16",
    "LongStorage": "I64",
    "IntStorage": "I32",
    "ShortStorage": "I16",
    "CharStorage": "I8",
    "ByteStorage": "U8",
    "BoolStorage": "BOOL",
    "ComplexFloatStorage": "C64",
    "UInt16Storage": "U16",
    "UInt32Storage": "U32",
    "UInt64Storage": "U64",
    "Float8_e4m3fnStorage": "F8_E4M3",
    "Float8_e5m2Storage": "F8_E5M2",
    "Float8_e8m0fnuStorage": "F8_E8M0",
}


class NotTorchZip(Exception):
    """The file is not a checkpoint this reader can map to tensors; the message says why."""


@dataclass(frozen=True)
class TorchZipLayout:
    """A parsed checkpoint. Shaped like `SafetensorsLayout` so that what reads a model file's
    tensors reads these too: `header` is the skeleton (the file less its storages' bytes),
    `tensors` the storages in file order (offsets from the start of the file), `views` the
    state dict's tensors."""

    header: bytes
    tensors: tuple[TensorSpan, ...]
    views: tuple[TensorView, ...]
    metadata: None = None
    data_start: int = 0


# --- the pickle ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class _StorageType:
    dtype: str


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: str
    numel: int


@dataclass(frozen=True)
class _Tensor:
    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class _StateDict(collections.OrderedDict):  # type: ignore[type-arg]
    """OrderedDict's stand-in: takes the `_metadata` attribute a module's state dict carries."""

    def __setstate__(self, state: Any) -> None:
        pass


def _rebuild_tensor_v2(storage: Any, offset: Any, shape: Any, stride: Any, *_: Any) -> _Tensor:
    if not isinstance(storage, _Storage):
        raise NotTorchZip("a tensor is rebuilt from something that is not a storage")
    shape, stride = tuple(shape), tuple(stride)
    if len(shape) != len(stride) or len(shape) > MAX_DIMS:
        raise NotTorchZip("a tensor has a shape and stride of different lengths")
    for v in (offset, *shape, *stride):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 2**62:
            raise NotTorchZip("a tensor's offset, shape or stride is not a count")
    return _Tensor(storage, offset, shape, stride)


def _rebuild_parameter(data: Any, *_: Any) -> _Tensor:
    if not isinstance(data, _Tensor):
        raise NotTorchZip("a parameter wraps something that is not a tensor")
    return data


def _allowed() -> dict[tuple[str, str], Any]:
    names: dict[tuple[str, str], Any] = {
        ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
        ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
        ("collections", "OrderedDict"): _StateDict,
    }
    for marker, dtype in STORAGE_DTYPES.items():
        names["torch", marker] = _StorageType(dtype)
    return names


ALLOWED = _allowed()


class _Unpickler(pickle._Unpickler):  # (Python's own: its errors on a forged pickle are plain exceptions)
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.storages: dict[str, _Storage] = {}

    def find_class(self, module: str, name: str) -> Any:
        found = ALLOWED.get((module, name))
        if found is None:
            raise NotTorchZip(f"its pickle names {module}.{name}, which a state dict of tensors does not need")
        return found

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise NotTorchZip("its pickle refers to something that is not a storage")
        _, kind, key, _location, numel = pid
        if not isinstance(kind, _StorageType) or not isinstance(key, str) or not key.isdigit():
            raise NotTorchZip("its pickle names a storage of no known type")
        if not isinstance(numel, int) or isinstance(numel, bool) or not 0 <= numel < 2**62:
            raise NotTorchZip(f"storage {key} has an invalid size")
        storage = _Storage(key, kind.dtype, numel)
        if self.storages.setdefault(key, storage) != storage:
            raise NotTorchZip(f"storage {key} is named twice with different types or sizes")
        return storage


def _state_dict(raw: bytes) -> tuple[list[tuple[str, _Tensor]], dict[str, _Storage]]:
    unpickler = _Unpickler(raw)
    try:
        obj = unpickler.load()
    except NotTorchZip:
        raise
    except Exception as exc:  # a malformed pickle: any of pickle's own errors  # noqa: BLE001
        raise NotTorchZip(f"its pickle cannot be read ({type(exc).__name__})") from None
    if not isinstance(obj, dict):
        raise NotTorchZip("it holds something other than a state dict (a dict of tensors)")
    items = list(obj.items())
    for name, value in items:
        if not isinstance(name, str) or not name:
            raise NotTorchZip("a state dict key is not a name")
        if not isinstance(value, _Tensor):
            raise NotTorchZip(f"{name!r} is not a tensor (only a dict of tensors is stored as tensors)")
    return items, unpickler.storages


# --- the zip ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Entry:
    name: str
    header_at: int
    data_at: int
    size: int
    stored: bool


def _entries(fh: Any, file_size: int) -> tuple[list[_Entry], int]:
    try:
        archive = zipfile.ZipFile(fh)
        infos = archive.infolist()
        central = archive.start_dir
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, NotImplementedError) as exc:
        raise NotTorchZip(f"not a zip checkpoint ({exc})") from None
    if len(infos) > MAX_ENTRIES:
        raise NotTorchZip(f"its zip has more than {MAX_ENTRIES} entries")
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise NotTorchZip("its zip names an entry twice")
    entries = []
    for info in infos:
        if info.flag_bits & 0x1:
            raise NotTorchZip(f"zip entry {info.filename!r} is encrypted")
        if not 0 <= info.header_offset <= file_size - LOCAL_HEADER.size:
            raise NotTorchZip(f"zip entry {info.filename!r} starts outside the file")
        fh.seek(info.header_offset)
        head = fh.read(LOCAL_HEADER.size)
        if len(head) != LOCAL_HEADER.size:
            raise NotTorchZip(f"zip entry {info.filename!r} starts beyond the end of the file")
        fields = LOCAL_HEADER.unpack(head)
        if fields[0] != LOCAL_MAGIC:
            raise NotTorchZip(f"zip entry {info.filename!r} has no local header where the directory says")
        name_len, extra_len = fields[9], fields[10]
        try:
            name = info.orig_filename.encode("utf-8" if info.flag_bits & 0x800 else "cp437")
        except UnicodeEncodeError:
            name = None
        if fh.read(name_len) != name:
            raise NotTorchZip(f"zip entry {info.filename!r} has another name in its local header")
        data_at = info.header_offset + LOCAL_HEADER.size + name_len + extra_len
        stored = info.compress_type == zipfile.ZIP_STORED and info.compress_size == info.file_size
        entries.append(_Entry(info.filename, info.header_offset, data_at, info.compress_size, stored))
    entries.sort(key=lambda e: e.header_at)
    end = central
    for entry, after in zip(entries, [*(e.header_at for e in entries[1:]), end], strict=True):
        if entry.data_at + entry.size > after:
            raise NotTorchZip(f"zip entry {entry.name!r} overlaps what follows it or runs beyond the file")
    if central > file_size:
        raise NotTorchZip("its zip directory starts beyond the end of the file")
    return entries, central


def read_torch_zip(path: Path) -> TorchZipLayout:
    """Parse a checkpoint on disk (its zip directory, local headers and pickle, not its
    storages' bytes). Raises NotTorchZip, or OSError when it cannot be read."""
    with open(path, "rb") as fh:
        file_size = fh.seek(0, 2)
        fh.seek(0)
        if fh.read(4) != b"PK\x03\x04":
            raise NotTorchZip("not a zip checkpoint (a legacy torch.save file, or not PyTorch's)")
        entries, _ = _entries(fh, file_size)
        pickles = [e for e in entries if e.name.count("/") == 1 and e.name.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise NotTorchZip("its zip has no single PREFIX/data.pkl")
        pkl = pickles[0]
        prefix = pkl.name.removesuffix("data.pkl")
        if not pkl.stored:
            raise NotTorchZip("its data.pkl is compressed")
        if pkl.size > MAX_PICKLE_BYTES:
            raise NotTorchZip(f"its data.pkl is over {MAX_PICKLE_BYTES} bytes")
        fh.seek(pkl.data_at)
        items, storages = _state_dict(fh.read(pkl.size))
        by_name = {e.name: e for e in entries}
        spans: list[tuple[_Entry, _Storage]] = []
        for key, storage in storages.items():
            entry = by_name.get(f"{prefix}data/{key}")
            if entry is None:
                raise NotTorchZip(f"storage {key} has no data entry")
            if not entry.stored:
                raise NotTorchZip(f"storage {key} is compressed")
            if entry.size != storage.numel * itemsize(storage.dtype):
                raise NotTorchZip(
                    f"storage {key} declares {storage.numel} {storage.dtype} elements"
                    f" but its entry holds {entry.size} bytes"
                )
            spans.append((entry, storage))
        spans.sort(key=lambda s: s[0].data_at)
        index = {storage.key: i for i, (_, storage) in enumerate(spans)}
        views = []
        for name, t in items:
            view = TensorView(name, index[t.storage.key], t.offset, t.shape, t.stride)
            if view.span()[1] > t.storage.numel:
                raise NotTorchZip(f"tensor {name!r} reads beyond its storage")
            views.append(view)
        tensors = _named_storages(spans, views)
        skeleton = bytearray()
        cursor = 0
        for span in tensors:
            fh.seek(cursor)
            skeleton += _read_exactly(fh, span.start - cursor)
            cursor = span.end
        fh.seek(cursor)
        skeleton += _read_exactly(fh, file_size - cursor)
    return TorchZipLayout(bytes(skeleton), tuple(tensors), tuple(views))


def _read_exactly(fh: Any, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise NotTorchZip("the file changed size while it was read")
    return data


def _named_storages(spans: list[tuple[_Entry, _Storage]], views: list[TensorView]) -> list[TensorSpan]:
    """Each storage as a tensor: one that is exactly a tensor of the state dict takes its name,
    dtype and shape (so it pairs with a parent's tensor of that name); any other is a flat
    tensor named after the first tensor that views it, `NAME:storage`."""
    first: dict[int, TensorView] = {}
    whole: dict[int, TensorView] = {}
    for v in views:
        first.setdefault(v.storage, v)
        if v.is_whole(spans[v.storage][1].numel):
            whole.setdefault(v.storage, v)
    names = {v.name for v in views}
    out = []
    for i, (entry, storage) in enumerate(spans):
        view = whole.get(i)
        if view is not None:
            name, shape = view.name, view.shape
        else:
            name = f"{first[i].name}:storage" if i in first else f"storage:{storage.key}"
            shape = (storage.numel,)
            if name in names:
                raise NotTorchZip(f"a storage's name {name!r} is also a tensor's")
        assert math.prod(shape) == storage.numel
        out.append(TensorSpan(name, storage.dtype, shape, entry.data_at, entry.data_at + entry.size))
    return out


def each_tensor_its_storage(tensors: Sequence[Any], views: Sequence[TensorView]) -> bool:
    """Whether every tensor of a checkpoint is a whole storage of its own, stored under its
    name (no tied, offset or strided tensor): then its storages are its state dict, as a
    safetensors file's tensors are. `tensors` are its storages (spans or manifest entries)."""
    return len(views) == len(tensors) and all(
        tensors[v.storage].name == v.name
        and tuple(tensors[v.storage].shape) == v.shape
        and v.is_whole(math.prod(v.shape))
        for v in views
    )


def safetensors_name(path: str) -> str:
    """What a checkpoint's tensors are called written as safetensors (a merge of it writes
    safetensors): `pytorch_model.bin` -> `model.safetensors`, `x.pt` -> `x.safetensors`."""
    folder, _, file = path.rpartition("/")
    stem = file.rsplit(".", 1)[0]
    name = "model.safetensors" if stem == "pytorch_model" else f"{stem}.safetensors"
    return f"{folder}/{name}" if folder else name


def plain_checkpoint(path: Path) -> TorchZipLayout | None:
    """A file's layout if it is a PyTorch checkpoint each of whose tensors is a storage of its
    own (what a merge reads as it reads safetensors), else None."""
    if path.suffix not in (".bin", ".pt", ".pth") or not path.is_file():
        return None
    try:
        layout = read_torch_zip(path)
    except (NotTorchZip, OSError):
        return None
    return layout if each_tensor_its_storage(layout.tensors, layout.views) else None
