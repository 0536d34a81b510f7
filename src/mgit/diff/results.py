"""The results of a diff (what `mgit diff --json` prints): tensors, groups, files, sides, the summary."""

from __future__ import annotations

from dataclasses import dataclass, field

from mgit.reports import Report
from mgit.tensorstats import TensorStats

STATUSES = ("changed", "dtype", "shape", "only_a", "only_b", "identical", "same")


@dataclass(frozen=True)
class TensorDiff(Report):
    name: str
    group: str
    status: str  # one of STATUSES
    dtype_a: str | None
    dtype_b: str | None
    shape_a: list[int] | None
    shape_b: list[int] | None
    stats: TensorStats | None = None


@dataclass(frozen=True)
class GroupDiff(Report):
    """The tensors under one module prefix (a layer): counts by status and their change."""

    name: str
    tensors: int
    counts: dict[str, int]
    params: int  # of B (of A for tensors only in A)
    changed_values: int
    rel_change: float | None  # ||B-A|| / ||A|| over the group's shared values
    max_abs: float | None
    min_cosine: float | None
    max_rank: int | None
    rank_capped: bool = False


@dataclass(frozen=True)
class FileDiff(Report):
    path: str
    status: str  # "identical", "changed", "only_a", "only_b"
    type: str  # "safetensors", "torch-zip" or "gguf" (its tensors are compared above), or "blob"
    size_a: int | None
    size_b: int | None
    diff: list[str] | None = None  # unified diff lines of a changed text file
    note: str | None = None  # why a changed file has no diff
    path_b: str | None = None  # B's name of the file when it differs (single weight files: mgit.formats.pairing)


@dataclass(frozen=True)
class DiffSide(Report):
    label: str  # "NAME@N" for a ref, the path for a folder or file
    kind: str  # "ref" or "path"
    version: str | None = None


@dataclass(frozen=True)
class DiffSummary(Report):
    tensors_a: int
    tensors_b: int
    params_a: int
    params_b: int
    counts: dict[str, int]  # tensors by status
    compared_values: int  # every value both sides share (same name and shape), unchanged ones included
    changed_values: int
    rel_change: float | None  # ||B-A|| / ||A|| over every shared value
    max_abs: float | None
    files: dict[str, int]  # files by status
    decoded: int  # stored objects decoded (an identical tensor once, one side, for its norm)
    reused: int  # decodes saved by taking a delta base from the other side, already in memory


@dataclass(frozen=True)
class DiffResult(Report):
    a: DiffSide
    b: DiffSide
    structural: bool
    summary: DiffSummary
    groups: list[GroupDiff]
    tensors: list[TensorDiff]
    files: list[FileDiff]
    layers: dict[str, list[int]]  # numbered blocks ("model.layers") -> [count in A, count in B]
    notes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        same = {"identical", "same"}
        return all(t.status in same for t in self.tensors) and all(f.status == "identical" for f in self.files)
