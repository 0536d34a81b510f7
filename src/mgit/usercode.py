"""User code (tests, recipes, gates), referenced as `module:function` or
`path/to/file.py:function`, and run only in a child process with a timeout.

MGit never imports user code in its own process: a crash, a hang, a NaN or a stray
`sys.exit` in a user's function fails that run alone. `source_hash` finds the file that
defines a function without importing anything (so `mgit add --recipe` can record it without
running user code), and hashes it: a result recorded for one source is reused only while the
file is unchanged.

Child protocol: `python -m mgit.usercode MODE SPEC ARGS...` prints, on its last marked line,
the JSON of what the function returned, or of the one line naming the exception it raised
(`raised KeyError: 'acc'`, the traceback going to the output); anything else it prints is kept
as the run's output.

Every `Repo` imports this module for `DEFAULT_TIMEOUT`: subprocess, tempfile, hashlib and
traceback are imported by the functions that use them, so that `mgit ls` does not wait for them.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import json
import math
import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import InvalidOptionError, UserCodeError
from mgit.reports import json_safe

if TYPE_CHECKING:
    from mgit.forkserver import Finished

DEFAULT_TIMEOUT = 600.0  # seconds a test or gate run may take unless told otherwise
RESULT_MARK = "MGIT-RESULT "
ERROR_MARK = "MGIT-RAISED "  # the child's line naming the exception the function (or its import) raised
MAX_ERROR = 300  # characters of that line
MAX_OUTPUT = 64 * 1024  # of a run's output kept for `mgit test show --output`
SOURCE_FILE = "mgit_recorded_source.py"  # what a recorded source runs as, in its temporary folder


@dataclass(frozen=True)
class RunOutcome:
    ok: bool
    value: Any  # what the function returned (JSON), when ok
    error: str | None  # one line, when not ok
    output: str  # what the child printed (stdout and stderr), the tail if long
    seconds: float
    origin: str = ""  # where it ran (`user@host`), when not in this process's machine


def split_spec(spec: str) -> tuple[str, str]:
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name or not name.isidentifier():
        raise UserCodeError(spec, "it is not MODULE:FUNCTION or FILE.py:FUNCTION")
    return target, name


MAX_REFERENCE = 1024  # characters of a function reference


def check_reference(spec: Any, *, absolute: bool = False) -> str:
    """`spec` if it is a function reference MGit will use as it came (from a remote, from
    checks.sqlite, in a cluster's job): `MODULE:FUNCTION` with a dotted module path, or
    `FILE.py:FUNCTION` with a relative path below the work folder (no `..`, no empty or `.`
    part, nothing but printable characters); with `absolute`, an absolute file path too
    (what `anchored` records for a local file outside the work folder). UserCodeError if not."""
    if not isinstance(spec, str) or not 0 < len(spec) <= MAX_REFERENCE or not spec.isprintable() or "\\" in spec:
        raise UserCodeError(str(spec)[:80], "it is not MODULE:FUNCTION or FILE.py:FUNCTION")
    target, _ = split_spec(spec)
    if target.endswith(".py"):
        parts = target.split("/")
        rooted = target.startswith("/")
        if rooted and not absolute:
            raise UserCodeError(spec, "a file must be named relative to the work folder")
        if any(p in ("", ".", "..") for p in parts[1 if rooted else 0 :]):
            raise UserCodeError(spec, "a file path must not hold '..', '.' or an empty part")
    elif not all(p.isidentifier() for p in target.split(".")):
        raise UserCodeError(spec, f"{target!r} is not a module name")
    return spec


def source_file(spec: str, *, cwd: Path | None = None) -> Path:
    """The file that defines a referenced function, found without importing anything."""
    target, _ = split_spec(spec)
    base = Path(cwd or Path.cwd())
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else base / target
        if not path.is_file():
            raise UserCodeError(spec, f"no file {target}")
        return path
    parts = target.split(".")
    if not all(p.isidentifier() for p in parts):
        raise UserCodeError(spec, f"{target!r} is not a module name")
    search: list[str] | None = [str(base), *[p for p in sys.path if p]]
    found = None
    for i, part in enumerate(parts):
        # PathFinder looks for files only; unlike importlib.util.find_spec it never runs a
        # package's __init__.
        found = importlib.machinery.PathFinder.find_spec(part, search)
        if found is None:
            raise UserCodeError(spec, f"no module {'.'.join(parts[: i + 1])} here or on the Python path")
        search = list(found.submodule_search_locations or [])
    assert found is not None
    if not found.origin or not os.path.isfile(found.origin):
        raise UserCodeError(spec, f"{target} has no source file")
    return Path(found.origin)


def source_hash(spec: str, *, cwd: Path | None = None) -> str:
    """sha256 of the source file defining the function (any change to the file counts), which
    must name the function at its top level (checked without running it: `defines`)."""
    path = source_file(spec, cwd=cwd)
    source = path.read_bytes()
    _, name = split_spec(spec)
    if not defines(source, name):
        raise UserCodeError(spec, f"{path.name} defines no {name!r} at its top level (read, not run)")
    import hashlib

    return hashlib.sha256(source).hexdigest()


_PARSING = threading.Lock()


def defines(source: bytes, name: str) -> bool:
    """Whether a module's source binds `name` at its top level (a def, a class, an assignment,
    an import), or may (a `from M import *` or a module `__getattr__`); a source that does not
    parse is left to fail when it runs."""
    import ast

    try:
        with _PARSING:  # CPython 3.11's parser is not safe to run in two threads at once (gh-106905)
            tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return True
                bound.add(alias.asname or alias.name.split(".")[0])
        else:
            for sub in ast.walk(node):  # assignments, also under if/try at the top level
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    bound.add(sub.id)
                elif isinstance(sub, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    bound.add(sub.name)
    return name in bound or "__getattr__" in bound


def anchored(spec: str, root: Path, *, recorded: bool = False) -> str:
    """A reference that still works from `root` (where MGit runs user code): a file path is
    made relative to `root` when inside it, absolute otherwise; a module name stays. A file
    path a user gives is read from the current folder, else from `root`; one `recorded` (as
    a version's recipe holds it, relative to the work folder) from `root` alone."""
    target, name = split_spec(spec)
    if not target.endswith(".py"):
        return spec
    here = Path(target).resolve()
    path = here if not recorded and here.is_file() else (root / target).resolve()
    if not path.is_file():
        raise UserCodeError(spec, f"no file {target}")
    try:
        return f"{path.relative_to(root.resolve()).as_posix()}:{name}"
    except ValueError:
        return f"{path}:{name}"


RESOURCE_KEYS = ("num_cpus", "num_gpus")
MAX_RESOURCE = 1024.0


def resources_of(values: Mapping[str, Any] | None) -> dict[str, float]:
    """Declared resources, checked: only `num_cpus` and `num_gpus`, each a number in
    [0, 1024] (fractions allowed, as Ray takes them). Unset ones are left out."""
    out: dict[str, float] = {}
    for key, value in (values or {}).items():
        if key not in RESOURCE_KEYS:
            raise InvalidOptionError(f"unknown resource {key!r}", hint=f"Use {' or '.join(RESOURCE_KEYS)}")
        if value is None:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not 0 <= value <= MAX_RESOURCE
        ):
            raise InvalidOptionError(f"resource {key} must be a number from 0 to {MAX_RESOURCE:g}, not {value!r}")
        out[key] = float(value)
    return out


