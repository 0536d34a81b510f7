"""Immutable records (tensor and file entries, manifests, versions), their canonical encoding
and their ids.

An object's id is the blake3 hash of its *logical* content: `kind`, a newline, the canonical
JSON of its metadata (for a tensor, its dtype and shape), a newline, then its bytes. The id
does not depend on how the object is encoded on disk, so one tensor shared by ten models is
one object whatever codec stored it. Records parsed from disk are validated field by field:
a damaged or forged record raises instead of flowing on.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import blake3

from mgit.errors import UnsafePathError
from mgit.formats.dtypes import DTYPES, blocks_fit, element_count, itemsize, value_shape
from mgit.formats.paths import CONTROL, folder_clash, path_problem
from mgit.formats.tensor_views import TensorView, storages_and_views
from mgit.store.run_record import checked_run

OID_RE = re.compile(r"^[0-9a-f]{64}\Z")  # \Z, not $: "$" also matches before a final newline
RELATIONS = ("finetune", "adapter", "quantize", "prune", "distill", "merge", "other")
KINDS = ("tensor", "blob", "manifest", "version")
RECORD_FORMAT = 1

# What a version record may hold (docs/format.md, "Version record"); `add` refuses the same.
VERSION_KEYS = {"format", "model", "manifest", "parents", "predecessor", "message", "author", "time", "tags"}
VERSION_KEYS |= {"summary", "recipe", "lossy"}
# Optional fields: written only when they say something, so that records without them keep their ids.
VERSION_OPTIONAL_KEYS = {"number", "run"}
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")  # as mgit.index.refs
MAX_MODEL_NAME = 128
MAX_MESSAGE, MAX_AUTHOR, MAX_FN = 65536, 256, 4096  # characters
MAX_TAGS, MAX_TAG_KEY, MAX_TAG_VALUE = 256, 128, 1024
MAX_PARENTS = 1024
MAX_COUNT = 2**63 - 1  # what SQLite's INTEGER holds
TIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z\Z")
TEXT_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # CONTROL less newline and tab
SUMMARY_KEYS = {"files", "tensors", "params", "logical_bytes"}
RECIPE_NEEDS = {"fn", "params", "source_sha256"}
RECIPE_KEYS = RECIPE_NEEDS | {"source", "resources"}
RESOURCES, MAX_RESOURCE = ("num_cpus", "num_gpus"), 1024.0
LOSSY_NEEDS = {"eps", "mode", "max_error", "tensors", "guard"}
LOSSY_MAY = {"rel", "scope"}


class RecordError(ValueError):
    """A record that does not have the shape this version of MGit writes."""


def utc_now() -> str:
    """A record's time: UTC, ISO 8601, microseconds, `Z`."""
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def user_at_host() -> str:
    """Who writes a record here, `user@host`: a version's default author, where a test
    result was recorded."""
    import getpass  # (here: it loads termios, and only a writer asks who it is)

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
    _check(isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_COUNT, f"{what} is not a count")
    return value


def _version_number(value: Any) -> int:
    _check(_int(value, "number") >= 1, "number is not a version number (1 or more)")
    return value


def _str(value: Any, what: str) -> str:
    _check(isinstance(value, str), f"{what} is not a string")
    return value


def _text(value: Any, what: str, limit: int, *, multiline: bool = False) -> str:
    """A string of at most `limit` characters with no control character (C0, DEL, C1), but
    newline and tab where the field may hold several lines (a message)."""
    _check(isinstance(value, str), f"{what} is not a string")
    _check(len(value) <= limit, f"{what} is longer than {limit} characters")
    found = (TEXT_CONTROL if multiline else CONTROL).search(value)
    _check(found is None, f"{what} has a control character (\\x{ord(found.group()) if found else 0:02x})")
    return value


