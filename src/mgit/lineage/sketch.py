"""Sketches: a small, fixed-size summary of a version's tensors, which parent inference
compares instead of the tensors themselves (so ranking a thousand stored models reads a few
megabytes, not their weights).

Per tensor a sketch keeps its name, dtype, shape and object id, the fraction of exact zeros
(on a strided sample of up to ZERO_SAMPLES values) and SAMPLES values at positions drawn from
a hash of the tensor's shape. Two models with a tensor of the same shape are therefore sampled
at the same positions whatever the tensor is called: layer 3 and layer 7 of one model (a
distilled student's layers are compared with any of its teacher's), and a task model's
`bert.encoder...` and its base's `encoder...`. Values are kept as float32: bf16, fp16 and fp8 are decoded; an integer
or fp8 tensor that comes with a scale tensor (int8 per-row quantization, fp8 with per-tensor
or block scales, bitsandbytes' SCB) is dequantized, and the scale at each sampled position is
kept, so that a candidate parent's values can be quantized again exactly the same way. A
GGUF's block-quantized tensor (Q8_0 ...) is sketched by its dequantized values, under its
shape in values, so that it meets its float parent's tensor: a float GGUF's under the same
name, a Hugging Face model's under the name llama.cpp's convert script gave it
(`mgit.lineage.evidence` pairs the names; a sketch keeps each tensor's own). A llama GGUF's
q and k, whose rows the convert script permuted, are sampled where they hold the values
found at the sampled positions of the Hugging Face tensor.

A sketch encodes to one blob (`to_bytes`) that the catalog stores per version.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

import blake3
import numpy as np

from mgit.codecs.derived import to_bfloat16_bits
from mgit.errors import DequantizeError, GgufFormatError
from mgit.formats import safetensors
from mgit.formats.dtypes import BLOCK_DTYPES, value_shape
from mgit.formats.folder import ModelSource, SourceFile
from mgit.formats.gguf import dequantize as dequantize_blocks
from mgit.formats.gguf import permuted_heads, permuted_positions, skeleton_metadata
from mgit.formats.layers import layer_count
from mgit.formats.packed_quant import PackedTensor, dequantize, packed_tensors
from mgit.formats.safetensors import DTYPES, FP8_VALUES, TensorSpan, is_float
from mgit.store.base import ObjectStore
from mgit.store.objectformat import file_objects_expected
from mgit.store.objects import Manifest, TensorEntry, object_id, tensor_meta
from mgit.store.reader import tensor_bytes

if TYPE_CHECKING:
    from mgit.index.catalog import Catalog

SKETCH_FORMAT = 4  # 3: positions drawn from the shape alone; 4: a llama GGUF's q and k sampled unpermuted
# (a sketch of format 3 is read still unless it is a GGUF's: no other sketch differs)
SAMPLES = 64  # values per tensor: enough to tell a 1e-3 change from noise on ~50 tensors
ZERO_SAMPLES = 4096
MAGIC = b"MGSK"

# Role of a tensor in a sketch. PLAIN: integer buffers and the like, never compared by value.
PLAIN, FLOAT, QUANTIZED, SCALE, CONSTANT = 0, 1, 2, 3, 4

QUANT_DTYPES = ("I8", "U8", "F8_E4M3", "F8_E5M2")
# Names a quantized tensor's scale goes by (bitsandbytes' SCB holds absmax, so scale = SCB / 127).
SCALE_SUFFIXES = (("_scale", 1.0), ("_scales", 1.0), (".scale", 1.0), (".scales", 1.0), ("_scale_inv", 1.0))
WEIGHT_SCALE_NAMES = ((".weight_scale", 1.0), (".scales", 1.0), (".SCB", 1 / 127), (".weight_scale_inv", 1.0))
# Widths of float encodings, to tell which of two tensors is the narrower (lossier) one.
PRECISION = {"F64": 52, "F32": 23, "BF16": 7, "F16": 10, "F8_E4M3": 3, "F8_E5M2": 2, "I8": 7, "U8": 8}
# ggml's block types (a GGUF's tensors, sketched dequantized): about the bits a value keeps
PRECISION.update({"Q8_0": 7, "Q8_1": 7, "Q8_K": 7, "Q6_K": 5, "Q5_0": 4, "Q5_1": 4, "Q5_K": 4, "Q4_0": 3})
PRECISION.update({"Q4_1": 3, "Q4_K": 3, "IQ4_NL": 3, "IQ4_XS": 3, "MXFP4": 3, "Q3_K": 2, "IQ3_XXS": 2, "IQ3_S": 2})
PRECISION.update({"Q2_K": 1, "IQ2_XXS": 1, "IQ2_XS": 1, "IQ2_S": 1, "IQ1_S": 0, "IQ1_M": 0, "TQ1_0": 0, "TQ2_0": 0})

DIGITS = re.compile(r"\d+")


def pattern(name: str) -> str:
    """A tensor name with its layer numbers replaced: `encoder.layer.#.attention.query.weight`."""
    return DIGITS.sub("#", name)


@lru_cache(maxsize=4096)
def positions(shape: tuple[int, ...]) -> np.ndarray:
    """The flat positions sampled in every tensor of this shape, whatever its name: so that a
    tensor is sampled alike under a wrapper's prefix (`bert.encoder...` in a task model) and
    in any layer (a student's layer 1 against its teacher's layer 2)."""
    n = math.prod(shape)
    if n <= SAMPLES:
        return np.arange(n, dtype=np.int64)
    seed = int.from_bytes(blake3.blake3(f"{list(shape)}".encode()).digest()[:8], "little")
    return np.sort(np.random.default_rng(seed).integers(0, n, SAMPLES))


def element_values(raw: np.ndarray, dtype: str) -> np.ndarray:
    """One float32 per element of a tensor (given as little-endian bytes), decoded by the
    formats' one decoder; a complex element, which it gives as a pair of reals, is sampled
    by its magnitude."""
    values = safetensors.to_float(raw, dtype, np.float32)
    return np.hypot(values[0::2], values[1::2]) if dtype == "C64" else values


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values rounded to a narrower float encoding and back: to nearest even for
    BF16 and F16 (as a cast does), to the nearest fp8 value (ties to the lower) for fp8."""
    if dtype == "BF16":
        rounded = (to_bfloat16_bits(values.astype(np.float32)).astype(np.uint32) << 16).view(np.float32)
        return np.where(np.isfinite(values), rounded, values)
    if dtype == "F16":
        with np.errstate(over="ignore"):
            return values.astype(np.float16).astype(np.float32)
    if dtype in ("F8_E4M3", "F8_E5M2"):
        table = FP8_VALUES[dtype]
        finite = np.sort(np.unique(table[np.isfinite(table)]))
        idx = np.clip(np.searchsorted(finite, values), 1, len(finite) - 1)
        lo, hi = finite[idx - 1], finite[idx]
        return np.where(np.abs(values - lo) <= np.abs(hi - values), lo, hi).astype(np.float32)
    return values.astype(np.float32)


