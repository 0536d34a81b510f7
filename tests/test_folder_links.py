"""Links inside a model folder: a link whose target leaves the folder is refused (naming the
link) wherever a folder is read (add, diff, suggest), nothing stored; a link inside the folder
is stored as the file it points to, with a note, and checks out as a regular file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import make_model, run_cli, sha256_tree

from mgit import Repo


@pytest.fixture
def work(tmp_path: Path) -> Path:
    Repo.init(tmp_path)
    make_model(tmp_path / "m", seed=3)
    (tmp_path / "secret.txt").write_text("not the model's\n")
    return tmp_path


def _repo_files(root: Path) -> set[str]:
    return {
        str(p.relative_to(root))
        for p in (root / ".mgit").rglob("*")
        if p.is_file() and "locks" not in p.parts and not p.name.endswith(("-wal", "-shm"))
    }


@pytest.mark.parametrize("target", ["/etc/passwd", "../secret.txt", "ABSOLUTE_SECRET"])
@pytest.mark.parametrize("command", [["add", "m", "--name", "m"], ["diff", "m", "m"], ["lineage", "suggest", "m"]])
def test_a_link_out_of_the_folder_is_refused_by_every_reader(work: Path, target: str, command: list[str]) -> None:
    if command[0] != "add":
        Repo(work).add(work / "m", name="first")
    os.symlink(str(work / "secret.txt") if target == "ABSOLUTE_SECRET" else target, work / "m" / "leak")
    before = _repo_files(work) if command[0] == "add" else None
    code, out, err = run_cli(*command, cwd=work)
    assert code == 1 and out == "", err
    assert (
        err.startswith(f"Error: m/leak: is a link to {os.path.realpath(work / 'm' / 'leak')}, outside the model folder")
        and err.count("\n") == 1
    )
    if before is not None:
        assert _repo_files(work) == before and "m" not in Repo(work).refs.all()


def test_a_link_chain_that_ends_outside_is_refused(work: Path) -> None:
    os.symlink("../secret.txt", work / "m" / "hop")
    os.symlink("hop", work / "m" / "start")
    code, _, err = run_cli("add", "m", "--name", "m", cwd=work)
    assert code == 1 and "outside the model folder" in err


def test_a_link_inside_the_folder_is_stored_as_its_target_and_checks_out_as_a_file(work: Path) -> None:
    os.symlink("config.json", work / "m" / "config-copy.json")
    code, out, err = run_cli("add", "m", "--name", "m", cwd=work)
    assert code == 0, err
    assert "note: config-copy.json is a link to config.json: stored as the file it points to" in err
    assert run_cli("checkout", "m", "-o", "out", cwd=work)[0] == 0
    copy = work / "out" / "config-copy.json"
    assert copy.is_file() and not copy.is_symlink()
    assert copy.read_bytes() == (work / "m" / "config.json").read_bytes()
    assert sha256_tree(work / "out") == sha256_tree(work / "m")  # sha256_tree reads through the link
