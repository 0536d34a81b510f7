"""Fixtures and terse builders shared by the suite.

repo                      an empty repository in a temporary folder
make_model(dir, seed=0)   a small Hugging Face-style folder (config, tokenizer, safetensors)
tensors(seed, scale)      a small state dict of numpy arrays
add_lineage(repo, "base", "ft <- base", "q <- ft : quantize")   a lineage graph in a line
run_cli("add", ...)       the CLI in-process: (exit code, stdout, stderr)
run_mgit("add", ..., cwd=)  the CLI in a process of its own (for kills, races, real exit codes)
sha256_tree(dir)          {relative path: sha256} of every file, to compare round trips
copy_user_code(dir, "mlp")  tests/fixtures/mlp's recipes.py and evals.py copied into a work folder
load_recipes(dir)         dir/recipes.py imported here, to make a family's first versions
mgit_json(root, "ls")     `mgit ls --json` in-process, checked to succeed, parsed
fsck_ok(root)             `mgit fsck --json` finds nothing wrong; its report
history(root, "m")        `mgit log m --json`, checked to be one chain
one_line_error(result, "what")  a command failed with one line "Error: ..." naming what; the line
st_bytes(header, data)    a safetensors file's bytes, its header length given or forged
needs_torch               a marker: the test is skipped without torch (an optional extra)
OnFolder                  mixin for a contract class: `url` (a fresh folder remote) and `env`
web_family                the family the web pages show, hostile text in every field (module scope)
HOSTILE, CARD             user text (and a model card) that would run script where it is not escaped
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from mgit import Repo

MGIT = [sys.executable, "-m", "mgit.cli.main"]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# What a page would run if it did not escape user text (messages, tags, names, cards).
HOSTILE = '</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2"> & "q"'
CARD = f"""---
base_model: base
license: "<script>window.pwned = 3</script>"
---
# The card

<script>window.pwned = 4</script><iframe src="http://example.com/"></iframe>
<img src="http://example.com/x.png" onerror="window.pwned = 5">

| metric | value |
|---|---|
| acc | 0.9 |

[safe](https://example.com/doc) [bad](javascript:window.pwned=6) ![pixel](http://example.com/p.png)
{HOSTILE}
"""
# torch is an optional extra: the tests that use it import it themselves and carry this mark.
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="needs torch (pip install 'mgit-models[torch]')"
)


def tensors(seed: int = 0, *, scale: float = 1.0, layers: int = 2, width: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = {"embed.weight": (rng.standard_normal((32, width)) * scale).astype(np.float32)}
    for i in range(layers):
        state[f"layer.{i}.weight"] = (rng.standard_normal((width, width)) * scale).astype(np.float32)
        state[f"layer.{i}.bias"] = np.zeros(width, np.float32)
    state["position_ids"] = np.arange(8, dtype=np.int64)
    return state


def make_model(
    path: Path, seed: int = 0, *, state: dict[str, np.ndarray] | None = None, metadata: dict[str, str] | None = None
) -> Path:
    """A model folder: model.safetensors written by the reference library, plus text files."""
    path.mkdir(parents=True, exist_ok=True)
    save_file(
        state if state is not None else tensors(seed),
        str(path / "model.safetensors"),
        metadata=metadata or {"format": "pt"},
    )
    (path / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 16, "seed": seed}))
    (path / "tokenizer").mkdir(exist_ok=True)
    (path / "tokenizer" / "vocab.txt").write_text("\n".join(f"tok{i}" for i in range(50)))
    return path


def add_lineage(repo: Repo, *lines: str) -> None:
    """Add models from terse lines: `name`, `name <- parent`, `name <- a b : merge`; a name
    seen before gets a new version. Each model gets distinct small weights."""
    for i, line in enumerate(lines):
        head, _, relation = line.partition(":")
        name, _, parents = head.partition("<-")
        repo.add(
            tensors(1000 + i, layers=1, width=4),
            name=name.strip(),
            parent=parents.split() or None,
            relation=relation.strip() or None,
        )


def copy_user_code(root: Path, family: str, *names: str) -> Path:
    """The user code of a family of tests (tests/fixtures/FAMILY: its recipes.py, evals.py,
    or only the files `names`) copied into the work folder `root`, where `recipes.py:fn` and
    `evals.py:fn` name it."""
    for name in names or sorted(p.name for p in (FIXTURES / family).glob("*.py")):
        shutil.copyfile(FIXTURES / family / name, root / name)
    return root


def load_recipes(root: Path) -> ModuleType:
    """A work folder's recipes.py imported in the test (to make each model's first version
    as its recipe would); a module name of its own per folder."""
    spec = importlib.util.spec_from_file_location(f"recipes_{abs(hash(root))}", root / "recipes.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sha256_tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `mgit ARGS` in-process (fast) and capture its exit code and output."""
    from mgit.cli.main import main

    old_cwd, old_env = os.getcwd(), dict(os.environ)
    out, err = io.StringIO(), io.StringIO()
    try:
        if cwd:
            os.chdir(cwd)
        os.environ.update(env or {})
        with redirect_stdout(out), redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(old_cwd)
        os.environ.clear()
        os.environ.update(old_env)
    return code, out.getvalue(), err.getvalue()


