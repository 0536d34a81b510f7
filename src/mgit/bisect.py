"""Bisect: which ancestor introduced a test failure.

The ancestors of a version are its lineage parents (the exact versions it was derived from)
and its predecessor (the version before it). Starting from a failing version, bisect follows
one line of ancestry (the model's own history, then the version its first version was
derived from, and so on), searches it (galloping back from the failing end, then binary
search) for a failing version whose next ancestor passes, then checks that version's other
ancestors: if one of them fails too, the
failure came from there and the search goes on along that line. It ends at a version that
fails while every ancestor passes (the edge that introduced the failure), or at a root that
has always failed.

Results already recorded for the same test source are reused (judged by the test's
conditions now), so a second bisect, or one after `mgit test run`, runs few tests or none.
An error (the test raised, hung or gave no metrics) does not pass: bisect looks for where
the test stopped passing, and says whether it fails or errs there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mgit.checks import CheckOutcome, Checks
from mgit.errors import NothingToBisectError
from mgit.repo.repository import Repo
from mgit.reports import Report
from mgit.store.objects import walk_history


@dataclass(frozen=True)
class BisectStep(Report):
    ref: str
    version: str
    status: str
    reused: bool


@dataclass(frozen=True)
class BisectResult(Report):
    test: str
    start: str  # the failing version bisect started from
    culprit: str  # `model@seq`: the earliest failing version whose ancestors all pass
    culprit_version: str
    parent: str | None  # the passing ancestor on the edge that introduced the failure
    parent_version: str | None
    edge: str | None  # "lineage" (derived from the parent) or "history" (a new version); None at a root
    relation: str | None  # the lineage relation, for a lineage edge
    reasons: list[str]  # why the culprit fails
    steps: list[BisectStep]  # every version whose result was needed, in the order asked
    tests_run: int  # how many of those had to be run (the rest were recorded)
    diff: dict[str, Any] | None = None  # summary of the diff along the edge
    also: list[str] = field(default_factory=list)  # its other ancestors, all passing: "relation from model@seq"
    status: str = "fail"  # the culprit's: fail, or error (the test raised, hung or gave no metrics there)


def bisect(
    repo: Repo,
    test: str,
    ref: str,
    *,
    timeout: float | None = None,
    force: bool = False,
    trust_remote_code: bool = False,
) -> BisectResult:
    """The edge along the ancestors of `ref` where `test` started to fail (see above). A
    test pulled from a remote and not trusted here runs only with `trust_remote_code`
    (mgit.checks.Checks.require_trust)."""
    with repo.caching():  # the ancestors it checks out share their parents
        return Bisector(repo, test, timeout=timeout, force=force, trust_remote_code=trust_remote_code).run(ref)


class Bisector:
    def __init__(
        self,
        repo: Repo,
        test: str,
        *,
        timeout: float | None = None,
        force: bool = False,
        trust_remote_code: bool = False,
    ) -> None:
        self.repo = repo
        self.checks = Checks(repo)
        self.test = test
        self.timeout = timeout
        self.force = force
        self.results: dict[str, CheckOutcome] = {}
        self.steps: list[BisectStep] = []
        # An unknown test, or one from a remote not trusted here, fails before anything runs.
        self.checks.require_trust([self.checks.test(test)], trust_remote_code=trust_remote_code)

    def outcome(self, vid: str) -> CheckOutcome:
        if vid not in self.results:
            o = self.checks.run_one(vid, self.test, timeout=self.timeout, force=self.force)
            self.results[vid] = o
            self.steps.append(BisectStep(o.ref, vid, o.status, o.reused))
        return self.results[vid]

    def fails(self, vid: str) -> bool:
        return not self.outcome(vid).passed

    def ancestors(self, vid: str) -> list[tuple[str, str, str | None]]:
        """(version, "lineage" or "history", relation) of each ancestor; for a model's first
        version its lineage parents, otherwise its predecessor first."""
        info = self.repo.info(vid)
        lineage = [(p.version, "lineage", p.relation) for p in info.parents]
        history = [(info.predecessor, "history", None)] if info.predecessor else []
        return history + lineage

    def line(self, vid: str) -> list[str]:
        """One line of ancestry from `vid` back to a root, following first ancestors."""
        return list(walk_history(vid, self.first_ancestor))

    def first_ancestor(self, vid: str) -> str | None:
        steps = self.ancestors(vid)
        return steps[0][0] if steps else None

    def run(self, start_ref: str) -> BisectResult:
        start = self.repo.resolve(start_ref)
        if not self.fails(start):
            raise NothingToBisectError(self.test, self.outcome(start).ref, start_ref)
        current, visited = start, set()
        while True:
            visited.add(current)
            chain = self.line(current)
            # chain[lo] fails and chain[hi] passes (hi == len(chain): past the root). Gallop
            # out from the failing end first (1, 2, 4, ... back), so a recent regression
            # costs few runs and a line that failed once long ago and was fixed is not
            # mistaken for the cause; then binary search between the two.
            lo, hi, step = 0, len(chain), 1
            while lo + step < len(chain):
                if not self.fails(chain[lo + step]):
                    hi = lo + step
                    break
                lo, step = lo + step, step * 2
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self.fails(chain[mid]):
                    lo = mid
                else:
                    hi = mid
            culprit = chain[lo]
            passing = chain[lo + 1] if lo + 1 < len(chain) else None
            elsewhere = [
                a for a, _, _ in self.ancestors(culprit) if a != passing and a not in visited and self.fails(a)
            ]
            if not elsewhere:
                return self._result(start, culprit, passing)
            current = elsewhere[0]

    def _result(self, start: str, culprit: str, passing: str | None) -> BisectResult:
        kind = relation = None
        for a, k, rel in self.ancestors(culprit):
            if a == passing:
                kind, relation = k, rel
                break
        diff = None
        if passing is not None:
            d = self.repo.diff(passing, culprit)
            diff = {"summary": d.summary.to_json(), "groups": [g.to_json() for g in d.groups]}
        bad = self.results[culprit]
        also = [
            f"{rel or 'new version'} from {self.outcome(a).ref}"
            for a, _, rel in self.ancestors(culprit)
            if a != passing
        ]
        return BisectResult(
            self.test,
            self.results[start].ref,
            bad.ref,
            culprit,
            self.results[passing].ref if passing else None,
            passing,
            kind,
            relation,
            bad.reasons,
            self.steps,
            sum(1 for s in self.steps if not s.reused),
            diff,
            also,
            bad.status,
        )
