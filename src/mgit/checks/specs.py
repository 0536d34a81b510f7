"""A test's registration: its function, what it is attached to, its pass conditions; one
that came from a remote, checked field by field."""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from typing import Any

from mgit import usercode
from mgit.errors import MgitError, RemoteError
from mgit.execution import resources_of
from mgit.reports import Report
from mgit.store.objects import OID_RE, tag_matches


@dataclass(frozen=True)
class Condition(Report):
    metric: str
    bound: str  # "min" (metric >= value) or "max" (metric <= value)
    value: float

    def check(self, metrics: dict[str, float]) -> str | None:
        """Why the metrics break this condition, or None."""
        got = metrics.get(self.metric)
        if got is None:
            return f"{self.metric} is missing"
        if math.isnan(got) or (got < self.value if self.bound == "min" else got > self.value):
            return f"{self.metric} {got:g} {'<' if self.bound == 'min' else '>'} {self.value:g}"
        return None


@dataclass(frozen=True)
class CheckSpec(Report):
    name: str
    fn: str
    target: str  # a model name, a glob (`bert-*`) or a tag (`tag:KEY[=VALUE]`)
    inherit: bool
    conditions: list[Condition]
    timeout: float | None = None
    source: str | None = None  # the object holding the function's source file when attached
    resources: dict[str, float] = field(default_factory=dict)  # declared to a cluster (mgit.execution)

    def matches(self, model: str, tags: dict[str, str]) -> bool:
        if self.target.startswith("tag:"):
            return tag_matches(self.target[4:], tags)
        return fnmatch.fnmatchcase(model, self.target)


def is_pattern(target: str) -> bool:
    """Whether a test's target is a glob or a tag rather than one model's name."""
    return target.startswith("tag:") or any(c in target for c in "*?[")


def parse_registration(record: Any) -> tuple[CheckSpec, str]:
    """A registration from a remote, checked field by field (a RemoteError if malformed)."""
    try:
        conditions = [Condition(str(c["metric"]), c["bound"], float(c["value"])) for c in record["conditions"]]
        spec = CheckSpec(
            record["name"],
            record["fn"],
            record["target"],
            record["inherit"],
            conditions,
            record.get("timeout"),
            record.get("source"),
            resources_of(record.get("resources")),
        )
        ok = (
            all(isinstance(v, str) and 0 < len(v) <= 1024 for v in (spec.name, spec.fn, spec.target))
            and isinstance(spec.inherit, bool)
            and all(c.bound in ("min", "max") for c in conditions)
            and (spec.timeout is None or (isinstance(spec.timeout, (int, float)) and spec.timeout > 0))
            and (spec.source is None or (isinstance(spec.source, str) and OID_RE.match(spec.source) is not None))
            and isinstance(record.get("created"), str)
        )
        usercode.check_reference(spec.fn)  # a module path or a file below the work folder, nothing else
    except (KeyError, TypeError, ValueError, AttributeError, MgitError):
        ok = False
    if not ok:
        raise RemoteError(f"a malformed test registration {str(record)[:80]!r}")
    return spec, record["created"]
