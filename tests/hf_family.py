"""A family of transformers 5 `save_pretrained` folders, made the way people make them: a base
saved from `AutoModel`, a fine-tune, a task model (`AutoModelForSequenceClassification`, every
name under `bert.` plus a new head), a merged LoRA, fp16 and bf16 casts, a second fine-tune
saved in shards (`max_shard_size`) and an exact copy. transformers 5 drops the non-persistent
`embeddings.position_ids` buffer on save, so no member saved here holds it, while the base,
saved by older versions as models on the Hub were, does (`_with_position_ids` adds it to the
tiny one).

build_family(root, base=None)   the folders under root, {name: (folder, parent, relation)}; and
                                root/task-body, the task model's `bert` alone (no prefix, no head)

`base` is a folder of a BERT model (all-MiniLM-L6-v2 in the benchmark); without it a tiny BERT
of random weights is made, small enough for the tests.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

TINY = {
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 64,
}
# name: (parent, relation), in the order they are added
FAMILY = {
    "base": (None, None),
    "ft": ("base", "finetune"),
    "task": ("base", "finetune"),
    "lora-merged": ("base", "adapter"),
    "base-fp16": ("base", "quantize"),
    "ft-bf16": ("ft", "quantize"),
    "ft2-sharded": ("base", "finetune"),
    "base-copy": ("base", "other"),
}


def _perturb(model: torch.nn.Module, layers: tuple[int, ...] | None, scale: float, seed: int) -> None:
    """A fine-tune's change: noise of `scale` times each tensor's RMS on the given layers (on
    every tensor without them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if layers is None or any(f"layer.{k}." in name for k in layers):
                p.add_(torch.randn(p.shape, generator=g) * scale * p.float().pow(2).mean().sqrt())


def _train(model: torch.nn.Module, steps: int, seed: int, lr: float = 2e-5) -> None:
    """A fine-tune as people run one: Adam steps on batches of random tokens, on the model's own
    loss for a task model (random labels), else on the size of its last hidden state."""
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        tokens = torch.randint(0, vocab, (8, 16), generator=g)
        if hasattr(model, "classifier"):
            labels = torch.randint(0, model.config.num_labels, (8,), generator=g)
            loss = model(input_ids=tokens, labels=labels).loss
        else:
            loss = model(input_ids=tokens).last_hidden_state.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def _lora(model: torch.nn.Module, rank: int, seed: int) -> None:
    """A LoRA of `rank` on every query and value projection, merged (W + B A)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("query.weight", "value.weight")):
                b = torch.randn(p.shape[0], rank, generator=g) * 0.02
                a = torch.randn(rank, p.shape[1], generator=g) * 0.02
                p.add_(b @ a)


def build_family(root: Path, base: Path | None = None) -> dict[str, tuple[Path, str | None, str | None]]:
    """Every member of FAMILY saved under root/NAME; returns {name: (folder, parent, relation)}."""
    from transformers import AutoModel, AutoModelForSequenceClassification, BertConfig

    torch.manual_seed(0)
    model = AutoModel.from_config(BertConfig(**TINY)) if base is None else AutoModel.from_pretrained(base)
    model.eval()
    out = {name: (root / name, parent, relation) for name, (parent, relation) in FAMILY.items()}
    model.save_pretrained(root / "base")
    if base is None:
        _with_position_ids(root / "base" / "model.safetensors", TINY["max_position_embeddings"])
    else:
        shutil.copy(base / "model.safetensors", root / "base" / "model.safetensors")
    shutil.copytree(root / "base", root / "base-copy")
    model.half().save_pretrained(root / "base-fp16")
    model = AutoModel.from_pretrained(root / "base")
    _train(model, steps=10, seed=1)
    model.save_pretrained(root / "ft")
    model.to(torch.bfloat16).save_pretrained(root / "ft-bf16")
    model = AutoModel.from_pretrained(root / "base")
    _perturb(model, (0,), 0.03, seed=4)
    model.save_pretrained(root / "ft2-sharded", max_shard_size=_size(model) // 3)
    task = AutoModelForSequenceClassification.from_pretrained(root / "base", num_labels=3)
    _train(task, steps=10, seed=2)
    task.save_pretrained(root / "task")
    task.bert.save_pretrained(root / "task-body")  # the same fine-tune without the prefix, to compare
    model = AutoModel.from_pretrained(root / "base")
    _lora(model, rank=4, seed=3)
    model.save_pretrained(root / "lora-merged")
    return out


def _size(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def _with_position_ids(path: Path, positions: int) -> None:
    """The file as transformers 4 saved it: with the `embeddings.position_ids` buffer."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    tensors["embeddings.position_ids"] = torch.arange(positions).unsqueeze(0)
    save_file(dict(sorted(tensors.items())), path, metadata={"format": "pt"})
