"""PEFT adapters made the way people make them: `get_peft_model(base, config)`, the adapter's
weights moved off their initial values (a trained adapter's are not zeros), `save_pretrained`.

make_adapter(base_dir, out_dir, kind="lora", r=8, seed=0)
    an adapter folder (adapter_config.json, adapter_model.safetensors) for the transformers
    model saved in base_dir; kind is "lora", "dora" (LoRA with DoRA), "ia3" or "loha" (a type
    MGit keeps as its tensors); its `base_model_name_or_path` is base_dir unless `base_name`
make_base(out_dir, seed=0, dtype=None, arch="bert")  a tiny BERT (or GPT-2) of random weights, saved
half_adapter(adapter_dir)  its weights rewritten in bfloat16, as an adapter trained in bfloat16 is saved
merged_by_peft(base_dir, adapter_dir)  peft's merge_and_unload of the two: {name: tensor}

Both the tests and benchmarks/formats.py call these (all-MiniLM-L6-v2 as the base there).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

TINY = {
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 256,
    "vocab_size": 256,
    "max_position_embeddings": 32,
}
TARGETS = {
    "lora": ["query", "value"],
    "dora": ["query", "value"],
    "ia3": ["key", "value", "output.dense"],
    "loha": ["query", "value"],
}


GPT2 = {"n_embd": 128, "n_layer": 2, "n_head": 4, "vocab_size": 256, "n_positions": 32}


def make_base(out_dir: Path, seed: int = 0, dtype: torch.dtype | None = None, *, arch: str = "bert") -> Path:
    """A tiny model of random weights: BERT, or GPT-2 (`arch="gpt2"`: Conv1D layers, whose
    weights are in x out, which peft adapts with fan_in_fan_out)."""
    from transformers import AutoModel, BertConfig, GPT2Config

    torch.manual_seed(seed)
    model = AutoModel.from_config(BertConfig(**TINY) if arch == "bert" else GPT2Config(**GPT2))
    (model if dtype is None else model.to(dtype)).save_pretrained(out_dir)
    return out_dir


def half_adapter(adapter_dir: Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """The adapter's weights rewritten in `dtype` (as an adapter trained in bfloat16 is saved)."""
    from safetensors.torch import load_file, save_file

    path = adapter_dir / "adapter_model.safetensors"
    save_file({k: v.to(dtype) for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
    return adapter_dir


def _config(kind: str, r: int, targets: list[str], options: dict[str, Any]):
    import peft

    if kind in ("lora", "dora"):
        return peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, use_dora=kind == "dora", **options)
    if kind == "ia3":
        return peft.IA3Config(target_modules=targets, feedforward_modules=["output.dense"], **options)
    if kind == "loha":
        return peft.LoHaConfig(r=r, alpha=2 * r, target_modules=targets, **options)
    raise ValueError(f"unknown adapter kind {kind!r}")


def make_adapter(
    base_dir: Path,
    out_dir: Path,
    kind: str = "lora",
    r: int = 8,
    seed: int = 0,
    *,
    targets: list[str] | None = None,
    base_name: str | None = None,
    **options: Any,
) -> Path:
    """An adapter of `kind` for the model in base_dir, saved in out_dir; its weights random
    (scaled as a few training steps leave them), from `seed`. `options` go to peft's config
    (`fan_in_fan_out`, `use_rslora`, `modules_to_save`, `rank_pattern` ...)."""
    import peft
    from transformers import AutoModel

    base = AutoModel.from_pretrained(base_dir)
    model = peft.get_peft_model(base, _config(kind, r, targets or TARGETS[kind], options))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                if kind == "ia3":
                    p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
                elif "magnitude" in name:
                    p.mul_(1 + 0.05 * torch.randn(p.shape, generator=g))
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    model.save_pretrained(out_dir)
    config = out_dir / "adapter_config.json"
    data = json.loads(config.read_text())
    data["base_model_name_or_path"] = base_name if base_name is not None else str(base_dir)
    config.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out_dir


def merged_by_peft(base_dir: Path, adapter_dir: Path) -> dict[str, torch.Tensor]:
    """What peft's `merge_and_unload` makes of the base and the adapter: the merged state dict."""
    import peft
    from transformers import AutoModel

    model = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(base_dir), adapter_dir)
    return {k: v.detach().clone() for k, v in model.merge_and_unload().state_dict().items()}
