"""Data packs (mgit.remotes.datapack): small objects pushed in packs with an index, read back
by ranged reads, whole or lazily, from a folder remote and a real S3 server; old remotes of
loose objects still read; repacking; a remote whose packs or indexes lie is refused in one
line and nothing is kept."""
# ruff: noqa: F811  (test arguments named after the imported fixtures are how pytest injects them)

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from conftest import make_model
from hostile_remote import cli, holdings, packed_remote, rewrite_index
from s3server import FaultProxy, s3_bucket, s3_server  # noqa: F401

from mgit import Repo, sync
from mgit.errors import ReceivedError
from mgit.remotes import datapack
from mgit.remotes.folder import FolderBackend
from mgit.remotes.repack import repack
from mgit.remotes.repository import RemoteRepository


def tree_digest(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def keys(remote: Path, folder: str) -> list[str]:
    base = remote / folder
    return sorted(p.relative_to(remote).as_posix() for p in base.rglob("*") if p.is_file()) if base.is_dir() else []


def test_a_push_packs_small_objects_and_a_clone_gets_the_same_bytes(tmp_path):
    remote, alice = packed_remote(tmp_path)
    assert json.loads((remote / "config.json").read_text())["pack_threshold"] == datapack.PACK_THRESHOLD
    assert keys(remote, "objects") == []  # every object of these small models travelled in a pack
    idx = [k for k in keys(remote, "packs") if k.endswith(".objidx")]
    packs = [k for k in keys(remote, "packs") if k.endswith(".objpack")]
    assert len(idx) == len(packs) == 1
    pid = packs[0].removeprefix("packs/").removesuffix(".objpack")
    data = (remote / packs[0]).read_bytes()
    datapack.check_hash(pid, data, where="here")
    index = datapack.PackIndex.parse(pid, (remote / idx[0]).read_bytes(), where="here")
    source = Repo(alice)
    assert {o for o, _, _ in index.entries} == set(source.store.ids())
    for oid, offset, length in index.entries:
        assert data[offset : offset + length] == source.store.path_of(oid).read_bytes()

    code, _, err = cli("clone", str(remote), str(tmp_path / "bob"))
    assert code == 0, err
    bob = Repo(tmp_path / "bob")
    for name in ("base", "ft"):
        source.checkout(name, tmp_path / f"a-{name}")
        bob.checkout(name, tmp_path / f"b-{name}")
        assert tree_digest(tmp_path / f"a-{name}") == tree_digest(tmp_path / f"b-{name}")


def test_a_lazy_checkout_reads_objects_out_of_packs_by_range(tmp_path, monkeypatch):
    # Wanted entries closer than GAP share a range, and a range that covers the whole pack is
    # read whole (and hashed): whether the first and last entries are wanted depends on the
    # ids, which order the pack, so with GAP 0 only neighbours join and the reads are parts.
    monkeypatch.setattr(datapack, "GAP", 0)
    remote, alice = packed_remote(tmp_path)
    ranges: list[tuple[str, int, int]] = []
    whole: list[str] = []
    real_range, real_read = FolderBackend.read_range, FolderBackend.read

    def counted_range(self, key, start, length):
        ranges.append((key, start, length))
        return real_range(self, key, start, length)

    def counted_read(self, key, *, limit):
        if key.endswith(".objpack"):
            whole.append(key)
        return real_read(self, key, limit=limit)

    monkeypatch.setattr(FolderBackend, "read_range", counted_range)
    monkeypatch.setattr(FolderBackend, "read", counted_read)
    lazy = Repo(sync.clone(str(remote), tmp_path / "lazy", lazy=True).path)
    lazy.checkout("ft", tmp_path / "out")
    Repo(alice).checkout("ft", tmp_path / "want")
    assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "want")
    assert ranges and not whole  # parts of the pack, never all of it
    # Each range is whole entries the checkout kept, each byte brought once, not the pack.
    (idx,) = (remote / "packs").glob("*.objidx")
    pid = idx.name.removesuffix(".objidx")
    index = datapack.PackIndex.parse(pid, idx.read_bytes(), where="here")
    starts = {off: (o, n) for o, off, n in index.entries}
    for key, start, length in ranges:
        assert key == datapack.pack_key(pid)
        at = start
        while at < start + length:
            oid, n = starts[at]  # (a KeyError: a range that does not start at an entry)
            assert lazy.store.has(oid)
            at += n
        assert at == start + length
    assert len({s for _, s, _ in ranges}) == len(ranges)
    assert sum(n for _, _, n in ranges) < index.size