@dataclass
class Sketch:
    """The sketch of one version (or of a model not stored yet): parallel per-tensor fields
    and an (n, SAMPLES) matrix of values (NaN past a small tensor's last element)."""

    names: list[str]
    dtypes: list[str]
    shapes: list[tuple[int, ...]]
    oids: list[str]
    roles: np.ndarray  # int8, one of PLAIN, FLOAT, QUANTIZED, SCALE
    zeros: np.ndarray  # float32, fraction of exact zeros
    values: np.ndarray  # float32 (n, SAMPLES)
    scales: np.ndarray  # float32 (n, SAMPLES): the quantization scale at each sample, 0 if none

    # Most stored sketches are only scanned once by parent inference: these are built on demand.
    @cached_property
    def layers(self) -> int:
        """How many layers the model has (`mgit.formats.layers.layer_count`)."""
        return layer_count(self.names)

    @cached_property
    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    @cached_property
    def params(self) -> np.ndarray:
        return np.array([math.prod(s) for s in self.shapes], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def same_tensors(self, other: Sketch) -> bool:
        """Whether both hold the same tensors bit for bit under the same names (a re-save of one
        model, whatever its files): one is the other already stored."""
        if len(self) != len(other):
            return False
        if self.names == other.names:  # the usual case, compared without building anything
            return self.oids == other.oids
        return dict(zip(self.names, self.oids, strict=True)) == dict(zip(other.names, other.oids, strict=True))

    def to_bytes(self) -> bytes:
        quantized = np.flatnonzero(self.roles == QUANTIZED)
        header = json.dumps(
            {
                "format": SKETCH_FORMAT,
                "samples": SAMPLES,
                "names": self.names,
                "dtypes": self.dtypes,
                "shapes": [list(s) for s in self.shapes],
                "oids": self.oids,
                "zeros": [round(float(z), 6) for z in self.zeros],
                "roles": [int(r) for r in self.roles],
            },
            separators=(",", ":"),
        ).encode()
        body = self.values.astype("<f4").tobytes() + self.scales[quantized].astype("<f4").tobytes()
        return MAGIC + struct.pack("<I", len(header)) + header + body

    @classmethod
    def from_bytes(cls, blob: bytes) -> Sketch:
        """Parse a stored sketch; raises ValueError on anything but a sketch of this format."""
        try:
            return cls._parse(blob)
        except (KeyError, TypeError, IndexError, struct.error) as exc:
            raise ValueError(f"a damaged sketch ({exc})") from None

    @classmethod
    def _parse(cls, blob: bytes) -> Sketch:
        if blob[:4] != MAGIC or len(blob) < 8:
            raise ValueError("not a sketch")
        (size,) = struct.unpack_from("<I", blob, 4)
        header = json.loads(blob[8 : 8 + size])
        if header.get("format") not in (SKETCH_FORMAT, 3) or header.get("samples") != SAMPLES:
            raise ValueError("a sketch of another format")
        names, dtypes, shapes, oids = header["names"], header["dtypes"], header["shapes"], header["oids"]
        if header["format"] == 3 and any(str(n).startswith("blk.") for n in names):
            raise ValueError("a GGUF's sketch of format 3")  # (format 4 differs from 3 only there)
        n = len(names)
        roles = np.array(header["roles"], dtype=np.int8)
        if not len(dtypes) == len(shapes) == len(oids) == len(roles) == len(header["zeros"]) == n:
            raise ValueError("a sketch whose columns differ in length")
        quantized = np.flatnonzero(roles == QUANTIZED)
        data = np.frombuffer(blob, "<f4", offset=8 + size)
        if data.size != (n + len(quantized)) * SAMPLES:
            raise ValueError("a truncated sketch")
        values = data[: n * SAMPLES].reshape(n, SAMPLES)
        scales = np.zeros((n, SAMPLES), np.float32)
        scales[quantized] = data[n * SAMPLES :].reshape(len(quantized), SAMPLES)
        return cls(
            names,
            dtypes,
            [tuple(s) for s in shapes],
            oids,
            roles,
            np.array(header["zeros"], np.float32),
            values,
            scales,
        )


def _scale_for(entry: TensorEntry, by_name: dict[str, TensorEntry]) -> tuple[TensorEntry, float] | None:
    """The scale tensor that goes with a quantized tensor, if the model has one that fits."""
    names = [(entry.name + s, f) for s, f in SCALE_SUFFIXES]
    if entry.name.endswith(".weight"):
        names += [(entry.name.removesuffix(".weight") + s, f) for s, f in WEIGHT_SCALE_NAMES]
    for name, factor in names:
        scale = by_name.get(name)
        if scale is not None and is_float(scale.dtype) and _scale_index(entry.shape, scale.shape) is not None:
            return scale, factor
    return None


def _scale_index(shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray] | None:
    """Maps flat positions of a tensor to flat positions of its scale: one scale, one per
    row, one per column, or one per block; None when the shapes do not fit any of these."""
    rows = shape[0] if shape else 1
    cols = math.prod(shape[1:]) if len(shape) > 1 else 1
    count = math.prod(scale_shape)
    if count == 1:
        return lambda p: np.zeros_like(p)
    if count == rows and (len(scale_shape) == 1 or scale_shape[-1] == 1):
        return lambda p: p // cols
    if count == cols and len(scale_shape) == 2 and scale_shape[0] == 1:
        return lambda p: p % cols
    if len(scale_shape) == 2 and len(shape) == 2 and scale_shape[0] <= rows and scale_shape[1] <= cols:
        br, bc = -(-rows // scale_shape[0]), -(-cols // scale_shape[1])
        if -(-rows // br) == scale_shape[0] and -(-cols // bc) == scale_shape[1]:
            return lambda p: (p // cols // br) * scale_shape[1] + (p % cols) // bc
    return None


def _packed_as_floats(
    by_name: dict[str, TensorEntry],
) -> tuple[dict[str, TensorEntry], dict[str, tuple[PackedTensor, list[TensorEntry]]]]:
    """The entries with each packed-integer layer (GPTQ, AWQ, pack-quantized) replaced by the
    float32 matrix it stands for, in the place of its first tensor, and those layers by name
    (with their tensors). FP8 and int8 with a scale are sketched as quantized tensors already."""
    found = packed_tensors({e.name: (e.dtype, e.shape) for e in by_name.values()})
    layers = {n: p for n, p in found.items() if p.layout in ("gptq", "awq", "pack") and not p.problem}
    if not layers:
        return by_name, {}
    member_of = {m: p for p in layers.values() for m in p.tensors}
    out: dict[str, TensorEntry] = {}
    packed: dict[str, tuple[PackedTensor, list[TensorEntry]]] = {}
    for name, e in by_name.items():
        p = member_of.get(name)
        if p is None:
            out.setdefault(name, e)
        elif p.name not in packed:
            first = by_name[p.members.get("qweight", p.members.get("weight", name))]
            packed[p.name] = (p, [by_name[m] for m in p.tensors])
            out[p.name] = TensorEntry(p.name, "F32", p.shape, first.object)
    return out, packed


def _varies(values: np.ndarray) -> bool:
    finite = values[np.isfinite(values)]
    return finite.size > 1 and bool(finite.max() > finite.min())


def _sampled_at(shape: tuple[int, ...], heads: int | None) -> np.ndarray | None:
    """The flat positions read for a tensor of `shape` (in values): `positions(shape)`, or for
    a tensor whose rows the convert script permuted, where it holds the values found there
    in the Hugging Face tensor (None when its head count cannot be right)."""
    pos = positions(shape)
    return pos if heads is None else permuted_positions(pos, shape, heads)


def sketch_tensors(
    entries: Sequence[TensorEntry],
    read: Callable[[TensorEntry], np.ndarray],
    after: Callable[[TensorEntry], None] | None = None,
    permuted: Mapping[str, int] | None = None,
) -> Sketch:
    """The sketch of a model's tensors; `read(entry)` gives a tensor's raw bytes (uint8), and
    `after(entry)` is called once a tensor has been sampled (to release its pages).
    `permuted`: a GGUF's tensors whose rows the convert script permuted, by name, with the
    head count (`permuted_tensors`): sampled as the Hugging Face tensor would be, so that they
    meet it and any other GGUF of the model alike; one whose count cannot be right is
    sampled as stored and never compared (role PLAIN)."""
    permuted = permuted or {}
    by_name: dict[str, TensorEntry] = {}
    for e in entries:
        by_name.setdefault(e.name, e)
    by_name, packed = _packed_as_floats(by_name)
    companions = {
        e.name: found
        for e in by_name.values()
        if e.dtype in QUANT_DTYPES and (found := _scale_for(e, by_name)) is not None
    }
    scale_names = {s.name for s, _ in companions.values()}
    n = len(by_name)
    roles = np.zeros(n, np.int8)
    zeros = np.zeros(n, np.float32)
    values = np.full((n, SAMPLES), np.nan, np.float32)
    scales = np.zeros((n, SAMPLES), np.float32)
    value_shapes = [value_shape(e.dtype, e.shape) for e in by_name.values()]
    for i, e in enumerate(by_name.values()):
        where = _sampled_at(value_shapes[i], permuted.get(e.name))
        if e.dtype in BLOCK_DTYPES:  # a GGUF's quantized tensor: its sampled blocks dequantized
            zeros[i], values[i], roles[i] = _block_sample(read(e), e.dtype, value_shapes[i], where)
            roles[i] = roles[i] if where is not None else PLAIN
            if after is not None:
                after(e)
            continue
        if e.name in packed:
            p, members = packed[e.name]
            by_member = {m.name: m for m in members}
            shapes = {m.name: (m.dtype, m.shape) for m in members}
            try:
                raw = dequantize(p, shapes, lambda n, by_member=by_member: read(by_member[n]))
            except DequantizeError:
                raw = np.full(p.shape, np.nan, np.float32)
            raw = raw.astype("<f4", copy=False).reshape(-1).view(np.uint8)
            roles[i] = QUANTIZED
            for m in members if after is not None else ():
                after(m)
        else:
            raw = read(e)
        size = itemsize = DTYPES[e.dtype][0]
        count = raw.size // itemsize
        step = max(1, count // ZERO_SAMPLES)
        strided = (
            element_values(raw.reshape(count, size)[::step].reshape(-1), e.dtype) if count else np.zeros(0, np.float32)
        )
        zeros[i] = float(np.mean(strided == 0)) if count else 0.0
        pos = positions(e.shape) if where is None else where
        picked = raw.reshape(count, size)[pos].reshape(-1)
        sample = element_values(picked, e.dtype)
        if e.name in packed:
            pass  # dequantized above; no scale reproduces its values (zero points, groups)
        elif e.name in companions:
            scale_entry, factor = companions[e.name]
            to_scale = _scale_index(e.shape, scale_entry.shape)
            assert to_scale is not None
            s = element_values(read(scale_entry), scale_entry.dtype)[to_scale(pos)] * np.float32(factor)
            scales[i, : len(pos)] = s
            sample = sample * s
            roles[i] = QUANTIZED
        elif e.name in scale_names:
            roles[i] = SCALE
        elif e.name in permuted and where is None:
            pass  # permuted by a head count the metadata does not give: not comparable
        elif is_float(e.dtype) and count > 1 and _varies(strided):
            roles[i] = FLOAT
        elif is_float(e.dtype) and count and np.any(strided != 0):
            roles[i] = CONSTANT  # like a norm's initial ones; all zeros say nothing about a trained tensor
        values[i, : len(pos)] = sample
        if after is not None and e.name not in packed:
            after(e)
    listed = list(by_name.values())
    return Sketch(
        [e.name for e in listed],
        [e.dtype for e in listed],
        value_shapes,
        [e.object for e in listed],
        roles,
        zeros,
        values,
        scales,
    )


def _block_sample(
    raw: np.ndarray, dtype: str, shape: tuple[int, ...], where: np.ndarray | None = None
) -> tuple[float, np.ndarray, int]:
    """(fraction of zeros, SAMPLES values, role) of a block-quantized tensor of `shape` values,
    dequantizing only the blocks that hold the sampled positions (`where`, by default
    `positions(shape)`) and ZERO_SAMPLES values' worth of strided blocks."""
    block, type_size = BLOCK_DTYPES[dtype]
    blocks = raw.reshape(-1, type_size)
    out = np.full(SAMPLES, np.nan, np.float32)
    if not blocks.shape[0]:
        return 0.0, out, PLAIN
    strided = dequantize_blocks(blocks[:: max(1, blocks.shape[0] * block // ZERO_SAMPLES)].reshape(-1), dtype)
    pos = positions(shape) if where is None else where
    picked = dequantize_blocks(blocks[pos // block].reshape(-1), dtype).reshape(len(pos), block)
    out[: len(pos)] = picked[np.arange(len(pos)), pos % block]
    role = FLOAT if _varies(strided) else CONSTANT if np.any(strided != 0) else PLAIN
    return float(np.mean(strided == 0)), out, role


def permuted_tensors(files: Sequence[tuple[dict[str, object], Sequence[str]]]) -> dict[str, int]:
    """For (metadata, tensor names) of a model's GGUF files: each tensor whose rows the convert
    script permuted, and the head count it did so by (`mgit.formats.gguf.permuted_heads`)."""
    out: dict[str, int] = {}
    for metadata, names in files:
        heads = permuted_heads(metadata)
        for name in names:
            suffix = name.rpartition(".")[0].rpartition(".")[2] + ".weight"
            if suffix in heads and name.endswith("." + suffix):
                out.setdefault(name, heads[suffix])
    return out


def _source_permuted(source: ModelSource) -> dict[str, int]:
    return permuted_tensors(
        [(f.layout.metadata, [s.name for s in f.layout.tensors]) for f in source.files if f.kind == "gguf" and f.layout]
    )


def _source_tensors(source: ModelSource) -> dict[str, tuple[SourceFile, TensorSpan, np.ndarray]]:
    data: dict[str, tuple[SourceFile, TensorSpan, np.ndarray]] = {}
    for f in source.files:
        if f.is_safetensors:
            for span, raw in f.tensor_data():
                data.setdefault(span.name, (f, span, np.asarray(raw).reshape(-1)))
    return data


def _sketch_source_tensors(
    entries: list[TensorEntry],
    data: dict[str, tuple[SourceFile, TensorSpan, np.ndarray]],
    permuted: Mapping[str, int],
) -> Sketch:
    """Sample memory-mapped source tensors, releasing each one's pages once it is sampled: a
    sample strided across a tensor faults in most of its pages, and for a large model those
    would otherwise stay resident until the add ends."""

    def release(e: TensorEntry) -> None:
        f, span, _ = data[e.name]
        f.release(span)

    return sketch_tensors(entries, lambda e: data[e.name][2], release, permuted)


def sketch_source(source: ModelSource) -> Sketch:
    """The sketch of a model not stored yet (its tensors' object ids are computed here).
    Hashing reads every page: they are released after, as the snapshot releases them."""
    data = _source_tensors(source)
    entries = []
    for name, (f, span, raw) in data.items():
        entries.append(
            TensorEntry(name, span.dtype, span.shape, object_id("tensor", tensor_meta(span.dtype, span.shape), raw))
        )
        f.release(span)  # hashing read every page of it
    return _sketch_source_tensors(entries, data, _source_permuted(source))


def sketch_added(manifest: Manifest, source: ModelSource) -> Sketch:
    """The sketch of a version just added, read from its source files (still in the page
    cache) rather than decoded from the store. A lossy version's values differ from the
    source by at most its bound, far below what a sketch resolves."""
    return _sketch_source_tensors(list(manifest.tensors()), _source_tensors(source), _source_permuted(source))


def sketch_stored(store: ObjectStore, manifest: Manifest) -> Sketch:
    """The sketch of a stored version, decoding each of its tensors once (and a GGUF's
    skeleton, for the head counts its q and k were permuted by)."""
    ggufs = []
    for f in manifest.files:
        if f.type == "gguf":
            skeleton = store.get(f.object, expect=file_objects_expected(f)[f.object])[1]
            try:
                metadata = skeleton_metadata(f.path, bytes(skeleton))
            except GgufFormatError:
                metadata = {}  # (checked when it was added: a damaged object fails before this)
            ggufs.append((metadata, [t.name for t in f.tensors]))
    return sketch_tensors(manifest.tensors(), lambda e: tensor_bytes(store, e), None, permuted_tensors(ggufs))


def stored_sketches(store: ObjectStore, catalog: Catalog) -> list[tuple[str, str, Sketch]]:
    """(id, model@seq, sketch) of every indexed version: what parent inference compares. A
    missing or unreadable sketch (a rebuilt catalog, a version indexed by a sync after a
    crash or a fetch) is computed from the stored tensors once and saved."""
    rows, missing = catalog.sketches()
    out = []
    for vid, model, seq, blob in rows:
        try:
            out.append((vid, f"{model}@{seq}", Sketch.from_bytes(blob)))
        except ValueError:
            missing.append(vid)
    for vid in missing:
        row = catalog.version(vid)
        if row is None:
            continue
        with catalog.explained():
            sketch = sketch_stored(store, store.get_manifest(row.manifest))
        catalog.put_sketch(vid, sketch.to_bytes())
        out.append((vid, f"{row.model}@{row.seq}", sketch))
    return out
