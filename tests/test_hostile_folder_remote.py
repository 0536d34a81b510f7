"""A folder remote laid out to attack whoever reaches it: links that lead a push's writes or a
clone's reads out of the remote, and FIFOs that would block a reader forever. Each is refused
in one line naming what is wrong, before anything is written outside or kept inside."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from conftest import make_model, one_line_error, run_mgit, sha256_tree

from mgit import Repo, sync

WAIT = 30  # seconds a CLI run may take here before it counts as hung (it takes about one)


def files_under(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.fixture
def alice(tmp_path: Path) -> Repo:
    repo = Repo.init(tmp_path / "alice")
    repo.add(make_model(tmp_path / "src", seed=3), name="m")
    return repo


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    sync.init_bare(str(tmp_path / "remote"))
    return tmp_path / "remote"


def link_away(remote: Path, rel: str, outside: Path) -> None:
    """Replace the folder `rel` of the remote (created if absent) with a link to `outside`."""
    path = remote / rel
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    outside.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside, target_is_directory=True)


@pytest.mark.parametrize("rel", ["packs", "objects/XX", "refs/models", "refs", "objects", "locks"])
def test_a_push_never_writes_through_a_linked_folder(alice: Repo, remote: Path, tmp_path: Path, rel: str) -> None:
    rel = rel.replace("XX", alice.resolve("m")[:2])  # a fan-out folder the push writes into
    outside = tmp_path / "outside"
    link_away(remote, rel, outside)

    one_line_error(run_mgit("push", str(remote), cwd=alice.root, timeout=WAIT), "is a link")

    assert files_under(outside) == []
    assert not (remote / "refs" / "models" / "m").exists()


def test_a_push_into_a_planted_lock_link_writes_nothing_outside(alice: Repo, remote: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (remote / "locks" / "refs").mkdir(parents=True, exist_ok=True)
    (remote / "locks" / "refs" / "m.lock").symlink_to(outside / "planted")

    one_line_error(run_mgit("push", str(remote), cwd=alice.root, timeout=WAIT), "locks/refs/m.lock", "is a link")

    assert files_under(outside) == []


def pushed(alice: Repo, remote: Path) -> None:
    sync.push(alice, str(remote))


def test_a_clone_refuses_a_linked_object_file(alice: Repo, remote: Path, tmp_path: Path) -> None:
    pushed(alice, remote)
    vid = alice.resolve("m")
    manifest = alice.store.get_version(vid).manifest
    key = f"objects/{manifest[:2]}/{manifest[2:]}"
    kept = tmp_path / "kept"
    shutil.move(remote / key, kept)  # the right bytes, but outside the remote
    (remote / key).symlink_to(kept)
    shutil.rmtree(remote / "packs")  # records then come from objects/ one by one

    one_line_error(run_mgit("clone", str(remote), str(tmp_path / "bob"), cwd=tmp_path, timeout=WAIT), key, "is a link")

    assert not (tmp_path / "bob").exists() or Repo(tmp_path / "bob").refs.all() == {}


def test_a_clone_refuses_a_linked_object_folder(alice: Repo, remote: Path, tmp_path: Path) -> None:
    pushed(alice, remote)
    oid = max(alice.store.ids(), key=alice.store.stored_size)  # a tensor: never in a pack
    folder = remote / "objects" / oid[:2]
    shutil.move(folder, tmp_path / "kept")
    folder.symlink_to(tmp_path / "kept", target_is_directory=True)

    one_line_error(
        run_mgit("clone", str(remote), str(tmp_path / "bob"), cwd=tmp_path, timeout=WAIT),
        f"objects/{oid[:2]}",
        "is a link",
    )


def test_a_clone_refuses_linked_refs(alice: Repo, remote: Path, tmp_path: Path) -> None:
    pushed(alice, remote)
    shutil.move(remote / "refs" / "models", tmp_path / "kept")
    (remote / "refs" / "models").symlink_to(tmp_path / "kept", target_is_directory=True)

    one_line_error(
        run_mgit("clone", str(remote), str(tmp_path / "bob"), cwd=tmp_path, timeout=WAIT), "refs/models", "is a link"
    )


@pytest.mark.parametrize("key", ["refs/models/m", "config.json", "refs/models/other", "packs/PACK"])
def test_a_fifo_in_the_remote_is_refused_not_waited_on(alice: Repo, remote: Path, tmp_path: Path, key: str) -> None:
    pushed(alice, remote)
    if key == "packs/PACK":
        [pack] = (remote / "packs").iterdir()
        key = f"packs/{pack.name}"
    path = remote / key
    path.unlink(missing_ok=True)
    os.mkfifo(path)  # nobody ever writes to it: a reader that opens it waits forever

    one_line_error(run_mgit("clone", str(remote), str(tmp_path / "bob"), cwd=tmp_path, timeout=WAIT), key, "FIFO")


def test_a_fifo_ref_is_refused_by_a_push_too(alice: Repo, remote: Path, tmp_path: Path) -> None:
    (remote / "refs" / "models").mkdir(parents=True, exist_ok=True)
    os.mkfifo(remote / "refs" / "models" / "m")

    one_line_error(run_mgit("push", str(remote), cwd=alice.root, timeout=WAIT), "refs/models/m", "FIFO")


def test_a_clean_remote_still_round_trips(alice: Repo, remote: Path, tmp_path: Path) -> None:
    pushed(alice, remote)
    sync.clone(str(remote), tmp_path / "bob")
    Repo(tmp_path / "bob").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "src")
