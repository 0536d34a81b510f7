"""Where a tensor sits among a model's numbered layers, read from its name.

Checkpoints name the tensors of a repeated block by the block and the layer's index:
`model.layers.3.mlp.up_proj.weight` (Llama), `bert.encoder.layer.3.output.dense.weight`
(BERT), `h.3.attn.c_attn.weight` (GPT-2). The one rule: a tensor's layer is the first part
of its name, after the first part, that is a whole number; the parts before it name its
block (`model.layers`, `bert.encoder.layer`, `h`). A name without one (embeddings, the final
norm, the head) is in no layer, and so is a name that starts with a number: a bare
`nn.Sequential` numbers every module it holds, activations included, not repeated layers.

Three counts are read from it, because their callers ask three questions:

- `layer_counts`, the layers of each block (`{"model.layers": 32}`): what `diff` compares.
- `layer_count`, how deep a model is: the most layers one block holds. Parent inference
  reads a student with fewer layers than a candidate as distilled from it.
- `layer_span`, one past the highest layer index: merging reads positions by index, as
  mergekit does (`layer_range: [0, N]`, a gradient's value for layer i at i / (N - 1)).

For the models people have (every layer of each block present, numbered from 0) the last
two agree; they part when layers are missing (a student that kept layers 0, 2 and 4 of its
teacher under their old numbers has 3 layers and a span of 5).
"""

from __future__ import annotations

from collections.abc import Iterable


def layer_of(name: str) -> tuple[str, int] | None:
    """(block, index) of the layer a tensor belongs to, or None: `("model.layers", 3)` for
    `model.layers.3.mlp.up_proj.weight`."""
    parts = name.split(".")
    for i, part in enumerate(parts[1:], 1):
        if part.isascii() and part.isdigit():
            return ".".join(parts[:i]), int(part)
    return None


def layer_counts(names: Iterable[str]) -> dict[str, int]:
    """Each numbered block and how many distinct layers its tensors name, in the order the
    blocks first appear."""
    blocks: dict[str, set[int]] = {}
    for block, index in filter(None, map(layer_of, names)):
        blocks.setdefault(block, set()).add(index)
    return {block: len(indices) for block, indices in blocks.items()}


def layer_count(names: Iterable[str]) -> int:
    """How many layers a model has: the most that one block holds (0: none)."""
    return max(layer_counts(names).values(), default=0)


def layer_span(names: Iterable[str]) -> int:
    """One past the highest layer index of any block (0: no layer)."""
    return max((found[1] + 1 for found in map(layer_of, names) if found), default=0)
