"""An LLM-shaped model family, generated: a bf16 base of about 1.08 GB (or, with more layers,
4 GB) in two safetensors shards with their index and a config, a fine-tune of it, and a
fine-tune of the fine-tune.

The base is a decoder of `layers` blocks (four hidden x hidden attention matrices and three
hidden x ffn MLP matrices each, two norms), a vocab x hidden embedding and head; weights are
normal with std 0.02, cast to bfloat16 (round to nearest even). Each generation after it is
its parent plus 0.2% relative noise, cast back to bf16: about 18% of the values move by a
unit or two in the last place, as a short full fine-tune of a large model does. Tensors are
generated and written one at a time (memory stays near the largest tensor, whatever the
model's size), each from its own seed, so a generation is the same however it is built.
Folders are written once under `.cache/bench/` and reused (their recipe is in the name).

    python benchmarks/llm_family.py                  # build (or find) the 1.08 GB family, print its sizes
    python benchmarks/llm_family.py --layers 36      # the 4 GB family of the same shape
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from mgit.codecs.derived import to_bfloat16_bits  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
GENERATOR = 2  # bumped when the values a recipe generates change (old folders are not reused)


@dataclass(frozen=True)
class Shape:
    vocab: int = 32000
    hidden: int = 2048
    ffn: int = 5632
    layers: int = 8
    seed: int = 7

    @property
    def key(self) -> str:
        return f"llm-g{GENERATOR}-v{self.vocab}-h{self.hidden}-f{self.ffn}-l{self.layers}-s{self.seed}"

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, self.hidden))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out += [
                (f"{p}.self_attn.{m}.weight", (self.hidden, self.hidden))
                for m in ("q_proj", "k_proj", "v_proj", "o_proj")
            ]
            out += [
                (f"{p}.mlp.gate_proj.weight", (self.ffn, self.hidden)),
                (f"{p}.mlp.up_proj.weight", (self.ffn, self.hidden)),
                (f"{p}.mlp.down_proj.weight", (self.hidden, self.ffn)),
            ]
            out += [
                (f"{p}.input_layernorm.weight", (self.hidden,)),
                (f"{p}.post_attention_layernorm.weight", (self.hidden,)),
            ]
        out += [("model.norm.weight", (self.hidden,)), ("lm_head.weight", (self.vocab, self.hidden))]
        return out


def tensor(shape: Shape, index: int, dims: tuple[int, ...], generation: int, noise: float) -> np.ndarray:
    """The bf16 bit patterns of tensor `index` in `generation` (0 is the base): the base drawn
    from this tensor's seed, each later generation its parent with relative noise."""
    if len(dims) == 1:
        return to_bfloat16_bits(np.ones(dims, np.float32))  # norms: the same in every generation
    w = np.random.default_rng([shape.seed, index, 0]).standard_normal(dims, dtype=np.float32)
    w *= np.float32(0.02)
    bits = to_bfloat16_bits(w)
    for g in range(1, generation + 1):
        w = (bits.astype(np.uint32) << 16).view(np.float32)  # the parent's bf16 values, exactly
        w *= 1 + np.random.default_rng([shape.seed, index, g]).standard_normal(dims, dtype=np.float32) * np.float32(
            noise
        )
        bits = to_bfloat16_bits(w)
    return bits


def write_safetensors(path: Path, specs: list[tuple[str, tuple[int, ...]]], values: Iterator[np.ndarray]) -> int:
    """A safetensors file of BF16 tensors, the header from `specs` and each tensor's bit
    patterns (uint16) drawn from `values` in order and written as it comes."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in specs:
        size = 2 * int(np.prod(shape))
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(body)) + body)
        for (_, shape), bits in zip(specs, values, strict=True):
            assert bits.shape == shape and bits.dtype == np.uint16
            fh.write(memoryview(bits).cast("B"))
    return 8 + len(body) + offset


def _folder(path: Path, shape: Shape, generation: int, noise: float) -> None:
    names = shape.tensors()
    index_of = {name: i for i, (name, _) in enumerate(names)}
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    path.mkdir(parents=True, exist_ok=True)
    total = 0
    for file, members in shards.items():
        values = (tensor(shape, index_of[n], s, generation, noise) for n, s in members)
        total += write_safetensors(path / file, members, values)
    index = {"metadata": {"total_size": total}, "weight_map": {n: f for f, ms in shards.items() for n, _ in ms}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn,
        "num_hidden_layers": shape.layers,
        "vocab_size": shape.vocab,
        "torch_dtype": "bfloat16",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))


def build(shape: Shape = Shape(), *, noise: float = 0.002, generations: int = 1) -> list[Path]:
    """[base, fine-tune, fine-tune of the fine-tune, ...]: the base and `generations`
    fine-tunes, each of the one before, generated once and reused."""
    top = CACHE / shape.key
    folders = [top / "base"] + [top / f"ft{g}-{noise:g}" for g in range(1, generations + 1)]
    for g, folder in enumerate(folders):
        done = top / f".built-{folder.name}"
        if not done.exists():
            _folder(folder, shape, g, noise)
            done.write_text("ok\n")
    return folders


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=Shape.layers)
    parser.add_argument("--generations", type=int, default=1)
    args = parser.parse_args()
    for folder in build(Shape(layers=args.layers), generations=args.generations):
        print(f"{folder}: {folder_bytes(folder) / 1e9:.2f} GB")
