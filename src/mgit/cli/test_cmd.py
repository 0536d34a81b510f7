"""`mgit test` (attach, run, show, list and remove tests) and `mgit bisect`."""

from __future__ import annotations

import math
from typing import Any

import click

from mgit.bisect import bisect as bisect_test
from mgit.checks import CheckOutcome, Checks, Condition
from mgit.cli.executor_opts import (
    CLUSTER_JOBS,
    executor_from,
    executor_options,
    resource_options,
    trust_option,
)
from mgit.cli.main import SuggestingGroup
from mgit.cli.output import err, out, plural, print_json, table

json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")


@click.group(name="test", cls=SuggestingGroup)
def test_group() -> None:
    """Tests: checks on models (a function returning metrics) and their results.

    \b
    Examples:
      mgit test add bert-base --fn evals.py:accuracy --metric acc --min 0.9 --inherit
      mgit test run --all
      mgit test show bert-sst2
    """


def _conditions(metric: str | None, mins: tuple[str, ...], maxs: tuple[str, ...]) -> list[Condition]:
    """`--metric acc --min 0.9`, or `--min acc=0.9` (repeatable, for several metrics)."""
    out = []
    for bound, values in (("min", mins), ("max", maxs)):
        for v in values:
            name, sep, number = v.rpartition("=")
            name = name if sep else metric
            if not name:
                raise click.UsageError(f"--{bound} {v}: say which metric (--metric M --{bound} X, or --{bound} M=X)")
            try:
                out.append(Condition(name, bound, float(number)))
            except ValueError:
                raise click.BadParameter(f"{number!r} is not a number", param_hint=f"--{bound}") from None
    return out


@test_group.command(name="add")
@click.argument("selector")
@click.option(
    "--fn",
    required=True,
    metavar="MODULE:FUNCTION",
    help="The test: takes a model folder, returns a dict of metrics (FILE.py:FUNCTION works too).",
)
@click.option("--name", default=None, help="The test's name (default: the function's name).")
@click.option("--metric", default=None, help="The metric that --min and --max bound.")
@click.option(
    "--min", "mins", multiple=True, metavar="[METRIC=]VALUE", help="Pass only if the metric >= VALUE (repeatable)."
)
@click.option(
    "--max", "maxs", multiple=True, metavar="[METRIC=]VALUE", help="Pass only if the metric <= VALUE (repeatable)."
)
@click.option("--inherit", is_flag=True, help="Also apply to every descendant, present and future.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds per run.")
@resource_options
@json_option
@click.pass_context
def test_add(
    ctx: click.Context,
    selector: str,
    fn: str,
    name: str | None,
    metric: str | None,
    mins: tuple[str, ...],
    maxs: tuple[str, ...],
    inherit: bool,
    timeout: float | None,
    num_cpus: float | None,
    num_gpus: float | None,
    as_json: bool,
) -> None:
    """Attach a test to a model, a name glob ('bert-*') or a tag (tag:KEY=VALUE).

    The function is found but not run. Without bounds, a test passes when it returns
    metrics (and `passed` is not false).

    \b
    Examples:
      mgit test add bert-base --fn evals.py:accuracy --metric acc --min 0.9 --inherit
      mgit test add 'bert-*' --fn evals.sst2:run --name sst2 --min acc=0.9 --max loss=0.4
      mgit test add tag:task=nli --fn evals.py:nli
      mgit test add 'llama-*' --fn evals.py:mmlu --min acc=0.6 --num-gpus 1
    """
    conditions = _conditions(metric, mins, maxs)
    if metric is not None and not conditions:
        raise click.UsageError("--metric needs --min or --max")
    spec = Checks(ctx.obj.repo()).attach(
        selector,
        fn,
        name=name,
        conditions=conditions,
        inherit=inherit,
        timeout=timeout,
        resources={"num_cpus": num_cpus, "num_gpus": num_gpus},
    )
    if as_json:
        print_json(spec.to_json())
        return
    bounds = ", ".join(f"{c.metric} {'>=' if c.bound == 'min' else '<='} {c.value:g}" for c in spec.conditions)
    out.print(
        f"test {spec.name} ({spec.fn}) attached to {spec.target}"
        + (" and its descendants" if inherit else "")
        + (f"; passes if {bounds}" if bounds else "")
    )


