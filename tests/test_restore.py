"""Rebuilding a manifest's files (mgit.repo.checkout.restore_manifest): `Repo.checkout`
is that function plus the version's notes, so the two give the same bytes and refuse the
same output folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_model, sha256_tree

from mgit import Repo
from mgit.errors import UnsafePathError
from mgit.repo.checkout import restore_manifest


def test_checkout_and_restore_manifest_rebuild_the_same_files(repo: Repo, tmp_path: Path) -> None:
    source = make_model(tmp_path / "model", seed=3)
    repo.add(source, name="m")
    repo.checkout("m", tmp_path / "checked-out", jobs=2)
    restore_manifest(repo.store, repo.manifest("m"), tmp_path / "new" / "restored", jobs=2)  # parents made
    assert sha256_tree(tmp_path / "checked-out") == sha256_tree(tmp_path / "new" / "restored") == sha256_tree(source)


@pytest.mark.parametrize("how", ["checkout", "restore_manifest"])
def test_a_planted_link_is_refused_before_anything_is_written(repo: Repo, tmp_path: Path, how: str) -> None:
    source = make_model(tmp_path / "model", seed=3)
    repo.add(source, name="m")
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    out.mkdir()
    first = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())[0]
    (out / first).symlink_to(elsewhere / "victim")
    with pytest.raises(UnsafePathError, match="is a link"):
        if how == "checkout":
            repo.checkout("m", out, force=True)
        else:
            restore_manifest(repo.store, repo.manifest("m"), out, jobs=1)
    assert [p.name for p in out.iterdir()] == [first] and list(elsewhere.iterdir()) == []
