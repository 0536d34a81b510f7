"""Cascades: after a model gets a new version, rebuild its descendants by re-running their
recipes on the new parent versions, commit each result as a new version and run its tests.

A descendant of the cascade's model is *planned* when one of its lineage parents (the
cascade's model or another descendant) is rebuilt in this cascade, or when the parent
version it records is no longer that parent's latest. The second rule is what makes a
cascade resumable: after a failure or a kill, running it again finds exactly the models
still built on old versions, and the finished ones are up to date.

A planned model without a recipe needs a manual update (the plan gives the command that
records a recipe); everything below it is blocked, as is everything below a model whose
recipe or tests failed, or below a parent whose tests fail.

Recipes are user code: they run only here, each in a child process (`mgit.usercode`), on
parent folders checked out into a temporary folder. The output folder is added as one
version, atomically, so a kill leaves the old head or the new one, never half of one.
Independent branches run in parallel on a thread pool: a model starts once all the planned
parents it waits for are done.

A recipe recorded with a version that came from a remote, and a test pulled from one, are
another person's code: a cascade that would run any of it not trusted here stops before it
runs anything, naming it, unless `trust_remote_code` (mgit.checks.Checks.require_trust);
recipes recorded here are trusted (mgit.repo.location).
"""

from __future__ import annotations

import fnmatch
import functools
import shlex
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import mgit.merging  # noqa: F401  (registers how a re-run merge is stored: mgit.execution)
from mgit import usercode
from mgit.checks import CheckOutcome, Checks
from mgit.errors import MgitError
from mgit.execution import Executor, LocalExecutor, RecipeJob, RecipeRun, resources_of
from mgit.lineage.graph import Lineage, LineageEdge
from mgit.repo.location import trusted_code
from mgit.repo.repository import Repo
from mgit.reports import Report
from mgit.util.faults import crash_point

RECIPE_TIMEOUT = 3600.0  # per recipe run: a fine-tune can take a while
REBUILT = ("recipe", "manual", "blocked")  # actions under which a model gets (or needs) a new version
FAILED = ("failed-recipe", "failed-tests")
ModelProgress = Callable[[str, str], None]  # (model, what happens to it)


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
    (re-run it), `manual` (no recipe), `blocked`, `skipped` (not matched by --only) or
    `up-to-date`."""

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

    def count(self, action: str) -> int:
        return sum(s.action == action for s in self.steps)


@dataclass(frozen=True)
class CheckLine(Report):
    """One test's result on one version."""

    test: str
    status: str  # pass, fail or error
    metrics: dict[str, float]
    reasons: list[str]


@dataclass(frozen=True)
class ModelResult(Report):
    """What the cascade did to one model. `tests_before`/`tests_after` are None when no test
    was run, [] when none applies."""

    model: str
    status: str  # updated, failed-recipe, failed-tests, manual, blocked, skipped, up-to-date
    old: str
    old_ref: str
    new: str | None = None
    new_ref: str | None = None
    rebuilt_on: list[str] = field(default_factory=list)
    recipe: str | None = None
    source_changed: bool = False
    tests_before: list[CheckLine] | None = None
    tests_after: list[CheckLine] | None = None
    reason: str | None = None
    command: str | None = None
    output: str = ""  # what a failed recipe printed
    seconds: float = 0.0
    where: str | None = None  # the node that ran the recipe (an executor's name for it)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CascadeReport(Report):
    plan: CascadePlan
    dry_run: bool
    results: list[ModelResult]  # in the plan's order; empty for a dry run
    tests: list[CheckLine] | None = None  # of the cascade's model, when models were rebuilt on it

    @property
    def failed(self) -> list[ModelResult]:
        return [r for r in self.results if r.status in FAILED]

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)


# --- the plan ----------------------------------------------------------------------------------
def plan_cascade(repo: Repo, name: str, *, only: str | None = None, recorded_source: bool = False) -> CascadePlan:
    """What a cascade from `name` (a model, or a ref of one: its latest version counts) would
    do, in topological order. Runs no user code: recorded test results are read, not run."""
    top = repo.model_of(name)
    graph = repo.lineage
    node = graph.node(top)
    scope = {top, *graph.descendants(top)}
    steps: dict[str, CascadeStep] = {}
    checks = Checks(repo)

    @functools.cache
    def failing(vid: str) -> tuple[str, ...]:  # recorded results only: planning runs nothing
        return tuple(checks.failing(vid, graph))

    for model in graph.topological_order(scope - {top}):
        steps[model] = _plan_step(repo, graph, model, scope, steps, only, failing, recorded_source)
    return CascadePlan(top, node.head, f"{top}@{node.seq}", list(steps.values()))


