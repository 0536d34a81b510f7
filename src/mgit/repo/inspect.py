"""What the reading verbs report (`ls`, `log`, `show`, `du`, storage figures), built from the
catalog's rows: `Repo` resolves references and hands the rows here.

Nothing here loads numpy or the codecs, so that these commands start in milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

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
from mgit.store.local import LocalStore
from mgit.store.objects import Manifest, tag_matches

if TYPE_CHECKING:
    from mgit.lineage.graph import Lineage

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
    )


def file_infos(manifest: Manifest) -> list[FileInfo]:
    return [FileInfo(f.path, f.type, f.size, f.digest, len(f.tensors), f.converted_from) for f in manifest.files]


def list_models(catalog: Catalog, row_of: RowOf, *, tag: str | None = None) -> list[ModelSummary]:
    """Every model with its latest version (`ls`); with `tag`, those whose latest version has
    it (`KEY` or `KEY=VALUE`, as `log --tag`)."""
    heads = catalog.heads()
    rows = catalog.versions_of(list(heads.values()))
    parents = catalog.versions_of(sorted({p for row in rows.values() for p, _ in row.parents}))
    out = []
    for name, head in heads.items():
        row = rows.get(head) or row_of(head)
        if tag is not None and not tag_matches(tag, row.tags):
            continue
        out.append(
            ModelSummary(
                name,
                head,
                row.seq,
                row.seq,
                catalog.parent_infos(row.parents, rows=parents),
                row.logical_bytes,
                row.time,
                row.lossy,
            )
        )
    return out


def every_version(catalog: Catalog, heads: dict[str, str], chain: ChainOf, row_of: RowOf) -> list[VersionInfo]:
    """Every version of every model, newest first (`log` without a model)."""
    vids = [v for head in heads.values() for v in chain(head)]
    rows = catalog.versions_of(vids)  # one query for all of them
    every = [version_info(catalog, rows[v] if v in rows else row_of(v)) for v in vids]
    return sorted(every, key=lambda v: (v.time, v.ref), reverse=True)


def show_version(catalog: Catalog, row: VersionRow, manifest: Manifest) -> ShowResult:
    """One version with its files, its parameters by dtype and how it is stored (`show`)."""
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
    )


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
