"""Where a recipe's `file.py:fn` is read from (mgit.usercode.anchored): a reference a user
gives, from the current folder first; one a version recorded, from the work folder alone.
`mgit add --recipe` records the one, a cascade records the other anew."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import tensors

from mgit import Repo
from mgit.cascade import cascade
from mgit.usercode import anchored

RECIPE = """
import pathlib
from safetensors.numpy import load_file, save_file

def halve(parents, out_dir):
    state = load_file(str(pathlib.Path(parents[0]) / "model.safetensors"))
    save_file({k: v / 2 for k, v in state.items()}, str(pathlib.Path(out_dir) / "model.safetensors"))
"""
DECOY = "def halve(parents, out_dir):\n    raise SystemExit('the current folder is not the work folder')\n"


@pytest.fixture
def folders(repo: Repo, tmp_path: Path) -> tuple[Repo, Path]:
    """The work folder with recipes.py, and another folder whose recipes.py is not it."""
    (repo.root / "recipes.py").write_text(RECIPE)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "recipes.py").write_text(DECOY)
    return repo, elsewhere


def test_a_given_reference_is_read_from_here_a_recorded_one_from_the_work_folder(
    folders: tuple[Repo, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, elsewhere = folders
    monkeypatch.chdir(elsewhere)
    assert anchored("recipes.py:halve", repo.root) == f"{(elsewhere / 'recipes.py').resolve()}:halve"
    assert anchored("recipes.py:halve", repo.root, recorded=True) == "recipes.py:halve"
    assert repo.recipe_record("recipes.py:halve")["fn"] == f"{(elsewhere / 'recipes.py').resolve()}:halve"
    assert repo.recipe_record("recipes.py:halve", recorded=True)["fn"] == "recipes.py:halve"
    assert anchored("pkg.mod:fn", repo.root, recorded=True) == "pkg.mod:fn"  # a module name stays


def test_a_cascade_run_from_another_folder_records_the_work_folders_recipe(
    folders: tuple[Repo, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, elsewhere = folders
    monkeypatch.chdir(repo.root)
    repo.add(tensors(1), name="base")
    repo.add(tensors(1, scale=0.5), name="kid", parent="base", relation="finetune", recipe="recipes.py:halve")
    assert repo.version("kid").recipe["fn"] == "recipes.py:halve"
    repo.add(tensors(2), name="base")
    monkeypatch.chdir(elsewhere)
    cascade(repo, "base")
    assert len(repo.log("kid")) == 2  # rebuilt: the decoy would have failed the recipe
    assert repo.version("kid").recipe["fn"] == "recipes.py:halve"
