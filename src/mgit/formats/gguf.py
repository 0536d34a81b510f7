"""GGUF files (llama.cpp's model format): strict parsing into a skeleton plus tensor spans, so
that a `.gguf` is stored as its tensors and rebuilt byte for byte.

A GGUF file is `GGUF`, a u32 version (2 or 3), u64 tensor and key-value counts, the key-value
metadata (typed values, arrays of them), one info per tensor (name, dimensions in ggml's
`ne` order, ggml type, offset from the start of the data), then, at the next multiple of
`general.alignment` (32 by default), the tensors' bytes at their offsets, each aligned.
MGit keeps the file less its tensors' bytes (the skeleton: header, metadata, infos, padding)
as one blob, and each tensor as an object, named as in the file; F16 and F32 tensors have
their usual dtypes, block-quantized ones the ggml type's name with a block shape
(`mgit.formats.dtypes`).

The header is read here rather than by `gguf.GGUFReader`, which trusts the counts it reads:
every count, length and offset is checked against the bytes left in the file before anything
is allocated for it, so a forged file costs a one-line error and never a huge allocation.
Needs no `gguf` package; only dequantizing values (diff, parent inference) does.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from mgit.errors import GgufFormatError, InputError, MissingDependencyError
from mgit.formats.dtypes import BLOCK_DTYPES, GGML_TYPES
from mgit.formats.safetensors import TensorSpan

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 1024
MAX_STRING_BYTES = 64 << 20  # a metadata string kept (a chat template is a few KB)
MAX_SKELETON_BYTES = 256 << 20  # header, metadata and padding (a 256k-token vocabulary is ~6 MB)
MAX_ARRAY_DEPTH = 4
# value type -> struct format of a fixed-size value (8: string and 9: array are not fixed)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
_BLOCK = re.compile(r"\.(\d+)\.")  # a layer number inside a tensor name


@dataclass(frozen=True)
class GgufLayout:
    """A parsed GGUF file, shaped like `SafetensorsLayout` so that what reads a model file's
    tensors reads these too: `header` is the skeleton (the file less its tensors' bytes),
    `tensors` the tensors in file order (offsets from the start of the file). `metadata` holds
    the scalar and string values (arrays are left out: a vocabulary says nothing about lineage)."""

    header: bytes
    tensors: tuple[TensorSpan, ...]
    metadata: dict[str, Any] = field(default_factory=dict)
    version: int = 3
    alignment: int = DEFAULT_ALIGNMENT
    data_start: int = 0
    views: tuple[()] = ()  # (a checkpoint's layout has views of its storages; a GGUF's tensors are whole)


class _Cursor:
    """Reads the header of `buf`, refusing any read past its end."""

    def __init__(self, path: str, buf: memoryview) -> None:
        self.path, self.buf, self.at = path, buf, 0

    def fail(self, why: str) -> GgufFormatError:
        return GgufFormatError(self.path, f"not a valid GGUF file: {why}")

    @property
    def left(self) -> int:
        return len(self.buf) - self.at

    def skip(self, n: int, what: str) -> None:
        if n > self.left:
            raise self.fail(f"{what} runs past the end of the file ({len(self.buf)} bytes)")
        self.at += n

    def take(self, n: int, what: str) -> bytes:
        """The next n bytes, copied (no view of the map outlives the parse)."""
        self.skip(n, what)
        return bytes(self.buf[self.at - n : self.at])

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def count(self, what: str, least_bytes: int) -> int:
        """A u64 count of items that take at least `least_bytes` each, checked against what is left."""
        n = self.unpack("<Q", what)
        if n * least_bytes > self.left:
            raise self.fail(f"{what} {n} cannot fit in the {self.left} bytes left")
        return n

    def string(self, what: str, limit: int | None = None) -> str:
        n = self.unpack("<Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} is {n} bytes long (at most {limit})")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8") from None

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        """A value of type `kind`; an array's items are checked and skipped (None)."""
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind], what)
        if kind == STRING and depth:  # an array's strings (a vocabulary): checked, not read
            self.skip(self.unpack("<Q", f"the length of {what}"), what)
            return None
        if kind == STRING:
            return self.string(what, MAX_STRING_BYTES)
        if kind != ARRAY:
            raise self.fail(f"{what} has unknown value type {kind}")
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"{what} nests arrays over {MAX_ARRAY_DEPTH} deep")
        item = self.unpack("<I", f"the item type of {what}")
        if item in _SCALARS:
            size = struct.calcsize(_SCALARS[item])
            self.skip(self.count(f"the length of {what}", size) * size, what)
        elif item in (STRING, ARRAY):
            for _ in range(self.count(f"the length of {what}", 8 if item == STRING else 12)):
                self.value(item, what, depth + 1)
        else:
            raise self.fail(f"{what} is an array of unknown type {item}")
        return None


