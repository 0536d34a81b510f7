"""MGit as people install it: the wheel built from this checkout, installed with its
dependencies into a fresh virtual environment that cannot see the source tree, runs `mgit`.

The build and the install go through pip as a user's would (build isolation, dependencies
from the package index), so they need the index: without it the test fails, it never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import make_model, sha256_tree

import mgit

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DIST = "mgit-models"


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def run(self, *args: str | Path, cwd: Path) -> str:
        done = subprocess.run(
            [str(a) for a in args], cwd=cwd, env=self.env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, f"{' '.join(map(str, args))} exited {done.returncode}\n{done.stdout}{done.stderr}"
        return done.stdout

    def mgit(self, *args: str | Path, cwd: Path) -> str:
        return self.run(self.venv / "bin" / "mgit", *args, cwd=cwd)


def source_copy(folder: str, names: list[str]) -> set[str]:
    """What the copy of the checkout leaves out: caches, virtual environments, earlier build
    output (a stale build/lib would leak deleted modules into the wheel)."""
    top = Path(folder) == ROOT
    return {
        n
        for n in names
        if n == "__pycache__" or n.endswith(".egg-info") or (top and (n.startswith(".") or n in ("build", "dist")))
    }


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("packaging")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env |= {"PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "NO_COLOR": "1"}
    shutil.copytree(ROOT, tmp / "source", ignore=source_copy)
    pip = [sys.executable, "-m", "pip"]
    build = subprocess.run(
        [*pip, "wheel", "--no-deps", "-q", "-w", tmp / "wheels", tmp / "source"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, f"building the wheel failed (it needs the package index):\n{build.stderr}"
    [wheel] = (tmp / "wheels").glob("*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, env=env, timeout=120)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    install = subprocess.run(
        [*pip, "--python", venv / "bin" / "python", "install", "-q", wheel],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, f"installing the wheel failed (it needs the package index):\n{install.stderr}"
    return Installed(wheel, venv, env)


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(installed: Installed) -> None:
    package = ROOT / "src" / "mgit"
    source = {
        p.relative_to(package.parent).as_posix()
        for p in package.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    with zipfile.ZipFile(installed.wheel) as wheel:
        names = set(wheel.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers, _, description = wheel.read(metadata).decode().partition("\n\n")
    packaged = {n for n in names if n.startswith("mgit/")}
    assert not source - packaged, f"not in the wheel (package-data in pyproject.toml?): {sorted(source - packaged)}"
    assert not packaged - source, f"in the wheel but not in src/: {sorted(packaged - source)}"
    assert {n.split("/")[0] for n in names} == {"mgit", metadata.split("/")[0]}
    assert f"Name: {DIST}" in headers.splitlines()
    assert f"Version: {mgit.__version__}" in headers.splitlines()
    assert "License-Expression: Apache-2.0" in headers.splitlines()
    assert description.strip() == (ROOT / "README.md").read_text().strip()
    extras = {
        line.removeprefix("Provides-Extra: ") for line in headers.splitlines() if line.startswith("Provides-Extra:")
    }
    assert {"torch", "s3", "ray", "web", "hf", "all"} <= extras


def test_the_installed_mgit_comes_from_the_fresh_environment(installed: Installed, tmp_path: Path) -> None:
    where = installed.run(
        installed.python, "-c", "import mgit, numpy; print(mgit.__file__); print(numpy.__file__)", cwd=tmp_path
    ).split()
    site = next((installed.venv / "lib").glob("python*/site-packages"))
    assert [Path(p).resolve().is_relative_to(site.resolve()) for p in where] == [True, True], where
    assert installed.mgit("--version", cwd=tmp_path).strip() == f"mgit, version {mgit.__version__}"
    shown = installed.run(sys.executable, "-m", "pip", "--python", installed.python, "show", DIST, cwd=tmp_path)
    assert f"Name: {DIST}" in shown.splitlines() and f"Version: {mgit.__version__}" in shown.splitlines()


def test_the_installed_command_adds_and_checks_out_a_model(installed: Installed, tmp_path: Path) -> None:
    assert not tmp_path.resolve().is_relative_to(ROOT)
    model = make_model(tmp_path / "model")
    installed.mgit("init", cwd=tmp_path)
    installed.mgit("add", "model", "--name", "m", cwd=tmp_path)
    installed.mgit("checkout", "m", "-o", "out", cwd=tmp_path)
    assert sha256_tree(tmp_path / "out") == sha256_tree(model)