@test_group.command(name="ls")
@json_option
@click.pass_context
def test_ls(ctx: click.Context, as_json: bool) -> None:
    """List attached tests.

    \b
    Example:
      mgit test ls
    """
    tests = Checks(ctx.obj.repo()).tests()
    if as_json:
        print_json([t.to_json() for t in tests])
        return
    t = table("test", "function", "attached to", "inherit", "passes if")
    for s in tests:
        bounds = ", ".join(f"{c.metric} {'>=' if c.bound == 'min' else '<='} {c.value:g}" for c in s.conditions)
        t.add_row(s.name, s.fn, s.target, "yes" if s.inherit else "no", bounds or "-")
    out.print(t if tests else "No tests. Attach one with: mgit test add MODEL --fn FILE.py:FUNCTION")


@test_group.command(name="rm")
@click.argument("name")
@click.pass_context
def test_rm(ctx: click.Context, name: str) -> None:
    """Detach a test (its recorded results stay).

    \b
    Example:
      mgit test rm sst2
    """
    spec = Checks(ctx.obj.repo()).detach(name)
    out.print(f"test {spec.name} removed")


def _metrics(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" if math.isfinite(v) else f"{k}={v}" for k, v in sorted(metrics.items())) or "-"


def _change(o: CheckOutcome) -> str:
    """Against the lineage parent's result: 'acc +0.012, loss -0.1 (bert-base@2: pass)'."""
    if o.parent is None:
        return "-"
    if o.parent_status is None:
        return f"{o.parent}: not run"
    deltas = [
        f"{k} {o.metrics[k] - v:+.4g}"
        for k, v in sorted((o.parent_metrics or {}).items())
        if k in o.metrics and math.isfinite(v) and math.isfinite(o.metrics[k])
    ]
    return ", ".join(deltas) + f" ({o.parent}: {o.parent_status})" if deltas else f"{o.parent}: {o.parent_status}"


def _provenance(o: CheckOutcome) -> str:
    """` (recorded)` for a reused result; with the verdict it was recorded with when the
    test's conditions now judge it otherwise."""
    if o.recorded_status is not None:
        return f" (recorded {o.recorded_status.upper()}, judged now)"
    return " (recorded)" if o.reused else ""


def print_outcomes(outcomes: list[CheckOutcome], *, output: bool = False) -> None:
    t = table("model", "test", "result", "metrics", "vs parent", "why")
    for o in outcomes:
        result = o.status.upper() + _provenance(o)
        t.add_row(o.ref, o.test, result, _metrics(o.metrics), _change(o), "; ".join(o.reasons) or "-")
    out.print(t)
    if output:
        for o in outcomes:
            if o.output.strip():
                out.print(f"--- output of {o.test} on {o.ref} ---")
                out.print(o.output.rstrip())


@test_group.command(name="run")
@click.argument("ref", required=False)
@click.option("--all", "run_all", is_flag=True, help="Every model's latest version.")
@click.option("--descendants", is_flag=True, help="REF's descendants too.")
@click.option("--test", "tests", multiple=True, metavar="NAME", help="Only these tests (repeatable).")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(1, 256),
    default=None,
    help=f"Models tested at once (default 2, on a cluster {CLUSTER_JOBS}).",
)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds per test run.")
@click.option("--force", is_flag=True, help="Run again even where a result for this version and source exists.")
@click.option("--output", "show_output", is_flag=True, help="Show what each test printed.")
@click.option(
    "--recorded-source",
    is_flag=True,
    help="Run each test from the source recorded when it was attached, not from the file here.",
)
@executor_options
@json_option
@click.pass_context
def test_run(
    ctx: click.Context,
    ref: str | None,
    run_all: bool,
    descendants: bool,
    tests: tuple[str, ...],
    jobs: int | None,
    timeout: float | None,
    force: bool,
    show_output: bool,
    recorded_source: bool,
    as_json: bool,
    **cluster: Any,
) -> None:
    """Run the tests that apply, each in its own process; exit code 1 if any fails or errs.

    A test fails when its metrics break its conditions (or it returns passed: false); it
    errs when it gives no verdict: it raises, times out, crashes or returns no metrics.
    Results are recorded per version and test source, and reused unless --force; a reused
    result is judged by the test's conditions now, without running it again.

    \b
    Examples:
      mgit test run --all
      mgit test run bert-base --descendants --jobs 2
      mgit test run bert-sst2@3 --test sst2 --force --output
      RAY_ADDRESS=head:6379 mgit test run --all --executor ray

    With --executor ray, each test run is a Ray task on the cluster, reading the version
    through the repository's remote; results are recorded here as for a local run.
    """
    if bool(ref) == run_all:
        raise click.UsageError("give a REF or --all")
    repo = ctx.obj.repo()
    executor = executor_from(repo, cluster)
    try:
        result = Checks(repo).run(
            [ref] if ref else None,
            descendants=descendants,
            tests=list(tests) or None,
            jobs=jobs or (None if executor.name == "local" else CLUSTER_JOBS),
            timeout=timeout,
            force=force,
            recorded_source=recorded_source,
            executor=executor,
            trust_remote_code=cluster["trust_remote_code"],
        )
    finally:
        executor.close()
    if as_json:
        print_json(result.to_json())
    else:
        for note in result.notes:
            err.print(f"note: {note}")
        if result.outcomes:
            print_outcomes(result.outcomes, output=show_output)
        if result.skipped:
            err.print(f"note: no test applies to {', '.join(result.skipped)}")
        passed = len(result.outcomes) - len(result.failed) - len(result.errors)
        out.print(
            f"{plural(passed, 'test')} passed, {len(result.failed)} failed, {plural(len(result.errors), 'error')}"
        )
    if not result.ok:
        ctx.exit(1)