def recipe_record_of(
    spec: str, params: Any = None, *, root: Path, resources: Any = None, recorded: bool = False
) -> dict[str, Any]:
    """What a version records of its recipe: the reference (`anchored` at the work folder
    `root`; `recorded`: as a version recorded it), its parameters (JSON values; a random seed
    among them makes the recipe re-runnable as it was), the resources it declares (already
    checked), and its source's hash."""
    spec = anchored(spec, root, recorded=recorded)
    params = dict(params or {})
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidOptionError(
            f"recipe parameters must be JSON values ({exc})", hint="Use --param KEY=VALUE"
        ) from None
    bad = [k for k in params if not isinstance(k, str) or not k.isidentifier()]
    if bad:
        raise InvalidOptionError(
            f"recipe parameter names must be identifiers, not {bad[0]!r}", hint="Use --param KEY=VALUE"
        )
    record = {"fn": spec, "params": params, "source_sha256": source_hash(spec, cwd=root)}
    if declared := resources_of(resources):
        record["resources"] = declared
    return record


def run(
    mode: str, spec: str, args: list[str], *, timeout: float, cwd: Path | None = None, source: bytes | None = None
) -> RunOutcome:
    """Run `spec` in a child process (`mode`: `call` passes ARGS as strings; `recipe` passes
    parent folders, an output folder and JSON keyword arguments): a child forked from a warm
    server that has imported numpy and torch already (mgit.forkserver), else a fresh
    interpreter. With `source`, the function's file is that recorded source instead of the
    file `spec` names (which may not be on this machine): it is written to a temporary
    folder, always under the same name (`SOURCE_FILE`), and run from there."""
    import tempfile

    from mgit import forkserver

    if source is not None:
        _, name = split_spec(spec)
        with tempfile.TemporaryDirectory(prefix="mgit-source-") as tmp:
            file = Path(tmp) / SOURCE_FILE  # never a name from the reference: it came from elsewhere
            file.write_bytes(source)
            return run(mode, f"{file}:{name}", args, timeout=timeout, cwd=cwd)
    start = time.monotonic()
    env = dict(os.environ)
    here = str(Path(cwd or Path.cwd()))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    argv = [mode, spec, *args]
    proc = forkserver.run_module("mgit.usercode", argv, cwd=here, env=env, timeout=timeout)
    if proc is None:
        proc = _cold(argv, cwd=here, env=env, timeout=timeout)
    if proc.timed_out:
        output = proc.stdout + proc.stderr
        return RunOutcome(False, None, f"did not finish within {timeout:g} s", _tail(output), time.monotonic() - start)
    seconds = time.monotonic() - start
    marked = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARK)]
    raised = [ln for ln in proc.stdout.splitlines() if ln.startswith(ERROR_MARK)]
    output = (
        "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith((RESULT_MARK, ERROR_MARK))) + proc.stderr
    )
    if raised and proc.returncode == 1 and not marked:
        why = "".join(c if c.isprintable() else "?" for c in raised[-1][len(ERROR_MARK) :].strip()[:MAX_ERROR])
        return RunOutcome(False, None, f"raised {why}", _tail(output), seconds)
    if proc.returncode != 0 or not marked:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
        return RunOutcome(False, None, f"{why}: {last}", _tail(output), seconds)
    try:
        value = json.loads(marked[-1][len(RESULT_MARK) :])
    except ValueError:
        return RunOutcome(False, None, "printed a malformed result", _tail(output), seconds)
    return RunOutcome(True, value, None, _tail(output), seconds)


