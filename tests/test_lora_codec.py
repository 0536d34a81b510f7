"""The `lora_merge` codec: any content round-trips exactly whatever its bases (a wrong
prediction costs space); torch's own W + (B A) x scale is predicted bit for bit on this
machine's CPU (float32 and bfloat16 weights, transposed layers); forged parameters and bases
of the wrong sizes are refused."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import needs_torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit.codecs import CodecContext, CodecError, LoraMergeCodec, codec_from_dict, decode_chain, encode_chain

IDS = ["a" * 64, "b" * 64, "c" * 64]


def _context(objects: dict[str, np.ndarray], size: int) -> CodecContext:
    return CodecContext(size, lambda oid: objects[oid].reshape(-1).view(np.uint8))


def _factors(rng: np.random.Generator, out: int, inp: int, rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = (rng.standard_normal((out, inp)) * 0.05).astype(np.float32)
    b = (rng.standard_normal((out, rank)) * 0.02).astype(np.float32)
    a = (rng.standard_normal((rank, inp)) * 0.02).astype(np.float32)
    return w, b, a


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), rank=st.integers(1, 9), transpose=st.booleans(), noise=st.booleans())
def test_any_content_round_trips(seed: int, rank: int, transpose: bool, noise: bool) -> None:
    rng = np.random.default_rng(seed)
    w, b, a = _factors(rng, 12, 7, rank)
    if transpose:
        w = np.ascontiguousarray(w.T)
    content = w + (rng.standard_normal(w.shape).astype(np.float32) if noise else 0)
    codec = LoraMergeCodec(bases=IDS, rank=rank, scale=1.5, transpose=transpose, dtype="F32", factor_dtype="F32")
    ctx = _context({IDS[0]: w, IDS[1]: b, IDS[2]: a}, content.nbytes)
    chain = [codec, codec_from_dict({"name": "zstd", "configuration": {"level": 3}})]
    payload = encode_chain(chain, content.view(np.uint8).reshape(-1), ctx)
    assert bytes(decode_chain(chain, payload, ctx)) == content.tobytes()


@needs_torch
@pytest.mark.parametrize(("dtype", "transpose", "rank", "scale"), [("F32", False, 8, 2.0), ("F32", True, 16, 16 / 6),
                         ("BF16", False, 4, 0.5), ("F32", False, 64, 1.0)])  # fmt: skip
def test_torchs_merge_is_predicted_exactly(dtype: str, transpose: bool, rank: int, scale: float) -> None:
    import torch

    w, b, a = _factors(np.random.default_rng(rank), 384, 256, rank)
    tw = torch.from_numpy(np.ascontiguousarray(w.T) if transpose else w)
    if dtype == "BF16":
        tw = tw.to(torch.bfloat16)
    delta = (torch.from_numpy(b) @ torch.from_numpy(a)) * scale
    merged = tw.clone()
    merged += delta.T if transpose else delta  # as peft merges: in place, in the weight's dtype
    raw = lambda t: t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()  # noqa: E731
    content = np.ascontiguousarray(raw(merged)).reshape(-1).view(np.uint8)
    codec = LoraMergeCodec(bases=IDS, rank=rank, scale=scale, transpose=transpose, dtype=dtype, factor_dtype="F32")
    ctx = _context({IDS[0]: np.ascontiguousarray(raw(tw)), IDS[1]: b, IDS[2]: a}, content.size)
    assert not np.asarray(codec.encode(content, ctx)).any()  # the residual is zeros


def test_forged_parameters_and_bases_are_refused() -> None:
    good = {"bases": IDS, "rank": 2, "scale": 1.0, "transpose": False, "dtype": "F32", "factor_dtype": "F32"}
    for bad in ({"bases": IDS[:2]}, {"rank": 0}, {"rank": True}, {"scale": float("nan")}, {"transpose": 1},
                {"dtype": "I8"}, {"factor_dtype": "F64"}, {"bases": ["x", *IDS[1:]]}):  # fmt: skip
        with pytest.raises(ValueError):
            LoraMergeCodec(**{**good, **bad})
    codec = LoraMergeCodec(**good)
    w, b, a = _factors(np.random.default_rng(0), 4, 3, 2)
    with pytest.raises(CodecError, match="do not fit|does not fit"):
        codec.decode(np.zeros(w.nbytes + 4, np.uint8), _context({IDS[0]: w, IDS[1]: b, IDS[2]: a}, w.nbytes + 4))
    with pytest.raises(CodecError, match="do not fit|does not fit"):
        codec.decode(np.zeros(w.nbytes, np.uint8), _context({IDS[0]: w, IDS[1]: b[:3], IDS[2]: a}, w.nbytes))
    with pytest.raises(CodecError, match="needs its bases"):
        codec.decode(np.zeros(w.nbytes, np.uint8), CodecContext(w.nbytes, None))
