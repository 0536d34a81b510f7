"""The tensors of one version as a table: each tensor's file, name, dtype and shape, how its
object is stored (the codec chain as recorded, stored bytes, storage class), which other
versions use the same object, and whether it is here (a lazy clone's objects not fetched
yet are said as such). Read from the manifest and the catalog: nothing is decoded and
nothing is fetched. `mgit show --tensors` and `mgit serve`'s version page both read it."""

from __future__ import annotations

from dataclasses import dataclass

from mgit.index.catalog import Catalog, storage_class
from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.store.objects import Manifest


@dataclass(frozen=True)
class TensorRow(Report):
    file: str
    name: str
    dtype: str
    shape: list[int]
    params: int
    nbytes: int
    object: str
    codec: str | None  # the chain as its object's header records it (None: the catalog has no row)
    stored_bytes: int | None
    storage: str | None  # delta, derived or standalone
    shared_with: list[str]  # model@seq of the other versions that use the same object
    fetched: bool  # False: a lazy clone's object still on its remote only


def version_tensors(store: ObjectStore, catalog: Catalog, vid: str, manifest: Manifest) -> list[TensorRow]:
    """Every tensor of the version `vid` (whose manifest is `manifest`), in file order."""
    entries = [(f.path, t) for f in manifest.files for t in f.tensors]
    objects = catalog.object_rows({t.object for _, t in entries})
    me = catalog.version(vid)
    own = f"{me.model}@{me.seq}" if me is not None else None
    users: dict[str, list[str]] = {}
    rows = []
    for path, t in entries:
        if t.object not in users:
            users[t.object] = [u for u in catalog.object_users(t.object) if u != own]
        row = objects.get(t.object)
        known = row is not None and row.codec != "unknown"
        rows.append(
            TensorRow(
                file=path,
                name=t.name,
                dtype=t.dtype,
                shape=list(t.shape),
                params=t.params,
                nbytes=t.nbytes,
                object=t.object,
                codec=row.codec if known else None,
                stored_bytes=row.stored_size if known else None,
                storage=storage_class(row.codec) if known else None,
                shared_with=users[t.object],
                fetched=store.has(t.object),
            )
        )
    return rows
