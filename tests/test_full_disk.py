"""A full disk, for real: a repository on a small tmpfs. The add that runs out of space fails
with one line, commits nothing, and leaves a repository that fsck finds clean and gc tidies;
a checkout that runs out of space leaves no half-written file under its final name."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_cli, sha256_tree

from mgit import Repo, sync


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def big_model(path: Path, megabytes: int, *, one_tensor: bool = False) -> Path:
    """Random float32 weights: incompressible, so they take their full size on disk. In 256 KiB
    tensors, or in one tensor (over a block: coded and written block by block)."""
    rng = np.random.default_rng(megabytes)
    if one_tensor:
        return make_model(path, state={"w": rng.standard_normal(megabytes << 18, dtype=np.float32)})
    quarter = 256 * 1024 // 4  # float32 values in 256 KiB
    state = {f"w{i}": rng.standard_normal(quarter, dtype=np.float32) for i in range(megabytes * 4)}
    return make_model(path, state=state)


@pytest.mark.parametrize("one_tensor", [False, True], ids=["small-tensors", "blocked-tensor"])
def test_add_on_a_full_disk_commits_nothing(tiny_disk: Path, tmp_path: Path, one_tensor: bool) -> None:
    Repo.init(tiny_disk)
    small = make_model(tmp_path / "small", seed=1)
    assert run_cli("add", str(small), "--name", "small", cwd=tiny_disk)[0] == 0
    before = run_cli("ls", "--json", cwd=tiny_disk)[1]

    code, out, err = run_cli(
        "add", str(big_model(tmp_path / "big", 5, one_tensor=one_tensor)), "--name", "big", cwd=tiny_disk
    )

    assert code == 1 and out == ""
    assert err.startswith("Error: no space left on the device") and "nothing was committed" in err
    assert err.count("\n") == 1
    assert run_cli("ls", "--json", cwd=tiny_disk)[1] == before
    repo = Repo(tiny_disk)
    assert repo.fsck().ok
    partial = len(list(repo.store.ids()))
    gc = repo.gc()
    assert len(gc.removed) > 0 and len(list(repo.store.ids())) == partial - len(gc.removed)
    assert not repo.store.temporary_files()
    repo.checkout("small", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(small)
    # With the space back, the same kind of add succeeds.
    repo.rm("small")
    repo.gc()
    assert repo.add(big_model(tmp_path / "fits", 1), name="fits").created


@pytest.mark.parametrize("one_tensor", [False, True], ids=["small-tensors", "blocked-tensor"])
def test_checkout_onto_a_full_disk_leaves_no_half_file(tiny_disk: Path, tmp_path: Path, one_tensor: bool) -> None:
    repo = Repo.init(tmp_path / "repo")
    src = big_model(tmp_path / "big", 5 if one_tensor else 4, one_tensor=one_tensor)
    repo.add(src, name="big")
    out = tiny_disk / "out"

    code, _, err = run_cli("-C", str(tmp_path / "repo"), "checkout", "big", "-o", str(out))

    assert code == 1 and err.startswith("Error: no space left on the device"), err
    for path in out.rglob("*"):
        if path.is_file():
            assert not path.name.startswith(".tmp-"), f"temporary file left: {path}"
            assert (
                sha256_tree(out)[path.relative_to(out).as_posix()] == sha256_tree(src)[path.relative_to(out).as_posix()]
            )


# --- sharing on a full disk: push, fetch and clone --------------------------------------------


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs with a filler file (`filler`) that leaves 2 MiB free: delete it to make room."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path, *, leave: int) -> Path:
    """A filler file that leaves `leave` bytes free on `disk`."""
    st = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * (st.f_bavail * st.f_frsize - leave))
    return filler


def no_space(result: tuple[int, str, str]) -> None:
    code, out, err = result
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("Error: no space left on the device") and "nothing was committed" in err, err
    assert err.count("\n") == 1, err


def remote_objects(remote: Path) -> dict[str, int]:
    """{object id: file size} of every entry under an object's final name on a folder remote
    (-1 for one that is not a regular file)."""
    return {
        p.parent.name + p.name: p.lstat().st_size if stat.S_ISREG(p.lstat().st_mode) else -1
        for p in (remote / "objects").glob("*/*")
        if not p.name.startswith(".")
    }


def test_a_push_onto_a_full_remote_publishes_no_short_object(small_disk: Path, tmp_path: Path) -> None:
    src = big_model(tmp_path / "big", 4, one_tensor=True)  # one 4 MiB object: more than the space left
    alice = Repo.init(tmp_path / "alice")
    alice.add(src, name="big")
    remote = small_disk / "remote"
    sync.init_bare(str(remote))
    sync.add_remote(alice, "origin", str(remote))
    filler = fill(small_disk, leave=2 << 20)

    no_space(run_cli("-C", str(alice.root), "push"))

    kept = remote_objects(remote)
    assert all(size == alice.store.stored_size(oid) for oid, size in kept.items()), kept
    assert not (remote / "refs" / "models" / "big").exists()
    assert not [p for p in remote.rglob(".tmp-*")]
    filler.unlink()
    code, out, err = run_cli("-C", str(alice.root), "push", "--json")
    assert code == 0, err
    sent = json.loads(out)["sent"]
    needed = {oid: alice.store.stored_size(oid) for oid in alice.store.ids()}
    assert remote_objects(remote) == needed
    assert sent["objects"] == len(needed) - len(kept) and sent["skipped"] == len(kept)
    sync.clone(str(remote), tmp_path / "bob")
    Repo(tmp_path / "bob").checkout("big", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def test_a_push_sends_again_an_object_the_remote_has_short_or_not_as_a_file(tmp_path: Path) -> None:
    """What an older mgit left on a full remote: an object cut short under its final name,
    and one that is not a regular file. The existence check compares sizes."""
    src = big_model(tmp_path / "big", 1)
    alice = Repo.init(tmp_path / "alice")
    alice.add(src, name="big")
    remote = tmp_path / "remote"
    sync.init_bare(str(remote))
    sync.add_remote(alice, "origin", str(remote))
    short, fifo, link = sorted(alice.store.ids(), key=alice.store.stored_size)[-3:]
    for oid in (short, fifo, link):
        (remote / "objects" / oid[:2]).mkdir(exist_ok=True)
    (remote / "objects" / short[:2] / short[2:]).write_bytes(alice.store.read_bytes(short)[:1000])
    os.mkfifo(remote / "objects" / fifo[:2] / fifo[2:])
    outside = tmp_path / "outside"
    outside.write_bytes(alice.store.read_bytes(link))  # the right bytes, but out of the remote
    (remote / "objects" / link[:2] / link[2:]).symlink_to(outside)

    pushed = sync.push(alice)

    assert pushed.sent.objects == len(list(alice.store.ids()))
    assert remote_objects(remote) == {oid: alice.store.stored_size(oid) for oid in alice.store.ids()}
    assert not (remote / "objects" / link[:2] / link[2:]).is_symlink()
    sync.clone(str(remote), tmp_path / "bob")
    Repo(tmp_path / "bob").checkout("big", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def shared_remote(tmp_path: Path, src: Path) -> Path:
    alice = Repo.init(tmp_path / "alice")
    alice.add(src, name="big")
    remote = tmp_path / "remote"
    sync.init_bare(str(remote))
    sync.add_remote(alice, "origin", str(remote))
    sync.push(alice)
    return remote


def test_a_fetch_onto_a_full_disk_keeps_nothing(small_disk: Path, tmp_path: Path) -> None:
    src = big_model(tmp_path / "big", 4, one_tensor=True)
    remote = shared_remote(tmp_path, src)
    bob = Repo.init(small_disk / "bob")
    bob.add(make_model(tmp_path / "small", seed=1), name="small")
    sync.add_remote(bob, "origin", str(remote))
    before = objects_and_refs(bob)
    filler = fill(small_disk, leave=2 << 20)

    no_space(run_cli("-C", str(bob.root), "fetch"))

    assert objects_and_refs(bob) == before
    assert not list((bob.dir / "incoming").glob("*/*")) if (bob.dir / "incoming").is_dir() else True
    filler.unlink()
    assert run_cli("-C", str(bob.root), "pull")[0] == 0
    Repo(bob.root).checkout("big", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def test_a_clone_onto_a_full_disk_says_no_space_and_keeps_nothing(small_disk: Path, tmp_path: Path) -> None:
    src = big_model(tmp_path / "big", 4, one_tensor=True)
    remote = shared_remote(tmp_path, src)
    filler = fill(small_disk, leave=2 << 20)
    target = small_disk / "bob"

    no_space(run_cli("clone", str(remote), str(target)))

    assert not target.exists()  # the repository made for the clone is gone with what it fetched
    filler.unlink()
    assert run_cli("clone", str(remote), str(target))[0] == 0
    Repo(target).checkout("big", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def objects_and_refs(repo: Repo) -> dict[str, object]:
    files = sorted(
        p.relative_to(repo.dir).as_posix()
        for sub in ("objects", "refs")
        for p in (repo.dir / sub).rglob("*")
        if p.is_file()
    )
    return {"files": files, "heads": repo.refs.all()}


def test_an_export_to_a_full_hf_cache_writes_no_short_blob_and_no_ref(tiny_disk: Path, tmp_path: Path) -> None:
    pytest.importorskip("huggingface_hub")
    repo = Repo.init(tmp_path / "repo")
    src = big_model(tmp_path / "big", 4, one_tensor=True)
    repo.add(src, name="big")
    cache = tiny_disk / "hf"

    no_space(run_cli("-C", str(repo.root), "export-hf", "big", "--repo-id", "acme/big", "--cache-dir", str(cache)))

    storage = cache / "models--acme--big"
    assert not (storage / "refs" / "main").exists() and not list((storage / "snapshots").iterdir())
    sizes = {hashlib.sha256(p.read_bytes()).hexdigest() for p in (storage / "blobs").iterdir()}
    assert sizes <= {hashlib.sha256(p.read_bytes()).hexdigest() for p in src.rglob("*") if p.is_file()}
    assert [p.name for p in storage.iterdir() if p.name.startswith(".")] == []


def test_any_full_disk_the_cli_meets_is_the_one_line_of_storage_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that meets a full disk outside the atomic writers (a folder made, a quarantine
    file) says the same line as every other: nothing was committed, free space, run again."""
    import errno

    repo = Repo.init(tmp_path / "repo")
    sync.add_remote(repo, "origin", str(tmp_path / "remote"))

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(repo.dir / "incoming" / "x"))

    monkeypatch.setattr(sync, "fetch", full)
    no_space(run_cli("-C", str(repo.root), "fetch"))