@test_group.command(name="show")
@click.argument("ref", required=False)
@click.option("--output", "show_output", is_flag=True, help="Show what each test printed.")
@json_option
@click.pass_context
def test_show(ctx: click.Context, ref: str | None, show_output: bool, as_json: bool) -> None:
    """Recorded results of a version (default: every model's latest).

    \b
    Examples:
      mgit test show
      mgit test show bert-sst2@2 --output
    """
    outcomes = Checks(ctx.obj.repo()).show(ref)
    if as_json:
        print_json([o.to_json(output=show_output) for o in outcomes])
    elif outcomes:
        print_outcomes(outcomes, output=show_output)
    else:
        out.print("No recorded results. Run: mgit test run --all")


@click.command()
@click.argument("test")
@click.argument("ref")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=None, help="Seconds per test run.")
@click.option("--force", is_flag=True, help="Run every needed test again instead of reusing recorded results.")
@trust_option
@json_option
@click.pass_context
def bisect(
    ctx: click.Context, test: str, ref: str, timeout: float | None, force: bool, trust_remote_code: bool, as_json: bool
) -> None:
    """Find the ancestor of REF where TEST started to fail.

    Searches the lineage parents and version history of REF, running as few tests as it
    can (binary search along each line, recorded results reused), and prints the edge
    that introduced the failure with the diff along it.

    \b
    Example:
      mgit bisect sst2 bert-sst2-int8
    """
    result = bisect_test(ctx.obj.repo(), test, ref, timeout=timeout, force=force, trust_remote_code=trust_remote_code)
    if as_json:
        print_json(result.to_json())
        return
    for s in result.steps:
        out.print(f"  {s.ref:<30} {s.status}{' (recorded)' if s.reused else ''}")
    why = f": {'; '.join(result.reasons)}" if result.reasons else ""
    if result.parent is None:
        verb = "fails" if result.status == "fail" else "raises an error"
        out.print(f"{test} {verb} at {result.culprit}, a root: it never passed{why}")
    else:
        how = f"derived by {result.relation}" if result.edge == "lineage" else "a new version"
        verb = "failing" if result.status == "fail" else "to raise an error"
        out.print(f"{test} started {verb} at {result.culprit} ({how} from {result.parent}, which passes){why}")
        if result.also:
            out.print(f"  its other ancestors pass too: {'; '.join(result.also)}")
        summary = (result.diff or {}).get("summary") or {}
        counts = summary.get("counts") or {}
        if counts:
            out.print(
                "diff "
                + f"{result.parent} -> {result.culprit}: "
                + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            )
        for g in (result.diff or {}).get("groups", []):
            if g.get("changed_values"):
                out.print(f"  {g['name']:<40} {g['changed_values']} values changed, max |change| {g['max_abs']:.3g}")
    out.print(
        f"{plural(result.tests_run, 'test')} run, {len(result.steps) - result.tests_run} recorded result(s) reused"
    )