def test_a_lazy_read_whose_range_covers_the_pack_reads_it_whole_and_checks_it(tmp_path, monkeypatch):
    remote, _ = packed_remote(tmp_path)
    (idx,) = (remote / "packs").glob("*.objidx")
    pid = idx.name.removesuffix(".objidx")
    index = datapack.PackIndex.parse(pid, idx.read_bytes(), where="here")
    ranges: list[str] = []
    monkeypatch.setattr(FolderBackend, "read_range", lambda self, key, start, length: ranges.append(key))
    reader = RemoteRepository(FolderBackend(remote))
    first, last = index.entries[0], index.entries[-1]
    wanted = {o: (tmp_path / o, n) for o, _, n in (first, last)}
    assert reader.read_objects_into(wanted) == {first[0]: first[2], last[0]: last[2]}
    assert ranges == []  # one span from 0 to the end: the pack, hashed against its name
    data = (remote / datapack.pack_key(pid)).read_bytes()
    assert (tmp_path / first[0]).read_bytes() == data[first[1] : first[1] + first[2]]
    assert (tmp_path / last[0]).read_bytes() == data[last[1] : last[1] + last[2]]


def test_a_second_push_sends_only_what_is_new_in_a_new_pack(tmp_path):
    remote, alice = packed_remote(tmp_path)
    before = set(keys(remote, "packs"))
    assert cli("-C", str(alice), "push")[0] == 0  # nothing new: no pack
    assert set(keys(remote, "packs")) == before
    repo = Repo(alice)
    repo.add(make_model(tmp_path / "m4", seed=4), name="ft", parent="base")
    result = sync.push(repo)
    new = set(keys(remote, "packs")) - before
    assert sorted(k.rsplit(".", 1)[1] for k in new) == ["mgpack", "objidx", "objpack"]
    pid = next(k for k in new if k.endswith(".objidx")).removeprefix("packs/").removesuffix(".objidx")
    index = datapack.PackIndex.parse(pid, (remote / datapack.index_key(pid)).read_bytes(), where="here")
    assert len(index.entries) == result.sent.objects  # the new objects only
    code, _, err = cli("clone", str(remote), str(tmp_path / "bob"))
    assert code == 0, err
    assert Repo(tmp_path / "bob").log("ft")[0].id == repo.log("ft")[0].id


def test_an_old_remote_of_loose_objects_stays_readable_and_mixed_remotes_read_both(tmp_path):
    remote, alice = tmp_path / "old.mgit", tmp_path / "alice"
    assert cli("init", "--bare", str(remote))[0] == 0  # a folder: no packs unless asked
    assert "pack_threshold" not in json.loads((remote / "config.json").read_text())
    assert cli("init", str(alice))[0] == 0
    run = lambda *a: cli("-C", str(alice), *a)  # noqa: E731
    assert run("add", str(make_model(tmp_path / "m1", seed=1)), "--name", "base")[0] == 0
    assert run("remote", "add", "origin", str(remote))[0] == 0
    assert run("push")[0] == 0
    loose = keys(remote, "objects")
    assert loose and not [k for k in keys(remote, "packs") if k.endswith(".objpack")]
    # The remote starts taking packs: the next push packs, the loose objects stay where they are.
    config = json.loads((remote / "config.json").read_text())
    (remote / "config.json").write_text(json.dumps({**config, "pack_threshold": datapack.PACK_THRESHOLD}))
    assert run("add", str(make_model(tmp_path / "m2", seed=2)), "--name", "ft", "--parent", "base")[0] == 0
    assert run("push")[0] == 0
    assert keys(remote, "objects") == loose
    assert [k for k in keys(remote, "packs") if k.endswith(".objpack")]
    for lazy in ((), ("--lazy",)):
        target = tmp_path / f"bob{len(lazy)}"
        code, _, err = cli("clone", *lazy, str(remote), str(target))
        assert code == 0, err
        Repo(target).checkout("ft", tmp_path / f"out{len(lazy)}")
        Repo(alice).checkout("ft", tmp_path / f"want{len(lazy)}")
        assert tree_digest(tmp_path / f"out{len(lazy)}") == tree_digest(tmp_path / f"want{len(lazy)}")


