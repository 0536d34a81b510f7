"""Fixtures and terse builders shared by the suite.

    repo                      an empty repository in a temporary folder
    make_model(dir, seed=0)   a small Hugging Face-style folder (config, tokenizer, safetensors)
    tensors(seed, scale)      a small state dict of numpy arrays
    add_lineage(repo, "base", "ft <- base", "q <- ft : quantize")   a lineage graph in a line
    run_cli("add", ...)       the CLI in-process: (exit code, stdout, stderr)
    sha256_tree(dir)          {relative path: sha256} of every file, to compare round trips
    load_recipes(dir)         dir/recipes.py imported here, to make a family's first versions
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from safetensors.numpy import save_file

from mgit import Repo

MGIT = [sys.executable, "-m", "mgit.cli.main"]


def tensors(seed: int = 0, *, scale: float = 1.0, layers: int = 2, width: int = 16) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = {"embed.weight": (rng.standard_normal((32, width)) * scale).astype(np.float32)}
    for i in range(layers):
        state[f"layer.{i}.weight"] = (rng.standard_normal((width, width)) * scale).astype(np.float32)
        state[f"layer.{i}.bias"] = np.zeros(width, np.float32)
    state["position_ids"] = np.arange(8, dtype=np.int64)
    return state


def make_model(path: Path, seed: int = 0, *, state: dict[str, np.ndarray] | None = None,
               metadata: dict[str, str] | None = None) -> Path:  # fmt: skip
    """A model folder: model.safetensors written by the reference library, plus text files."""
    path.mkdir(parents=True, exist_ok=True)
    save_file(state if state is not None else tensors(seed), str(path / "model.safetensors"),
              metadata=metadata or {"format": "pt"})  # fmt: skip
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
        repo.add(tensors(1000 + i, layers=1, width=4), name=name.strip(),
                 parent=parents.split() or None, relation=relation.strip() or None)  # fmt: skip


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


def run_mgit(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `mgit ARGS` in a separate process (for kills, races and real exit codes)."""
    return subprocess.run([*MGIT, *args], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo.init(tmp_path / "repo")


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
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"])  # fmt: skip
        yield b
        b.close()
