"""The rows the catalog gives back: an object's (`ObjectRow`), a version's (`VersionRow`), and
a version's columns read by name, so that neither the order of a query's columns nor that of
a dataclass's fields can put a value in the wrong field."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mgit.store.base import ObjectStore, PutResult
    from mgit.store.objects import Version

# The columns of `versions` a VersionRow holds (its `parents` come from `edges`), and those a
# lineage graph's VersionNode holds (mgit.lineage.graph).
VERSION_COLUMNS = (
    "id",
    "model",
    "seq",
    "manifest",
    "predecessor",
    "message",
    "author",
    "time",
    "tags",
    "files",
    "tensors",
    "params",
    "logical_bytes",
    "stored_bytes",
    "new_bytes",
    "lossy",
    "recipe",
    "removed",
    "run",
)
# A new version's row (its `removed` is 0) and its values, from its record and what the
# catalog derives: its position in its history and its stored and new bytes.
INSERT_VERSION = (
    "INSERT INTO versions (id, model, seq, manifest, predecessor, message, author, time, tags, files, tensors, "
    "params, logical_bytes, stored_bytes, new_bytes, lossy, recipe, run) "
    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


def version_values(vid: str, version: Version, seq: int, stored: int, new: int) -> tuple[Any, ...]:
    s = version.summary
    return (
        vid,
        version.model,
        seq,
        version.manifest,
        version.predecessor,
        version.message,
        version.author,
        version.time,
        json.dumps(version.tags),
        s.get("files", 0),
        s.get("tensors", 0),
        s.get("params", 0),
        s.get("logical_bytes", 0),
        stored,
        new,
        json.dumps(version.lossy) if version.lossy else None,
        json.dumps(version.recipe) if version.recipe else None,
        json.dumps({k: version.run[k] for k in ("id", "step", "metrics")}) if version.run else None,
    )


GRAPH_COLUMNS = (
    "id",
    "model",
    "seq",
    "predecessor",
    "time",
    "message",
    "tags",
    "params",
    "logical_bytes",
    "new_bytes",
    "lossy",
    "removed",
)
JSON_COLUMNS = ("tags", "lossy", "recipe", "parents", "run")  # stored as JSON text (lossy and recipe may be NULL)


def decoded_rows(cursor: sqlite3.Cursor) -> Iterator[list[Any]]:
    """A query's rows, column by column, its JSON columns decoded (and `removed` a bool)."""
    names = [d[0] for d in cursor.description]
    as_json = [i for i, name in enumerate(names) if name in JSON_COLUMNS]  # (once: `lineage` reads every version)
    flags = [i for i, name in enumerate(names) if name == "removed"]
    decode = json.JSONDecoder().decode
    for values in cursor:
        row = list(values)
        for i in as_json:
            row[i] = decode(row[i]) if row[i] else None
        for i in flags:
            row[i] = bool(row[i])
        yield row


def named_rows(cursor: sqlite3.Cursor) -> Iterator[dict[str, Any]]:
    """A query's rows as {column: value}, decoded as `decoded_rows` decodes them."""
    names = [d[0] for d in cursor.description]
    return (dict(zip(names, row, strict=True)) for row in decoded_rows(cursor))


@dataclass(frozen=True)
class ObjectRow:
    """An object as the catalog indexes it: kind, sizes, codec chain, delta bases."""

    id: str
    kind: str
    logical_size: int
    stored_size: int
    codec: str
    bases: tuple[str, ...] = ()

    @classmethod
    def written(cls, result: PutResult) -> ObjectRow:
        """The row of an object a store just wrote."""
        return cls(result.oid, result.kind, result.size, result.stored_size, result.codec, result.bases)

    @classmethod
    def read(cls, store: ObjectStore, oid: str) -> ObjectRow:
        """The row of an object in `store`, from its header."""
        header = store.header(oid)
        return cls(oid, header.kind, header.size, store.stored_size(oid), header.codec_names, tuple(header.bases))


@dataclass(frozen=True)
class VersionRow:
    """A version as the catalog indexes it: its record's fields and figures, its parents."""

    id: str
    model: str
    seq: int
    manifest: str
    predecessor: str | None
    message: str
    author: str
    time: str
    tags: dict[str, str]
    files: int
    tensors: int
    params: int
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    lossy: dict[str, Any] | None
    parents: tuple[tuple[str, str], ...]
    recipe: dict[str, Any] | None = None
    removed: bool = False  # on no model's history any more (see Catalog.set_heads)
    run: dict[str, Any] | None = None  # a checkpoint's run id, step and metrics