def _header(cur: _Cursor) -> tuple[int, int, dict[str, Any], int]:
    """(version, tensor count, metadata, alignment): what comes before the tensor infos."""
    if cur.take(4, "the magic") != MAGIC:
        raise cur.fail("it does not start with GGUF")
    version = cur.unpack("<I", "the version")
    if version not in VERSIONS:
        raise cur.fail(f"version {version} (this reader knows {', '.join(map(str, VERSIONS))})")
    n_tensors = cur.unpack("<Q", "the tensor count")
    n_kv = cur.count("the metadata count", 8 + 4 + 1)
    if n_tensors * (8 + 4 + 4 + 8) > cur.left:
        raise cur.fail(f"the tensor count {n_tensors} cannot fit in the {cur.left} bytes left")
    metadata: dict[str, Any] = {}
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = cur.string("a metadata key", MAX_NAME_BYTES)
        if key in metadata:
            raise cur.fail(f"metadata key {key!r} appears twice")
        kind = cur.unpack("<I", f"the type of {key!r}")
        metadata[key] = cur.value(kind, f"metadata {key!r}")
        if key == "general.alignment":
            alignment = metadata[key]
            if kind != 4 or alignment == 0 or alignment & (alignment - 1):
                raise cur.fail(f"general.alignment is not a power of two ({alignment!r})")
    return version, n_tensors, {k: v for k, v in metadata.items() if v is not None}, alignment


def skeleton_metadata(label: str, skeleton: bytes) -> dict[str, Any]:
    """The scalar and string metadata of a stored GGUF's skeleton (which starts with the
    file's header as it was). Raises GgufFormatError."""
    view = memoryview(skeleton)
    try:
        return _header(_Cursor(label, view))[2]
    finally:
        view.release()