def metrics_of(value: Any) -> tuple[dict[str, float], bool | None, str | None]:
    """(metrics, `passed` if the function returned it, a problem) from what a test or a gate
    returned: the one reading of a user's metrics. No metrics: the problem says why it gave
    none. A metric that is NaN or infinite (a NaN arrives as null) cannot pass a bound: it
    is kept as it is, so that what was measured stays visible, and named in the problem,
    which makes the verdict a failure."""
    if not isinstance(value, dict) or not value:
        return {}, None, "must return a non-empty dict of metrics"
    passed = value.get("passed")
    if passed is not None and not isinstance(passed, bool):
        return {}, None, "'passed' must be true or false"
    out: dict[str, float] = {}
    for k, v in value.items():
        if k == "passed":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) and v is not None:
            return {}, None, f"metric {k!r} is not a number"
        out[k] = float("nan") if v is None else float(v)
    bad = [k for k, v in out.items() if not math.isfinite(v)]
    return out, passed, (f"metric {', '.join(bad)} is not finite" if bad else None)


def load_function(spec: str) -> Any:
    """The function a reference names (child processes only: this runs user code)."""
    target, name = split_spec(spec)
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("mgit_user_module", target)
        if module_spec is None or module_spec.loader is None:
            raise ValueError(f"cannot load {target}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    return getattr(module, name)


def _cold(argv: list[str], *, cwd: str, env: dict[str, str], timeout: float) -> Finished:
    """`python -m mgit.usercode ARGV` in a fresh interpreter, ended the way a warm server
    reports its child's end (mgit.forkserver.Finished)."""
    import subprocess

    from mgit.forkserver import Finished

    cmd = [sys.executable, "-m", "mgit.usercode", *argv]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as exc:
        return Finished(-9, _text(exc.stdout), _text(exc.stderr), timed_out=True)  # run killed it (SIGKILL)
    return Finished(proc.returncode, proc.stdout, proc.stderr, timed_out=False)


def _text(value: bytes | str | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value or ""


def _tail(text: str) -> str:
    return text if len(text) <= MAX_OUTPUT else "...\n" + text[-MAX_OUTPUT:]


def _encode(value: Any) -> str:
    # NaN stays visible as null (JSON has no NaN): a test returning NaN must fail, not crash.
    return json.dumps(json_safe(value))


def main(argv: list[str]) -> int:
    mode, spec, *args = argv
    if mode not in ("call", "recipe"):
        raise SystemExit(f"unknown mode {mode!r}")
    try:
        fn = load_function(spec)
        if mode == "call":
            value = fn(*args)
        else:
            out, params, *parents = args
            fn([Path(p) for p in parents], Path(out), **json.loads(params))
            value = {"written": out}
    except Exception as exc:  # the user's function raised: an error with its one line (SystemExit is an exit)
        import traceback

        traceback.print_exc()
        line = (f"{type(exc).__name__}: {exc}".splitlines() or [type(exc).__name__])[0]
        sys.stdout.flush()
        sys.stdout.write("\n" + ERROR_MARK + line[:MAX_ERROR] + "\n")
        return 1
    sys.stdout.flush()
    sys.stdout.write("\n" + RESULT_MARK + _encode(value) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
