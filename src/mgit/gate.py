"""The lossy gate: a user's metric function run on the original and on the lossy
reconstruction, each in a separate Python process with a timeout.

A gate is `module:function` (importable from the current folder) or `path/to/file.py:function`;
the function takes a model folder and returns a dict of metrics (name -> number). User code
never runs in the mgit process: `python -m mgit.gate SPEC FOLDER` imports it, calls it and
prints the metrics as JSON on its last line. A crash, a timeout or malformed metrics are a
failed gate, and a failed gate means lossless storage.

Direction: a metric whose name has a word meaning lower-is-better (`LOWER_IS_BETTER`: loss,
error, perplexity, ...; words are split on anything but letters and digits) must not rise by
more than `max_drop`; any other metric must not fall by more than `max_drop`.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from mgit.usercode import load_function

DEFAULT_TIMEOUT = 600.0
LOWER_IS_BETTER = frozenset({"loss", "error", "err", "perplexity", "ppl", "mse", "mae", "rmse", "wer", "cer", "latency"})
RESULT_MARK = "MGIT-GATE-METRICS "


class GateFailure(Exception):
    """The gate function could not produce metrics (crash, timeout, bad output)."""


@dataclass(frozen=True)
class GateResult:
    passed: bool
    reason: str | None = None
    original: dict[str, float] = field(default_factory=dict)
    reconstruction: dict[str, float] = field(default_factory=dict)


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


def metrics(spec: str, folder: Path, *, timeout: float = DEFAULT_TIMEOUT) -> dict[str, float]:
    """Run the gate on one folder in a child process; raise GateFailure if it fails."""
    try:
        proc = subprocess.run([sys.executable, "-m", "mgit.gate", spec, str(folder)], capture_output=True,
                              text=True, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise GateFailure(f"the gate {spec} did not finish within {timeout:g} s") from None
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GateFailure(f"the gate {spec} failed (exit code {proc.returncode}: {last})")
    return _parse(spec, lines[-1][len(RESULT_MARK) :])


def _parse(spec: str, text: str) -> dict[str, float]:
    try:
        value = json.loads(text)
    except ValueError:
        raise GateFailure(f"the gate {spec} printed malformed metrics") from None
    ok = isinstance(value, dict) and value and all(
        isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for k, v in value.items()
    )  # fmt: skip
    if not ok:
        raise GateFailure(f"the gate {spec} must return a non-empty dict of finite numbers")
    return {k: float(v) for k, v in value.items()}


def evaluate(spec: str, original: Path, reconstruction: Path, *, max_drop: float,
             timeout: float = DEFAULT_TIMEOUT) -> GateResult:  # fmt: skip
    """Run the gate on both folders and judge the reconstruction."""
    try:
        before = metrics(spec, original, timeout=timeout)
        after = metrics(spec, reconstruction, timeout=timeout)
    except GateFailure as exc:
        return GateResult(False, str(exc))
    failures = compare(before, after, max_drop)
    return GateResult(not failures, "; ".join(failures) or None, before, after)


def main(argv: list[str]) -> int:
    spec, folder = argv
    result = load_function(spec)(folder)  # user code: this runs in the child process only
    sys.stdout.write("\n" + RESULT_MARK + json.dumps(result, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