def _number(value: Any, what: str, *, low: float, high: float = math.inf, open_low: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    _check(ok and (value > low if open_low else value >= low) and value <= high, f"{what} is out of range")
    return value


def model_name_problem(name: Any) -> str | None:
    """Why `name` cannot be a model's name, or None: the rule of `mgit.index.refs.validate_model_name`
    (docs/format.md, "Refs"), which this layer cannot import."""
    if not isinstance(name, str):
        return "it is not a string"
    if not name:
        return "it is empty"
    if len(name) > MAX_MODEL_NAME:
        return f"it is longer than {MAX_MODEL_NAME} characters"
    if not MODEL_NAME_RE.match(name) or ".." in name or name.endswith((".lock", ".")):
        return "it is not a model name"
    return None


def check_version_fields(*, model: str, message: str, author: str, tags: Any, parents: int, recipe: Any = None) -> None:
    """The fields of a version a writer chooses (add's inputs), by the rules every reader
    applies (`Version.from_json`); raises RecordError."""
    if (why := model_name_problem(model)) is not None:
        raise RecordError(f"invalid model: {why}")
    _text(message, "message", MAX_MESSAGE, multiline=True)
    _text(author, "author", MAX_AUTHOR)
    _tags(tags)
    _check(parents <= MAX_PARENTS, f"more than {MAX_PARENTS} parents")
    _recipe(recipe)


def _tags(tags: Any) -> dict[str, str]:
    _check(isinstance(tags, dict), "tags is not an object")
    _check(len(tags) <= MAX_TAGS, f"more than {MAX_TAGS} tags")
    for key, value in tags.items():
        _check(bool(key), "a tag has an empty key")
        _text(key, "a tag's key", MAX_TAG_KEY)
        _text(value, "a tag's value", MAX_TAG_VALUE)
    return dict(tags)


def tag_matches(query: str, tags: Mapping[str, str]) -> bool:
    """Whether a version's tags hold `query`: `KEY` (with any value) or `KEY=VALUE` (the
    first `=` ends the key). What `mgit graph --tag`, a test attached to `tag:KEY[=VALUE]`
    and the web app's tag filter select by."""
    key, sep, value = query.partition("=")
    return key in tags and (not sep or tags[key] == value)


def _time(value: Any) -> str:
    _check(
        isinstance(value, str) and bool(TIME_RE.match(value)), "time is not a UTC time (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)"
    )
    try:
        datetime.fromisoformat(value.removesuffix("Z"))
    except ValueError:
        raise RecordError("time is not a UTC time (YYYY-MM-DDTHH:MM:SS[.ffffff]Z)") from None
    return value


def _parents(value: Any) -> tuple[Parent, ...]:
    _check(isinstance(value, list), "parents is not a list")
    _check(len(value) <= MAX_PARENTS, f"more than {MAX_PARENTS} parents")
    parsed = []
    for p in value:
        _check(isinstance(p, dict) and set(p) == {"version", "relation"}, "a parent is not {version, relation}")
        _check(p["relation"] in RELATIONS, f"a parent's relation is not one of {', '.join(RELATIONS)}")
        parsed.append(Parent(_oid(p["version"], "parent"), p["relation"]))
    return tuple(parsed)


def _recipe(value: Any) -> dict[str, Any] | None:
    """A recipe as `add` records it (docs/format.md, "Version record")."""
    if value is None:
        return None
    _check(
        isinstance(value, dict) and RECIPE_NEEDS <= set(value) <= RECIPE_KEYS,
        f"recipe is not an object of {', '.join(sorted(RECIPE_KEYS))}",
    )
    target, sep, name = _text(value["fn"], "recipe fn", MAX_FN).rpartition(":")
    _check(bool(sep and target) and name.isidentifier(), "recipe fn is not MODULE:FUNCTION or FILE.py:FUNCTION")
    params = value["params"]
    _check(
        isinstance(params, dict) and all(isinstance(k, str) and k.isidentifier() for k in params),
        "recipe params are not keyword arguments",
    )
    _check(
        isinstance(value["source_sha256"], str) and bool(OID_RE.match(value["source_sha256"])),
        "recipe source_sha256 is not a sha256",
    )
    if value.get("source") is not None:
        _oid(value["source"], "recipe source")
    resources = value.get("resources", {})
    _check(
        isinstance(resources, dict) and set(resources) <= set(RESOURCES), "recipe resources are not num_cpus, num_gpus"
    )
    for key, amount in resources.items():
        _number(amount, f"recipe resource {key}", low=0, high=MAX_RESOURCE)
    return value


def _lossy(value: Any) -> dict[str, Any] | None:
    """A lossy bound as `add` records it (docs/format.md, "Version record")."""
    if value is None:
        return None
    _check(
        isinstance(value, dict) and LOSSY_NEEDS <= set(value) <= LOSSY_NEEDS | LOSSY_MAY,
        f"lossy is not an object of {', '.join(sorted(LOSSY_NEEDS | LOSSY_MAY))}",
    )
    if "scope" in value:  # only the tensors named so were stored lossily (a checkpoint's optimizer state)
        scope = value["scope"]
        _check(isinstance(scope, str) and 0 < len(scope) <= 256 and scope.isprintable(), "lossy scope is not a prefix")
    _check(value["mode"] in ("abs", "rel", "abs+rel"), "lossy mode is not abs, rel or abs+rel")
    for key in ("eps", "rel"):
        if value.get(key) is not None:
            _number(value[key], f"lossy {key}", low=0, open_low=True)
    _number(value["guard"], "lossy guard", low=0, open_low=True)
    _number(value["max_error"], "lossy max_error", low=0)
    _int(value["tensors"], "lossy tensors")
    return value


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a file: its name, dtype, shape and the object holding its data."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    object: str

    @property
    def nbytes(self) -> int:
        return element_count(self.shape) * itemsize(self.dtype)

    @property
    def params(self) -> int:  # (values: a block-quantized tensor's, not its bytes)
        return element_count(value_shape(self.dtype, self.shape))

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape), "object": self.object}

    @classmethod
    def from_json(cls, d: Any) -> TensorEntry:
        _check(isinstance(d, dict), "tensor entry is not an object")
        _check(d.get("dtype") in DTYPES, f"unknown dtype {d.get('dtype')!r}")
        shape = d.get("shape")
        _check(
            isinstance(shape, list) and blocks_fit(d["dtype"], shape), "shape is not a list (ending in a block's bytes)"
        )
        return cls(
            _str(d.get("name"), "tensor name"),
            d["dtype"],
            tuple(_int(x, "dimension") for x in shape),
            _oid(d.get("object"), "tensor object"),
        )


