"""A model name removed and used again: `NAME@N` never names two versions.

`mgit rm ft` then `mgit add ... --name ft` goes on at the number after ft's last (its record
says so, so a clone numbers alike), and what still shows the removed versions (a child's
parents, the lineage, `NAME@N`) says they were removed instead of naming the new ones.
"""

from __future__ import annotations

from pathlib import Path

from conftest import make_model, mgit_json, one_line_error, run_cli, tensors

from mgit import Repo


def family(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A work folder with ft@1, ft@2, ft-copy built on ft@1 and ft-fp16 on ft@2; three model folders."""
    work = tmp_path / "work"
    work.mkdir()
    folders = [make_model(tmp_path / f"m{i}", state=tensors(i)) for i in range(3)]
    assert run_cli("init", cwd=work)[0] == 0
    for args in (
        [str(folders[0]), "--name", "ft"],
        [str(folders[1]), "--name", "ft"],
        [str(folders[2]), "--name", "ft-copy", "--parent", "ft@1"],
        [str(folders[2]), "--name", "ft-fp16", "--parent", "ft", "--relation", "quantize"],
    ):
        assert run_cli("add", *args, cwd=work)[0] == 0
    return work, folders


def test_a_name_used_again_goes_on_from_its_removed_numbers(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    old = {v["seq"]: v["id"] for v in mgit_json(work, "log", "ft")}
    assert mgit_json(work, "rm", "ft", "--force")["versions"] == 2
    added = mgit_json(work, "add", str(folders[1]), "--name", "ft", "-m", "again")
    assert added["seq"] == 3 and added["version"] not in old.values()
    assert [v["seq"] for v in mgit_json(work, "log", "ft")] == [3]
    assert mgit_json(work, "show", "ft@3")["version"]["id"] == added["version"]
    for n in (1, 2):  # the old numbers name the removed versions, never the new one
        err = one_line_error(run_cli("show", f"ft@{n}", cwd=work), f"ft@{n} was removed", old[n][:12])
        assert added["version"][:12] not in err
    # A child of a removed version says so, in show's text and JSON, and in the lineage.
    parents = mgit_json(work, "show", "ft-fp16")["version"]["parents"]
    assert [(p["model"], p["seq"], p["version"], p["removed"]) for p in parents] == [("ft", 2, old[2], True)]
    code, out, _ = run_cli("show", "ft-fp16", cwd=work)
    assert code == 0 and "parents: ft@2 [removed] (quantize)" in out
    code, out, _ = run_cli("lineage", cwd=work)
    assert code == 0
    assert "(stale: ft-copy built on ft@1 [removed], latest @3)" in out
    assert "(stale: ft-fp16 built on ft@2 [removed], latest @3)" in out
    # A second removal goes on from the highest number the name ever had.
    run_cli("rm", "ft", "--force", cwd=work)
    assert mgit_json(work, "add", str(folders[0]), "--name", "ft")["seq"] == 4
    one_line_error(run_cli("show", "ft@3", cwd=work), "ft@3 was removed")


def test_a_removed_model_is_named_as_removed(tmp_path: Path) -> None:
    work, _ = family(tmp_path)
    run_cli("rm", "ft", "--force", cwd=work)
    one_line_error(run_cli("log", "ft", cwd=work), "no model named 'ft'", "ft was removed", "goes on at @3")


def test_removing_the_latest_version_never_gives_its_number_again(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    repo = Repo(work)
    repo.retired.retire_locked("ft", 5)  # as `rm ft@3`..`ft@5` leave it
    added = mgit_json(work, "add", str(folders[2]), "--name", "ft")
    assert added["seq"] == 6 and [v["seq"] for v in mgit_json(work, "log", "ft")] == [6, 2, 1]
    assert mgit_json(work, "show", "ft@6")["version"]["id"] == added["version"]
    one_line_error(run_cli("show", "ft@4", cwd=work), "ft@4 was removed")


def test_the_numbers_are_the_same_on_a_clone_and_after_a_rebuilt_catalog(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    run_cli("rm", "ft", "--force", cwd=work)
    added = mgit_json(work, "add", str(folders[1]), "--name", "ft")
    remote = tmp_path / "remote.mgit"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("remote", "add", "origin", str(remote), cwd=work)[0] == 0
    assert run_cli("push", cwd=work)[0] == 0
    assert run_cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    bob = tmp_path / "bob"
    for where in (work, bob):
        assert mgit_json(where, "show", "ft@3")["version"]["id"] == added["version"]
        assert [v["seq"] for v in mgit_json(where, "log", "ft")] == [3]
        parents = mgit_json(where, "show", "ft-copy")["version"]["parents"]
        assert [(p["seq"], p["removed"]) for p in parents] == [(1, True)]
    Repo(bob).rebuild_catalog()
    assert [v["seq"] for v in mgit_json(bob, "log", "ft")] == [3]
    assert mgit_json(bob, "show", "ft-copy")["version"]["parents"][0]["removed"] is True


def test_a_version_records_its_number_only_when_it_is_not_the_next() -> None:
    import pytest

    from mgit.store.objects import RecordError, Version

    plain = Version("m", "0" * 64, time="2026-01-01T00:00:00Z").to_json()
    assert "number" not in plain  # records before numbers were recorded keep their ids
    numbered = {**plain, "number": 8}
    assert Version.from_json(numbered).number == 8 and Version.from_json(numbered).to_json() == numbered
    for bad in (0, -1, "8", None, True, 2**63):
        with pytest.raises(RecordError, match="number"):
            Version.from_json({**plain, "number": bad})
