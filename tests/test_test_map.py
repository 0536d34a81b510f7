"""The suite's own shape: what a test module may import (conftest and the modules that build
things, never another test module: a helper two files need has one home)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_modules(path: Path) -> set[str]:
    """The top-level names of every module `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def test_no_test_module_imports_another() -> None:
    modules = {p.stem for p in TESTS.glob("test_*.py")}
    found = {p.name: sorted(imported_modules(p) & modules) for p in sorted(TESTS.glob("*.py"))}
    assert {name: names for name, names in found.items() if names} == {}


def test_the_import_check_sees_every_form_of_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import test_a\nimport x.y as z\nfrom test_b import f\nfrom . import c\n"
                     "def g():\n    from test_c.sub import h\n")  # fmt: skip
    assert imported_modules(probe) == {"test_a", "x", "test_b", "test_c"}