def _plan_step(
    repo: Repo,
    graph: Lineage,
    model: str,
    scope: set[str],
    steps: dict[str, CascadeStep],
    only: str | None,
    failing: Callable[[str], tuple[str, ...]],
    recorded_source: bool,
) -> CascadeStep:
    node = graph.node(model)
    edges = graph.parents(model)
    rebuilt = {e.parent for e in edges if e.parent in steps and steps[e.parent].action in REBUILT}
    changed = [e for e in edges if e.parent in scope and (e.parent in rebuilt or e.stale)]
    parents = [_planned_parent(graph, e, e.parent in rebuilt) for e in edges]
    step = CascadeStep(
        model, node.head, f"{model}@{node.seq}", "up-to-date", edges[0].relation if edges else "other", parents
    )
    if not changed:
        return step
    if only is not None and not fnmatch.fnmatchcase(model, only):
        return replace(step, action="skipped", reason=f"not matched by --only {only}")
    recipe = repo.info(node.head).recipe
    step = replace(step, recipe=recipe)
    stopped = [e.parent for e in edges if e.parent in rebuilt and steps[e.parent].action != "recipe"]
    if stopped:
        return replace(step, action="blocked", reason=f"below {stopped[0]}, which is {steps[stopped[0]].action}")
    bad = [e for e in edges if e.parent in scope and e.parent not in rebuilt and failing(graph.node(e.parent).head)]
    if bad:
        p = graph.node(bad[0].parent)
        return replace(step, action="blocked", reason=f"{p.name}@{p.seq} fails {', '.join(failing(p.head))}")
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


# --- running it ---------------------------------------------------------------------------------
def cascade(
    repo: Repo,
    name: str,
    *,
    jobs: int = 1,
    only: str | None = None,
    timeout: float | None = None,
    dry_run: bool = False,
    recorded_source: bool = False,
    progress: ModelProgress | None = None,
    executor: Executor | None = None,
    trust_remote_code: bool = False,
) -> CascadeReport:
    """Rebuild the descendants of `name` on its latest version by re-running their recipes,
    commit and test the results: plan it and, unless `dry_run`, carry it out (see
    `execute`). A dry run's report holds the plan and no results. A recipe runs from its
    file here, or from the source recorded with the version when the file is not here (a
    teammate's clone) or `recorded_source` asks for it."""
    plan = plan_cascade(repo, name, only=only, recorded_source=recorded_source)
    return execute(
        repo,
        plan,
        jobs=jobs,
        timeout=timeout,
        dry_run=dry_run,
        progress=progress,
        executor=executor,
        trust_remote_code=trust_remote_code,
    )


def execute(
    repo: Repo,
    plan: CascadePlan,
    *,
    jobs: int = 1,
    timeout: float | None = None,
    dry_run: bool = False,
    progress: ModelProgress | None = None,
    executor: Executor | None = None,
    trust_remote_code: bool = False,
) -> CascadeReport:
    """Carry out a plan: rebuild its `recipe` steps, `jobs` at a time, parents first; a
    failure blocks the models below it. `progress(model, text)` is called from this thread
    as models start and finish. `executor` says where recipes and tests run (default: here;
    `mgit.cluster` has Ray's). A dry run runs nothing and reports the plan alone. Code from
    a remote that is not trusted here stops it before anything runs (UntrustedCodeError),
    unless `trust_remote_code` (see the module's docstring)."""
    if dry_run:
        return CascadeReport(plan, True, [])
    require_trust(repo, plan, trust_remote_code=trust_remote_code)
    executor = executor or LocalExecutor(repo)
    return _Cascade(repo, plan, timeout or RECIPE_TIMEOUT, progress or (lambda model, text: None), executor).run(jobs)


def require_trust(repo: Repo, plan: CascadePlan, *, trust_remote_code: bool = False) -> None:
    """Refuse to carry out a plan that would run code from a remote not trusted here: the
    recipes it re-runs and the tests that apply to the models it tests (the cascade's model,
    the parents it builds on, the models it rebuilds), unless `trust_remote_code`."""
    trusted = trusted_code(repo.dir)
    todo = [s for s in plan.steps if s.action == "recipe" and s.recipe is not None and not s.problem]
    recipes = {}
    for step in todo:
        assert step.recipe is not None
        key = (str(step.recipe.get("fn")), step.recipe.get("source") or "")
        if key not in trusted:
            author = repo.info(step.head).author or "someone else"
            recipes[f"the recipe of {step.head_ref} ({key[0]}, recorded by {author})"] = key
    tested = {plan.model, *(s.model for s in todo), *(p.model for s in todo for p in s.parents)}
    checks = Checks(repo)
    applying = checks.applicable_all(repo.lineage)
    specs = list({t.name: t for m in sorted(tested) for t in applying.get(m, [])}.values())
    checks.require_trust(specs, trust_remote_code=trust_remote_code, more=recipes)


