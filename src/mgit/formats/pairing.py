"""Which files of two or more models correspond: the one rule of every verb that pairs
versions file by file (merge and a cascade's re-merge, diff and the diff page).

Files pair by path, as in a folder, but for one case: models whose weights are one file each
pair those files whatever they are called. A model added as a single file keeps its file's
name (`mgit add base.safetensors --name base`, then `ft.safetensors --name ft`), so two such
models never share a path, and yet each one file is the model. Models of several weight files
(shards, a folder of checkpoints) keep pairing by path: a folder of shards against a single
file pairs nothing, and the verb says which file is missing. (Tensors pair by name inside the
paired files; parent inference and an add's deltas match tensors by name alone, whatever file
holds them.)
"""

from __future__ import annotations

from collections.abc import Collection, Sequence


def single_weight_files(weights: Sequence[Collection[str]]) -> list[str] | None:
    """Each model's one weight file when every model has exactly one, else None."""
    if len(weights) < 2 or any(len(w) != 1 for w in weights):
        return None
    return [next(iter(w)) for w in weights]


def paired_files(files: Sequence[Sequence[str]], weights: Sequence[Collection[str]]) -> list[tuple[str | None, ...]]:
    """The files of several models that correspond, as rows of each model's path (None where
    it has no such file), in the order they first appear, the first model's first.
    `weights[i]` are model i's weight files (safetensors) among `files[i]`."""
    singles = single_weight_files(weights)
    rows: dict[tuple[bool, str], list[str | None]] = {}
    for i, paths in enumerate(files):
        for path in paths:
            paired = singles is not None and path == singles[i]
            row = rows.setdefault((paired, "" if paired else path), [None] * len(files))
            row[i] = path
    return [tuple(row) for row in rows.values()]