def test_a_push_killed_between_pack_and_index_leaves_an_unreferenced_pack_and_a_rerun_completes(tmp_path, monkeypatch):
    remote, alice = tmp_path / "remote.mgit", tmp_path / "alice"
    assert cli("init", "--bare", "--packs", str(remote))[0] == 0
    repo = Repo.init(alice)
    repo.add(make_model(tmp_path / "m1", seed=1), name="base")
    sync.add_remote(repo, "origin", str(remote))
    real_write = FolderBackend.write

    def killed(self, key, data):
        if key.endswith(".objidx"):
            raise KeyboardInterrupt  # the push dies after its pack landed
        return real_write(self, key, data)

    monkeypatch.setattr(FolderBackend, "write", killed)
    with pytest.raises(KeyboardInterrupt):
        sync.push(repo)
    monkeypatch.setattr(FolderBackend, "write", real_write)
    assert [k.rsplit(".", 1)[1] for k in keys(remote, "packs")] == ["objpack"]  # no index, no metadata pack
    assert not (remote / "refs" / "models" / "base").exists()
    remote_repo = RemoteRepository(FolderBackend(remote))
    assert remote_repo.packed() == {}  # the pack is unreferenced: nothing reads it
    sync.push(repo)
    code, _, err = cli("clone", str(remote), str(tmp_path / "bob"))
    assert code == 0, err


def test_concurrent_pushes_lose_no_index_entry(tmp_path):
    """Two pushes packing at once (two threads, each its own remote handle) write two packs
    and two indexes; the union holds every object of both."""
    import threading

    remote = tmp_path / "remote.mgit"
    assert cli("init", "--bare", "--packs", str(remote))[0] == 0
    repos = []
    for i in range(2):
        repo = Repo.init(tmp_path / f"w{i}")
        repo.add(make_model(tmp_path / f"m{i}", seed=10 + i), name=f"model{i}")
        sync.add_remote(repo, "origin", str(remote))
        repos.append(repo)
    barrier = threading.Barrier(2)
    real_write = FolderBackend.write

    def together(self, key, data):
        if key.endswith(".objpack"):
            barrier.wait(timeout=30)  # both packs are written before either index
        return real_write(self, key, data)

    errors: list[BaseException] = []

    def push(repo: Repo) -> None:
        try:
            sync.push(repo)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    import unittest.mock

    with unittest.mock.patch.object(FolderBackend, "write", together):
        threads = [threading.Thread(target=push, args=(r,)) for r in repos]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors, errors
    packed = RemoteRepository(FolderBackend(remote)).packed()
    assert set().union(*(set(r.store.ids()) for r in repos)) <= set(packed)
    assert len([k for k in keys(remote, "packs") if k.endswith(".objidx")]) == 2