def parse_gguf(path: str, buf: memoryview) -> GgufLayout:
    """Validate a whole GGUF file held in `buf` (a memory map): its header, and its tensors'
    places, which must be aligned, inside the file and disjoint."""
    cur = _Cursor(path, buf)
    version, n_tensors, metadata, alignment = _header(cur)
    infos = [_tensor_info(cur) for _ in range(n_tensors)]
    if len({name for name, *_ in infos}) != len(infos):
        raise cur.fail("a tensor name appears twice")
    data_start = -(-cur.at // alignment) * alignment
    spans = []
    for name, dtype, shape, offset, nbytes in infos:
        if offset % alignment:
            raise cur.fail(f"tensor {name!r} is at offset {offset}, not a multiple of the alignment {alignment}")
        start = data_start + offset
        if start + nbytes > len(buf):
            raise cur.fail(
                f"tensor {name!r} ends at byte {start + nbytes}, past the end of the file ({len(buf)} bytes)"
            )
        spans.append(TensorSpan(name, dtype, shape, start, start + nbytes))
    spans.sort(key=lambda s: (s.start, s.end))
    cursor = 0
    for span in spans:
        if span.start < cursor:
            raise cur.fail(f"tensor {span.name!r} overlaps the tensor before it")
        cursor = span.end
    if (rest := len(buf) - sum(s.nbytes for s in spans)) > MAX_SKELETON_BYTES:
        raise cur.fail(f"{rest} bytes of it are no tensor's (at most {MAX_SKELETON_BYTES})")
    skeleton = bytearray()
    cursor = 0
    for span in spans:
        skeleton += buf[cursor : span.start]
        cursor = span.end
    skeleton += buf[cursor:]
    return GgufLayout(bytes(skeleton), tuple(spans), metadata, version, alignment)


def _tensor_info(cur: _Cursor) -> tuple[str, str, tuple[int, ...], int, int]:
    """(name, dtype, shape as MGit stores it, offset in the data, bytes) of one tensor info."""
    name = cur.string("a tensor name", MAX_NAME_BYTES)
    n_dims = cur.unpack("<I", f"the dimension count of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cur.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    ne = [cur.unpack("<Q", f"the dimensions of {name!r}") for _ in range(n_dims)]
    kind = cur.unpack("<I", f"the type of {name!r}")
    offset = cur.unpack("<Q", f"the offset of {name!r}")
    if kind not in GGML_TYPES:
        raise cur.fail(f"tensor {name!r} has unknown ggml type {kind}")
    dtype, block, type_size = GGML_TYPES[kind]
    if ne[0] % block:
        raise cur.fail(f"tensor {name!r} has {ne[0]} values a row, not a multiple of its {dtype} block ({block})")
    count = 1
    for d in ne:
        count *= d
    nbytes = count // block * type_size
    if nbytes > len(cur.buf):
        raise cur.fail(f"tensor {name!r} of {ne} {dtype} needs {nbytes} bytes, more than the file holds")
    shape = tuple(reversed(ne))
    if dtype in BLOCK_DTYPES:
        shape = (*shape[:-1], ne[0] // block, type_size)
    return name, dtype, shape, offset, nbytes


def read_gguf(path: Path, label: str | None = None) -> GgufLayout:
    """Parse a GGUF file on disk (memory-mapped: only its header is read). Raises InputError."""
    label = label or str(path)
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            if size == 0:
                raise GgufFormatError(label, "not a valid GGUF file: it is empty")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                view = memoryview(mapped)
                try:
                    return parse_gguf(label, view)
                finally:
                    view.release()
    except OSError as exc:
        raise InputError(label, f"cannot read file ({exc.strerror or exc})") from None


def is_quantized(layout: GgufLayout) -> bool:
    """Whether any of its tensors is block-quantized (a Q8_0, Q4_K ... file)."""
    return any(t.dtype in BLOCK_DTYPES for t in layout.tensors)


def ggml_type(dtype: str) -> Any:
    """gguf's GGMLQuantizationType of a dtype (imports the optional `gguf` package)."""
    try:
        from gguf.constants import GGMLQuantizationType
    except ImportError:
        raise MissingDependencyError("gguf", "Reading GGUF tensor values", "gguf") from None
    return GGMLQuantizationType[dtype]


def dequantize(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A block-quantized tensor's bytes (whole blocks) as float32 values, flat, with
    gguf's reference dequantizer."""
    qtype = ggml_type(dtype)
    from gguf.quants import dequantize as gguf_dequantize

    type_size = BLOCK_DTYPES[dtype][1]
    if raw.size % type_size:
        raise ValueError(f"{raw.size} bytes are not whole {dtype} blocks")
    blocks = raw.reshape(-1).view(np.uint8).reshape(1, -1)
    return gguf_dequantize(blocks, qtype).astype(np.float32, copy=False).reshape(-1)


@lru_cache(maxsize=256)
def _name_table(arch: str, blocks: int) -> Any:
    """gguf's TensorNameMap of an architecture (building one takes milliseconds: pairing a
    model against every architecture builds a hundred)."""
    from gguf.constants import MODEL_ARCH_NAMES
    from gguf.tensor_mapping import get_tensor_name_map

    found = [a for a, n in MODEL_ARCH_NAMES.items() if n == arch]
    return get_tensor_name_map(found[0], blocks) if found else None


def gguf_names(arch: str, names: Collection[str]) -> dict[str, str]:
    """What llama.cpp's convert script calls each of a Hugging Face model's tensors in a GGUF
    of architecture `arch` (`model.layers.0.self_attn.q_proj.weight` -> `blk.0.attn_q.weight`),
    for those it maps; empty without the `gguf` package or for an architecture it does not know.
    (Names only: the convert script's permutation of llama's q and k rows is not undone, so
    those two tensors are not predicted from a safetensors parent; from a float GGUF they are.)"""
    try:
        import gguf.tensor_mapping  # noqa: F401
    except ImportError:
        return {}
    blocks = 1 + max((int(m.group(1)) for n in names if (m := _BLOCK.search(n))), default=-1)
    table = _name_table(arch, blocks)
    if table is None:
        return {}
    out = {}
    for name in names:
        new = table.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is not None and new != name:
            out[name] = new
    return out


MAX_BASE_MODELS = 64


def declared_bases(metadata: dict[str, Any]) -> list[list[str]]:
    """The models a GGUF's metadata names as its bases (`general.base_model.count`, then each
    `general.base_model.{i}.name`, `.organization` and `.repo_url`): for each, the names it
    may have in a repository, most specific first (`org/name`, `name`, the repo URL's tail)."""
    count = metadata.get("general.base_model.count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return []
    out = []
    for i in range(min(count, MAX_BASE_MODELS)):
        name, org, url = (metadata.get(f"general.base_model.{i}.{k}") for k in ("name", "organization", "repo_url"))
        names = []
        if isinstance(url, str) and url.count("/") >= 2:
            names.append("/".join(url.rstrip("/").split("/")[-2:]))
        if isinstance(name, str) and name:
            if isinstance(org, str) and org:
                names.insert(0, f"{org}/{name}")
            names.append(name)
        if names:
            out.append(list(dict.fromkeys(names)))
    return out


def _is_gguf_side(names: Collection[str]) -> bool:
    return any(n.startswith(("blk.", "token_embd.")) for n in names)


def _conversion(names: Collection[str], gguf_side: Collection[str]) -> tuple[str, dict[str, str]]:
    """The architecture under which the convert script maps most of a Hugging Face model's
    tensor `names` onto `gguf_side`, and that mapping (restricted to names found there)."""
    targets = set(gguf_side)
    if not _is_gguf_side(targets) or not names:
        return "", {}
    try:
        from gguf.constants import MODEL_ARCH_NAMES
    except ImportError:
        return "", {}
    # Chosen on the names outside the layers and in layer 0 (a name table for one layer is
    # quick to build, for 32 layers of every architecture it takes seconds), then mapped whole.
    probe = [n for n in names if (m := _BLOCK.search(n)) is None or m.group(1) == "0"]
    if not any(_BLOCK.search(n) for n in probe):  # no layer 0 (layers kept under their old numbers)
        probe = list(names)
    best, most = "", 0
    for arch in MODEL_ARCH_NAMES.values():
        found = sum(1 for v in gguf_names(arch, probe).values() if v in targets)
        if found > most:
            best, most = arch, found
    if not best:
        return "", {}
    return best, {k: v for k, v in gguf_names(best, names).items() if v in targets}


def converted_names(names: Collection[str], gguf_side: Collection[str]) -> dict[str, str]:
    """For a Hugging Face model's tensor names, the names they have among `gguf_side` (a GGUF's
    tensors), under the architecture that maps most of them there: what diff pairs a model
    with its GGUF by. Empty when the other side has no GGUF names, or without `gguf`."""
    return _conversion(names, gguf_side)[1]


# Tensors whose rows the convert script permutes, by architecture, with the metadata key of
# the head count it permutes by (`LlamaModel.permute`: Hugging Face's rotary halves to ggml's
# interleaved pairs; mgit.repo.permuted predicts them, parent inference samples them unpermuted).
PERMUTED_ROWS = {
    "llama": {"attn_q.weight": "llama.attention.head_count", "attn_k.weight": "llama.attention.head_count_kv"}
}


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 1 << 16 else 0


def permuted_heads(metadata: dict[str, Any]) -> dict[str, int]:
    """For a GGUF of an architecture whose rows the convert script permutes: the name suffix
    of each permuted tensor and the head count it was permuted by (0: the metadata gives none
    that can be; k falls back to q's, as the script's does). Empty for other architectures."""
    keys = PERMUTED_ROWS.get(metadata.get("general.architecture"), {})  # type: ignore[arg-type]
    heads = {suffix: _count(metadata.get(key)) for suffix, key in keys.items()}
    if "attn_k.weight" in heads:
        heads["attn_k.weight"] = heads["attn_k.weight"] or heads.get("attn_q.weight", 0)
    return heads


def permuted_positions(pos: np.ndarray, shape: tuple[int, ...], heads: int) -> np.ndarray | None:
    """Where a tensor of `shape` permuted by the convert script for `heads` heads holds the
    values found at flat positions `pos` of the Hugging Face tensor; None when it cannot
    have been permuted so (not a matrix, rows not a multiple of 2 x heads)."""
    if len(shape) != 2 or heads <= 0 or shape[0] % (2 * heads):
        return None
    rows, cols = shape
    half = rows // heads // 2
    r, c = pos // cols, pos % cols
    head, t, j = r // (2 * half), (r % (2 * half)) // half, r % half  # HF row: head, half, pair index
    return (head * 2 * half + j * 2 + t) * cols + c


def conversion_pairs(names: Collection[str], others: Collection[str]) -> tuple[dict[str, str], frozenset[str]]:
    """When one model's tensors are a GGUF's and another's a Hugging Face model's (either way
    round): each of `names` that has a counterpart among `others` as the convert script names
    it, and the Hugging Face model's tensors the script drops (a pooler, a buffer), which say
    nothing of lineage. Empty unless exactly one side has GGUF names; what parent inference
    pairs such models by. (A llama's q and k, which the script permutes, are sampled
    unpermuted in a GGUF's sketch, so they pair as the others do.)"""
    mine, theirs = _is_gguf_side(names), _is_gguf_side(others)
    if mine == theirs:
        return {}, frozenset()
    hf, gguf_side = (others, names) if mine else (names, others)
    found = _conversion(hf, gguf_side)[1]
    if not found:
        return {}, frozenset()
    left_out = frozenset(n for n in hf if n not in found)
    return ({v: k for k, v in found.items()} if mine else found), left_out
