"""Which files of two or more models correspond: the one rule of every verb that pairs
versions file by file (merge and a cascade's re-merge, diff and the diff page).

Files pair by path, as in a folder, but for one case: models whose weights are one file each
pair those files whatever they are called. A model added as a single file keeps its file's
name (`mgit add base.safetensors --name base`, then `ft.safetensors --name ft`), so two such
models never share a path, and yet each one file is the model. Models of several weight files
(shards, a folder of checkpoints) keep pairing by path: a folder of shards against a single
file pairs nothing, and the verb says which file is missing. (Tensors pair by name inside the
paired files; parent inference and an add's deltas match tensors by name alone, whatever file
holds them, across the wrapper prefix two models' names may differ by: see `tensor_names`.)

Tensors pair by name, but a task model saved from `AutoModelForSequenceClassification` names
every tensor of its `AutoModel` base under `bert.` (`roberta.`, `model.`, PEFT's
`base_model.model.` ...). The prefix is read from the names themselves rather than from a list:
the pair of leading components whose removal from one side and addition on the other makes
the most names meet is the one the two models differ by.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Sequence

MAX_PREFIX = 3  # leading name components a wrapper may add (`base_model.model.` is two)


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


def _prefixes(name: str) -> Iterable[tuple[str, str]]:
    """(prefix, rest) for the empty prefix and each of up to MAX_PREFIX leading components,
    keeping at least two components in the rest (`weight` alone says nothing)."""
    yield "", name
    parts = name.split(".")
    for k in range(1, min(MAX_PREFIX, len(parts) - 2) + 1):
        cut = len(".".join(parts[:k])) + 1
        yield name[:cut], name[cut:]


def wrapper_prefix(names: Collection[str], others: Collection[str]) -> tuple[str, str]:
    """The prefixes (mine, theirs) that two models' tensor names differ by: `("bert.", "")` for
    a task model against its base, `("", "")` when names meet as they are (ties go to these)."""
    by_rest: dict[str, list[str]] = {}
    for other in others:
        for prefix, rest in _prefixes(other):
            by_rest.setdefault(rest, []).append(prefix)
    counts: Counter[tuple[str, str]] = Counter()
    for name in names:
        for prefix, rest in _prefixes(name):
            for theirs in by_rest.get(rest, ()):
                counts[prefix, theirs] += 1
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0] == ("", "")), default=None)
    if best is None or best[1] <= counts[("", "")]:
        return "", ""
    return best[0]


def tensor_names(names: Collection[str], others: Collection[str]) -> dict[str, str]:
    """For each of one model's tensor names that has a counterpart in another model, that
    counterpart's name: across the wrapper prefix they differ by, else the same name (a head
    kept outside the wrapper). Names with no counterpart (an added head, a buffer one save
    dropped) are left out."""
    mine, theirs = wrapper_prefix(names, others)
    available = set(others)
    pairs: dict[str, str] = {}
    for name in names:
        if (mine or theirs) and name.startswith(mine) and (other := theirs + name[len(mine) :]) in available:
            pairs[name] = other
        elif name in available:
            pairs[name] = name
    return pairs
