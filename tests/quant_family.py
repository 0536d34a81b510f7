"""Quantized models written the way the libraries write them, from a float model folder
(a `model.safetensors` and a `config.json`): the tests' and the benchmark's builders.

write_fp8(model_dir, out_dir, per_channel=False)   compressed-tensors float-quantized FP8: each
        linear weight in a layer as F8_E4M3 (`(w / scale).clamp(-448, 448).to(float8_e4m3fn)`,
        scale = absmax / 448 per tensor [1] or per row [out, 1], F32) and `x.weight_scale`
write_gptq(model_dir, out_dir, bits=4, group_size=32)   AutoGPTQ v1: round-to-nearest symmetric
        quantization (GPTQ's layout without its error correction), `qweight`, `qzeros` (minus
        one), F16 `scales`, `g_idx`
write_awq(model_dir, out_dir, group_size=32)   AutoAWQ GEMM: 4-bit asymmetric, packed along the
        output dimension in the order [0, 2, 4, 6, 1, 3, 5, 7]
write_tiny_llama(out_dir)   a small random Llama-shaped model (transformers), float32
rtn(w, bits, group_size, sym)   the integer values, zeros and F16 scales the int writers pack

Which tensors are quantized: the 2-D `.weight`s inside numbered layers (the linear layers of
the transformer blocks, as the libraries' default targets); the rest is copied as it is.
The compressed-tensors package (0.20) needs torch >= 2.10 and transformers and writes a model
only through llm-compressor's calibration, so these follow its documented layout instead.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

LAYER = re.compile(r"\.(layer|layers|h|blocks)\.\d+\.")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
FP8_MAX = 448.0


def quantized_names(tensors: dict[str, torch.Tensor]) -> list[str]:
    return [n for n, t in tensors.items() if n.endswith(".weight") and t.dim() == 2 and LAYER.search(n)]


def _copy(model_dir: Path, out_dir: Path, quantization_config: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for f in Path(model_dir).iterdir():
        if f.is_file() and f.name != "model.safetensors" and f.name != "config.json":
            shutil.copy2(f, out_dir / f.name)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    config["quantization_config"] = quantization_config
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))


def write_fp8(model_dir: Path, out_dir: Path, per_channel: bool = False) -> Path:
    tensors = load_file(Path(model_dir) / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    targets = set(quantized_names(tensors))
    for name, w in tensors.items():
        if name not in targets:
            out[name] = w
            continue
        amax = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().reshape(1)
        scale = (amax / FP8_MAX).to(torch.float32)
        out[name] = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        out[name.removesuffix("weight") + "weight_scale"] = scale
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    save_file(out, Path(out_dir) / "model.safetensors")
    strategy = "channel" if per_channel else "tensor"
    _copy(
        model_dir,
        Path(out_dir),
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": strategy, "symmetric": True},
                    "input_activations": None,
                }
            },
            "ignore": [],
        },
    )
    return Path(out_dir)


def rtn(w: np.ndarray, bits: int, group_size: int, sym: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Round-to-nearest of a float matrix [out, in] by groups of `group_size` input columns:
    (q [in, out] int32, zeros [groups, out] int32, scales [groups, out] float16)."""
    maxq = (1 << bits) - 1
    out_dim, in_dim = w.shape
    g = w.astype(np.float32).reshape(out_dim, in_dim // group_size, group_size)
    if sym:
        xmax = np.maximum(np.abs(g).max(axis=2), 1e-8)
        scale, zero = 2 * xmax / maxq, np.full(xmax.shape, (maxq + 1) // 2)
    else:
        lo, hi = np.minimum(g.min(axis=2), 0), np.maximum(g.max(axis=2), 0)
        scale = np.maximum(hi - lo, 1e-8) / maxq
        zero = np.clip(np.rint(-lo / scale), 0, maxq)
    scales = scale.astype(np.float16)
    q = np.clip(np.rint(g / scales[..., None].astype(np.float32)) + zero[..., None], 0, maxq)
    return q.reshape(out_dim, in_dim).T.astype(np.int32), zero.T.astype(np.int32), scales.T.copy()


def pack(values: np.ndarray, bits: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    """Unsigned values packed 32/bits per int32 along the last axis (slot j of word c holds
    value c*per + order[j])."""
    per = 32 // bits
    v = values.astype(np.uint32).reshape(*values.shape[:-1], values.shape[-1] // per, per)
    if order is not None:
        v = v[..., list(order)]
    words = np.zeros(v.shape[:-1], np.uint32)
    for j in range(per):
        words |= v[..., j] << np.uint32(bits * j)
    return words.view(np.int32)


def _int_model(
    model_dir: Path, out_dir: Path, config: dict, layer: Callable[[np.ndarray], dict[str, np.ndarray]]
) -> Path:
    tensors = load_file(Path(model_dir) / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    targets = set(quantized_names(tensors))
    for name, w in tensors.items():
        if name not in targets:
            out[name] = w
            continue
        base = name.removesuffix(".weight")
        for role, value in layer(w.float().numpy()).items():
            out[f"{base}.{role}"] = torch.from_numpy(np.ascontiguousarray(value))
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    save_file(out, Path(out_dir) / "model.safetensors")
    _copy(model_dir, Path(out_dir), config)
    return Path(out_dir)


def write_gptq(model_dir: Path, out_dir: Path, bits: int = 4, group_size: int = 32) -> Path:
    def layer(w: np.ndarray) -> dict[str, np.ndarray]:
        q, zeros, scales = rtn(w, bits, group_size, sym=True)
        return {
            "qweight": pack(q.T, bits).T,  # packed along the input dimension
            "qzeros": pack(zeros - 1, bits),
            "scales": scales,
            "g_idx": (np.arange(w.shape[1]) // group_size).astype(np.int32),
        }

    config = {
        "quant_method": "gptq",
        "bits": bits,
        "group_size": group_size,
        "desc_act": False,
        "sym": True,
        "damp_percent": 0.01,
        "true_sequential": True,
        "checkpoint_format": "gptq",
    }
    return _int_model(model_dir, out_dir, config, layer)


def write_awq(model_dir: Path, out_dir: Path, group_size: int = 32) -> Path:
    def layer(w: np.ndarray) -> dict[str, np.ndarray]:
        q, zeros, scales = rtn(w, 4, group_size, sym=False)
        return {"qweight": pack(q, 4, AWQ_ORDER), "qzeros": pack(zeros, 4, AWQ_ORDER), "scales": scales}

    config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "version": "gemm", "zero_point": True}
    return _int_model(model_dir, out_dir, config, layer)


def write_tiny_llama(out_dir: Path, seed: int = 0) -> Path:
    """A Llama-shaped model of random weights (hidden 128, 2 layers), saved by transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    LlamaForCausalLM(config).save_pretrained(out_dir)
    return Path(out_dir)