def run_mgit(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run `mgit ARGS` in a separate process (for kills, races and real exit codes)."""
    return subprocess.run(
        [*MGIT, *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )


def mgit_json(root: Path, *args: str) -> Any:
    """`mgit ARGS --json`, in-process; it must succeed."""
    code, out, err = run_cli(*args, "--json", cwd=root)
    assert code == 0, f"mgit {' '.join(args)} failed ({code}): {err}"
    return json.loads(out)


def fsck_ok(root: Path, *, in_subprocess: bool = False) -> dict[str, Any]:
    """`mgit fsck --json` exits 0 with no problems (temporary leftovers are allowed); its
    report. `in_subprocess`: a real process, for its real exit code."""
    if in_subprocess:
        r = run_mgit("fsck", "--json", cwd=root)
        code, out, err = r.returncode, r.stdout, r.stderr
    else:
        try:
            code, out, err = run_cli("fsck", "--json", cwd=root)
        except SystemExit as exc:  # fsck leaves through sys.exit(1) when it finds problems
            pytest.fail(f"fsck found problems (exit {exc.code}): {Repo(root).fsck().problems}")
    report = json.loads(out) if out else {}
    assert code == 0 and report.get("ok") is True, f"fsck failed ({code}): {out} {err}"
    assert report["problems"] == []
    return report  # type: ignore[no-any-return]


def history(root: Path, name: str) -> list[dict[str, Any]]:
    """`mgit log NAME --json`, checked to be one chain back to the model's first version."""
    log = mgit_json(root, "log", name)
    for newer, older in zip(log, log[1:], strict=False):
        assert newer["predecessor"] == older["id"], f"{name}: history is not one chain"
    assert log[-1]["predecessor"] is None
    return log  # type: ignore[no-any-return]


def one_line_error(
    result: tuple[int, str, str] | subprocess.CompletedProcess[str], *fragments: str, code: int = 1
) -> str:
    """`result` (of `run_cli` or `run_mgit`) exited `code` with nothing on stdout and exactly one
    line on stderr, "Error: ..." holding every fragment, no traceback; that line."""
    if isinstance(result, subprocess.CompletedProcess):
        result = (result.returncode, result.stdout, result.stderr)
    rc, out, err = result
    assert rc == code and out == "", (rc, out, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)
    return err


def st_bytes(header: dict[str, Any] | bytes, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file: u64 header length (the real one unless `length`), header, data."""
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(body) if length is None else length) + body + data


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo.init(tmp_path / "repo")


class OnFolder:
    """Mixin for a contract class run against a folder remote (the folder twin of
    s3server.OnS3): `url`, a fresh bare repository in tmp_path; `env`, for child processes."""

    @pytest.fixture
    def url(self, tmp_path: Path) -> str:
        from mgit import sync

        sync.init_bare(str(tmp_path / "remote.mgit"))
        return str(tmp_path / "remote.mgit")

    @pytest.fixture
    def env(self) -> dict[str, str]:
        return dict(os.environ)


@pytest.fixture(scope="module")
def web_family(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """base (two versions, a hostile message and tag) -> org/ft (a folder with a hostile
    card and file name; built on base@1, so stale) -> q8 (quantize, a planted test
    failure); base -> other (adapter). Test `acc` attached to base and inherited, and run."""
    from mgit.checks import Checks, Condition

    root = tmp_path_factory.mktemp("web")
    repo = Repo.init(root / "repo")
    repo.add(tensors(1), name="base", message=HOSTILE, tags={"stage": HOSTILE})
    folder = make_model(root / "ft", seed=2)
    (folder / "README.md").write_text(CARD)
    (folder / '<img src=x onerror="window.pwned=8">.txt').write_text("hostile file name")
    repo.add(folder, name="org/ft", parent="base", tags={"task": "sst2"}, message="fine-tune")
    repo.add(tensors(3, scale=100), name="q8", parent="org/ft", relation="quantize")
    repo.add(tensors(4), name="other", parent="base", relation="adapter", tags={"task": "nli"})
    repo.add(tensors(5), name="base", message="v2")
    copy_user_code(repo.root, "web")
    checks = Checks(repo)
    checks.attach("base", "evals.py:acc", conditions=[Condition("acc", "min", 0.5)], inherit=True)
    checks.run()
    return repo


@pytest.fixture(autouse=True)
def _quiet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MGIT_DIR", raising=False)
    monkeypatch.delenv("MGIT_CRASH_AT", raising=False)
    monkeypatch.setenv("MGIT_AUTHOR", "tester <t@example.com>")


CHROMIUM = "/usr/bin/chromium"  # Debian's: playwright drives it and never downloads a browser of its own


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium for a module's browser tests (skipped with MGIT_NO_BROWSER=1)."""
    if os.environ.get("MGIT_NO_BROWSER") == "1":
        pytest.skip("MGIT_NO_BROWSER=1")
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (or set MGIT_NO_BROWSER=1)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--disable-dev-shm-usage",
            ],
        )
        yield b
        b.close()
