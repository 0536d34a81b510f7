"""A remote's history of a model holds versions of that model only. A forged record of model
"evil" that the remote's ref of "base" reaches, or a version of base whose predecessor is a
version of another model, would show under another model's history (`mgit log evil`
listing it as base@3): a fetch refuses it in one line naming the remote and the version,
and keeps nothing. Lineage parents may be of any model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hostile_remote import cli, forge_version, head_of, holdings, pushed_remote, set_ref

from mgit import Repo

UNCHANGED = "nothing was kept, the local repository is unchanged"


def refused(result: tuple[int, str, str], *fragments: str) -> None:
    code, out, err = result
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for f in (*fragments, UNCHANGED):
        assert f in err, (f, err)


def _forged_head(remote: Path, alice: Path, how: str) -> str:
    """The remote's ref of base moved to a forged version: of model evil after base's head,
    or of model base after ft's head."""
    repo = Repo(alice)
    base = repo.store.get_version(head_of(remote, "base"))
    if how == "other model":
        forged = replace(base, model="evil", predecessor=head_of(remote, "base"), message="forged")
    else:
        forged = replace(base, predecessor=head_of(remote, "ft"), message="forged")
    vid = forge_version(remote, forged)
    set_ref(remote, "base", vid)
    return vid


@pytest.mark.parametrize("how", ["other model", "predecessor of another model"])
def test_a_clone_refuses_a_history_that_leaves_its_model(tmp_path: Path, how: str) -> None:
    remote, alice = pushed_remote(tmp_path)
    vid = _forged_head(remote, alice, how)
    refused(cli("clone", str(remote), str(tmp_path / "bob")), str(remote), vid[:12])
    assert not (tmp_path / "bob").exists()


@pytest.mark.parametrize("how", ["other model", "predecessor of another model"])
def test_fetch_and_pull_refuse_a_history_that_leaves_its_model(tmp_path: Path, how: str) -> None:
    remote, alice = pushed_remote(tmp_path)
    assert cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    before = holdings(tmp_path / "bob")
    vid = _forged_head(remote, alice, how)
    for verb in ("fetch", "pull"):
        refused(cli("-C", str(tmp_path / "bob"), verb), str(remote), vid[:12])
        assert holdings(tmp_path / "bob") == before
    assert cli("-C", str(tmp_path / "bob"), "log", "evil")[0] == 1


def test_a_ref_naming_a_version_of_another_model_is_refused(tmp_path: Path) -> None:
    """Even when that version is here already: origin/ft would name base's head."""
    remote, _ = pushed_remote(tmp_path)
    assert cli("clone", str(remote), str(tmp_path / "bob"))[0] == 0
    before = holdings(tmp_path / "bob")
    set_ref(remote, "ft", head_of(remote, "base"))
    refused(cli("-C", str(tmp_path / "bob"), "fetch"), str(remote), head_of(remote, "base")[:12], "'ft'")
    assert holdings(tmp_path / "bob") == before
