"""PEFT adapters in a repository: the adapter a folder or a stored version holds, and the
stored model it adapts (its base, which becomes its lineage parent with relation `adapter`).

The base is the model `base_model_name_or_path` names, found in this order: a model whose
latest version is tagged `hf.repo_id` with that name (what `mgit import-hf` sets), a model of
that name (or of its last path component: peft writes the folder the base was loaded from),
else the one stored model whose tensors the adapter fits (every adapted module's weight there,
of the shape the adapter's factors imply). A named model that does not fit, or no model that
fits, is refused with what was tried; several that fit are refused with their names (which
`--parent` chooses among).
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

from mgit.errors import InputError
from mgit.formats.adapter import CONFIG, MAX_CONFIG_BYTES, WEIGHTS, Adapter, fit, parse_adapter
from mgit.index.catalog import Catalog
from mgit.store.base import ObjectStore
from mgit.store.objectformat import file_expected
from mgit.store.objects import Manifest

REPO_ID_TAG = "hf.repo_id"  # set by mgit import-hf (mgit.hf.importing)
RELATION = "adapter"


def folder_adapter(source: Any) -> Adapter | None:
    """The adapter a model folder holds (None when `source` is not a folder with an
    adapter_config.json), read from its config and its weight file's header."""
    if not isinstance(source, str | os.PathLike):
        return None
    root = Path(source)
    config = root / CONFIG
    if not root.is_dir() or config.is_symlink() or not config.is_file():
        return None
    where = str(config)
    if config.stat().st_size > MAX_CONFIG_BYTES:
        raise InputError(where, f"is larger than {MAX_CONFIG_BYTES} bytes: not an adapter config")
    weights = root / WEIGHTS
    tensors: list[tuple[str, tuple[int, ...]]] = []
    if weights.is_file() and not weights.is_symlink():
        from mgit.formats.safetensors import read_layout  # (numpy: `show` does not need it)

        tensors = [(t.name, t.shape) for t in read_layout(weights).tensors]
    return parse_adapter(config.read_bytes(), tensors, where=where)


def stored_adapter(store: ObjectStore, manifest: Manifest, *, label: str = CONFIG) -> Adapter | None:
    """The adapter a stored version holds (None when it has no adapter_config.json)."""
    config = next((f for f in manifest.files if f.path == CONFIG), None)
    if config is None:
        return None
    raw = store.get(config.object, expect=file_expected(config))[1].tobytes()
    weights = next((f for f in manifest.files if f.path == WEIGHTS), None)
    tensors = [(t.name, t.shape) for t in weights.tensors] if weights is not None else []
    return parse_adapter(raw, tensors, where=label)


def shapes_of(manifest: Manifest) -> dict[str, tuple[int, ...]]:
    return {t.name: tuple(t.shape) for t in manifest.tensors()}


def base_candidates(catalog: Catalog, adapter: Adapter, *, own: str | None = None) -> list[tuple[str, str]]:
    """The heads `base_model_name_or_path` names, as (model, how it named it): by tag, by
    name, by its last path component."""
    name = adapter.base
    if not name:
        return []
    heads = {m: v for m, v in catalog.heads().items() if m != own}
    rows = catalog.versions_of(list(heads.values()))
    tagged = [row.model for row in rows.values() if row.tags.get(REPO_ID_TAG) == name]
    if tagged:
        return [(m, f"tagged {REPO_ID_TAG}={name}") for m in sorted(tagged)]
    for candidate in (name, PurePosixPath(name.replace("\\", "/")).name):
        if candidate in heads:
            return [(candidate, "named" if candidate == name else f"named (the last part of {name!r})")]
    return []


