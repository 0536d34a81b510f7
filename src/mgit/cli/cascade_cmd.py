"""`mgit cascade`: rebuild the descendants of a model after it got a new version."""

from __future__ import annotations

import math
from typing import Any

import click

from mgit.cascade import (
    CascadePlan,
    CascadeReport,
    CascadeStep,
    CheckLine,
    execute,
    plan_cascade,
    require_signer,
    require_trust,
    tests_summary,
)
from mgit.cli.executor_opts import CLUSTER_JOBS, executor_from, executor_options
from mgit.cli.output import err, out, print_json, table

OUTPUT_LINES = 15  # of a failed recipe's output, shown under the report


@click.command()
@click.argument("name")
@click.option("--dry-run", is_flag=True, help="Print the plan and stop: no recipe or test is run.")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 256),
    default=None,
    help=f"Models rebuilt at once (independent branches run in parallel; default 1, on a cluster {CLUSTER_JOBS}).",
)
@click.option("--only", metavar="GLOB", default=None, help="Rebuild only the models whose name matches GLOB.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Seconds each recipe may take (default: 3600).",
)
@click.option(
    "--recorded-source",
    is_flag=True,
    help="Run each recipe from the source recorded with its version, not from the file here.",
)
@click.option(
    "--ignore-tests",
    "ignore_tests",
    multiple=True,
    metavar="NAME",
    help="Rebuild even where test NAME does not pass on a parent or a new version (repeatable; recorded "
    "in the report and in each new version's message).",
)
@executor_options
@click.option("--json", "as_json", is_flag=True, help="Print the plan (with --dry-run) or the report as JSON.")
@click.pass_context
def cascade(
    ctx: click.Context,
    name: str,
    dry_run: bool,
    jobs: int | None,
    only: str | None,
    timeout: float | None,
    recorded_source: bool,
    ignore_tests: tuple[str, ...],
    as_json: bool,
    **cluster: Any,
) -> None:
    """Re-run the recipes of NAME's descendants on its latest version, commit and test them.

    A descendant is rebuilt when a parent is rebuilt before it, or when the parent version
    it was built on is no longer the latest. Each new version records the same relation and
    recipe, and its tests run (with the old version's results for comparison). A failing
    recipe or test stops only the models below it; run the cascade again after a fix or an
    interruption and it resumes with the models still built on old versions. A model
    without a recipe is listed with the command that records one.

    A parent whose test fails or errs blocks the models built on it, unless that test is
    named with --ignore-tests (each one by name: an override says what it overrides).
    Exit code 1 when a model is blocked or fails (with --dry-run: when one would be blocked);
    a dry run runs no test and names the parents' tests not run yet, which the run runs
    first.

    \b
    Examples:
      mgit cascade bert-base --dry-run
      mgit cascade bert-base --jobs 2
      mgit cascade bert-base --only 'bert-sst2*' --json
      mgit cascade bert-base --ignore-tests sst2
      RAY_ADDRESS=head:6379 mgit cascade bert-base --executor ray --num-gpus 1

    With --executor ray, each recipe and test run is a Ray task on the cluster, reading
    and writing through the repository's remote (S3); the models involved are pushed
    first, and each new version's ref moves here and on the remote as it is committed.
    """
    repo = ctx.obj.repo()
    plan = plan_cascade(repo, name, only=only, recorded_source=recorded_source, ignore_tests=ignore_tests)
    trust = cluster.pop("trust_remote_code")
    if not dry_run:  # before anything is printed or connected: code from a remote needs the flag, signing a key
        require_trust(repo, plan, trust_remote_code=trust)
        require_signer(repo, plan)
    if not as_json:
        _print_plan(plan)
    progress = None if as_json else (lambda model, text: err.print(f"{model}: {text}"))
    if dry_run:
        report = execute(repo, plan, dry_run=True)
    else:
        executor = executor_from(repo, cluster)
        try:
            report = execute(
                repo,
                plan,
                jobs=jobs or (1 if executor.name == "local" else CLUSTER_JOBS),
                timeout=timeout,
                progress=progress,
                executor=executor,
                trust_remote_code=trust,
            )
        finally:
            executor.close()
    if as_json:
        print_json(report.to_json())
    elif dry_run:
        if report.plan.count("recipe"):
            out.print("\nDry run: nothing was run.")
    else:
        _print_report(report)
    if not report.ok:
        ctx.exit(1)


