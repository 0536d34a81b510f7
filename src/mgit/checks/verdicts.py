"""Verdicts: pass, fail or error, and why, judged from a test's metrics by the conditions of
its registration in force now.

A recorded result keeps the metrics a run measured, which stay true of the version and the
source that produced them; its verdict is a judgement by conditions that may have changed
since (a test removed and attached again with another bound). So every reader of results
judges again (`rejudged`), without running anything: `mgit test run` reusing a result,
`test show`, bisect, a cascade's plan and run, and `mgit serve`.

The three verdicts follow pytest's words, where a failure is an assertion that does not hold
and an error an exception raised elsewhere (in a fixture, say). MGit's tests return metrics
rather than assert, so an exception in the test function itself is an error: a *failure*
is a verdict on the model (a metric breaks a condition, is not finite, or the
test returned `passed: false`); an *error* says the test gave no verdict (it raised, hung
past its time limit, crashed or exited its process, or returned no usable metrics). An
error is not a pass: it makes `test run` exit 1 and blocks a cascade as a failure does, and
it is counted and named apart. An error does not depend on the conditions, so it is never
judged again.
"""

from __future__ import annotations

import math
from dataclasses import replace

from mgit import usercode
from mgit.checks.results import CheckOutcome
from mgit.checks.specs import CheckSpec, Condition

RETURNED_FALSE = "the test returned passed: false"
STATUSES = ("pass", "fail", "error")


def judge(
    conditions: list[Condition], metrics: dict[str, float], passed: bool | None, problem: str | None
) -> tuple[str, list[str]]:
    """(status, reasons) of metrics as `usercode.metrics_of` read them from what a test
    returned: its `passed` and the problem with them, if any."""
    if problem and not metrics:
        return "error", [problem]
    reasons = [RETURNED_FALSE] if passed is False else []
    reasons += [problem] if problem else []
    reasons += [r for c in conditions if (r := c.check(metrics))]
    return ("fail" if reasons else "pass"), reasons


def judge_run(conditions: list[Condition], run: usercode.RunOutcome) -> tuple[str, dict[str, float], list[str]]:
    """(status, metrics, reasons) of one run of a test."""
    if not run.ok:
        return "error", {}, [f"the test {run.error}"]
    metrics, passed, problem = usercode.metrics_of(run.value)
    status, reasons = judge(conditions, metrics, passed, problem)
    return status, metrics, reasons


def rejudged(outcome: CheckOutcome, spec: CheckSpec | None) -> CheckOutcome:
    """A recorded outcome judged by `spec`, the test's registration now (None: the test is
    no longer attached, and the recorded verdict stands). `recorded_status` keeps what was
    recorded when the verdict differs."""
    if spec is None or outcome.status == "error" or not outcome.metrics:
        return outcome
    value: dict[str, object] = {k: v if math.isfinite(v) else None for k, v in outcome.metrics.items()}
    if RETURNED_FALSE in outcome.reasons:
        value["passed"] = False
    metrics, passed, problem = usercode.metrics_of(value)
    status, reasons = judge(spec.conditions, metrics, passed, problem)
    if (status, reasons) == (outcome.status, outcome.reasons):
        return outcome
    return replace(outcome, status=status, reasons=reasons, recorded_status=outcome.recorded_status or outcome.status)