@dataclass(frozen=True)
class FileEntry:
    """One file of a version. `type` is "blob" (bytes in `object`), "safetensors" (header
    bytes in `object`, then `tensors` in data order) or "torch-zip" (a PyTorch checkpoint: the
    file less its storages in `object`, each storage a tensor at `storage_offsets`, the state
    dict's tensors as `views` of them) or "gguf" (the file less its tensors in `object`, each
    tensor at `storage_offsets`). `digest` is the blake3 of the whole file, checked after
    every rebuild."""

    path: str
    type: str
    size: int
    digest: str
    object: str
    tensors: tuple[TensorEntry, ...] = ()
    converted_from: str | None = None
    storage_offsets: tuple[int, ...] = ()
    views: tuple[TensorView, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path,
            "type": self.type,
            "size": self.size,
            "digest": self.digest,
            "object": self.object,
        }
        if self.type in ("safetensors", "torch-zip", "gguf"):
            d["tensors"] = [t.to_json() for t in self.tensors]
        if self.type in ("torch-zip", "gguf"):
            d["storage_offsets"] = list(self.storage_offsets)
        if self.type == "torch-zip":
            d["views"] = [v.to_json() for v in self.views]
        if self.converted_from:
            d["converted_from"] = self.converted_from
        return d

    @classmethod
    def from_json(cls, d: Any) -> FileEntry:
        _check(isinstance(d, dict), "file entry is not an object")
        kind = d.get("type")
        _check(kind in ("blob", "safetensors", "torch-zip", "gguf"), f"unknown file type {kind!r}")
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
        entries = tuple(TensorEntry.from_json(t) for t in tensors)
        size = _int(d.get("size"), "file size")
        _check(kind != "blob" or not entries, "a blob file lists tensors")
        _check(sum(t.nbytes for t in entries) <= size, "the file's tensors hold more bytes than the file")
        try:
            numels, sizes = [t.params for t in entries], [t.nbytes for t in entries]
            offsets, views = storages_and_views(d, kind, numels, sizes, size)
        except ValueError as exc:
            raise RecordError(str(exc)) from None
        digest, oid = _oid(d.get("digest"), "file digest"), _oid(d.get("object"), "file object")
        return cls(d["path"], kind, size, digest, oid, entries, conv, offsets, views)


