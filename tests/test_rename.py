"""`mgit rename OLD NEW`: the model's versions keep their ids and numbers under NEW; OLD is
refused ("it was renamed to NEW") until a model is added under it, which goes on from OLD's
numbers; tests attached to exactly OLD follow; a push sends NEW and marks OLD renamed on the
remote, so that other copies no longer see OLD as a current model."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fsck_ok, make_model, mgit_json, one_line_error, run_cli, run_mgit, tensors

from mgit import Repo


def family(tmp_path: Path) -> tuple[Path, list[Path]]:
    """ft@1, ft@2 and kid built on ft@2, in a work folder with a folder remote `origin`."""
    work = tmp_path / "work"
    work.mkdir()
    folders = [make_model(tmp_path / f"m{i}", state=tensors(i)) for i in range(4)]
    assert run_cli("init", cwd=work)[0] == 0
    for folder, args in zip(folders, (["ft"], ["ft"], ["kid", "--parent", "ft"]), strict=False):
        assert run_cli("add", str(folder), "--name", *args, cwd=work)[0] == 0
    return work, folders


def test_a_renamed_model_keeps_its_versions_and_the_old_name_says_where_it_went(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    before = mgit_json(work, "log", "ft")
    result = mgit_json(work, "rename", "ft", "ft-v1")
    assert (result["old"], result["new"], result["head"], result["seq"]) == ("ft", "ft-v1", before[0]["id"], 2)
    after = mgit_json(work, "log", "ft-v1")
    assert [(v["id"], v["seq"], v["model"]) for v in after] == [(v["id"], v["seq"], "ft-v1") for v in before]
    assert mgit_json(work, "show", "ft-v1@1")["version"]["id"] == before[1]["id"]
    assert [m["name"] for m in mgit_json(work, "ls")] == ["ft-v1", "kid"]
    assert mgit_json(work, "show", "kid")["version"]["parents"][0]["model"] == "ft-v1"
    code, out, _ = run_cli("lineage", cwd=work)
    assert code == 0 and "ft-v1@2" in out and "ft@" not in out
    for ref in ("ft", "ft@1"):
        one_line_error(run_cli("show", ref, cwd=work), "no model named 'ft'; it was renamed to 'ft-v1'")
    checked = mgit_json(work, "checkout", "ft-v1", "-o", str(tmp_path / "out"))
    assert checked["model"] == "ft-v1"
    # A new version of the renamed model follows on; a new model under the old name goes on
    # from the old name's numbers, so ft@1 and ft@2 never name anything else.
    assert mgit_json(work, "add", str(folders[3]), "--name", "ft-v1")["seq"] == 3
    assert mgit_json(work, "add", str(folders[3]), "--name", "ft")["seq"] == 3
    one_line_error(run_cli("show", "ft@1", cwd=work), "ft@1 was removed")
    Repo(work).rebuild_catalog()
    assert [v["model"] for v in mgit_json(work, "log", "ft-v1")] == ["ft-v1"] * 3
    fsck_ok(work)


def test_a_rename_refuses_a_name_in_use_or_used_before(tmp_path: Path) -> None:
    work, _ = family(tmp_path)
    one_line_error(run_cli("rename", "ft", "kid", cwd=work), "a model named 'kid' exists")
    one_line_error(run_cli("rename", "nope", "x", cwd=work), "no model named 'nope'")
    one_line_error(run_cli("rename", "ft", "bad..name", cwd=work), "bad..name")
    run_cli("rm", "kid", cwd=work)
    one_line_error(run_cli("rename", "ft", "kid", cwd=work), "'kid' had versions up to kid@1")
    assert [m["name"] for m in mgit_json(work, "ls")] == ["ft"]


def test_tests_attached_to_the_old_name_follow_it(tmp_path: Path) -> None:
    from mgit.checks import Checks

    work, _ = family(tmp_path)
    (work / "evals.py").write_text("def ok(model_dir):\n    return {'x': 1.0}\n")
    checks = Checks(Repo(work))
    checks.attach("ft", "evals.py:ok", name="exact")
    checks.attach("f*", "evals.py:ok", name="glob")
    assert mgit_json(work, "rename", "ft", "ft-v1")["retargeted_tests"] == ["exact"]
    assert {t["name"]: t["target"] for t in mgit_json(work, "test", "ls")} == {"exact": "ft-v1", "glob": "f*"}


def test_a_push_sends_the_new_name_and_other_copies_stop_seeing_the_old_one(tmp_path: Path) -> None:
    work, _ = family(tmp_path)
    remote = tmp_path / "remote.mgit"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("remote", "add", "origin", str(remote), cwd=work)[0] == 0
    assert run_cli("push", cwd=work)[0] == 0
    assert run_cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    bob = tmp_path / "bob"
    mgit_json(work, "rename", "ft", "ft-v1")
    pushed = mgit_json(work, "push")
    assert {m["model"]: m["status"] for m in pushed["models"]}["ft-v1"] == "new"
    assert pushed["notes"] == ["ft on origin is marked renamed to ft-v1 (a fetch there no longer lists it)"]
    pulled = mgit_json(bob, "pull")
    assert [(m["model"], m["status"], m["note"]) for m in pulled["fetch"]["models"] if m["model"] == "ft"] == [
        ("ft", "renamed", "renamed to ft-v1")
    ]
    assert {m["name"] for m in mgit_json(bob, "ls")} == {"ft", "ft-v1", "kid"}  # bob's own ft is his to rename
    assert mgit_json(bob, "show", "ft-v1")["version"]["id"] == mgit_json(work, "show", "ft-v1")["version"]["id"]
    assert run_cli("clone", str(remote), str(tmp_path / "carol"))[0] == 0
    assert [m["name"] for m in mgit_json(tmp_path / "carol", "ls")] == ["ft-v1", "kid"]
    assert "ft" not in {m["model"] for m in mgit_json(work, "pull")["models"]}  # not brought back here
    assert [m["name"] for m in mgit_json(work, "ls")] == ["ft-v1", "kid"]


def test_adding_the_same_content_to_a_renamed_model_names_it_by_its_new_name(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    mgit_json(work, "rename", "ft", "ft-v1")
    again = mgit_json(work, "add", str(folders[1]), "--name", "ft-v1")
    assert (again["created"], again["model"], again["seq"]) == (False, "ft-v1", 2)


@pytest.mark.parametrize("point", ["rename-after-retired", "rename-after-new-ref"])
def test_a_rename_killed_midway_loses_nothing_and_running_it_again_finishes_it(tmp_path: Path, point: str) -> None:
    work, _ = family(tmp_path)
    head = mgit_json(work, "show", "ft")["version"]["id"]
    r = run_mgit("rename", "ft", "ft-v1", cwd=work, env={"MGIT_CRASH_AT": point})
    assert r.returncode == -9, r.stderr
    assert mgit_json(work, "show", "ft")["version"]["id"] == head  # the old name still works
    fsck_ok(work)
    assert mgit_json(work, "rename", "ft", "ft-v1")["head"] == head
    assert [m["name"] for m in mgit_json(work, "ls")] == ["ft-v1", "kid"]
    one_line_error(run_cli("show", "ft", cwd=work), "renamed to 'ft-v1'")