class _Cascade:
    def __init__(
        self, repo: Repo, plan: CascadePlan, timeout: float, progress: ModelProgress, executor: Executor
    ) -> None:
        self.repo = repo
        self.plan = plan
        self.timeout = timeout
        self.progress = progress
        self.executor = executor
        self.checks = Checks(repo)  # opened here, before worker threads share it
        self.rebuilt: dict[str, tuple[str, str]] = {}  # model -> (new version, ref); written by the main thread
        self.top_tests: list[CheckLine] | None = None

    def run(self, jobs: int) -> CascadeReport:
        results: dict[str, ModelResult] = {}
        todo: list[CascadeStep] = []
        for step in self.plan.steps:
            if step.action == "recipe":
                todo.append(step)
            else:
                results[step.model] = _result(step, step.action, reason=step.reason, command=step.command)
        # What the jobs read, made reachable where they run: the heads they replace and build on.
        self.executor.prepare(
            models=sorted(
                {
                    self.plan.model,
                    *(s.model for s in todo),
                    *(p.model for s in todo for p in s.parents if p.version is not None),
                }
            )
        )
        blocked = self._check_parents(todo, results)  # model -> why
        jobs = max(1, jobs)
        # One session: each parent is checked out and encoded against by all its children.
        with self.repo.caching(), ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-cascade") as pool:
            running: dict[Future[ModelResult], CascadeStep] = {}
            while todo or running:
                for step in list(todo):  # parents come first: one pass propagates a block downwards
                    below = [m for m in step.waits_for if m in blocked or m in results and results[m].status in FAILED]
                    if step.model in blocked or below:
                        why = blocked.get(step.model) or f"below {below[0]} ({results[below[0]].status})"
                        results[step.model] = _result(step, "blocked", reason=why)
                        blocked[step.model] = why
                        todo.remove(step)
                        self.progress(step.model, f"blocked: {why}")
                    elif len(running) < jobs and all(m in self.rebuilt for m in step.waits_for):
                        parents = self._parents(step)
                        running[pool.submit(self._rebuild, step, parents)] = step
                        todo.remove(step)
                        self.progress(step.model, f"re-running {_fn(step)} on {', '.join(r for _, r in parents)}")
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    step = running.pop(future)
                    result = results[step.model] = future.result()
                    if result.status in ("updated", "up-to-date"):
                        self.rebuilt[step.model] = (result.new or result.old, result.new_ref or result.old_ref)
                    self.progress(step.model, _summary(result))
        return CascadeReport(self.plan, False, [results[s.model] for s in self.plan.steps], self.top_tests)

    def _check_parents(self, todo: list[CascadeStep], results: dict[str, ModelResult]) -> dict[str, str]:
        """Run the tests of the cascade's model and of up-to-date parents that planned models
        build on (recorded results are reused, so this runs only what an interrupted cascade
        did not). A parent that fails blocks the models built on it. Returns {model: why}."""
        ready = {
            p.model: (p.version, p.ref)
            for s in todo
            for p in s.parents
            if p.version is not None and (p.model in results or p.model == self.plan.model)
        }
        if not ready:
            return {}
        lines = self._tests([vid for vid, _ in ready.values()])
        stopped: dict[str, str] = {}
        for model, (vid, ref) in ready.items():
            mine = lines.get(vid, [])
            if model == self.plan.model:
                self.top_tests = mine
            else:
                results[model] = replace(results[model], tests_after=mine)
            bad = [t.test for t in mine if t.status != "pass"]
            for s in todo:
                if bad and any(p.model == model for p in s.parents):
                    stopped.setdefault(s.model, f"{ref} fails {', '.join(bad)}")
        return stopped

    def _parents(self, step: CascadeStep) -> list[tuple[str, str]]:
        """(version, ref) of each parent to rebuild on, in the recorded order."""
        return [(p.version, p.ref) if p.version is not None else self.rebuilt[p.model] for p in step.parents]

    def _rebuild(self, step: CascadeStep, parents: list[tuple[str, str]]) -> ModelResult:
        """Test the old version, run the recipe, commit and test the new one (a worker thread)."""
        start = time.monotonic()
        before = self._tests([step.head]).get(step.head, [])
        common: dict[str, Any] = {"rebuilt_on": [ref for _, ref in parents], "tests_before": before}  # in every outcome
        job = self._job_or_why(step, parents)
        if isinstance(job, str):
            result = _result(step, "failed-recipe", reason=job, **common)
        else:
            run = self.executor.run_recipe(job)
            common.update(where=run.where, notes=run.notes)
            if run.ok:
                crash_point("cascade-after-commit")
                result = self._committed(step, run, common)
            else:
                result = _result(step, "failed-recipe", reason=run.error, output=run.output, **common)
        return replace(result, seconds=round(time.monotonic() - start, 3))

    def _job_or_why(self, step: CascadeStep, parents: list[tuple[str, str]]) -> RecipeJob | str:
        """The job that re-runs a step's recipe on the parents, or why there is none."""
        if step.problem or step.recipe is None:
            return step.problem or "no recipe"
        try:
            return self._job(step, parents)
        except (MgitError, OSError) as exc:
            return str(exc)

    def _committed(self, step: CascadeStep, run: RecipeRun, common: dict[str, Any]) -> ModelResult:
        """The result of a recipe whose output the executor committed: `up-to-date` when it was
        not created (the same files, parents and recipe as the head), else `updated` once the
        new version's tests pass, `failed-tests` when one does not."""
        new = {"new": run.version, "new_ref": f"{step.model}@{run.seq}"}
        if not run.created:
            return _result(step, "up-to-date", **new, **common)
        after = self._tests([run.version]).get(run.version, []) if run.version else None
        if after and any(t.status != "pass" for t in after):
            why = "a test fails on the new version; the models below it are blocked"
            return _result(step, "failed-tests", reason=why, tests_after=after, **new, **common)
        return _result(step, "updated", tests_after=after, **new, **common)

    def _job(self, step: CascadeStep, parents: list[tuple[str, str]]) -> RecipeJob:
        """The recipe job of a step: the recipe as the new version records it (recorded anew
        from its file here, which may have changed, or as recorded when its source runs),
        with the same tags as the version it replaces (tests attached by tag must still
        apply)."""
        assert step.recipe is not None
        fn, params = step.recipe["fn"], dict(step.recipe.get("params") or {})
        resources = resources_of(step.recipe.get("resources"))
        if step.recorded_source:
            record, source = dict(step.recipe), self.repo.store.get(step.recipe["source"])[1].tobytes()
        else:
            record, source = self.repo.recipe_record(fn, params, resources=resources, recorded=True), None
        message = f"cascade from {self.plan.ref}: {fn} re-run on {', '.join(ref for _, ref in parents)}"
        return RecipeJob(
            step.model,
            step.head,
            [vid for vid, _ in parents],
            step.relation,
            record,
            message,
            dict(self.repo.version(step.head).tags),
            self.timeout,
            source,
            resources,
        )

    def _tests(self, vids: list[str]) -> dict[str, list[CheckLine]]:
        """The tests that apply to each version, run or reused from recorded results."""
        try:
            outcomes = self.checks.run(vids, executor=self.executor).outcomes
        except MgitError as exc:
            return {v: [CheckLine("tests", "error", {}, [str(exc)])] for v in vids}
        lines: dict[str, list[CheckLine]] = {v: [] for v in vids}
        for o in outcomes:
            lines.setdefault(o.version, []).append(_line(o))
        return lines