def resolve_base(
    store: ObjectStore, catalog: Catalog, adapter: Adapter, label: str, *, own: str | None = None
) -> tuple[str, str]:
    """The head of the stored model the adapter adapts, and a note saying how it was found
    (see the module docstring); `own` is the name the adapter is added under."""
    heads = {m: v for m, v in catalog.heads().items() if m != own}
    named = base_candidates(catalog, adapter, own=own)
    for model, how in named:
        got = fit(adapter, shapes_of(store.get_manifest(store.get_version(heads[model]).manifest)))
        if not got.problems:
            return heads[model], f"base {model} ({how} by base_model_name_or_path)"
        if len(named) == 1:
            raise InputError(
                label,
                f"its base_model_name_or_path {adapter.base!r} is {model}, which the adapter does not fit "
                f"({', '.join(got.problems[:2])})",
                hint="Name its base with --parent",
            )
    fitting = []
    for model, vid in sorted(heads.items()):
        manifest = store.get_manifest(store.get_version(vid).manifest)
        if adapter.modules and not fit(adapter, shapes_of(manifest)).problems:
            fitting.append((model, vid))
    if len(fitting) == 1:
        return fitting[0][1], f"base {fitting[0][0]} (the one stored model the adapter's modules fit)"
    roots = [(m, v) for m, v in fitting if not _ancestor_models(catalog, v) & {f for f, _ in fitting}]
    if len(fitting) > 1 and len(roots) == 1:  # the others derive from it (its fine-tunes, its merges)
        return roots[0][1], f"base {roots[0][0]} (of the stored models the adapter's modules fit, the others' ancestor)"
    said = f"base_model_name_or_path {adapter.base!r} names no stored model" if adapter.base else "it names no base"
    if fitting:
        raise InputError(
            label,
            f"{said}, and {len(fitting)} stored models fit its modules: {', '.join(m for m, _ in fitting[:5])}",
            hint="Name its base with --parent",
        )
    raise InputError(
        label,
        f"{said}, and no stored model has the weights it adapts",
        hint="Add its base first (mgit add BASE --name NAME), or name it with --parent",
    )


def _ancestor_models(catalog: Catalog, vid: str) -> set[str]:
    """The models of a version's lineage ancestors (parents, their parents...)."""
    seen: set[str] = set()
    models: set[str] = set()
    first = catalog.version(vid)
    todo = [p for p, _ in first.parents] if first is not None else []
    while todo:
        v = todo.pop()
        if v in seen or (row := catalog.version(v)) is None:
            continue
        seen.add(v)
        models.add(row.model)
        todo += [p for p, _ in row.parents]
    return models


def adapter_parents(
    store: ObjectStore, catalog: Catalog, source: Any, parents: list[str], *, own: str
) -> tuple[Adapter | None, list[str], list[str]]:
    """For an add: the adapter a folder holds (checked, whatever the parents), the parents
    (the given ones, else its base) and a note."""
    adapter = folder_adapter(source)
    if adapter is None or parents:
        return adapter, parents, []
    vid, note = resolve_base(store, catalog, adapter, str(Path(source) / CONFIG), own=own)
    return adapter, [vid], [f"{adapter.label} adapter: parent {note}"]


def merged_chains(store: ObjectStore, base_manifest: Manifest, adapter_manifest: Manifest) -> dict[str, list[Any]]:
    """By merged tensor name, the chain that stores a LoRA-merged weight as the base's tensor
    plus scale x B A of the adapter's stored B and A (`lora_merge`, mgit.codecs.lora, then
    zstd): tried beside the usual encodings, it wins where it reproduces the merge. None for
    DoRA (its rows rescaled), IA3, or other types: those are stored as deltas of the base.
    `mgit merge --adapter` offers these for what it writes, and an add whose parents are a
    base and an adapter of it for the model added (a merge made by peft itself)."""
    from mgit.codecs import LoraMergeCodec, ZstdCodec
    from mgit.codecs.lora import DTYPES

    adapter = stored_adapter(store, adapter_manifest)
    if adapter is None or adapter.peft_type != "LORA" or adapter.use_dora:
        return {}
    base = {t.name: t for t in base_manifest.tensors()}
    own = {t.name: t for t in adapter_manifest.tensors()}
    found = fit(adapter, {k: tuple(t.shape) for k, t in base.items()})
    chains: dict[str, list[Any]] = {}
    for m in adapter.modules:
        name = found.weights.get(m.path)
        keys = ("lora_embedding_A", "lora_embedding_B") if m.embedding else ("lora_A.weight", "lora_B.weight")
        if name is None or m.rank is None or not all(k in m.parts for k in keys):
            continue
        a, b, weight = own[m.parts[keys[0]]], own[m.parts[keys[1]]], base[name]
        if weight.dtype not in DTYPES or a.dtype not in DTYPES or a.dtype != b.dtype:
            continue
        codec = LoraMergeCodec(
            bases=[weight.object, b.object, a.object],
            rank=m.rank,
            scale=float(adapter.scaling(m)),
            transpose=m.embedding or adapter.fan_in_fan_out,
            dtype=weight.dtype,
            factor_dtype=a.dtype,
        )
        chains[name] = [codec, ZstdCodec(level=3)]
    return chains
