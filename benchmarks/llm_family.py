"""An LLM-shaped model family, generated: a bf16 base of about 1.08 GB in two safetensors
shards with their index and a config, and a fine-tune of it.

The base is a decoder of `layers` blocks (four hidden x hidden attention matrices and three
hidden x ffn MLP matrices each, two norms), a vocab x hidden embedding and head; weights are
normal with std 0.02, cast to bfloat16 (round to nearest even). The fine-tune is the base
plus 0.2% relative noise, cast back to bf16: about 18% of the values move by a unit or two
in the last place, as a short full fine-tune of a large model does. Both are written once
under `.cache/bench/` and reused (their recipe is in the folder name).

    python benchmarks/llm_family.py            # build (or find) the default family, print its sizes
"""

from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from mgit.codecs.derived import to_bfloat16_bits  # noqa: E402

CACHE = ROOT / ".cache" / "bench"


@dataclass(frozen=True)
class Shape:
    vocab: int = 32000
    hidden: int = 2048
    ffn: int = 5632
    layers: int = 8
    seed: int = 7

    @property
    def key(self) -> str:
        return f"llm-v{self.vocab}-h{self.hidden}-f{self.ffn}-l{self.layers}-s{self.seed}"

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, self.hidden))]
        for i in range(self.layers):
            p = f"model.layers.{i}"
            out += [(f"{p}.self_attn.{m}.weight", (self.hidden, self.hidden)) for m in ("q_proj", "k_proj", "v_proj", "o_proj")]
            out += [(f"{p}.mlp.gate_proj.weight", (self.ffn, self.hidden)), (f"{p}.mlp.up_proj.weight", (self.ffn, self.hidden)),
                    (f"{p}.mlp.down_proj.weight", (self.hidden, self.ffn))]  # fmt: skip
            out += [(f"{p}.input_layernorm.weight", (self.hidden,)), (f"{p}.post_attention_layernorm.weight", (self.hidden,))]
        out += [("model.norm.weight", (self.hidden,)), ("lm_head.weight", (self.vocab, self.hidden))]
        return out


def write_safetensors(path: Path, tensors: list[tuple[str, tuple[int, ...], np.ndarray]]) -> int:
    """A safetensors file of BF16 tensors (given as uint16 bit patterns), in order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape, bits in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + bits.nbytes]}
        offset += bits.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(body)) + body)
        for _, _, bits in tensors:
            fh.write(bits.tobytes())
    return 8 + len(body) + offset


def _folder(path: Path, shape: Shape, values: dict[str, np.ndarray]) -> None:
    names = shape.tensors()
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half], "model-00002-of-00002.safetensors": names[half:]}
    path.mkdir(parents=True, exist_ok=True)
    total = 0
    for file, members in shards.items():
        total += write_safetensors(path / file, [(n, s, values[n]) for n, s in members])
    index = {"metadata": {"total_size": total}, "weight_map": {n: f for f, ms in shards.items() for n, _ in ms}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {"model_type": "llama", "hidden_size": shape.hidden, "intermediate_size": shape.ffn,
              "num_hidden_layers": shape.layers, "vocab_size": shape.vocab, "torch_dtype": "bfloat16"}  # fmt: skip
    (path / "config.json").write_text(json.dumps(config, indent=2))


def build(shape: Shape = Shape(), *, noise: float = 0.002) -> tuple[Path, Path]:
    """(base folder, fine-tune folder), generated once and reused."""
    top = CACHE / shape.key
    base, ft = top / "base", top / f"ft-{noise:g}"
    if (top / ".built").exists() and (top / f".built-ft-{noise:g}").exists():
        return base, ft
    rng = np.random.default_rng(shape.seed)
    base_values, ft_values = {}, {}
    for name, dims in shape.tensors():
        w = (rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02)) if len(dims) > 1 else np.ones(dims, np.float32)
        b = to_bfloat16_bits(w)
        base_values[name] = b
        wb = (b.astype(np.uint32) << 16).view(np.float32)  # the bf16 values, exactly
        moved = wb * (1 + rng.standard_normal(dims, dtype=np.float32) * np.float32(noise))
        ft_values[name] = to_bfloat16_bits(moved) if len(dims) > 1 else b
        del w, wb, moved
    _folder(base, shape, base_values)
    (top / ".built").write_text("ok\n")
    _folder(ft, shape, ft_values)
    (top / f".built-ft-{noise:g}").write_text("ok\n")
    return base, ft


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


if __name__ == "__main__":
    b, f = build()
    print(f"base {b}: {folder_bytes(b) / 1e9:.2f} GB; fine-tune {f}: {folder_bytes(f) / 1e9:.2f} GB")
