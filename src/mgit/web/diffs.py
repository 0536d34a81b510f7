"""The diff page: two stored versions compared by `mgit.diff` (the numbers of `mgit diff`),
in a background thread so that a diff of two large models shows its progress instead of
holding the request, and a heatmap of relative change, layers by tensor kinds.

Sides are refs only, resolved in the catalog: a request never names a path (unlike `mgit
diff`, where an argument that exists on disk is a folder). A diff is keyed by the two
version ids, which never change, so a finished one is kept (the last few) and served again.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from mgit.diff import DiffResult, DiffSide, diff_models, stored_side
from mgit.errors import BadParameterError, DiffsBusyError, MgitError
from mgit.repo.repository import Repo

KEPT = 8  # finished diffs kept
RUNNING = 1  # diffs computed at once (each uses every core)
WAITING = 16  # diffs asked for and not finished: more are refused until some finish
MISSING = "#e2e8f0"
COLORS = {
    "identical": "#f7fafc",
    "same": "#f7fafc",
    "shape": "#805ad5",
    "dtype": "#d69e2e",
    "only_a": "#4a5568",
    "only_b": "#3182ce",
}


@dataclass
class DiffJob:
    a: str  # version ids
    b: str
    state: str = "queued"  # queued, running, done, error
    done: int = 0  # bytes compared
    total: int = 0
    result: DiffResult | None = None
    error: dict[str, str | None] = field(default_factory=dict)

    def progress(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "done": self.done,
            "total": self.total,
            **({"error": self.error} if self.error else {}),
        }


class DiffJobs:
    """Diffs being computed or recently done, by (version A, version B)."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self._lock = threading.Lock()
        self._slots = threading.Semaphore(RUNNING)
        self._jobs: OrderedDict[tuple[str, str], DiffJob] = OrderedDict()

    def job(self, a: str, b: str) -> DiffJob:
        """The job comparing versions `a` and `b` (ids), started if it is not known."""
        with self._lock:
            job = self._jobs.get((a, b))
            if job is not None and job.state != "error":
                self._jobs.move_to_end((a, b))
                return job
            if sum(j.state in ("queued", "running") for j in self._jobs.values()) >= WAITING:
                raise DiffsBusyError(WAITING)
            job = self._jobs[(a, b)] = DiffJob(a, b)
            finished = [k for k, j in self._jobs.items() if j.state in ("done", "error")]
            for k in finished[: max(0, len(finished) - KEPT)]:
                del self._jobs[k]
        threading.Thread(target=self._run, args=(job,), name="mgit-web-diff", daemon=True).start()
        return job

    def _run(self, job: DiffJob) -> None:
        with self._slots:
            job.state = "running"
            try:
                sides = [self._side(v) for v in (job.a, job.b)]

                def start(total: int) -> Any:
                    job.total = total

                    def tick(n: int) -> None:
                        job.done += n

                    return tick

                with self.repo.catalog.explained():
                    job.result = diff_models(*sides, progress=start)
                job.state = "done"
            except MgitError as exc:
                job.error = {"message": exc.message, "hint": exc.hint}
                job.state = "error"
            except Exception as exc:  # shown on the page rather than lost in a thread
                job.error = {"message": f"{type(exc).__name__}: {exc}", "hint": None}
                job.state = "error"

    def _side(self, vid: str) -> Any:
        info = self.repo.info(vid)
        return stored_side(self.repo.store, DiffSide(info.ref, "ref", vid), self.repo.manifest(vid))


def resolve_pair(repo: Repo, a: str, b: str) -> tuple[str, str]:
    """The version ids of two refs (`NAME`, `NAME@N`, `NAME@HEX`), or why not."""
    if not a or not b:
        raise BadParameterError("a" if not a else "b", "two refs to compare: ?a=NAME@N&b=NAME@M")
    return repo.resolve(a), repo.resolve(b)


def heatmap(result: DiffResult) -> dict[str, Any]:
    """Rows: the layers (groups) in order; columns: tensor kinds (a tensor's name after its
    layer, `attention.self.query.weight`), in order of first appearance. A cell holds the
    tensor's status and relative change; `color` is what the page fills it with."""
    kinds: dict[str, None] = {}
    rows = []
    members: dict[str, list[Any]] = {}
    for t in result.tensors:
        members.setdefault(t.group, []).append(t)
    for g in result.groups:
        cells = {}
        for t in members.get(g.name, []):
            kind = t.name[len(g.name) + 1 :] if t.name.startswith(g.name + ".") else "(whole)"
            kinds.setdefault(kind, None)
            rel = t.stats.rel_change if t.stats is not None else None
            cells[kind] = {
                "tensor": t.name,
                "status": t.status,
                "rel_change": _finite(rel),
                "color": color(t.status, rel),
            }
        rows.append(
            {
                "group": g.name,
                "rel_change": _finite(g.rel_change),
                "changed_values": g.changed_values,
                "params": g.params,
                "max_rank": g.max_rank,
                "rank_capped": g.rank_capped,
                "counts": g.counts,
                "cells": cells,
            }
        )
    return {
        "kinds": list(kinds),
        "rows": rows,
        "missing": MISSING,
        "scale": [{"rel_change": 10.0**e, "color": color("changed", 10.0**e)} for e in range(-6, 1)],
    }


def color(status: str, rel: float | None) -> str:
    """A cell's fill: by status, and for changed values by log10 of the relative change
    (1e-6 and below pale yellow, 1 and above dark red)."""
    if status not in ("changed", "dtype") or rel is None:
        return COLORS.get(status, MISSING)
    if rel == 0:
        return COLORS["identical"]
    t = min(1.0, max(0.0, (math.log10(rel) + 6) / 6)) if rel > 0 else 0.0
    stops = [(255, 245, 200), (246, 173, 85), (197, 48, 48), (99, 23, 27)]
    x = t * (len(stops) - 1)
    i = min(int(x), len(stops) - 2)
    f = x - i
    r, g, b = (round(stops[i][c] + (stops[i + 1][c] - stops[i][c]) * f) for c in range(3))
    return f"#{r:02x}{g:02x}{b:02x}"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None
