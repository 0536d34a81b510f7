"""The encoding policy: which codec chains an object is tried with, and which one is written.

A tensor is tried standalone (byte planes + zstd for floats), as exact deltas against the
tensors it probably derives from (its parents' tensors of the same name: XOR, the zig-zag
difference coded by pcodec, a patch of the items that differ), as transforms of them (a cast,
an int8 quantization and its scales, a transpose, a merged low-rank adapter) and, in a lossy
add, as a quantized step; the smallest output wins. Content larger than a block whose chain
allows it is coded in independent blocks (the same chain on each), which lets writers and
readers work on a block at a time, in parallel. docs/format.md states the rules exactly.
What each codec is (delta, derived, predictive, ending a family) is read from its class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mgit.codecs import (
    REQUANTIZABLE,
    AbsmaxScaleCodec,
    ByteplanesCodec,
    CastCodec,
    Codec,
    CodecContext,
    Fp8CastCodec,
    LowRankCodec,
    PatchCodec,
    PcoCodec,
    QuantizeInt8Codec,
    RequantizeCodec,
    SubDeltaCodec,
    TransposeCodec,
    XorDeltaCodec,
    ZstdCodec,
    blockwise,
    byte_array,
    chain_to_list,
    decode_chain,
    encode_chain,
)
from mgit.codecs.derived import low_rank_of
from mgit.codecs.requantize import available as requantize_available
from mgit.errors import CorruptObjectError, InvalidOptionError, MissingObjectError
from mgit.formats.dtypes import value_shape
from mgit.formats.safetensors import element_count, is_float, itemsize
from mgit.store.objectformat import MAX_DEPTH_LIMIT, ObjectHeader

SAMPLE_FROM = 256 << 10  # tensors larger than this choose their encoding on samples
SAMPLE_BYTES = 32 << 10
SAMPLES = 4


@dataclass(frozen=True)
class Encoding:
    """How an object would be stored: its codec chain, the encoded payload, its delta depth
    and, for content coded in blocks, the block size. The payload of a blocked encoding is
    the list of its coded blocks; a `deferred` one has none yet: its blocks are coded as
    they are written (`ObjectStore.encode_block`)."""

    codecs: list[Codec]
    payload: Any
    depth: int
    blocks: int = 0
    deferred: bool = False


@dataclass(frozen=True)
class Coded:
    """What `smallest` chose, coded: the chain and its output (the raw bytes for no chain), whole
    or, with `blocks`, as the list of its coded blocks of that size."""

    codecs: list[Codec]
    payload: Any
    blocks: int = 0


@dataclass(frozen=True)
class Deferred:
    """What `smallest` chose for content to be coded in blocks of `blocks` bytes by `codecs` (none:
    raw) as it is written, by the writers in parallel: nothing is coded yet."""

    codecs: list[Codec]
    blocks: int


def default_chain(kind: str, meta: dict[str, Any]) -> list[Codec]:
    """How an object is stored when nothing better is known: byte planes + zstd for
    multi-byte floats, zstd otherwise (a higher level for small files and records).

    pcodec would store a base's float32 weights 1.3% smaller (74.7 instead of 75.7 MB for
    MiniLM) but encodes at ~200 MB/s per core against ~500: not worth halving the add speed
    of a model without parents. It is worth it for deltas (`delta_chains`)."""
    if kind == "tensor":
        dtype = meta["dtype"]
        if is_float(dtype) and itemsize(dtype) > 1:
            return [ByteplanesCodec(itemsize=itemsize(dtype)), ZstdCodec(level=1)]
        return [ZstdCodec(level=1)]
    return [ZstdCodec(level=3)]


def delta_chains(base: str, meta: dict[str, Any]) -> list[list[Codec]]:
    """Lossless encodings of a tensor against a base of the same dtype: XOR of the bit
    patterns (followed by the tensor's default chain), their zig-zag difference (followed by
    pcodec on those integers), and a patch of the items that differ (pruning, sparse updates)."""
    tail = default_chain("tensor", meta)
    chains: list[list[Codec]] = [[XorDeltaCodec(base=base), *tail]]
    size = itemsize(meta["dtype"])
    if size in (1, 2, 4, 8):
        # The difference goes to pcodec when it reads the numbers: byte planes + zstd never
        # stored one smaller (on the MiniLM family), and every candidate costs a sampled encode.
        tail = [PcoCodec(dtype=f"<u{size}")] if size > 1 else tail
        chains.append([SubDeltaCodec(base=base, itemsize=size), *tail])
        chains.append([PatchCodec(base=base, itemsize=size), ZstdCodec(level=1)])
    return chains


def derived_chains(base: str, base_meta: dict[str, Any], meta: dict[str, Any]) -> list[list[Codec]]:
    """Encodings of a tensor predicted from a base of another dtype or shape: the transpose
    of a matrix (any dtype); from a float32 base, a cast, a symmetric int8 quantization (per
    row of a matrix, or of the whole tensor) or that quantization's scales, an FP8 cast with
    absmax scales (per row or for the tensor); from a float base, a ggml block quantization
    (a GGUF's Q8_0 ... tensor) made again."""
    shape, base_shape, dtype = meta["shape"], base_meta["shape"], meta["dtype"]
    tail: list[Codec] = [ZstdCodec(level=1)]
    chains: list[list[Codec]] = []
    if (
        dtype == base_meta["dtype"]
        and len(shape) == 2
        and shape == base_shape[::-1]
        and shape != base_shape
        and shape[0] > 0
        and shape[1] > 0
        and itemsize(dtype) in (1, 2, 4, 8)
    ):
        chains.append([TransposeCodec(base=base, rows=base_shape[0], itemsize=itemsize(dtype)), *tail])
    if (
        dtype in REQUANTIZABLE
        and base_meta["dtype"] in ("F32", "F16", "BF16")
        and base_shape
        and element_count(tuple(base_shape))
        and list(value_shape(dtype, tuple(shape))) == list(base_shape)
        and requantize_available()
    ):  # a GGUF's Q8_0 ... tensor from its float parent
        chains.append([RequantizeCodec(base, base_meta["dtype"], dtype, base_shape[-1]), *tail])
    if base_meta["dtype"] != "F32" or not element_count(tuple(base_shape)):
        return chains
    if dtype in ("BF16", "F16") and shape == base_shape:
        chains.append([CastCodec(base=base, to=dtype), *tail])
    if dtype == "F8_E4M3" and shape == base_shape:  # FP8 per channel, then per tensor
        if len(base_shape) == 2:
            chains.append([Fp8CastCodec(base=base, rows=base_shape[0]), *tail])
        chains.append([Fp8CastCodec(base=base, rows=1), *tail])
    if dtype == "I8" and shape == base_shape:
        if len(base_shape) == 2:
            chains.append([QuantizeInt8Codec(base=base, rows=base_shape[0]), *tail])
        chains.append([QuantizeInt8Codec(base=base, rows=1), *tail])  # one scale for the tensor
    if dtype == "F32" and len(base_shape) == 2 and shape == [base_shape[0]]:
        chains.append([AbsmaxScaleCodec(base=base, rows=base_shape[0]), *tail])
    if dtype == "F32" and shape in ([], [1]):
        chains.append([AbsmaxScaleCodec(base=base, rows=1), *tail])
    return chains


def chain_bases(kind: str, meta: dict[str, Any], chain: Sequence[Codec]) -> list[str]:
    return ObjectHeader(kind, meta, 0, chain_to_list(chain)).bases


Load = Callable[[str], np.ndarray]  # a base's decoded bytes
LoadRange = Callable[[str, int, int], np.ndarray]  # bytes [start, stop) of a base's decoded content


def choose_encoding(
    kind: str,
    meta: dict[str, Any],
    buf: np.ndarray,
    *,
    bases: Sequence[str],
    max_depth: int,
    extra: Sequence[list[Codec]],
    header: Callable[[str], ObjectHeader],
    load: Load,
    load_range: LoadRange,
    block_bytes: int = 0,
) -> Encoding:
    """The smallest encoding of `buf` among the candidates. `bases` are stored tensors it
    probably derives from (a base already `max_depth` deltas deep takes only a codec that
    ends a family); `extra` chains (a quantized step) compete when every base they name is
    usable; `header` and `load` read a base's header and its decoded bytes, `load_range`
    part of them (the samples, a block). With `block_bytes`, content
    larger than that whose best chain is blockwise (and not predictive) is coded in blocks
    of that size."""
    candidates = [default_chain(kind, meta)]
    transforms: list[list[Codec]] = []  # encoded in full: casts, quantizations, a merged adapter
    depths: dict[str, int] = {}
    matrix_bases: list[str] = []  # same-shape float32 matrices: a merged adapter's parent?
    for base in bases if kind == "tensor" else ():
        try:
            bh = header(base)
        except (CorruptObjectError, MissingObjectError):
            continue  # a damaged base is never used; fsck reports it
        if bh.kind != "tensor" or bh.depth > max_depth:
            continue
        at_bound = bh.depth == max_depth  # only a codec that ends a family may go one past the bound
        if at_bound and (max_depth == 0 or bh.depth + 1 > MAX_DEPTH_LIMIT):
            continue
        depths[base] = bh.depth + 1
        if bh.meta["dtype"] == meta["dtype"]:
            candidates += [c for c in delta_chains(base, meta) if not at_bound or c[0].ends_family]
            if (
                not at_bound
                and meta["dtype"] == "F32"
                and len(meta["shape"]) == 2
                and bh.meta["shape"] == meta["shape"]
            ):
                matrix_bases.append(base)
        transforms += derived_chains(base, bh.meta, meta)
    for chain in extra:  # within the depth bound, as deltas are, or one past it if it ends a family
        named = chain_bases(kind, meta, chain)
        for other in [b for b in named if b not in depths]:  # a base no parent's tensor of that name is
            try:  # (a merged adapter's factors)
                oh = header(other)
            except (CorruptObjectError, MissingObjectError):
                continue
            if oh.kind == "tensor" and oh.depth <= max_depth:
                depths[other] = oh.depth + 1
        if all(b in depths for b in named) and (
            max((depths[b] for b in named), default=0) <= max_depth or (chain and chain[0].ends_family)
        ):
            (transforms if chain and chain[0].storage == "derived" else candidates).append(chain)
    for base in matrix_bases:
        rows, cols = meta["shape"]
        probe = _probe_rows(rows, cols, header(base).blocks, block_bytes)
        n = probe * cols * 4
        near = load_range(base, 0, n) if probe < rows else load(base)
        rank = low_rank_of(buf[:n], near, probe)
        if rank is not None and rank * (rows + cols) <= rows * cols // 4:
            transforms.append([LowRankCodec(base=base, rows=rows, rank=rank), PcoCodec(dtype="<u4")])

    chosen = smallest(candidates, transforms, buf, load, load_range, block_bytes)
    if isinstance(chosen, Coded) and not chosen.blocks and any(c.predictive for c in chosen.codecs):
        # Never trust a prediction: what is written must decode to the content. (Deltas
        # and patches are exact bijections, property-tested; re-decoding them would cost
        # a third of an add.)
        decoded = decode_chain(chosen.codecs, chosen.payload, CodecContext(buf.nbytes, load))
        if not np.array_equal(byte_array(decoded), buf):
            chosen = smallest(candidates[:1], [], buf, load, load_range, block_bytes)
    depth = max((depths[b] for b in chain_bases(kind, meta, chosen.codecs)), default=0)
    if isinstance(chosen, Deferred):
        return Encoding(chosen.codecs, None, depth, chosen.blocks, deferred=True)
    return Encoding(chosen.codecs, chosen.payload, depth, chosen.blocks)


def _probe_rows(rows: int, cols: int, base_blocks: int, block_bytes: int) -> int:
    """The rows of a float32 matrix whose difference from its base is probed for a low rank:
    all of them, or for a matrix over a block against a base coded in blocks of that size,
    those of its first block (a merged adapter's rank shows in any rows), so that the probe
    decodes one block of the base, which the block's encoding then uses, not the whole."""
    per_block = block_bytes // (4 * cols) if cols else 0
    if base_blocks and base_blocks == block_bytes and rows * cols * 4 > block_bytes and per_block >= 128:
        return per_block
    return rows


def exact_encoding(
    kind: str,
    meta: dict[str, Any],
    size: int,
    chain: Sequence[Codec],
    *,
    max_depth: int,
    header: Callable[[str], ObjectHeader],
) -> Encoding | None:
    """The encoding of content its maker computed as `chain`'s first codec predicts it (an
    XOR-residual predictor: the residual is zeros), without predicting it again; None when
    a base may not be coded against (too deep, damaged), for the caller to choose as usual."""
    first = chain[0]
    if not (first.predictive and first.storage == "derived"):
        raise InvalidOptionError(f"{first.name} does not store a residual of its prediction")
    depths = []
    for base in chain_bases(kind, meta, chain):
        try:
            bh = header(base)
        except (CorruptObjectError, MissingObjectError):
            return None
        if bh.kind != "tensor" or bh.depth > max_depth or (bh.depth == max_depth and not first.ends_family):
            return None
        depths.append(bh.depth + 1)
    if max(depths, default=0) > MAX_DEPTH_LIMIT:
        return None
    zeros = np.zeros(size, np.uint8)
    payload = encode_chain(list(chain[1:]), zeros, CodecContext(size, None)) if len(chain) > 1 else zeros
    return Encoding(list(chain), payload, max(depths, default=0))


def _sample_slices(nbytes: int, block_bytes: int) -> list[slice]:
    """SAMPLES evenly spaced slices of SAMPLE_BYTES, at offsets aligned to 64 bytes, each
    inside one block (a blocked base decodes one block for it)."""
    step = (nbytes - SAMPLE_BYTES) // (SAMPLES - 1)
    starts = [i * step // 64 * 64 for i in range(SAMPLES)]
    if block_bytes:
        starts = [max(0, min(o, (o // block_bytes + 1) * block_bytes - SAMPLE_BYTES)) for o in starts]
    return [slice(o, o + SAMPLE_BYTES) for o in starts]


def block_encode(chain: Sequence[Codec], buf: np.ndarray, block_bytes: int, k: int, load_range: LoadRange) -> bytes:
    """Block k of `buf` coded by `chain`, its bases' bytes at the same offsets standing in
    for the bases."""
    start, stop = k * block_bytes, min(buf.nbytes, (k + 1) * block_bytes)
    if not chain:
        return bytes(buf[start:stop])
    return encode_chain(chain, buf[start:stop], CodecContext(stop - start, lambda o: load_range(o, start, stop)))


def smallest(
    candidates: list[list[Codec]],
    transforms: list[list[Codec]],
    buf: np.ndarray,
    load: Load,
    load_range: LoadRange,
    block_bytes: int,
) -> Coded | Deferred:
    """The chain with the smallest output, coded (raw if nothing saves a byte) whole or in
    blocks, or `Deferred`: to be coded in blocks as it is written. Large buffers choose
    among `candidates` on a few samples, then encode once; `transforms` (they need whole
    tensors) are always encoded in full, first: when one stores the tensor in under half of
    what the samples promise for the best candidate (a cast, a quantization, a merged
    adapter), that candidate is not encoded. A buffer over `block_bytes` whose best
    candidate is blockwise (and does not predict) is coded in blocks: with no transform to
    measure it against, deferred (the samples judge it against raw storage), so that writers
    code the blocks in parallel as they write them. Raw content over a block is deferred too
    (raw blocks all the same size: readers stream them)."""
    estimate = None
    blocked = bool(block_bytes) and buf.nbytes > block_bytes
    if (buf.nbytes > SAMPLE_FROM or blocked) and (len(candidates) > 1 or transforms or blocked):
        slices = _sample_slices(buf.nbytes, block_bytes if blocked else 0)

        def sampled(chain: list[Codec]) -> int:
            return sum(
                len(
                    encode_chain(
                        chain, buf[s], CodecContext(s.stop - s.start, lambda o, s=s: load_range(o, s.start, s.stop))
                    )
                )
                for s in slices
            )

        sizes = [sampled(c) for c in candidates]
        pick = min(range(len(candidates)), key=sizes.__getitem__)
        candidates = [candidates[pick]]
        estimate = sizes[pick] * buf.nbytes / sum(s.stop - s.start for s in slices)
    best = Coded([], buf)
    for chain in transforms:
        if len(best.payload) * 64 < buf.nbytes:
            break  # a transform already explains it (per-row int8: no need to try per-tensor)
        payload = encode_chain(chain, buf, CodecContext(buf.nbytes, load))
        if len(payload) < len(best.payload):
            best = Coded(chain, payload)
    for chain in candidates:
        if transforms and estimate is not None and len(best.payload) < estimate / 2:
            break
        if blocked and blockwise(chain) and not any(c.predictive for c in chain):
            if not transforms:
                assert estimate is not None
                return Deferred(chain if estimate < buf.nbytes else [], block_bytes)
            count = -(-buf.nbytes // block_bytes)
            frames = [block_encode(chain, buf, block_bytes, k, load_range) for k in range(count)]
            if sum(len(f) for f in frames) <= len(best.payload):
                best = Coded(chain, frames, block_bytes)
            continue
        payload = encode_chain(chain, buf, CodecContext(buf.nbytes, load)) if chain else buf
        if len(payload) <= len(best.payload):
            best = Coded(chain, payload)
    if blocked and not best.codecs and not best.blocks:
        return Deferred([], block_bytes)
    return best
