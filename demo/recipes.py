"""Recipes of the demo family: how each member is made from its parent's folder, recorded
with `mgit add --recipe` and re-run by `mgit cascade` in a child process as
`fn(parents, out_dir, **params)`.

They are the family builder's own derivations (benchmarks/minilm_family.py), so a recipe
re-run on the same parent gives the same weights; config and tokenizer files are copied from
the parent.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from minilm_family import (  # noqa: E402
    COPIED_FILES,
    SEED,
    WEIGHTS,
    Derivation,
    FineTune,
    MagnitudePrune,
    QuantizeInt8,
)
from safetensors.torch import save_file  # noqa: E402


def _write(derivation: Derivation, parents: list[Path], out_dir: Path) -> None:
    parent = Path(parents[0])
    for name in COPIED_FILES:
        shutil.copyfile(parent / name, out_dir / name)
    save_file(derivation.weights(parent), str(out_dir / WEIGHTS), metadata={"format": "pt"})


def finetune(parents: list[Path], out_dir: Path, *, task: str, steps: int, seed: int = SEED) -> None:
    """AdamW on a generated task, every weight trained, a fresh seeded classifier head."""
    _write(FineTune(task, steps, seed=seed), parents, out_dir)


def quantize_int8(parents: list[Path], out_dir: Path) -> None:
    """Per-row symmetric int8 of every weight matrix, with the scales beside."""
    _write(QuantizeInt8(), parents, out_dir)


def prune(parents: list[Path], out_dir: Path, *, sparsity: float = 0.5) -> None:
    """The `sparsity` fraction of smallest-magnitude entries of every weight matrix set to 0."""
    _write(MagnitudePrune(sparsity), parents, out_dir)


def recipe_of(derivation: Derivation | None) -> tuple[str, dict[str, Any]] | None:
    """The recipe function (in this file) and parameters that make a member, for `mgit add
    --recipe`; None for a member that is not made from a parent here."""
    if isinstance(derivation, FineTune) and not derivation.lora_rank and not derivation.freeze_early_layers:
        return "finetune", {"task": derivation.task, "steps": derivation.steps, "seed": derivation.seed}
    if isinstance(derivation, QuantizeInt8):
        return "quantize_int8", {}
    if isinstance(derivation, MagnitudePrune):
        return "prune", {"sparsity": derivation.sparsity}
    return None
