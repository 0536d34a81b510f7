"""Derived tensors: a child predicted from its parent's tensor by a known transform, plus an
exact residual.

Each codec computes the prediction from the base object and XORs it with the content, so
what remains is zero wherever the transform explains the child, and the chain that follows
(zstd) stores those zeros in almost nothing. The residual makes every codec lossless whatever
the prediction: a wrong guess costs space, never correctness.

- `cast`: a float32 parent cast to bfloat16 or float16 (round to nearest even).
- `quantize_int8`: symmetric int8 quantization of a float32 matrix, per row
  (scale = max|row| / 127, q = clip(round(w / scale), -127, 127)).
- `absmax_scale`: the float32 per-row scales of that quantization.
- `patch`: elements equal to the parent cost one bit; the others are stored as they are
  (magnitude pruning: the kept half is the parent's, the pruned half is zeros).
- `low_rank`: a float32 matrix that is its parent's plus a product of two thin factors (a
  merged LoRA adapter): the factors, then the exact residual.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mgit.codecs.base import (
    Buffer,
    Codec,
    CodecContext,
    CodecError,
    byte_array,
    check_int_width,
    check_oid,
    load_base,
    register,
    unzigzag,
    writable,
    zigzag,
)


def _base_f32(codec: Codec, ctx: CodecContext) -> np.ndarray:
    base = load_base(codec.name, codec.base, ctx)  # type: ignore[attr-defined]
    if base.size % 4:
        raise CodecError(f"{codec.name}: base is not float32")
    return base.view("<f4")


def _xor_prediction(data: Buffer, predicted: np.ndarray, *, decoding: bool = False) -> np.ndarray:
    out = writable(data) if decoding else byte_array(data).copy()
    pred = predicted.reshape(-1).view(np.uint8)
    if pred.size != out.size:
        raise CodecError(f"prediction has {pred.size} bytes for {out.size}")
    np.bitwise_xor(out, pred, out=out)
    return out


class PredictionCodec(Codec):
    """A codec that XORs the content with a prediction made from its base: encode and decode
    are the same operation. Subclasses say how to predict."""

    storage = "derived"
    predictive = True
    ends_family = True

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        raise NotImplementedError

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        return _xor_prediction(data, self._predict(ctx))

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        return _xor_prediction(data, self._predict(ctx), decoding=True)


def _check_rows(rows: object) -> None:
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise ValueError(f"rows must be a positive integer, not {rows!r}")


def to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even (as torch does)."""
    bits = values.astype("<f4", copy=False).view("<u4")
    tmp = bits >> 16  # one temporary, then in place: (bits + 0x7FFF + lsb) >> 16, wrapping as uint32
    tmp &= 1
    tmp += 0x7FFF
    tmp += bits
    tmp >>= 16
    rounded = tmp.astype("<u2")
    nan = np.isnan(values)
    rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype("<u2")  # quiet NaN, sign kept
    return rounded


@register
@dataclass(frozen=True)
class CastCodec(PredictionCodec):
    name = "cast"
    base: str
    to: str  # "BF16" or "F16"

    def __post_init__(self) -> None:
        check_oid(self.base)
        if self.to not in ("BF16", "F16"):
            raise ValueError(f"cast to {self.to!r} is not supported")

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        base = _base_f32(self, ctx)
        if self.to == "BF16":
            return to_bfloat16_bits(base)
        with np.errstate(over="ignore", invalid="ignore"):
            return base.astype("<f2")