@dataclass(frozen=True)
class Manifest:
    """The files of a version, in order: enough to rebuild each byte for byte."""

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
    # The version's number in its model's history when it is not its predecessor's plus one
    # (1 without one): a name re-used after its versions were removed goes on from the last.
    number: int | None = None
    run: dict[str, Any] | None = None  # a checkpoint of a training run (mgit.store.run_record)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": RECORD_FORMAT,
            "model": self.model,
            "manifest": self.manifest,
            "parents": [p.to_json() for p in self.parents],
            "predecessor": self.predecessor,
            "message": self.message,
            "author": self.author,
            "time": self.time,
            "tags": dict(self.tags),
            "summary": dict(self.summary),
            "recipe": self.recipe,
            "lossy": self.lossy,
            **({"number": self.number} if self.number is not None else {}),
            **({"run": self.run} if self.run is not None else {}),
        }

    @classmethod
    def from_json(cls, d: Any) -> Version:
        """A version record as this version of MGit writes it, every field checked as `add`
        checks its inputs (docs/format.md, "Version record"): whatever sent it, a reader gets
        a valid model name, known relations, ids, times, and text without terminal escapes."""
        _check(isinstance(d, dict) and d.get("format") == RECORD_FORMAT, "not a version of format 1")
        unknown, missing = sorted(set(d) - VERSION_KEYS - VERSION_OPTIONAL_KEYS), sorted(VERSION_KEYS - set(d))
        _check(not unknown, f"unknown field {unknown[0]!r}" if unknown else "")
        _check(not missing, f"no field {missing[0]!r}" if missing else "")
        if (why := model_name_problem(d["model"])) is not None:
            raise RecordError(f"invalid model: {why}")
        pred, summary = d["predecessor"], d["summary"]
        _check(
            isinstance(summary, dict) and set(summary) <= SUMMARY_KEYS,
            "summary is not a count of files, tensors, params and logical_bytes",
        )
        return cls(
            model=d["model"],
            manifest=_oid(d["manifest"], "manifest"),
            parents=_parents(d["parents"]),
            predecessor=None if pred is None else _oid(pred, "predecessor"),
            message=_text(d["message"], "message", MAX_MESSAGE, multiline=True),
            author=_text(d["author"], "author", MAX_AUTHOR),
            time=_time(d["time"]),
            tags=_tags(d["tags"]),
            summary={k: _int(v, f"summary {k}") for k, v in summary.items()},
            recipe=_recipe(d["recipe"]),
            lossy=_lossy(d["lossy"]),
            number=_version_number(d["number"]) if "number" in d else None,
            run=checked_run(d["run"], RecordError) if "run" in d else None,
        )

    def linked_versions(self) -> list[str]:
        """Versions this one points to (predecessor first, then lineage parents)."""
        return ([self.predecessor] if self.predecessor else []) + [p.version for p in self.parents]

    def linked_objects(self) -> set[str]:
        """Objects this record names besides versions: its manifest and its recipe's source."""
        source = (self.recipe or {}).get("source")
        return {self.manifest} | ({source} if isinstance(source, str) else set())


# --- walking what versions link to ---------------------------------------------------------------
def walk_history(vid: str | None, predecessor: Callable[[str], str | None]) -> Iterator[str]:
    """`vid` and its predecessors, newest first: the history of one model (or any line of
    versions one link apart: bisect follows first ancestors). `predecessor` is asked of a
    version only when the walk goes on past it, so a caller that stops early reads no
    further; the walk ends at a version with no predecessor (or one seen already)."""
    seen: set[str] = set()
    while vid and vid not in seen:
        seen.add(vid)
        yield vid
        vid = predecessor(vid)


def ancestors_first(
    tips: Iterable[str], linked: Callable[[str], Iterable[str]], *, stop: Callable[[str], bool] = lambda vid: False
) -> list[str]:
    """The versions reachable from `tips` through `linked` (what a version links to: its
    predecessor and lineage parents), each after every version it links to, the first tip's
    first; not entering a version for which `stop` is true. `linked` is asked once a version.
    Iterative: a history can be longer than Python's recursion limit."""
    order: list[str] = []
    seen: set[str] = set()
    stack: list[tuple[str, bool]] = [(t, False) for t in reversed(list(tips))]
    while stack:
        vid, expanded = stack.pop()
        if expanded:
            order.append(vid)
            continue
        if vid in seen or stop(vid):
            continue
        seen.add(vid)
        stack.append((vid, True))
        stack.extend((v, False) for v in linked(vid))
    return order