def _fn(step: CascadeStep) -> str:
    return str(step.recipe["fn"]) if step.recipe else "?"


def _line(o: CheckOutcome) -> CheckLine:
    return CheckLine(o.test, o.status, dict(o.metrics), list(o.reasons))


def _result(step: CascadeStep, status: str, **extra: Any) -> ModelResult:
    return ModelResult(
        step.model,
        status,
        step.head,
        step.head_ref,
        recipe=step.recipe["fn"] if step.recipe else None,
        source_changed=step.source_changed,
        **extra,
    )


def tests_summary(lines: list[CheckLine] | None) -> str:
    """`2/3 pass` for a list of test results; `-` when none was run, `no tests` when none applies."""
    if lines is None:
        return "-"
    if not lines:
        return "no tests"
    return f"{sum(t.status == 'pass' for t in lines)}/{len(lines)} pass"


def _summary(r: ModelResult) -> str:
    took = f" in {r.seconds:.1f} s"
    if r.status == "updated":
        return f"updated {r.old_ref} -> {r.new_ref}{took}; tests {tests_summary(r.tests_after)}"
    if r.status == "failed-tests":
        return f"committed {r.new_ref}{took}, but tests fail: {tests_summary(r.tests_after)}"
    return f"{r.status}{took}: {r.reason}"
