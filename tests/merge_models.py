"""Tiny Llama-shaped models for the merge tests, the same bytes wherever they are built
(tests/fixtures/merge/make_fixtures.py builds them too, to run mergekit on them)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HIDDEN, INTERMEDIATE, VOCAB, LAYERS = 32, 64, 64, 4
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": VOCAB,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
    "tie_word_embeddings": False,
}
MODELS = {"base": (0, None), "ft1": (1, "base"), "ft2": (2, "base")}  # name: (seed, derived from)
BF16_MODELS = {"base-bf16": "base", "ft1-bf16": "ft1", "ft2-bf16": "ft2"}  # the same, rounded to bfloat16
CONFIGS = {  # what mergekit was run with; model names are the folders' (the repository's model names)
    "linear": "models:\n  - model: ft1\n    parameters: {weight: 0.7}\n  - model: ft2\n    parameters: {weight: 0.5}\n"
    "merge_method: linear\ndtype: float32\n",
    "slerp": "models:\n  - model: base\n  - model: ft1\nmerge_method: slerp\nbase_model: base\nparameters: {t: 0.3}\n"
    "dtype: float32\n",
    "task_arithmetic": "models:\n  - model: ft1\n    parameters: {weight: 0.6}\n"
    "  - model: ft2\n    parameters: {weight: 0.3}\n"
    "merge_method: task_arithmetic\nbase_model: base\nparameters: {lambda: 0.9}\ndtype: float32\n",
    "ties": "models:\n  - model: ft1\n    parameters: {weight: 0.6, density: 0.5}\n  - model: ft2\n"
    "    parameters: {weight: 0.4, density: 0.7}\nmerge_method: ties\nbase_model: base\n"
    "parameters: {normalize: true}\ndtype: float32\n",
    "linear_bf16": "models:\n  - model: ft1-bf16\n    parameters: {weight: 0.7}\n  - model: ft2-bf16\n"
    "    parameters: {weight: 0.5}\nmerge_method: linear\ndtype: bfloat16\n",
    "task_arithmetic_bf16": "models:\n  - model: ft1-bf16\n    parameters: {weight: 0.6}\n  - model: ft2-bf16\n"
    "    parameters: {weight: 0.3}\nmerge_method: task_arithmetic\nbase_model: base-bf16\n"
    "dtype: bfloat16\n",
    "dare_ties": "models:\n  - model: ft1\n    parameters: {weight: 0.5, density: 1.0}\n  - model: ft2\n"
    "    parameters: {weight: 0.5, density: 1.0}\nmerge_method: dare_ties\nbase_model: base\n"
    "dtype: float32\n",
    # Gradients (interpolated along the 4 layers) and filters (by a part of the tensor's name),
    # per model with the config's parameters as the fallback; the classic SLERP config of one slice.
    "slerp_gradient": "slices:\n  - sources:\n      - model: base\n        layer_range: [0, 4]\n      - model: ft1\n"
    "        layer_range: [0, 4]\nmerge_method: slerp\nbase_model: base\nparameters:\n  t:\n"
    "    - filter: self_attn\n      value: [0, 0.5, 0.3, 0.7, 1]\n    - filter: mlp\n"
    "      value: [1, 0.5, 0.7, 0.3, 0]\n    - value: 0.5\ndtype: float32\n",
    "ties_gradient": "models:\n  - model: ft1\n    parameters:\n      weight: [0.2, 0.8]\n"
    "      density: [{filter: mlp, value: 0.4}, {value: 0.9}]\n  - model: ft2\n    parameters:\n"
    "      weight: [{filter: self_attn, value: [1.0, 0.3, 0.6]}]\nmerge_method: ties\n"
    "base_model: base\nparameters: {normalize: true, weight: 0.5, density: 0.6}\ndtype: float32\n",
    "task_arithmetic_gradient": "models:\n  - model: ft1\n    parameters: {weight: [0.0, 1.0]}\n  - model: ft2\n"
    "    parameters: {weight: [{filter: mlp, value: 0.25}, {value: 0.75}]}\n"
    "merge_method: task_arithmetic\nbase_model: base\nparameters: {lambda: [1.0, 0.5]}\n"
    "dtype: float32\n",
}


def shapes() -> dict[str, tuple[int, ...]]:
    out = {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (VOCAB, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for proj in ("q", "k", "v", "o"):
            out[f"{p}self_attn.{proj}_proj.weight"] = (HIDDEN, HIDDEN)
        out[f"{p}mlp.gate_proj.weight"] = out[f"{p}mlp.up_proj.weight"] = (INTERMEDIATE, HIDDEN)
        out[f"{p}mlp.down_proj.weight"] = (HIDDEN, INTERMEDIATE)
        out[f"{p}input_layernorm.weight"] = out[f"{p}post_attention_layernorm.weight"] = (HIDDEN,)
    return out


def state(name: str) -> dict[str, np.ndarray]:
    seed, parent = MODELS[name]
    rng = np.random.default_rng(seed)
    base = state(parent) if parent else None
    out = {}
    for key, shape in sorted(shapes().items()):
        noise = rng.standard_normal(shape).astype(np.float32)
        out[key] = (noise * np.float32(0.1)) if base is None else (base[key] + noise * np.float32(0.02))
    return out


def write_model(folder: Path, name: str) -> Path:
    """The model `name` (of MODELS, or of BF16_MODELS: rounded to bfloat16) in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    if name in BF16_MODELS:
        from mgit.formats.safetensors import build_header
        from mgit.merging.recipe import encode_floats

        weights = state(BF16_MODELS[name])
        header, _ = build_header([(k, "BF16", v.shape) for k, v in weights.items()], {"format": "pt"})
        with open(folder / "model.safetensors", "wb") as fh:
            fh.write(header)
            for v in weights.values():
                fh.write(encode_floats(v, "BF16").tobytes())
        config = {**CONFIG, "torch_dtype": "bfloat16"}
    else:
        save_file(state(name), str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = CONFIG
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder
