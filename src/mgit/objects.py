"""Immutable records (tensor and file entries, manifests, versions), their canonical encoding
and their ids.

An object's id is the blake3 hash of its *logical* content: `kind`, a newline, the canonical
JSON of its metadata (for a tensor, its dtype and shape), a newline, then its bytes. The id
does not depend on how the object is encoded on disk, so one tensor shared by ten models is
one object whatever codec stored it. Records parsed from disk are validated field by field:
a damaged or forged record raises instead of flowing on.
"""

from __future__ import annotations

import getpass
import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import blake3

from mgit.errors import UnsafePathError
from mgit.formats.dtypes import DTYPES, element_count, itemsize
from mgit.formats.paths import folder_clash, path_problem

OID_RE = re.compile(r"^[0-9a-f]{64}$")
RELATIONS = ("finetune", "adapter", "quantize", "prune", "distill", "merge", "other")
KINDS = ("tensor", "blob", "manifest", "version")
RECORD_FORMAT = 1


class RecordError(ValueError):
    """A record that does not have the shape this version of MGit writes."""


def utc_now() -> str:
    """A record's time: UTC, ISO 8601, microseconds, `Z`."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def user_at_host() -> str:
    """Who writes a record here, `user@host`: a version's default author, where a test
    result was recorded."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{os.uname().nodename}"


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def object_hasher(kind: str, meta: dict[str, Any]) -> blake3.blake3:
    """A hasher primed with the kind and metadata; feed it the object's bytes."""
    hasher = blake3.blake3()
    hasher.update(kind.encode() + b"\n" + canonical_json(meta) + b"\n")
    return hasher


def object_id(kind: str, meta: dict[str, Any], data: Any) -> str:
    hasher = object_hasher(kind, meta)
    hasher.update(data)
    return hasher.hexdigest()


def tensor_meta(dtype: str, shape: tuple[int, ...]) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape)}


def check_relative_path(rel: str) -> str:
    """A file path as a manifest may hold it (`mgit.formats.paths`: relative, no `..`, no
    control character, parts and whole bounded). Anything else could escape a checkout, or
    leave one half written."""
    if (why := path_problem(rel)) is not None:
        raise UnsafePathError(str(rel), why)
    return rel


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise RecordError(what)


def _oid(value: Any, what: str) -> str:
    _check(isinstance(value, str) and bool(OID_RE.match(value)), f"{what} is not an object id")
    return value


def _int(value: Any, what: str) -> int:
    _check(isinstance(value, int) and not isinstance(value, bool) and value >= 0, f"{what} is not a count")
    return value


def _str(value: Any, what: str) -> str:
    _check(isinstance(value, str), f"{what} is not a string")
    return value


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    object: str

    @property
    def nbytes(self) -> int:
        return element_count(self.shape) * itemsize(self.dtype)

    @property
    def params(self) -> int:
        return element_count(self.shape)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "object": self.object}

    @classmethod
    def from_json(cls, d: Any) -> TensorEntry:
        _check(isinstance(d, dict), "tensor entry is not an object")
        _check(d.get("dtype") in DTYPES, f"unknown dtype {d.get('dtype')!r}")
        shape = d.get("shape")
        _check(isinstance(shape, list), "shape is not a list")
        return cls(_str(d.get("name"), "tensor name"), d["dtype"],
                   tuple(_int(x, "dimension") for x in shape), _oid(d.get("object"), "tensor object"))  # fmt: skip


@dataclass(frozen=True)
class FileEntry:
    """One file of a version. `type` is "blob" (bytes in `object`) or "safetensors" (header
    bytes in `object`, then `tensors` in data order). `digest` is the blake3 of the whole file,
    checked after every rebuild."""

    path: str
    type: str
    size: int
    digest: str
    object: str
    tensors: tuple[TensorEntry, ...] = ()
    converted_from: str | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "type": self.type, "size": self.size,
                             "digest": self.digest, "object": self.object}  # fmt: skip
        if self.type == "safetensors":
            d["tensors"] = [t.to_json() for t in self.tensors]
        if self.converted_from:
            d["converted_from"] = self.converted_from
        return d

    @classmethod
    def from_json(cls, d: Any) -> FileEntry:
        _check(isinstance(d, dict), "file entry is not an object")
        kind = d.get("type")
        _check(kind in ("blob", "safetensors"), f"unknown file type {kind!r}")
        tensors = d.get("tensors", [])
        _check(isinstance(tensors, list), "tensors is not a list")
        conv = d.get("converted_from")
        _check(conv is None or isinstance(conv, str), "converted_from is not a string")
        try:
            check_relative_path(_str(d.get("path"), "file path"))
        except UnsafePathError as exc:
            raise RecordError(exc.message) from None
        if conv is not None and (why := path_problem(conv)) is not None:
            raise RecordError(f"converted_from {conv!r}: {why}")
        return cls(_str(d.get("path"), "file path"), kind, _int(d.get("size"), "file size"),
                   _oid(d.get("digest"), "file digest"), _oid(d.get("object"), "file object"),
                   tuple(TensorEntry.from_json(t) for t in tensors), conv)  # fmt: skip


@dataclass(frozen=True)
class Manifest:
    files: tuple[FileEntry, ...]

    def to_json(self) -> dict[str, Any]:
        return {"format": RECORD_FORMAT, "files": [f.to_json() for f in self.files]}

    @classmethod
    def from_json(cls, d: Any) -> Manifest:
        _check(isinstance(d, dict) and d.get("format") == RECORD_FORMAT, "not a manifest of format 1")
        files = d.get("files")
        _check(isinstance(files, list), "files is not a list")
        entries = tuple(FileEntry.from_json(f) for f in files)
        _check(len({f.path for f in entries}) == len(entries), "a file is listed twice")
        if (clash := folder_clash(f.path for f in entries)) is not None:
            raise RecordError(f"{clash[0]!r} is inside {clash[1]!r}, which is a file of the same manifest")
        return cls(entries)

    def tensors(self) -> list[TensorEntry]:
        return [t for f in self.files for t in f.tensors]

    def object_ids(self) -> set[str]:
        """Every object this manifest needs: file blobs, headers and tensors."""
        return {f.object for f in self.files} | {t.object for f in self.files for t in f.tensors}

    @property
    def logical_bytes(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Parent:
    version: str
    relation: str

    def to_json(self) -> dict[str, str]:
        return {"version": self.version, "relation": self.relation}


@dataclass(frozen=True)
class Version:
    """One immutable snapshot of a model. Its id is the id of its record."""

    model: str
    manifest: str
    parents: tuple[Parent, ...] = ()
    predecessor: str | None = None
    message: str = ""
    author: str = ""
    time: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    summary: dict[str, int] = field(default_factory=dict)
    recipe: dict[str, Any] | None = None
    lossy: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT, "model": self.model, "manifest": self.manifest,
            "parents": [p.to_json() for p in self.parents], "predecessor": self.predecessor,
            "message": self.message, "author": self.author, "time": self.time,
            "tags": dict(self.tags), "summary": dict(self.summary), "recipe": self.recipe,
            "lossy": self.lossy,
        }  # fmt: skip

    @classmethod
    def from_json(cls, d: Any) -> Version:
        _check(isinstance(d, dict) and d.get("format") == RECORD_FORMAT, "not a version of format 1")
        parents = d.get("parents")
        _check(isinstance(parents, list), "parents is not a list")
        parsed = []
        for p in parents:
            _check(isinstance(p, dict) and p.get("relation") in RELATIONS, f"bad parent {p!r}")
            parsed.append(Parent(_oid(p.get("version"), "parent"), p["relation"]))
        pred = d.get("predecessor")
        tags, summary = d.get("tags"), d.get("summary")
        _check(isinstance(tags, dict) and all(isinstance(v, str) for v in tags.values()), "bad tags")
        _check(isinstance(summary, dict), "bad summary")
        for key in ("recipe", "lossy"):
            _check(d.get(key) is None or isinstance(d.get(key), dict), f"bad {key}")
        if d.get("recipe") and d["recipe"].get("source") is not None:
            _oid(d["recipe"]["source"], "recipe source")
        return cls(
            model=_str(d.get("model"), "model"), manifest=_oid(d.get("manifest"), "manifest"),
            parents=tuple(parsed), predecessor=None if pred is None else _oid(pred, "predecessor"),
            message=_str(d.get("message"), "message"), author=_str(d.get("author"), "author"),
            time=_str(d.get("time"), "time"), tags=dict(tags),
            summary={k: _int(v, k) for k, v in summary.items()},
            recipe=d.get("recipe"), lossy=d.get("lossy"),
        )  # fmt: skip

    def linked_versions(self) -> list[str]:
        """Versions this one points to (predecessor first, then lineage parents)."""
        return ([self.predecessor] if self.predecessor else []) + [p.version for p in self.parents]

    def linked_objects(self) -> set[str]:
        """Objects this record names besides versions: its manifest and its recipe's source."""
        source = (self.recipe or {}).get("source")
        return {self.manifest} | ({source} if isinstance(source, str) else set())
