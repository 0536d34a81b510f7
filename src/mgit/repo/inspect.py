"""What the reading verbs report (`ls`, `log`, `show`, `du`, storage figures), built from the
catalog's rows: `Repo` resolves references and hands the rows here.

Nothing here loads numpy or the codecs, so that these commands start in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mgit.errors import MgitError
from mgit.index.catalog import Catalog, VersionRow
from mgit.reports import (
    DuResult,
    FileInfo,
    ModelSummary,
    ShowResult,
    StorageInfo,
    VersionInfo,
    VersionStorage,
)
from mgit.store.objects import Manifest, tag_matches

if TYPE_CHECKING:  # (the store's modules: loaded by the commands that read an object)
    from mgit.lineage.graph import Lineage
    from mgit.store.base import ObjectStore
    from mgit.store.local import LocalStore

RowOf = Callable[[str], VersionRow]  # a version's row, indexing it first if it is not yet
ChainOf = Callable[[str], list[str]]  # a version and its predecessors, newest first


def version_info(catalog: Catalog, row: VersionRow) -> VersionInfo:
    """One version as `log` lists it: model, sequence number, parents, tags, recipe, sizes."""
    return VersionInfo(
        id=row.id,
        model=row.model,
        seq=row.seq,
        time=row.time,
        author=row.author,
        message=row.message,
        parents=catalog.parent_infos(row.parents),
        predecessor=row.predecessor,
        tags=row.tags,
        files=row.files,
        tensors=row.tensors,
        params=row.params,
        logical_bytes=row.logical_bytes,
        stored_bytes=row.stored_bytes,
        new_bytes=row.new_bytes,
        lossy=row.lossy,
        recipe=row.recipe,
        removed=row.removed,
        run=row.run,
    )


def file_infos(manifest: Manifest) -> list[FileInfo]:
    return [FileInfo(f.path, f.type, f.size, f.digest, len(f.tensors), f.converted_from) for f in manifest.files]


def list_models(catalog: Catalog, row_of: RowOf, *, tag: str | None = None) -> list[ModelSummary]:
    """Every model with its latest version (`ls`); with `tag`, those whose latest version has
    it (`KEY` or `KEY=VALUE`, as `log --tag`)."""
    heads, parents = catalog.model_heads()
    out = []
    for name, head, seq, logical_bytes, time, lossy, tags in heads:
        if seq is None:  # a head not indexed yet
            row = row_of(head)
            seq, logical_bytes, time, lossy, tags = row.seq, row.logical_bytes, row.time, row.lossy, row.tags
            parents[name] = catalog.parent_infos(row.parents)
        else:  # (the JSON columns as stored: tags decoded only to match them)
            lossy = json.loads(lossy) if lossy else None
            tags = json.loads(tags) if tag is not None else tags
        if tag is not None and not tag_matches(tag, tags):
            continue
        out.append(ModelSummary(name, head, seq, seq, parents.get(name, []), logical_bytes, time, lossy))
    return out


def every_version(catalog: Catalog, heads: dict[str, str], chain: ChainOf, row_of: RowOf) -> list[VersionInfo]:
    """Every version of every model, newest first (`log` without a model)."""
    vids = [v for head in heads.values() for v in chain(head)]
    rows = catalog.versions_of(vids)  # one query for all of them
    every = [version_info(catalog, rows[v] if v in rows else row_of(v)) for v in vids]
    return sorted(every, key=lambda v: (v.time, v.ref), reverse=True)


CONFIG_BYTES = 1 << 20  # a config.json larger than this is not read for its quantization


def quantization(store: ObjectStore, manifest: Manifest) -> dict[str, Any] | None:
    """What the version's config.json announces in `quantization_config` (see
    `mgit.formats.quant_config`), or None: no config, none announced, or not readable here (a
    lazy clone that has not fetched it)."""
    config = next((f for f in manifest.files if f.path == "config.json"), None)
    if config is None or config.size > CONFIG_BYTES or (store.lazy and not store.has(config.object)):
        return None  # show never fetches
    from mgit.formats.quant_config import scheme_from_bytes  # (show's alone: ls and log do without it)
    from mgit.store.objectformat import file_expected

    try:
        scheme = scheme_from_bytes(store.get(config.object, expect=file_expected(config))[1].tobytes())
    except MgitError:
        return None
    if scheme is None:
        return None
    return {**dataclasses.asdict(scheme), "label": scheme.label}


def show_version(catalog: Catalog, row: VersionRow, manifest: Manifest, store: ObjectStore) -> ShowResult:
    """One version with its files, its parameters by dtype, how it is stored, the
    quantization it announces and, for a PEFT adapter, what adapter it is (`show`)."""
    dtypes: dict[str, int] = {}
    for t in manifest.tensors():
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.params
    return ShowResult(
        version_info(catalog, row),
        file_infos(manifest),
        dtypes,
        [StorageInfo(*r) for r in catalog.storage_by_codec(row.id)],
        catalog.shared_objects(row.id),
        catalog.tensor_storage([row.id]),
        quantization(store, manifest),
        adapter=adapter_info(catalog, store, row, manifest),
        training_args=(store.get_version(row.id).run or {}).get("args") if row.run else None,
    )


def adapter_info(catalog: Catalog, store: ObjectStore, row: VersionRow, manifest: Manifest) -> dict[str, Any] | None:
    """What `show` says of an adapter: its summary and the base it is stored under (the
    parent of relation `adapter`); a config that cannot be read is said, not raised, and one a
    lazy clone has not fetched is not fetched (None, as `quantization`)."""
    from mgit.formats.adapter import CONFIG  # (show's alone: ls and log do without the adapter format)
    from mgit.repo.adapters import RELATION, stored_adapter

    config = next((f for f in manifest.files if f.path == CONFIG), None)
    if config is None or (store.lazy and not store.has(config.object)):
        return None
    try:
        adapter = stored_adapter(store, manifest, label=f"{row.model}@{row.seq}:{CONFIG}")
    except MgitError as exc:
        return {"error": str(exc)}
    if adapter is None:
        return None
    bases = [p for p in catalog.parent_infos(row.parents) if p.relation == RELATION]
    return {**adapter.summary(), "base": bases[0].ref if bases else None}


def version_storage(catalog: Catalog, vids: list[str]) -> dict[str, VersionStorage]:
    """How each of these versions is stored, in one query (see `Repo.storage`)."""
    found = catalog.storage_by_version(vids)
    return {vid: VersionStorage(stored, tensors) for vid, (stored, tensors) in found.items()}


def disk_usage(catalog: Catalog, store: LocalStore, lineage: Lineage, chain: ChainOf) -> DuResult:
    """What each model and the whole repository take (`du`)."""
    # Chains from the lineage snapshot, figures in a few queries for every model together.
    heads, nodes = catalog.heads(), lineage.nodes
    chains = {
        name: [v.id for v in lineage.versions(name)] if name in nodes and nodes[name].head == head else chain(head)
        for name, head in heads.items()
    }
    models = catalog.model_usage(chains)
    live = sorted({v for vids in chains.values() for v in vids})
    count, stored = catalog.physical_bytes(live)
    _, _, on_disk = catalog.total_objects()
    remote_only, local = 0, None
    if store.lazy:
        sizes = catalog.object_sizes(live)
        remote_only = sum(n for oid, n in sizes.items() if not store.has(oid))
        local = sum(sizes.values()) - remote_only
        on_disk = sum(store.stored_size(oid) for oid in store.ids())
    return DuResult(
        models,
        sum(m.logical_bytes for m in models),
        stored,
        count,
        on_disk,
        max(on_disk - stored, 0) if local is None else max(on_disk - local, 0),
        remote_only,
        local,
    )
