"""A cascade's plan: what rebuilding the descendants of a model would do to each of them, in
topological order (see the package's docstring for the rules). Runs no user code: recorded
test results are read, not run, and judged by the tests' conditions now.

A parent whose recorded result of a test does not pass (a failure or an error) blocks the
models built on it, unless the cascade is told to ignore that test (`ignore_tests`: the
user's override, named in the plan, the report and each new version's message). A test
that applies to a parent and has no recorded result is named in the step (`untested`): the
run tests that parent first and blocks on it as the plan would have, had it been recorded.
"""

from __future__ import annotations

import fnmatch
import functools
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from mgit import usercode
from mgit.checks import Checks
from mgit.errors import MgitError
from mgit.lineage.graph import Lineage, LineageEdge
from mgit.repo.repository import Repo
from mgit.reports import Report

REBUILT = ("recipe", "manual", "blocked")  # actions under which a model gets (or needs) a new version
PENDING = (*REBUILT, "skipped")  # ... or would, but --only leaves it: the models below it cannot be rebuilt
Verdicts = Callable[[str], tuple[tuple[str, str | None], ...]]  # version -> (test, recorded status or None)


@dataclass(frozen=True)
class PlannedParent(Report):
    model: str
    relation: str
    recorded: str  # the version the child was built on
    recorded_ref: str
    version: str | None  # the version to rebuild on; None when this parent is rebuilt first
    ref: str  # `base@2`, or `ft@next` for a parent rebuilt in this cascade


@dataclass(frozen=True)
class CascadeStep(Report):
    """One descendant of the cascade's model and what the cascade does with it: `recipe`
    (re-run it), `manual` (no recipe), `blocked` (below a model that is not rebuilt, or on a
    parent whose tests do not pass), `skipped` (not matched by --only) or `up-to-date`."""

    model: str
    head: str
    head_ref: str
    action: str
    relation: str
    parents: list[PlannedParent]
    recipe: dict[str, Any] | None = None
    source_changed: bool = False  # the recipe's file changed since the head was made
    recorded_source: bool = False  # runs the source recorded with the version (its file is not here, or asked)
    problem: str | None = None  # the recipe can be run neither from its file nor from a recorded source
    reason: str | None = None  # why it is manual, blocked or skipped
    command: str | None = None  # for a manual step: how to record a recipe
    untested: list[str] = field(default_factory=list)  # `base@2: acc`, tests of parents not run yet
    ignored: list[str] = field(default_factory=list)  # `base@2 fails acc`, failures the user overrides

    @property
    def waits_for(self) -> list[str]:
        """Planned parents that must be rebuilt before this model."""
        return [p.model for p in self.parents if p.version is None]


@dataclass(frozen=True)
class CascadePlan(Report):
    model: str
    version: str
    ref: str  # the cascade's model at its latest version, `base@2`
    steps: list[CascadeStep]  # every descendant, parents before children
    ignored_tests: list[str] = field(default_factory=list)  # whose failures block nothing (--ignore-tests)

    def count(self, action: str) -> int:
        return sum(s.action == action for s in self.steps)


def plan_cascade(
    repo: Repo,
    name: str,
    *,
    only: str | None = None,
    recorded_source: bool = False,
    ignore_tests: Sequence[str] = (),
) -> CascadePlan:
    """What a cascade from `name` (a model, or a ref of one: its latest version counts) would
    do, in topological order. Runs no user code: recorded test results are read, not run.
    The tests named in `ignore_tests` block nothing (each must be attached)."""
    top = repo.model_of(name)
    graph = repo.lineage
    node = graph.node(top)
    scope = {top, *graph.descendants(top)}
    steps: dict[str, CascadeStep] = {}
    checks = Checks(repo)
    ignored = sorted({checks.test(t, checked=False).name for t in ignore_tests})  # CheckNotFoundError

    @functools.cache
    def verdicts(vid: str) -> tuple[tuple[str, str | None], ...]:  # recorded results only: planning runs nothing
        return tuple((t, o.status if o else None) for t, o in checks.standing(vid, graph).items())

    for model in graph.topological_order(scope - {top}):
        steps[model] = _plan_step(repo, graph, model, scope, steps, only, verdicts, recorded_source, ignored)
    return CascadePlan(top, node.head, f"{top}@{node.seq}", list(steps.values()), ignored)