def test_repack_consolidates_small_packs_keeps_what_is_asked_and_names_what_it_supersedes(tmp_path):
    remote, alice = packed_remote(tmp_path)
    repo = Repo(alice)
    for seed in (4, 5):
        repo.add(make_model(tmp_path / f"m{seed}", seed=seed), name="ft", parent="base")
        sync.push(repo)
    old = [k for k in keys(remote, "packs") if k.endswith((".objpack", ".objidx"))]
    assert len(old) == 6
    handle = RemoteRepository(FolderBackend(remote))
    everything = set(handle.packed())
    dropped = sorted(everything)[0]
    result = repack(handle, keep=lambda oid: oid != dropped)
    assert result.packs_read == 3 and len(result.written) == 1
    assert sorted(result.superseded) == sorted(old)
    assert result.objects_kept == len(everything) - 1 and result.objects_dropped == 1
    for key in result.superseded:  # what the caller (remote gc) does after its grace period
        (remote / key).unlink()
    fresh = RemoteRepository(FolderBackend(remote)).packed()
    assert set(fresh) == everything - {dropped}
    assert {pid for pid, _, _ in fresh.values()} == set(result.written)
    again = repack(RemoteRepository(FolderBackend(remote)))
    assert again.packs_read == 0 and again.written == [] and again.superseded == []  # one pack: nothing to do


def test_a_reader_whose_index_went_stale_by_a_repack_finds_the_object_in_the_new_pack(tmp_path):
    remote, alice = packed_remote(tmp_path)
    repo = Repo(alice)
    repo.add(make_model(tmp_path / "m4", seed=4), name="ft", parent="base")
    sync.push(repo)
    reader = RemoteRepository(FolderBackend(remote))
    oid = next(iter(reader.packed()))  # the reader read the indexes before the repack
    result = repack(RemoteRepository(FolderBackend(remote)))
    for key in result.superseded:
        (remote / key).unlink()
    got = reader.read_object(oid, limit=1 << 30)
    assert got == repo.store.path_of(oid).read_bytes()


def test_fsck_of_a_packed_remote_reads_every_object_out_of_its_pack_and_finds_a_damaged_one(tmp_path):
    remote, alice = packed_remote(tmp_path)
    report = sync.fsck_remote(str(remote))
    assert report.ok and report.objects_checked == len(list(Repo(alice).store.ids()))
    rewrite_index(remote, "pack-bytes")  # one byte of one object changed inside the pack
    damaged = sync.fsck_remote(str(remote))
    assert not damaged.ok and len({p.object for p in damaged.problems}) >= 1


def test_many_new_names_are_checked_against_one_listing_of_the_refs(tmp_path):
    from mgit.errors import ModelNameConflictError

    remote = tmp_path / "remote.mgit"
    assert cli("init", "--bare", str(remote))[0] == 0
    handle = RemoteRepository(FolderBackend(remote))
    for name in ("org/a", "solo"):
        handle.backend.write(f"refs/models/{name}", b"0" * 64 + b"\n")
    fine = [f"model{i:03d}" for i in range(80)]
    handle.check_new_names(fine)  # more than LIST_ABOVE names: one listing, no conflict
    for clash, other in (("org", "org/a"), ("solo/x", "solo")):
        with pytest.raises(ModelNameConflictError) as refused:
            handle.check_new_names([*fine, clash])
        assert other in str(refused.value)
        with pytest.raises(ModelNameConflictError):  # and the same with a name or two: a request each
            handle.check_new_names([clash])


def test_a_reader_that_read_the_indexes_before_a_push_finds_what_the_push_packed(tmp_path):
    remote, alice = packed_remote(tmp_path)
    reader = RemoteRepository(FolderBackend(remote))
    reader.packed()  # read before the push below
    repo = Repo(alice)
    repo.add(make_model(tmp_path / "m4", seed=4), name="ft", parent="base")
    sync.push(repo)
    new = sorted(set(RemoteRepository(FolderBackend(remote)).packed()) - set(reader.packed()))
    assert new
    got = reader.read_objects_into({o: (tmp_path / o, 1 << 30) for o in new})
    assert got == {o: repo.store.stored_size(o) for o in new}
    assert all((tmp_path / o).read_bytes() == repo.store.path_of(o).read_bytes() for o in new)


# --- hostile remotes ----------------------------------------------------------------------------


