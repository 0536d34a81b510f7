"""Shared job folders (mgit.jobfolders): a local executor checks out each version once for all
its jobs, reads a recipe's output as the new version's folder only when the add stored exactly
its bytes, and keeps every shared folder read-only: a job that writes into one fails, and the
folder is checked out anew for the next."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import make_model, sha256_tree

from mgit import Repo
from mgit.execution import CheckJob, LocalExecutor, RecipeJob
from mgit.jobfolders import JobFolders, holds_exactly, signature

USER_CODE = """
import os, pathlib, shutil

def copy(parents, out_dir, note=""):
    shutil.copytree(parents[0], out_dir, dirs_exist_ok=True)  # modes too: a sealed parent's
    os.chmod(out_dir, 0o755)
    (pathlib.Path(out_dir) / "note.txt").write_text(note)

def scribble(parents, out_dir):
    (pathlib.Path(parents[0]) / "config.json").write_text("{}")

def chmod_scribble(parents, out_dir):
    os.chmod(parents[0], 0o755)
    os.chmod(pathlib.Path(parents[0]) / "config.json", 0o644)
    (pathlib.Path(parents[0]) / "config.json").write_text("{}")
    copy(parents, out_dir)

def where(folder):
    return {"files": float(len(os.listdir(folder)))}

def stamp(folder):
    os.chmod(folder, 0o755)
    pathlib.Path(folder, "stamp").write_text("x")
    return {"files": 1.0}
"""


@pytest.fixture()
def work(tmp_path: Path) -> Repo:
    repo = Repo.init(tmp_path / "work")
    (repo.root / "jobs.py").write_text(USER_CODE)
    make_model(tmp_path / "base", seed=1)
    repo.add(tmp_path / "base", name="base")
    return repo


def _job(repo: Repo, model: str, parent: str, fn: str = "copy") -> RecipeJob:
    head = repo.add({"w": __import__("numpy").zeros(2, "float32")}, name=model).version
    record = repo.recipe_record(f"jobs.py:{fn}", {})
    return RecipeJob(model, head, [repo.resolve(parent)], "finetune", record, "by a job", {}, 60.0)


def _counting(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    checkout = Repo.checkout

    def counted(self: Repo, ref: str, out_dir: object, **kw: object) -> object:
        calls.append(ref)
        return checkout(self, ref, out_dir, **kw)

    monkeypatch.setattr(Repo, "checkout", counted)
    return calls


def test_each_version_is_checked_out_once_and_a_recipe_output_is_not_checked_out_again(
    work: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _counting(work, monkeypatch)
    executor = LocalExecutor(work)
    first = executor.run_recipe(_job(work, "a", "base"))
    second = executor.run_recipe(_job(work, "b", "a"))  # builds on a's output folder
    assert first.ok and second.ok and second.created
    outcomes = executor.run_tests(
        [CheckJob(v, "where", "jobs.py:where", 60.0) for v in (work.resolve("base"), first.version, second.version)]
    )
    base_files = len(os.listdir(work.root.parent / "base"))
    assert [o.value["files"] for o in outcomes] == [base_files, base_files + 1, base_files + 1]
    assert calls == [work.resolve("base")]  # the parent, once; a and b read as their recipes wrote them
    folders = executor.folders()
    assert folders is not None
    for vid in (first.version, second.version):  # what the tests read is what a checkout gives
        out = work.root.parent / f"check-{vid[:8]}"
        work.checkout(vid, out)
        assert sha256_tree(folders.folder(vid)) == sha256_tree(out)
    root = folders.root
    executor.close()
    assert not root.exists()

    monkeypatch.undo()
    calls = _counting(work, monkeypatch)
    cold = LocalExecutor(work, shared=False)
    run = cold.run_recipe(_job(work, "c", "a"))
    cold.run_tests([CheckJob(run.version, "where", "jobs.py:where", 60.0)])
    assert calls == [work.resolve("a"), run.version]  # as before: a checkout per job


def test_a_shared_folder_is_read_only_and_a_job_that_changes_it_fails(work: Repo) -> None:
    executor = LocalExecutor(work)
    base = work.resolve("base")
    folders = executor.folders()
    assert folders is not None
    original = folders.folder(base)
    assert (original / "config.json").stat().st_mode & 0o777 == 0o444 and original.stat().st_mode & 0o777 == 0o555
    refused = executor.run_recipe(_job(work, "a", "base", "scribble"))
    # Its permissions stop a user's recipe; root passes them, and the check after the job stops it.
    why = "changed the folder of its parent" if os.geteuid() == 0 else "raised PermissionError"
    assert not refused.ok and why in (refused.error or "")
    if os.geteuid() == 0:
        assert folders.folder(base) != original  # dropped
        original = folders.folder(base)
    job = _job(work, "b", "base", "chmod_scribble")
    forced = executor.run_recipe(job)
    assert not forced.ok and "changed the folder of its parent" in (forced.error or "")
    assert work.refs.get("b") == job.head  # nothing committed
    again = folders.folder(base)  # dropped, then checked out anew
    assert again != original and (again / "config.json").read_text() != "{}"
    (stamped,) = executor.run_tests([CheckJob(base, "stamp", "jobs.py:stamp", 60.0)])
    assert not stamped.ok and "changed the model folder it was given" in (stamped.error or "")
    assert not (folders.folder(base) / "stamp").exists()
    executor.close()


def test_an_output_is_adopted_only_when_it_holds_exactly_what_was_stored(work: Repo, tmp_path: Path) -> None:
    base = tmp_path / "base"
    folders = JobFolders(work)
    for change in ("extra", "byte", "missing", "link", "lossy", None):
        out = tmp_path / f"out-{change}"
        shutil.copytree(base, out)
        read = signature(out)  # what the add reads
        added = work.add(out, name="copy")
        if change == "extra":
            (out / "more.txt").write_text("x")
        elif change == "byte":  # rewritten after the add read it: the same size, other bytes
            data = bytearray((out / "config.json").read_bytes())
            data[0] ^= 1
            (out / "config.json").write_bytes(bytes(data))
        elif change == "missing":
            (out / "config.json").unlink()
        elif change == "link":  # the same bytes, but not a file a checkout writes
            (out / "config.json").unlink()
            (out / "config.json").symlink_to(tmp_path / "out-extra" / "config.json")
        elif change == "lossy":  # stored otherwise than the folder holds it
            added = replace(added, lossy={"max_abs_error": 0.1})
        assert holds_exactly(work, added.version, out, read) is (change in (None, "lossy"))
        assert folders.adopt(added, out, read) is (change is None)
        assert out.exists() is (change is not None)  # adopted: moved in
    work.checkout(added.version, tmp_path / "fresh")
    assert sha256_tree(folders.folder(added.version)) == sha256_tree(tmp_path / "fresh")
    folders.close()
