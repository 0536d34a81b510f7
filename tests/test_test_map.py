"""The suite's own shape: the map from modules to their tests in tests/README.md is whole and
true, and a test module imports conftest and the modules that build things, never another
test module (a helper two files need has one home)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src" / "mgit"
ROW = re.compile(r"\| `([^`]+)` \| ([^|]+) \|")


def the_map(readme: str) -> dict[str, list[str]]:
    """The rows of the map in tests/README.md: module -> the test files it names."""
    section = readme.split("\n## The map\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines():
        if m := ROW.fullmatch(line.strip()):
            assert m[1] not in rows, f"{m[1]} has two rows"
            rows[m[1]] = [t.strip() for t in m[2].split(",")]
    return rows


def modules(src: Path) -> set[str]:
    """Every module of the package as the map names it: its path under src/mgit, a package's
    __init__.py by the package's path (`merging/`), one that holds only a docstring left out."""
    found = set()
    for path in src.rglob("*.py"):
        name = path.relative_to(src).as_posix()
        if path.name == "__init__.py" and path.parent != src:
            body = ast.parse(path.read_text()).body
            if all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body):
                continue
            name = name.removesuffix("__init__.py")
        found.add(name)
    return found


def test_every_module_is_in_the_map_and_the_map_names_only_what_exists() -> None:
    rows = the_map((TESTS / "README.md").read_text())
    assert sorted(modules(SRC) - set(rows)) == [], "modules missing from the map in tests/README.md"
    assert sorted(set(rows) - modules(SRC)) == [], "rows of the map name modules that do not exist"
    named = {t for tests in rows.values() for t in tests}
    assert sorted(t for t in named if not t.startswith("test_") or not (TESTS / t).is_file()) == []


def test_every_test_file_is_named_in_the_readme() -> None:
    readme = (TESTS / "README.md").read_text()
    assert sorted(p.name for p in TESTS.glob("test_*.py") if p.name not in readme) == []


def test_the_map_check_sees_a_missing_module_and_a_package(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text('"""Only a docstring."""\n')
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "__init__.py").write_text("X = 1\n")
    (tmp_path / "__init__.py").write_text("X = 1\n")
    assert modules(tmp_path) == {"__init__.py", "pkg/mod.py", "other/"}
    readme = "# T\n\n## The map\n\n| module | tests |\n| --- | --- |\n| `pkg/mod.py` | test_a.py, test_b.py |\n"
    assert the_map(readme + "\n## After\n| `x.py` | test_c.py |\n") == {"pkg/mod.py": ["test_a.py", "test_b.py"]}


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
    probe.write_text(
        "import test_a\nimport x.y as z\nfrom test_b import f\nfrom . import c\n"
        "def g():\n    from test_c.sub import h\n"
    )
    assert imported_modules(probe) == {"test_a", "x", "test_b", "test_c"}
