"""The dataclasses that Repo verbs return. The CLI prints them as tables or, with `--json`,
as `to_json()`: one code path for people and programs.

Here: `Report`, and what the reading verbs (ls, log, show, du) and add return. The results of
the other verbs live beside the verb that makes them (FsckResult in mgit.repo.fsck, TagsResult
in mgit.repo.tagging, ParentSuggestion in mgit.lineage.inference, ...): every command imports
this module, and making a frozen dataclass costs about a millisecond at import."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (parent inference's result is its module's; an add only carries it)
    from mgit.lineage.inference import ParentSuggestion


def json_safe(value: Any) -> Any:
    """A value as strict JSON holds it: a non-finite float (a NaN metric, an infinite
    distance) becomes null, numpy and torch scalars become numbers. The one convention of
    the CLI's `--json`, recorded results and the web pages (docs/format.md)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and not isinstance(value, (str, bytes)):
        return json_safe(value.item())  # numpy and torch scalars
    return value


def human_size(n: int | float) -> str:
    """Bytes in a short human form, binary units: `512 B`, `86.7 MiB`, `1.2 TiB`."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


class Report:
    def to_json(self) -> dict[str, Any]:
        return json_safe(dataclasses.asdict(self))  # type: ignore[call-overload,no-any-return]


@dataclass(frozen=True)
class ParentInfo(Report):
    """A lineage parent as a report names it: version id, model, number, relation."""

    version: str
    model: str
    seq: int
    relation: str
    removed: bool = False  # removed from its model's history (`mgit rm`); its number is never given again

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"

    @property
    def label(self) -> str:
        """`ft@3`, or `ft@3 [removed]`."""
        return f"{self.ref} [removed]" if self.removed else self.ref


@dataclass(frozen=True)
class VersionInfo(Report):
    """One version as `log` lists it: model, number, parents, tags, recipe, sizes."""

    id: str
    model: str
    seq: int
    time: str
    author: str
    message: str
    parents: list[ParentInfo]
    predecessor: str | None
    tags: dict[str, str]
    files: int
    tensors: int
    params: int
    logical_bytes: int
    stored_bytes: int
    new_bytes: int
    lossy: dict[str, Any] | None = None
    recipe: dict[str, Any] | None = None  # how it was made from its parents (fn, params, source hash)
    removed: bool = False  # removed (`mgit rm`): kept while a later version or a child builds on it
    run: dict[str, Any] | None = None  # a training run's checkpoint: run id, step, metrics

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


@dataclass(frozen=True)
class AddResult(Report):
    """What `add` stored: the version, its parents, new and reused bytes, what lossy and
    auto_parent decided."""

    model: str
    version: str
    seq: int
    created: bool
    files: int
    tensors: int
    tensors_new: int
    logical_bytes: int
    new_bytes: int  # of objects no other version uses
    parents: list[ParentInfo]
    notes: list[str] = field(default_factory=list)
    reused_bytes: int = 0  # of new_bytes, found on disk unused (written by an interrupted add) rather than written
    lossy: dict[str, Any] | None = None  # the version's lossy record when it was stored lossily
    lossless_reason: str | None = None  # why a lossy add was stored losslessly instead
    gate: dict[str, dict[str, float]] | None = None  # gate metrics: original and reconstruction
    auto_parent: ParentSuggestion | None = None  # what auto_parent=True found, whether it was taken or not
    signed_by: str | None = None  # the fingerprint of the key that signed it (add --sign, signing.always)


@dataclass(frozen=True)
class FileInfo(Report):
    """One file of a version: its path, type, size, blake3 digest, tensor count."""

    path: str
    type: str
    size: int
    digest: str
    tensors: int = 0
    converted_from: str | None = None


@dataclass(frozen=True)
class StorageInfo(Report):
    """How the objects of one version are stored, by codec chain (`raw`, `byteplanes+zstd`, ...)."""

    codec: str
    objects: int
    logical_bytes: int
    stored_bytes: int


@dataclass(frozen=True)
class ShowResult(Report):
    """One version as `show` describes it: files, parameters by dtype, storage, quantization, adapter."""

    version: VersionInfo
    files: list[FileInfo]
    dtypes: dict[str, int]  # dtype -> parameter count
    storage: list[StorageInfo]
    shared_objects: int  # objects of this version that other versions use too
    tensor_storage: dict[str, int] = field(default_factory=dict)  # deduplicated/delta/derived/standalone
    # what config.json's quantization_config announces: method, bits, group_size, format, strategy, label
    quantization: dict[str, Any] | None = None
    adapter: dict[str, Any] | None = None  # a PEFT adapter's type, rank, alpha, target modules, base
    training_args: dict[str, Any] | None = None  # a checkpoint's: the arguments its run was trained with


@dataclass(frozen=True)
class VersionStorage(Report):
    """How one version is stored: bytes of the objects it uses, and its tensors by kind
    (deduplicated, delta, derived, standalone)."""

    stored_bytes: int
    tensors: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelSummary(Report):
    """One model as `ls` lists it: its latest version, that version's parents, size and time."""

    name: str
    head: str
    seq: int
    versions: int
    parents: list[ParentInfo]
    logical_bytes: int
    time: str
    lossy: dict[str, Any] | None = None  # the head's lossy record (its bound and max error)


@dataclass(frozen=True)
class ModelUsage(Report):
    """One model's storage as `du` counts it."""

    name: str
    versions: int
    logical_bytes: int
    stored_bytes: int
    objects: int
    tensor_storage: dict[str, int] = field(default_factory=dict)  # deduplicated/delta/derived/standalone

    @property
    def reduction(self) -> float:
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "reduction": round(self.reduction, 3)}


@dataclass(frozen=True)
class DuResult(Report):
    """`du`: each model's storage, and the repository's on disk."""

    models: list[ModelUsage]
    logical_bytes: int  # what every version would take as plain files
    stored_bytes: int  # objects that some model still uses
    objects: int
    on_disk_bytes: int  # every object on disk, reachable or not
    unreachable_bytes: int
    remote_only_bytes: int = 0  # a lazy clone's: objects its versions use that are still on the remote only
    local_bytes: int | None = None  # a lazy clone's: those it has here

    @property
    def reduction(self) -> float:
        return self.logical_bytes / self.stored_bytes if self.stored_bytes else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "models": [m.to_json() for m in self.models],
            "reduction": round(self.reduction, 3),
        }
