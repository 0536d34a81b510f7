"""The lossy gate: a user's metric function run on the original and on the lossy
reconstruction, each in a separate Python process with a timeout.

A gate is `module:function` (importable from the current folder) or `path/to/file.py:function`;
the function takes a model folder and returns a dict of metrics (name -> number). User code
never runs in the mgit process: `mgit.usercode.run` calls it in a child process. Its metrics
are read as a test's are (`usercode.metrics_of`). A crash, a timeout, no metrics, or a metric
that is NaN or infinite on either side are a failed gate, and a failed gate means lossless
storage.

Direction: a metric whose name has a word meaning lower-is-better (`LOWER_IS_BETTER`: loss,
error, perplexity, ...; words are split on anything but letters and digits) must not rise by
more than `max_drop`; any other metric must not fall by more than `max_drop`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mgit import usercode
from mgit.usercode import DEFAULT_TIMEOUT

LOWER_IS_BETTER = frozenset(
    {"loss", "error", "err", "perplexity", "ppl", "mse", "mae", "rmse", "wer", "cer", "latency"}
)


class GateFailure(Exception):
    """The gate function could not produce metrics (crash, timeout, bad output)."""


@dataclass(frozen=True)
class GateResult:
    passed: bool
    reason: str | None = None
    original: dict[str, float] = field(default_factory=dict)
    reconstruction: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Gate:
    """The check a lossy add must pass: the metric function `spec` run on the original and on
    the reconstruction, each run within `timeout` seconds; no metric may get worse by more
    than `max_drop`."""

    spec: str
    max_drop: float = 0.0
    timeout: float = DEFAULT_TIMEOUT

    def evaluate(self, original: Path, reconstruction: Path) -> GateResult:
        return evaluate(self.spec, original, reconstruction, max_drop=self.max_drop, timeout=self.timeout)


def lower_is_better(metric: str) -> bool:
    return any(word in LOWER_IS_BETTER for word in re.split(r"[^a-z0-9]+", metric.lower()))


def compare(original: dict[str, float], reconstruction: dict[str, float], max_drop: float) -> list[str]:
    """Each metric that got worse by more than `max_drop`, as a sentence."""
    failures = []
    for name, before in sorted(original.items()):
        after = reconstruction.get(name)
        if after is None:
            failures.append(f"{name} is missing on the reconstruction")
        elif lower_is_better(name) and after - before > max_drop:
            failures.append(f"{name} rose from {before:g} to {after:g} (more than {max_drop:g})")
        elif not lower_is_better(name) and before - after > max_drop:
            failures.append(f"{name} fell from {before:g} to {after:g} (more than {max_drop:g})")
    return failures


def metrics(spec: str, folder: Path, *, timeout: float = DEFAULT_TIMEOUT) -> tuple[dict[str, float], str | None]:
    """Run the gate on one folder in a child process: its metrics, read as a test's are
    (`usercode.metrics_of`), and why they cannot pass (a metric that is not finite), if so.
    GateFailure if it gave no metrics."""
    run = usercode.run("call", spec, [str(folder)], timeout=timeout)
    if not run.ok:
        raise GateFailure(f"the gate {spec} failed ({run.error})")
    values, passed, problem = usercode.metrics_of(run.value)
    if not values:
        raise GateFailure(f"the gate {spec} gave no metrics ({problem})")
    if passed is not None:
        raise GateFailure(f"the gate {spec} returned 'passed': a gate returns metrics, the gate compares them")
    return values, problem


def evaluate(
    spec: str, original: Path, reconstruction: Path, *, max_drop: float, timeout: float = DEFAULT_TIMEOUT
) -> GateResult:
    """Run the gate on both folders and judge the reconstruction. A metric that is not
    finite on either side fails it (its value is kept in the result)."""
    try:
        before, unusable_before = metrics(spec, original, timeout=timeout)
        after, unusable_after = metrics(spec, reconstruction, timeout=timeout)
    except GateFailure as exc:
        return GateResult(False, str(exc))
    failures = [
        f"{why} on the {side}"
        for why, side in ((unusable_before, "original"), (unusable_after, "reconstruction"))
        if why
    ]
    failures += compare(before, after, max_drop)
    return GateResult(not failures, "; ".join(failures) or None, before, after)