def _rows(codec: Codec, ctx: CodecContext, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The base as a float32 matrix of `rows` rows, and its per-row absmax scales."""
    base = _base_f32(codec, ctx)
    if rows <= 0 or base.size % rows:
        raise CodecError(f"{codec.name}: base of {base.size} values has no {rows} equal rows")
    matrix = base.reshape(rows, -1)
    if not matrix.size:
        return matrix, np.zeros(rows, "<f4")
    with np.errstate(invalid="ignore", over="ignore"):
        scale = (np.abs(matrix).max(axis=1) / np.float32(127)).astype("<f4")
    return matrix, scale


@dataclass(frozen=True)
class RowwiseCodec(PredictionCodec):
    """A prediction from a float32 base read as a matrix of `rows` rows."""

    base: str
    rows: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        _check_rows(self.rows)


@register
@dataclass(frozen=True)
class QuantizeInt8Codec(RowwiseCodec):
    name = "quantize_int8"

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        matrix, scale = _rows(self, ctx, self.rows)
        safe = np.where(scale == 0, np.float32(1), scale)[:, None]
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            q = matrix / safe  # one temporary; the rest in place (this runs on every checkout)
            np.rint(q, out=q)
            np.clip(q, -127, 127, out=q)  # infinities become +-127
        q[np.isnan(q)] = 0  # as nan_to_num would
        return q.astype(np.int8)


@register
@dataclass(frozen=True)
class AbsmaxScaleCodec(RowwiseCodec):
    name = "absmax_scale"

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        return _rows(self, ctx, self.rows)[1]


@register
@dataclass(frozen=True)
class PatchCodec(Codec):
    """Output: a bitmap (one bit per item, set where the item equals the base's), then the
    items that differ, in order. Items past the end of the base always differ."""

    name = "patch"
    blockwise = True
    storage = "delta"
    ends_family = True
    base: str
    itemsize: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        check_int_width(self.itemsize)

    def _base(self, ctx: CodecContext, count: int) -> np.ndarray:
        base = load_base(self.name, self.base, ctx)
        whole = base.size - base.size % self.itemsize
        return base[:whole].view(f"<u{self.itemsize}")[:count]

    def max_decoded(self, n: int) -> int:
        return 8 * n * self.itemsize  # one bit of bitmap per item at the least

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raw = byte_array(data)
        if raw.size % self.itemsize:
            raise CodecError(f"{raw.size} bytes is not a whole number of {self.itemsize}-byte items")
        items = raw.view(f"<u{self.itemsize}")
        base = self._base(ctx, items.size)
        same = np.zeros(items.size, bool)
        same[: base.size] = items[: base.size] == base
        return np.concatenate([np.packbits(same), items[~same].view(np.uint8)])

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        count = ctx.size // self.itemsize
        raw = byte_array(data)
        nbitmap = -(-count // 8)
        if ctx.size % self.itemsize or raw.size < nbitmap:
            raise CodecError("patch data is shorter than its bitmap")
        same = np.unpackbits(raw[:nbitmap], count=count).astype(bool)
        differ = raw[nbitmap:]
        if differ.size != int((~same).sum()) * self.itemsize:
            raise CodecError("patch data does not match its bitmap")
        base = self._base(ctx, count)
        if int(same[base.size :].sum()):
            raise CodecError("patch bitmap refers past the end of its base")
        out = np.empty(count, f"<u{self.itemsize}")
        out[: base.size] = base
        out[~same] = differ.view(f"<u{self.itemsize}")
        return out.view(np.uint8)


# --- low rank: a merged adapter ---------------------------------------------------------------

LOW_RANK_MAX = 64  # ranks above this are not adapters; the delta codecs store them as well
_PROBE = 64  # side of the sub-block whose singular values reveal a low rank
_GAP = 1e-4  # singular values below this share of the largest are rounding, not rank


def low_rank_of(child: Buffer, base: Buffer, rows: int) -> int | None:
    """The rank of `child - base` (float32 matrices of `rows` rows, as bytes) when it is
    small, as a merged LoRA adapter makes it (W + B A), else None. Judged on a sub-block of
    at most 64 x 64 (a rank-r matrix has rank r in almost every sub-block): cheap enough to
    ask of every changed matrix."""
    c32, b32 = byte_array(child), byte_array(base)
    if c32.size != b32.size or c32.size % (4 * rows):
        return None
    c32, b32 = c32.view("<f4"), b32.view("<f4")
    cols = c32.size // rows
    if rows < 2 * _PROBE or cols < 2 * _PROBE:
        return None
    step_r, step_c = rows // _PROBE, cols // _PROBE
    c = c32.reshape(rows, cols)[::step_r, ::step_c][:_PROBE, :_PROBE].astype(np.float64)
    b = b32.reshape(rows, cols)[::step_r, ::step_c][:_PROBE, :_PROBE].astype(np.float64)
    delta = c - b
    if not np.isfinite(delta).all() or not delta.any():
        return None
    s = np.linalg.svd(delta, compute_uv=False)
    rank = int((s > s[0] * _GAP).sum())
    if rank > min(LOW_RANK_MAX, _PROBE // 4) or rank * (rows + cols) > rows * cols // 4:
        return None
    return rank


def _factors(delta: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """U (rows x rank) and V (rank x cols), float32, with U V close to `delta`: a randomized
    range finder with two power iterations, then an exact SVD of the small projection."""
    rng = np.random.default_rng(0)
    y = delta @ rng.standard_normal((delta.shape[1], rank + 8))
    for _ in range(2):
        y = delta @ (delta.T @ np.linalg.qr(y)[0])
    q = np.linalg.qr(y)[0]
    u, s, vt = np.linalg.svd(q.T @ delta, full_matrices=False)
    return (q @ u[:, :rank] * s[:rank]).astype("<f4"), vt[:rank].astype("<f4")


_PREDICTION_ROWS = 1024  # rows summed at a time: the float64 accumulator stays in cache (5x faster)


def _low_rank_prediction(base: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """float32(base + sum_k u[:, k] v[k]) in float64, term by term in order: every product of
    two float32 numbers is exact in float64 and each sum is one IEEE addition, so any machine
    computes the same bits (a BLAS matmul would not promise that). Computed a block of rows at
    a time, which changes no operation of any element."""
    out = np.empty(base.shape, dtype="<f4")
    v64 = v.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):  # signalling NaNs, overflow: bits are bits
        for start in range(0, base.shape[0], _PREDICTION_ROWS):
            rows = slice(start, start + _PREDICTION_ROWS)
            acc = base[rows].astype(np.float64)
            u64 = u[rows].astype(np.float64)
            for k in range(u.shape[1]):
                acc += u64[:, k : k + 1] * v64[k]
            out[rows] = acc
    return out


@register
@dataclass(frozen=True)
class LowRankCodec(Codec):
    """A float32 matrix predicted as its base plus a product of two thin factors (a merged
    LoRA adapter: W + B A), and the exact residual. Output: U (`rows` x `rank` float32),
    V (`rank` x cols float32), then the zig-zag difference of the content's bit patterns
    and the prediction's (as `sub_delta`): zero wherever the prediction is exact."""

    name = "low_rank"
    storage = "derived"
    predictive = True
    base: str
    rows: int
    rank: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        _check_rows(self.rows)
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or not 1 <= self.rank <= LOW_RANK_MAX:
            raise ValueError(f"rank must be an integer from 1 to {LOW_RANK_MAX}, not {self.rank!r}")

    def _base(self, ctx: CodecContext, size: int) -> np.ndarray:
        base = _base_f32(self, ctx)
        if base.size * 4 != size or base.size % self.rows:
            raise CodecError(f"{self.name}: base of {base.size} values does not match {size // 4} in {self.rows} rows")
        return base.reshape(self.rows, -1)

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raw = byte_array(data)
        base = self._base(ctx, raw.size)
        child = raw.view("<f4").reshape(base.shape)
        with np.errstate(invalid="ignore", over="ignore"):  # NaN and infinity: the residual keeps them
            delta = np.nan_to_num(child.astype(np.float64) - base, nan=0.0, posinf=0.0, neginf=0.0)
        u, v = _factors(delta, self.rank)
        residual = child.view("<u4") - _low_rank_prediction(base, u, v).view("<u4")  # wraps modulo 2**32
        return np.concatenate(
            [
                u.reshape(-1).view(np.uint8),
                v.reshape(-1).view(np.uint8),
                zigzag(residual.view("<i4")).reshape(-1).view(np.uint8),
            ]
        )

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raw = byte_array(data)
        base = self._base(ctx, ctx.size)
        rows, cols = base.shape
        nu, nv = rows * self.rank * 4, self.rank * cols * 4
        if raw.size != nu + nv + ctx.size:
            raise CodecError(f"low_rank data has {raw.size} bytes where {nu + nv + ctx.size} were expected")
        u = raw[:nu].copy().view("<f4").reshape(rows, self.rank)
        v = raw[nu : nu + nv].copy().view("<f4").reshape(self.rank, cols)
        out = unzigzag(raw[nu + nv :].copy().view("<u4")).view("<u4")
        out += _low_rank_prediction(base, u, v).reshape(-1).view("<u4")  # wraps modulo 2**32
        return out.view(np.uint8)


@register
@dataclass(frozen=True)
class TransposeCodec(PredictionCodec):
    """A matrix that is its base's transpose (a checkpoint converted between layouts that
    store a linear layer's weight as in x out or out x in): XOR with the base, read as `rows`
    rows of `itemsize`-byte items, transposed. Any dtype."""

    name = "transpose"
    base: str
    rows: int
    itemsize: int

    def __post_init__(self) -> None:
        check_oid(self.base)
        _check_rows(self.rows)
        check_int_width(self.itemsize)

    def _predict(self, ctx: CodecContext) -> np.ndarray:
        base = load_base(self.name, self.base, ctx)
        if base.size % (self.rows * self.itemsize):
            raise CodecError(f"{self.name}: base of {base.size} bytes has no {self.rows} equal rows")
        return np.ascontiguousarray(base.view(f"<u{self.itemsize}").reshape(self.rows, -1).T)