def _how(step: CascadeStep) -> str:
    if step.action == "recipe" and step.recipe:
        params = ", ".join(f"{k}={v}" for k, v in sorted((step.recipe.get("params") or {}).items()))
        text = f"{step.recipe['fn']}" + (f" ({params})" if params else "")
        if step.problem:
            text += f"  [cannot run: {step.problem}]"
        elif step.recorded_source:
            text += "  [runs the recorded source]"
        elif step.source_changed:
            text += "  [recipe file changed since]"
        if step.untested:
            text += f"  [not tested yet, the run tests first: {', '.join(step.untested)}]"
        if step.ignored:
            text += f"  [ignoring: {'; '.join(step.ignored)}]"
        return text
    return f"{step.action}: {step.reason}" if step.reason else step.action


def _print_plan(plan: CascadePlan) -> None:
    if not plan.steps:
        out.print(f"{plan.ref} has no descendants: nothing to cascade.")
        return
    words = {
        "recipe": "to rebuild",
        "manual": "to update by hand",
        "blocked": "blocked",
        "skipped": "skipped",
        "up-to-date": "up to date",
    }
    counts = [f"{plan.count(a)} {w}" for a, w in words.items() if plan.count(a)]
    out.print(f"Cascade from {plan.ref}: {', '.join(counts)}")
    if plan.ignored_tests:
        out.print(f"Failing tests ignored (--ignore-tests): {', '.join(plan.ignored_tests)}")
    t = table("model", "now", "rebuild on", "how")
    for s in plan.steps:
        t.add_row(
            s.model, s.head_ref, ", ".join(p.ref for p in s.parents) if s.action != "up-to-date" else "-", _how(s)
        )
    out.print(t)
    for s in plan.steps:
        if s.action == "manual":
            out.print(
                f"\n{s.model} has no recipe: update it by hand, or record one (then run the cascade again):"
                f"\n  {s.command}"
            )


def _test_cell(line: CheckLine | None) -> str:
    """`pass (acc 0.91)`: a test's status and its metrics."""
    if line is None:
        return "-"
    metrics = ", ".join(f"{k} {v:.4g}" if math.isfinite(v) else f"{k} {v}" for k, v in sorted(line.metrics.items()))
    return line.status + (f" ({metrics})" if metrics else "")


def _print_report(report: CascadeReport) -> None:
    if not report.results:
        return
    out.print()
    if report.tests:
        out.print(f"{report.plan.ref}, rebuilt on: tests {tests_summary(report.tests)}")
    t = table("model", "old -> new", "status", "tests before", "tests after")
    for r in report.results:
        change = f"{r.old_ref} -> {r.new_ref}" if r.new_ref and r.new != r.old else r.old_ref
        t.add_row(r.model, change, r.status, tests_summary(r.tests_before), tests_summary(r.tests_after))
    out.print(t)
    tested = [r for r in report.results if r.tests_before or r.tests_after]
    if tested:
        out.print()
        tt = table("model", "test", "before", "after")
        for r in tested:
            before = {t.test: t for t in r.tests_before or []}
            after = {t.test: t for t in r.tests_after or []}
            for name in sorted(before | after):
                tt.add_row(r.model, name, _test_cell(before.get(name)), _test_cell(after.get(name)))
        out.print(tt)
    for r in report.results:
        if r.source_changed and r.status != "blocked":
            out.print(
                f"\nnote: the recipe file of {r.model} ({r.recipe}) changed since {r.old_ref} was made; "
                f"the new version records the new file's hash"
            )
        for note in r.notes:
            out.print(f"\nnote: {r.model}: {note}")
        if r.status == "failed-recipe":
            out.print(f"\n{r.model}: {r.reason}")
            tail = [ln for ln in r.output.strip().splitlines()][-OUTPUT_LINES:]
            for line in tail:
                out.print(f"  | {line}")
        elif r.status == "blocked":
            out.print(f"\n{r.model} is blocked: {r.reason}")
        elif r.status == "failed-tests":
            reasons = [
                f"{t.test}: {'; '.join(t.reasons) or t.status}" for t in r.tests_after or [] if t.status != "pass"
            ]
            out.print(f"\n{r.new_ref} was committed but does not pass: {'; '.join(reasons)}")
        if r.ignored:
            out.print(f"\nnote: {r.model} was rebuilt over failing tests ignored: {'; '.join(r.ignored)}")
    counts = [
        f"{report.count(s)} {s}"
        for s in ("updated", "failed-recipe", "failed-tests", "blocked", "manual")
        if report.count(s)
    ]
    out.print(f"\n{', '.join(counts) or 'nothing to do'}.")
