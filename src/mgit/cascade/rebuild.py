"""Carrying out a cascade's plan: re-run the recipes of its `recipe` steps, parents first and
independent branches in parallel, commit each output as one version and test it; what the
cascade did to each model, and the report."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any

import mgit.merging  # noqa: F401  (registers how a re-run merge is stored: mgit.execution)
from mgit.cascade.plan import CascadePlan, CascadeStep, not_passing, plan_cascade
from mgit.checks import CheckOutcome, Checks
from mgit.errors import MgitError
from mgit.execution import Executor, LocalExecutor, RecipeJob, RecipeRun, resources_of
from mgit.repo.location import trusted_code
from mgit.repo.repository import Repo
from mgit.reports import Report
from mgit.signing.policy import signs_always
from mgit.util.faults import crash_point

RECIPE_TIMEOUT = 3600.0  # per recipe run: a fine-tune can take a while
FAILED = ("failed-recipe", "failed-tests")
ModelProgress = Callable[[str, str], None]  # (model, what happens to it)


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
    ignored: list[str] = field(default_factory=list)  # `base@2 fails acc`: failures overridden (--ignore-tests)


@dataclass(frozen=True)
class CascadeReport(Report):
    plan: CascadePlan
    dry_run: bool
    results: list[ModelResult]  # in the plan's order; empty for a dry run
    tests: list[CheckLine] | None = None  # of the cascade's model, when models were rebuilt on it

    @property
    def failed(self) -> list[ModelResult]:
        return [r for r in self.results if r.status in FAILED]

    @property
    def ok(self) -> bool:
        """No model failed or was blocked (for a dry run: none is planned blocked). A cascade
        that is not ok exits 1."""
        if self.dry_run:
            return not self.plan.count("blocked")
        return not self.failed and not self.count("blocked")

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "ok": self.ok}

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)


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
    ignore_tests: Sequence[str] = (),
) -> CascadeReport:
    """Rebuild the descendants of `name` on its latest version by re-running their recipes,
    commit and test the results: plan it and, unless `dry_run`, carry it out (see
    `execute`). A dry run's report holds the plan and no results. A recipe runs from its
    file here, or from the source recorded with the version when the file is not here (a
    teammate's clone) or `recorded_source` asks for it. The tests in `ignore_tests` block
    nothing (mgit.cascade.plan)."""
    plan = plan_cascade(repo, name, only=only, recorded_source=recorded_source, ignore_tests=ignore_tests)
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
    require_signer(repo, plan)
    own = executor is None
    executor = executor or LocalExecutor(repo)
    try:
        return _Cascade(repo, plan, timeout or RECIPE_TIMEOUT, progress or (lambda model, text: None), executor).run(
            jobs
        )
    finally:
        if own:
            executor.close()  # the versions its jobs shared


def require_signer(repo: Repo, plan: CascadePlan) -> None:
    """Under signing.always, load the signing key before a plan that commits runs anything
    (SigningKeyError): a key that cannot sign stops the cascade before its first recipe, not
    after its first commit. Loaded once, it signs every version the cascade commits, here or
    (on the driver) for the cluster."""
    if plan.count("recipe") and signs_always(repo.config):
        repo.signer()


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
        self.ignore = set(plan.ignored_tests)
        self.overridden: dict[str, list[str]] = {}  # version -> `ref fails T` of ignored tests that do not pass

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
            bad = self._not_passing(vid, ref, mine)
            for s in todo:
                if bad and any(p.model == model for p in s.parents):
                    stopped.setdefault(s.model, bad)
        return stopped

    def _not_passing(self, vid: str, ref: str, lines: list[CheckLine]) -> str | None:
        """Why a version's tests block the models built on it (`ft@2 fails acc`), None when
        they do not; the failures of ignored tests are kept for the report and the messages."""
        wrong = [(t.test, t.status) for t in lines if t.status != "pass"]
        if ignored := [(t, status) for t, status in wrong if t in self.ignore]:
            self.overridden[vid] = [not_passing(ref, ignored)]
        bad = [(t, status) for t, status in wrong if t not in self.ignore]
        return not_passing(ref, bad) if bad else None

    def _parents(self, step: CascadeStep) -> list[tuple[str, str]]:
        """(version, ref) of each parent to rebuild on, in the recorded order."""
        return [(p.version, p.ref) if p.version is not None else self.rebuilt[p.model] for p in step.parents]

    def _rebuild(self, step: CascadeStep, parents: list[tuple[str, str]]) -> ModelResult:
        """Test the old version, run the recipe, commit and test the new one (a worker thread)."""
        start = time.monotonic()
        before = self._tests([step.head]).get(step.head, [])
        ignored = [why for vid, _ in parents for why in self.overridden.get(vid, [])]
        common: dict[str, Any] = {"rebuilt_on": [ref for _, ref in parents], "tests_before": before, "ignored": ignored}
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
        bad = self._not_passing(run.version, new["new_ref"], after) if after and run.version else None
        common["ignored"] = common["ignored"] + self.overridden.get(run.version or "", [])
        if bad:
            why = f"{bad}; the models below it are blocked"
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
        if ignored := [why for vid, _ in parents for why in self.overridden.get(vid, [])]:
            message += f"; failing tests ignored (--ignore-tests): {'; '.join(ignored)}"
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
    """`2/3 pass` (`1/3 pass, 1 error`) for a list of test results; `-` when none was run, `no
    tests` when none applies."""
    if lines is None:
        return "-"
    if not lines:
        return "no tests"
    errors = sum(t.status == "error" for t in lines)
    return f"{sum(t.status == 'pass' for t in lines)}/{len(lines)} pass" + (f", {errors} error" if errors else "")


def _summary(r: ModelResult) -> str:
    took = f" in {r.seconds:.1f} s"
    if r.status == "updated":
        return f"updated {r.old_ref} -> {r.new_ref}{took}; tests {tests_summary(r.tests_after)}"
    if r.status == "failed-tests":
        return f"committed {r.new_ref}{took}, but tests fail: {tests_summary(r.tests_after)}"
    return f"{r.status}{took}: {r.reason}"