def lie(tmp_path: Path, how: str) -> tuple[int, str, Path, dict]:
    remote, _ = packed_remote(tmp_path, seed=100)  # a pack no other test of this process read
    rewrite_index(remote, how)
    target = tmp_path / "bob"
    code, _, err = cli("clone", str(remote), str(target))
    return code, err, target, holdings(target)


@pytest.mark.parametrize(
    ("how", "said"),
    [
        ("shift", "corrupt"),  # wrong offsets: what comes out does not verify against its id
        ("overlap", "overlap"),
        ("huge", "past the pack"),
        ("past-limit", "more than the"),
        ("other-pack", "names another pack"),
        ("not-json", "is not JSON"),
        # (a byte of a pack changed: the pack refused when read whole, else the object in it)
        ("pack-bytes", "does not hash to its name|is corrupt"),
    ],
)
def test_a_lying_pack_index_or_pack_is_refused_in_one_line_and_nothing_is_kept(tmp_path, how, said):
    code, err, target, kept = lie(tmp_path, how)
    assert code == 1, err
    line = err.strip().splitlines()[0]
    assert any(part in line for part in said.split("|")) and "Traceback" not in err, err
    assert len(err.strip().splitlines()) <= 2, err  # the error and its hint
    assert kept == {} or not kept["files"] or all(not f.startswith("objects/") for f in kept["files"])


def test_a_pack_read_whole_that_does_not_hash_to_its_name_is_refused_and_nothing_written(tmp_path):
    remote, _ = packed_remote(tmp_path)
    rewrite_index(remote, "pack-bytes")
    reader = RemoteRepository(FolderBackend(remote))
    everything = reader.packed()  # every entry of the one pack: one read of all of it
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ReceivedError) as refused:
        reader.read_objects_into({o: (out / o, 1 << 30) for o in everything})
    assert "does not hash to its name" in str(refused.value) and "\n" not in str(refused.value)
    assert list(out.iterdir()) == []


def test_a_lying_index_refuses_a_lazy_read_and_keeps_nothing(tmp_path):
    remote, _ = packed_remote(tmp_path)
    lazy = Repo(sync.clone(str(remote), tmp_path / "lazy", lazy=True).path)
    before = sorted(lazy.store.ids())
    rewrite_index(remote, "shift")
    with pytest.raises(ReceivedError) as refused:
        lazy.checkout("ft", tmp_path / "out")
    assert "\n" not in str(refused.value)
    assert sorted(Repo(tmp_path / "lazy").store.ids()) == before


# --- S3: ranged GETs through a counting proxy ---------------------------------------------------------


def test_an_s3_push_of_many_small_objects_makes_few_requests_and_a_lazy_read_one_range(
    tmp_path, s3_bucket, monkeypatch
):
    proxy = FaultProxy(s3_bucket.endpoint)
    try:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
        url = s3_bucket.url + "/team"
        sync.init_bare(url)
        repo = Repo.init(tmp_path / "alice")
        for seed in range(12):
            repo.add(make_model(tmp_path / f"m{seed}", seed=seed), name=f"model{seed}")
        sync.add_remote(repo, "origin", url)
        objects = len(list(repo.store.ids()))
        start = proxy.requests
        sync.push(repo)
        puts = [r for r in proxy.seen[start:] if r.method == "PUT"]
        assert objects > 40
        assert len(puts) <= 12 + 6, [r.target for r in puts]  # refs, a pack, its index, a metadata pack
        lazy = Repo(sync.clone(url, tmp_path / "lazy", lazy=True).path)
        start = len(proxy.seen)
        lazy.checkout("model3", tmp_path / "out")
        gets = [r for r in proxy.seen[start:] if r.method == "GET"]
        assert any("objpack" in r.target for r in gets)
        repo.checkout("model3", tmp_path / "want")
        assert tree_digest(tmp_path / "out") == tree_digest(tmp_path / "want")
    finally:
        proxy.stop()
