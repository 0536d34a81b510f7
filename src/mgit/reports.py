"""The dataclasses that Repo verbs return. The CLI prints them as tables or, with `--json`,
as `to_json()`: one code path for people and programs."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


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
    path: str
    type: str
    size: int
    digest: str
    tensors: int = 0
    converted_from: str | None = None


@dataclass(frozen=True)
class CheckoutResult(Report):
    model: str
    version: str
    seq: int
    out_dir: str
    files: list[FileInfo]
    bytes: int
    notes: list[str] = field(default_factory=list)
    model_signature: str | None = None  # the OpenSSF model signature written over the folder, if asked
    signer: str | None = None  # its key: type and fingerprint (`ecdsa-sha2-nistp256 SHA256:...`)


@dataclass(frozen=True)
class StorageInfo(Report):
    """How the objects of one version are stored, by codec chain (`raw`, `byteplanes+zstd`, ...)."""

    codec: str
    objects: int
    logical_bytes: int
    stored_bytes: int


@dataclass(frozen=True)
class ShowResult(Report):
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


@dataclass(frozen=True)
class Problem(Report):
    object: str
    kind: str  # "corrupt", "missing", "ref", "catalog"
    message: str
    used_by: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FsckResult(Report):
    objects_checked: int
    bytes_checked: int
    refs_checked: int
    versions_checked: int
    problems: list[Problem]
    leftovers: int  # temporary files of interrupted writes (harmless; gc removes them)
    unreferenced: int = 0  # objects no ref reaches (an interrupted add's, a removed model's): gc removes them
    unreferenced_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "ok": self.ok}


@dataclass(frozen=True)
class GcResult(Report):
    dry_run: bool
    removed: list[str]
    removed_bytes: int
    kept: int
    leftovers: int


@dataclass(frozen=True)
class RemoveResult(Report):
    """What `rm` removed: a model (its head, how many versions), or one version of it
    (`version`; `head` is then the model's head after, None if it had no other)."""

    model: str
    head: str | None
    versions: int
    version: str | None = None
    seq: int | None = None
    kept_by: list[str] = field(default_factory=list)  # what still builds on it (with --force)


@dataclass(frozen=True)
class RenameResult(Report):
    """`rename`: the model's old and new names, its head and that head's number (kept)."""

    old: str
    new: str
    head: str
    seq: int
    retargeted_tests: list[str] = field(default_factory=list)  # registered tests whose target followed


@dataclass(frozen=True)
class TagsResult(Report):
    """A version's tags (`mgit tag`): what it has now, and what was set on it after it was
    added (`null`: a tag of its record removed)."""

    model: str
    seq: int
    version: str
    tags: dict[str, str]
    set_later: dict[str, str | None]
    changed: bool = False

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


@dataclass(frozen=True)
class ParentCandidate(Report):
    """A stored version ranked as a parent of a model, with the evidence (see mgit.lineage.inference)."""

    version: str
    model: str
    seq: int
    score: float  # in [0, 1]: relatedness x proximity, halved if it looks derived from the query
    confidence: float  # the score, discounted when an unexplained rival is nearly as good
    relation: str  # how the model would derive from it: quantize, prune, adapter, merge, distill, finetune
    direction: str  # "candidate -> query", "query -> candidate" (a child rather than a parent) or "unknown"
    structure: float  # tensors with the same name and shape / all tensors of both
    identical: float  # share of the model's float tensors that the candidate holds bit for bit
    distance: float | None  # RMS relative distance of sampled values (unrelated: ~1.4); None if none compared
    exact: float  # share of sampled values the candidate reproduces exactly (after a cast or requantization)
    compared: int  # tensors compared value by value
    merge_with: str | None = None  # the other parent when the model looks like a merge of the two
    reasons: list[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


@dataclass(frozen=True)
class ParentSuggestion(Report):
    """Candidate parents of a model, best first, and the choice `--auto-parent` makes of them."""

    query: str
    tensors: int
    compared: int  # stored versions compared
    seconds: float
    candidates: list[ParentCandidate]
    min_confidence: float
    parents: list[str]  # the chosen parents' version ids; empty when none is confident enough
    relation: str | None  # the chosen relation
    verdict: str  # what was chosen and why, or why nothing was
    notes: list[str] = field(default_factory=list)
    # Versions (model@seq) holding every tensor of the model bit for bit: it is stored already as
    # these, which are never its candidates (added under another name, it is a copy of the first).
    stored_as: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class RunCheckpoint(Report):
    """One checkpoint of a run as `prune-run` judged it: kept (and why) or removed."""

    ref: str
    version: str
    step: int | None
    kept: str | None  # why it stays (None: removed)
    stored_bytes: int = 0  # of the objects it alone uses, freed by gc when it is removed


@dataclass(frozen=True)
class PruneResult(Report):
    """What `prune-run` removed from a run (or, with `dry_run`, would remove)."""

    model: str
    dry_run: bool
    checkpoints: list[RunCheckpoint]  # oldest first
    freed_bytes: int  # stored bytes of the objects only removed checkpoints use: what gc frees
    relinked: int = 0  # kept versions recorded again, their predecessor the kept one before
    recoded: int = 0  # kept tensors coded again, against a kept base, so their old bases can go
    head: str | None = None  # the model's latest version afterwards (its id changes when relinked)

    @property
    def removed(self) -> list[RunCheckpoint]:
        return [c for c in self.checkpoints if c.kept is None]
