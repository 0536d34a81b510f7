"""`mgit rm NAME@N`: one version out of a model. Refused while another version derives from
it (the next in its history, a lineage child) unless --force, which lists them; the latest
moves the model back; a removed number is never given again; nothing else is ever lost."""

from __future__ import annotations

from pathlib import Path

from conftest import fsck_ok, make_model, mgit_json, one_line_error, run_cli, sha256_tree, tensors

from mgit import Repo


def family(tmp_path: Path) -> tuple[Path, list[Path]]:
    """ft@1..3 and kid built on ft@2."""
    work = tmp_path / "work"
    work.mkdir()
    folders = [make_model(tmp_path / f"m{i}", state=tensors(i)) for i in range(5)]
    assert run_cli("init", cwd=work)[0] == 0
    for i in range(3):
        assert run_cli("add", str(folders[i]), "--name", "ft", cwd=work)[0] == 0
    assert run_cli("add", str(folders[3]), "--name", "kid", "--parent", "ft@2", cwd=work)[0] == 0
    return work, folders


def test_removing_the_latest_version_moves_the_model_back_and_gc_frees_it(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    ids = {v["seq"]: v["id"] for v in mgit_json(work, "log", "ft")}
    result = mgit_json(work, "rm", "ft@3")
    assert (result["model"], result["version"], result["seq"], result["head"]) == ("ft", ids[3], 3, ids[2])
    assert [v["seq"] for v in mgit_json(work, "log", "ft")] == [2, 1]
    one_line_error(run_cli("show", "ft@3", cwd=work), "ft@3 was removed")
    assert ids[3] in {o for o in mgit_json(work, "gc")["removed"]}  # its record (and what only it used) went
    fsck_ok(work)
    for n in (1, 2):  # every other version is still whole
        out = tmp_path / f"out{n}"
        assert run_cli("checkout", f"ft@{n}", "-o", str(out), cwd=work)[0] == 0
        assert sha256_tree(out) == sha256_tree(folders[n - 1])
    # The next version under the name does not take the removed number.
    assert mgit_json(work, "add", str(folders[4]), "--name", "ft")["seq"] == 4
    assert [v["seq"] for v in mgit_json(work, "log", "ft")] == [4, 2, 1]


def test_a_version_others_build_on_is_removed_only_with_force_which_lists_them(tmp_path: Path) -> None:
    work, _ = family(tmp_path)
    before = mgit_json(work, "log", "ft")
    one_line_error(
        run_cli("rm", "ft@2", cwd=work),
        "ft@2 has 2 versions built on it",
        "ft@3 (next in its history)",
        "kid@1",
        "--force",
    )
    one_line_error(run_cli("rm", "ft@1", cwd=work), "ft@1 has 1 version built on it: ft@2 (next in its history)")
    assert mgit_json(work, "log", "ft") == before  # refused: nothing changed
    result = mgit_json(work, "rm", "ft@2", "--force")
    assert result["kept_by"] == ["ft@3 (next in its history)", "kid@1"] and result["head"] == before[0]["id"]
    log = mgit_json(work, "log", "ft")
    assert [(v["seq"], v["removed"]) for v in log] == [(3, False), (2, True), (1, False)]
    code, out, _ = run_cli("log", "ft", "--oneline", cwd=work)
    assert code == 0 and "ft@2 [removed]" in out
    one_line_error(run_cli("show", "ft@2", cwd=work), "ft@2 was removed", before[1]["id"][:12])
    assert mgit_json(work, "show", "kid")["version"]["parents"][0]["removed"] is True
    # Later versions still stand on it: gc keeps it, and every version checks out.
    mgit_json(work, "gc")
    fsck_ok(work)
    assert run_cli("checkout", "ft@3", "-o", str(tmp_path / "o3"), cwd=work)[0] == 0
    assert run_cli("checkout", before[1]["id"][:12], "-o", str(tmp_path / "o2"), cwd=work)[0] == 0
    Repo(work).rebuild_catalog()  # the mark is in the refs: a rebuilt catalog has it
    assert [v["removed"] for v in mgit_json(work, "log", "ft")] == [False, True, False]


def test_removing_the_only_version_removes_the_model(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    assert run_cli("add", str(folders[4]), "--name", "solo", cwd=work)[0] == 0
    result = mgit_json(work, "rm", "solo@1")
    assert result["head"] is None and "solo" not in {m["name"] for m in mgit_json(work, "ls")}
    assert mgit_json(work, "add", str(folders[4]), "--name", "solo")["seq"] == 2
    one_line_error(run_cli("rm", "nope@1", cwd=work), "no model named 'nope@1'")
    one_line_error(run_cli("rm", "ft@9", cwd=work), "ft@9")


def test_a_removed_number_is_never_given_again_on_another_copy(tmp_path: Path) -> None:
    work, folders = family(tmp_path)
    remote = tmp_path / "remote.mgit"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("remote", "add", "origin", str(remote), cwd=work)[0] == 0
    assert run_cli("push", cwd=work)[0] == 0
    mgit_json(work, "rm", "ft@3")
    assert run_cli("push", "origin", "ft", "--force", cwd=work)[0] == 0  # the remote's ft goes back to @2
    assert run_cli("clone", str(remote), str(tmp_path / "carol"))[0] == 0
    carol = tmp_path / "carol"
    assert [v["seq"] for v in mgit_json(carol, "log", "ft")] == [2, 1]
    assert mgit_json(carol, "add", str(folders[4]), "--name", "ft")["seq"] == 4  # the remote said @3 was used
