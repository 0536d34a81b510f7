"""Tags set on a version after it was added (`mgit tag`): kept beside the refs by
compare-and-swap, indexed by the catalog (log --tag, ls --tag), rebuilt from refs, never
carried to the model's next version, and moved by push, pull and clone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_model, mgit_json, one_line_error, run_cli, tensors

from mgit import Repo, TagConflictError


def work_folder(tmp_path: Path) -> tuple[Path, list[Path]]:
    """bert@1 (added with --tag task=sst2), bert@2, and three model folders."""
    work = tmp_path / "work"
    work.mkdir()
    folders = [make_model(tmp_path / f"m{i}", state=tensors(i)) for i in range(3)]
    assert run_cli("init", cwd=work)[0] == 0
    assert run_cli("add", str(folders[0]), "--name", "bert", "--tag", "task=sst2", cwd=work)[0] == 0
    assert run_cli("add", str(folders[1]), "--name", "bert", cwd=work)[0] == 0
    return work, folders


def test_tags_are_set_listed_and_removed_on_one_version(tmp_path: Path) -> None:
    work, _ = work_folder(tmp_path)
    result = mgit_json(work, "tag", "bert@1", "stage=prod", "reviewed")
    assert result["tags"] == {"reviewed": "", "stage": "prod", "task": "sst2"} and result["changed"] is True
    assert mgit_json(work, "tag", "bert@1")["tags"] == result["tags"]
    assert mgit_json(work, "tag", "bert@2")["tags"] == {"task": "sst2"}  # bert@2's record carried task
    code, out, _ = run_cli("tag", "bert@1", cwd=work)
    assert code == 0 and out == "bert@1: reviewed stage=prod task=sst2\n"
    # A tag of the record itself can be removed too, and setting it again brings it back.
    removed = mgit_json(work, "tag", "-d", "bert@1", "task", "reviewed")
    assert removed["tags"] == {"stage": "prod"} and removed["set_later"] == {"stage": "prod", "task": None}
    assert mgit_json(work, "tag", "bert@1", "task=sst2")["set_later"] == {"stage": "prod"}
    # The same change again changes nothing.
    assert mgit_json(work, "tag", "bert@1", "stage=prod")["changed"] is False


def test_log_and_ls_select_by_tags_set_later_and_a_new_version_does_not_inherit_them(tmp_path: Path) -> None:
    work, folders = work_folder(tmp_path)
    mgit_json(work, "tag", "bert@2", "stage=prod")
    assert [v["seq"] for v in mgit_json(work, "log", "--tag", "stage=prod")] == [2]
    assert [v["seq"] for v in mgit_json(work, "log", "bert", "--tag", "task")] == [2, 1]
    repo = Repo(work)
    assert [m.name for m in repo.ls(tag="stage=prod")] == ["bert"]
    assert repo.ls(tag="stage=dev") == []
    assert mgit_json(work, "add", str(folders[2]), "--name", "bert")["seq"] == 3
    assert mgit_json(work, "tag", "bert@3")["tags"] == {"task": "sst2"}  # the record's tags go on, not stage
    assert Repo(work).ls(tag="stage=prod") == []  # its latest version no longer has it
    assert [v["seq"] for v in mgit_json(work, "log", "--tag", "stage")] == [2]


def test_a_rebuilt_catalog_has_the_tags_set_later(tmp_path: Path) -> None:
    work, _ = work_folder(tmp_path)
    mgit_json(work, "tag", "bert@1", "stage=old")
    mgit_json(work, "tag", "-d", "bert@2", "task")
    before = mgit_json(work, "log", "bert")
    Repo(work).rebuild_catalog()
    assert mgit_json(work, "log", "bert") == before
    assert [v["tags"] for v in before] == [{}, {"stage": "old", "task": "sst2"}]


def test_gc_takes_the_tags_of_the_versions_it_deletes_and_a_killed_write_s_leftover(tmp_path: Path) -> None:
    work, folders = work_folder(tmp_path)
    assert run_cli("add", str(folders[2]), "--name", "other", cwd=work)[0] == 0
    removed, kept = mgit_json(work, "tag", "bert@2", "stage=dev"), mgit_json(work, "tag", "other", "stage=prod")
    tag_dir = work / ".mgit" / "refs" / "tags"
    (tag_dir / ".tmp-killed-write").write_bytes(b"{")  # what a tag write killed before its rename leaves
    assert run_cli("rm", "bert@2", cwd=work)[0] == 0
    assert (tag_dir / removed["version"]).exists()  # the version's objects, and its tags, wait for gc
    assert run_cli("gc", cwd=work)[0] == 0
    assert sorted(p.name for p in tag_dir.iterdir()) == [kept["version"]]
    assert mgit_json(work, "tag", "other")["tags"] == {"stage": "prod"}
    assert [m["name"] for m in mgit_json(work, "ls", "--tag", "stage")] == ["other"]


def test_a_tag_change_is_a_compare_and_swap(tmp_path: Path) -> None:
    work, _ = work_folder(tmp_path)
    repo = Repo(work)
    vid = repo.resolve("bert@1")
    repo.tags.update(vid, {"stage": "dev"}, expected={})
    with pytest.raises(TagConflictError):
        repo.tags.update(vid, {"stage": "prod"}, expected={})  # a writer that read before the change
    assert repo.tags.get(vid) == {"stage": "dev"}
    assert json.loads((repo.dir / "refs" / "tags" / vid).read_text()) == {"stage": "dev"}


def test_bad_tags_are_refused_and_change_nothing(tmp_path: Path) -> None:
    work, _ = work_folder(tmp_path)
    one_line_error(run_cli("tag", "-d", "bert@1", "nope", cwd=work), "bert@1 has no tag 'nope'")
    one_line_error(run_cli("tag", "bert@1", "k\x1b[31m=v", cwd=work), "control character")
    one_line_error(run_cli("tag", "bert@1", "k=" + "v" * 2000, cwd=work), "1024")
    one_line_error(run_cli("tag", "bert@9", "k=v", cwd=work), "bert@9")
    code, _, err = run_cli("tag", "-d", "bert@1", cwd=work)
    assert code == 2 and "-d needs the NAMEs" in err
    assert mgit_json(work, "tag", "bert@1")["set_later"] == {}
    assert not (work / ".mgit" / "refs" / "tags").exists() or not any((work / ".mgit" / "refs" / "tags").iterdir())


def test_ls_tag_lists_models_whose_latest_version_has_the_tag(tmp_path: Path) -> None:
    work, folders = work_folder(tmp_path)
    assert run_cli("add", str(folders[2]), "--name", "gpt", cwd=work)[0] == 0
    mgit_json(work, "tag", "gpt", "stage=prod")
    mgit_json(work, "tag", "bert@1", "stage=prod")  # not bert's latest
    assert [m["name"] for m in mgit_json(work, "ls", "--tag", "stage=prod")] == ["gpt"]
    assert [m["name"] for m in mgit_json(work, "ls", "--tag", "task")] == ["bert"]
    assert [m["name"] for m in mgit_json(work, "ls")] == ["bert", "gpt"]
    code, out, _ = run_cli("ls", "--tag", "stage=dev", cwd=work)
    assert code == 0 and "No model's latest version has the tag stage=dev" in out


def shared(tmp_path: Path) -> tuple[Path, Path, Path]:
    """alice's work folder (bert@1, bert@2) pushed to a folder remote, and bob's clone of it."""
    alice, _ = work_folder(tmp_path)
    remote = tmp_path / "remote.mgit"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("remote", "add", "origin", str(remote), cwd=alice)[0] == 0
    assert run_cli("push", cwd=alice)[0] == 0
    assert run_cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    return alice, tmp_path / "bob", remote


def test_tags_travel_with_push_pull_and_clone(tmp_path: Path) -> None:
    alice, bob, remote = shared(tmp_path)
    mgit_json(alice, "tag", "bert@1", "stage=prod")
    mgit_json(alice, "tag", "-d", "bert@2", "task")
    assert mgit_json(alice, "push")["tags"] == {"sent": 2, "received": 0, "conflicts": []}
    assert mgit_json(bob, "pull")["tags"] == {"sent": 0, "received": 2, "conflicts": []}
    assert mgit_json(bob, "tag", "bert@1")["tags"] == {"stage": "prod", "task": "sst2"}
    assert mgit_json(bob, "tag", "bert@2")["tags"] == {}
    assert [v["seq"] for v in mgit_json(bob, "log", "--tag", "stage=prod")] == [1]
    # bob changes one back; alice pulls it; a clone made now has every tag.
    mgit_json(bob, "tag", "bert@2", "task=sst2")
    assert mgit_json(bob, "push")["tags"]["sent"] == 1
    assert mgit_json(alice, "pull")["tags"]["received"] == 1
    assert mgit_json(alice, "tag", "bert@2")["tags"] == {"task": "sst2"}
    assert run_cli("clone", str(remote), str(tmp_path / "carol"))[0] == 0
    carol = tmp_path / "carol"
    for ref in ("bert@1", "bert@2"):
        assert mgit_json(carol, "tag", ref)["tags"] == mgit_json(alice, "tag", ref)["tags"]
    # Nothing changed: nothing travels.
    assert mgit_json(alice, "push")["tags"] == {"sent": 0, "received": 0, "conflicts": []}


def test_a_tag_changed_on_both_sides_is_never_overwritten_silently(tmp_path: Path) -> None:
    alice, bob, remote = shared(tmp_path)
    mgit_json(alice, "tag", "bert@1", "stage=prod")
    mgit_json(alice, "push")
    mgit_json(bob, "tag", "bert@1", "stage=dev")  # bob has not pulled alice's change
    code, out, err = run_cli("push", cwd=bob)
    assert code == 0 and "the tags of bert@1 changed on origin since last seen" in err
    assert json.loads((remote / "refs" / "tags" / Repo(alice).resolve("bert@1")).read_text()) == {"stage": "prod"}
    pulled = mgit_json(bob, "pull")["tags"]
    assert pulled["conflicts"] == ["bert@1"] and pulled["received"] == 0
    assert mgit_json(bob, "tag", "bert@1")["tags"]["stage"] == "dev"  # bob's kept, and he was told
    # Having seen alice's, bob's next push sends his: the remote moves only from what he saw.
    assert mgit_json(bob, "push")["tags"]["sent"] == 1
    assert mgit_json(alice, "pull")["tags"]["received"] == 1
    assert mgit_json(alice, "tag", "bert@1")["tags"]["stage"] == "dev"