def not_passing(ref: str, verdicts: list[tuple[str, str]]) -> str:
    """`ft@2 fails acc; errors in size`: why a version's tests block what is built on it."""
    fails = [t for t, status in verdicts if status == "fail"]
    errors = [t for t, status in verdicts if status != "fail"]
    said = ([f"fails {', '.join(fails)}"] if fails else []) + ([f"errors in {', '.join(errors)}"] if errors else [])
    return f"{ref} {'; '.join(said)}"


def _plan_step(
    repo: Repo,
    graph: Lineage,
    model: str,
    scope: set[str],
    steps: dict[str, CascadeStep],
    only: str | None,
    verdicts: Verdicts,
    recorded_source: bool,
    ignored: list[str],
) -> CascadeStep:
    node = graph.node(model)
    edges = graph.parents(model)
    rebuilt = {e.parent for e in edges if e.parent in steps and steps[e.parent].action in PENDING}
    changed = [e for e in edges if e.parent in scope and (e.parent in rebuilt or e.stale)]
    parents = [_planned_parent(graph, e, e.parent in rebuilt) for e in edges]
    step = CascadeStep(
        model, node.head, f"{model}@{node.seq}", "up-to-date", edges[0].relation if edges else "other", parents
    )
    if not changed:
        return step
    if all(e.relation == "adapter" for e in changed) and repo.info(node.head).recipe is None:
        # An adapter holds none of its base's weights: it is kept as it is (still recorded on
        # the base version it was trained on), and what is merged from it is merged again.
        return replace(step, reason="an adapter: kept as it is")
    if only is not None and not fnmatch.fnmatchcase(model, only):
        return replace(step, action="skipped", reason=f"not matched by --only {only}")
    recipe = repo.info(node.head).recipe
    step = replace(step, recipe=recipe)
    stopped = [e.parent for e in edges if e.parent in rebuilt and steps[e.parent].action != "recipe"]
    if stopped:
        return replace(step, action="blocked", reason=f"below {stopped[0]}, which is {steps[stopped[0]].action}")
    bad: list[str] = []  # `base@2 fails acc`, per parent
    untested: list[str] = []
    overridden: list[str] = []
    for e in edges:
        if e.parent in scope and e.parent not in rebuilt:
            p = graph.node(e.parent)
            found = [(t, status) for t, status in verdicts(p.head) if status != "pass"]
            if wrong := [(t, s) for t, s in found if s is not None and t not in ignored]:
                bad.append(not_passing(f"{p.name}@{p.seq}", wrong))
            if wrong := [(t, s) for t, s in found if s is not None and t in ignored]:
                overridden.append(not_passing(f"{p.name}@{p.seq}", wrong))
            untested += [f"{p.name}@{p.seq}: {t}" for t, s in found if s is None and t not in ignored]
    if bad:
        return replace(step, action="blocked", reason=bad[0])
    step = replace(step, untested=untested, ignored=overridden)
    if recipe is None:
        return replace(step, action="manual", reason="no recipe recorded", command=_record_command(step))
    problem, source_changed, stored = None, False, recorded_source and recipe.get("source") is not None
    try:
        source_changed = usercode.source_hash(str(recipe.get("fn")), cwd=repo.root) != recipe.get("source_sha256")
    except MgitError as exc:
        stored = recipe.get("source") is not None  # a teammate's recipe: run what was recorded
        problem = None if stored else str(exc)
    return replace(
        step, action="recipe", source_changed=source_changed and not stored, recorded_source=stored, problem=problem
    )


def _planned_parent(graph: Lineage, edge: LineageEdge, rebuilt: bool) -> PlannedParent:
    latest = graph.node(edge.parent)
    if rebuilt:
        return PlannedParent(
            edge.parent, edge.relation, edge.parent_version, edge.parent_ref, None, f"{edge.parent}@next"
        )
    return PlannedParent(
        edge.parent, edge.relation, edge.parent_version, edge.parent_ref, latest.head, f"{latest.name}@{latest.seq}"
    )


def _record_command(step: CascadeStep) -> str:
    """The commands that give a model without a recipe one: its current files again, as a
    new version on the same parents, with a recipe recorded (not run). The next cascade
    then rebuilds it with that recipe."""
    folder = f"{step.model.replace('/', '-')}-v{step.head_ref.rpartition('@')[2]}"
    args = ["mgit", "add", folder, "--name", step.model]
    for p in step.parents:
        args += ["--parent", p.recorded_ref]
    args += ["--relation", step.relation, "--recipe", "FILE.py:FUNCTION", "--param", "KEY=VALUE"]
    return f"{shlex.join(['mgit', 'checkout', step.head_ref, '-o', folder])} && {shlex.join(args)}"
