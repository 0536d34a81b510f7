"""Safe remote garbage collection and model deletion on remotes: `mgit gc --remote`,
`push --delete`/`--prune`, `fetch --prune` and a serve mirror dropping deleted models.

One contract class runs on a folder, on S3 (moto's server) and, where cheap, on GCS and
Azure emulators (each a real server process). The race is two real processes: a push
paused between its objects and its refs (MGIT_STALL_AT) while `gc --remote --expire now`
runs; the push then completes and the remote is checked whole (clone, fsck, checkout by
hash). Every remote is compared by what it holds before and after, never by counts alone.
"""

# ruff: noqa: F811

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from azurite import OnAzure, azure_container, azurite_server, requires_azurite  # noqa: F401
from conftest import MGIT, OnFolder, make_model, one_line_error, run_cli, sha256_tree, tensors
from gcsemulator import OnGCS, gcs_bucket, gcs_emulator  # noqa: F401
from s3server import OnS3, S3Bucket, s3_bucket, s3_server  # noqa: F401

from mgit import Repo, sync
from mgit.errors import RemoteConflictError
from mgit.remotes import RemoteSpec, normalize_url, open_backend
from mgit.remotes.folder import FolderBackend
from mgit.remotes.leases import GC_LOCK, GC_STALE, LEASE_TTL, LEASES
from mgit.remotes.repository import REFS, TOMBSTONE, RemoteRepository, object_key
from mgit.store.transfer import closure
from mgit.sync import remote_gc
from mgit.sync.connection import connect
from mgit.sync.mirror import open_mirror


def remote_of(url: str) -> RemoteRepository:
    return RemoteRepository(open_backend(RemoteSpec(normalize_url(url))))


def remote_objects(url: str) -> set[str]:
    remote = remote_of(url)
    try:
        return set(remote.object_ids())
    finally:
        remote.close()


def cli(repo: Repo, *args: str) -> tuple[int, str, str]:
    return run_cli("-C", str(repo.root), *args)


def gc_json(repo: Repo, *args: str) -> dict:
    code, out, err = cli(repo, "gc", "--remote", "origin", "--json", *args)
    assert code == 0, err
    return json.loads(out)


def needs(repo: Repo, *names: str) -> set[str]:
    """Every object these models' histories need (records, files, tensors, delta bases)."""
    from mgit.store.transfer import history

    return closure(repo.store, history(repo.store, [repo.refs.get(n) for n in names]))


def family(repo: Repo, tmp: Path) -> dict[str, Path]:
    """base, ft (a fine-tune of base: deltas against it) and solo (a model of its own)."""
    rng = np.random.default_rng(7)
    tuned = {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * np.float32(1e-3)) for k, v in tensors(1).items()}
    folders = {
        "base": make_model(tmp / "src-base", state=tensors(1)),
        "ft": make_model(tmp / "src-ft", state=tuned),
        "solo": make_model(tmp / "src-solo", state=tensors(99, width=24)),
    }
    repo.add(folders["base"], name="base")
    repo.add(folders["ft"], name="ft", parent="base")
    repo.add(folders["solo"], name="solo")
    return folders


def assert_whole(url: str, tmp: Path, folders: dict[str, Path], who: str) -> None:
    """A clone of the remote checks out every model byte for byte, and fsck finds nothing."""
    assert sync.fsck_remote(url).ok
    sync.clone(url, tmp / who)
    clone = Repo(tmp / who)
    assert clone.fsck().ok
    for name, folder in folders.items():
        clone.checkout(name, tmp / f"{who}-{name}")
        assert sha256_tree(tmp / f"{who}-{name}") == sha256_tree(folder), name


class RemoteGcContract:
    """Subclasses supply `url` (a fresh remote) and `env` (for child processes). Every kind of
    remote runs what its listing (sizes, times), deletes and conditional writes decide; what
    the client alone decides runs once, in TestFolderRemoteGc."""

    cas = True  # whether the backend's conditional writes hold (the GCS emulator's do not)

    @pytest.fixture
    def alice(self, tmp_path: Path, url: str) -> Repo:
        repo = Repo.init(tmp_path / "alice")
        sync.add_remote(repo, "origin", url)
        return repo

    def test_gc_removes_exactly_what_only_a_deleted_model_used(self, alice, url, tmp_path) -> None:
        folders = family(alice, tmp_path)
        sync.push(alice)
        kept, before = needs(alice, "base", "ft"), remote_objects(url)
        only_solo = needs(alice, "solo") - kept
        assert only_solo and before == kept | needs(alice, "solo")
        assert cli(alice, "rm", "solo")[0] == 0
        code, out, err = cli(alice, "push", "--prune", "--json")
        assert code == 0, err
        assert [(d["model"], d["status"]) for d in json.loads(out)["deleted"]] == [("solo", "deleted")]
        assert remote_objects(url) == before  # a delete takes the ref; objects wait for gc

        young = gc_json(alice)  # default grace period: two weeks
        assert young["removed"] == [] and young["young"] == len(only_solo)
        done = gc_json(alice, "--expire", "now")
        assert set(done["removed"]) == only_solo and done["kept"] == len(kept)
        assert remote_objects(url) == kept
        del folders["solo"]
        assert_whole(url, tmp_path, folders, "bob")
        assert gc_json(alice, "--expire", "now")["removed"] == []  # nothing left to collect

    def test_dry_run_lists_what_would_go_and_its_bytes_and_deletes_nothing(self, alice, url, tmp_path) -> None:
        family(alice, tmp_path)
        sync.push(alice)
        only_solo = needs(alice, "solo") - needs(alice, "base", "ft")
        alice.rm("solo")
        sync.delete_remote_models(alice, "origin", ["solo"])
        before = remote_objects(url)
        would = gc_json(alice, "--dry-run", "--expire", "now")
        assert would["dry_run"] and set(would["removed"]) == only_solo
        sizes = {o: alice.store.stored_size(o) for o in would["removed"]}  # byte for byte as pushed
        assert would["removed_bytes"] == sum(sizes.values()) > 0
        code, out, _ = cli(alice, "gc", "--remote", "origin", "--dry-run", "--expire", "now")
        assert code == 0 and all(f"would remove {o}" in out for o in would["removed"])
        assert remote_objects(url) == before
        assert gc_json(alice, "--expire", "now")["removed"] == would["removed"]

    def test_a_push_paused_before_its_refs_survives_a_gc_with_no_grace(self, alice, url, tmp_path, env) -> None:
        folders = family(alice, tmp_path)
        sync.push(alice)
        folders["ft"] = make_model(tmp_path / "src-ft2", state=tensors(5))
        alice.add(folders["ft"], name="ft", message="second")
        sent = needs(alice, "ft") - remote_objects(url)
        go = tmp_path / "go"
        push = subprocess.Popen(
            [*MGIT, "-C", str(alice.root), "push"],
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "MGIT_STALL_AT": "push-before-refs", "MGIT_STALL_FILE": str(go)},
        )
        deadline = time.monotonic() + 120
        while not Path(f"{go}.reached").exists():
            assert push.poll() is None and time.monotonic() < deadline, push.stderr.read()  # type: ignore[union-attr]
            time.sleep(0.05)
        assert sent <= remote_objects(url)  # uploaded, no ref names them yet
        result = gc_json(alice, "--expire", "now")  # from this process, while the push waits
        assert result["leases"] == 1 and result["leased"] >= len(sent) and not set(result["removed"]) & sent
        go.touch()
        assert push.wait(timeout=120) == 0, push.stderr.read()  # type: ignore[union-attr]
        assert remote_of(url).head("ft")[0] == alice.refs.get("ft")
        assert list(remote_of(url).backend.list(LEASES)) == []  # dropped once its refs moved
        assert_whole(url, tmp_path, folders, "bob")

    def test_after_a_gc_a_push_sends_again_what_a_stale_tracking_ref_named(self, alice, url, tmp_path) -> None:
        folders = family(alice, tmp_path)
        sync.push(alice)
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        sync.delete_remote_models(alice, "origin", ["ft", "solo"])
        sync.delete_remote_models(alice, "origin", ["base"])
        gc_json(alice, "--expire", "now")
        assert remote_objects(url) == set()
        # bob still has origin/base: a push that trusted it would send ft2 without its parent
        folders = {"ft2": make_model(tmp_path / "src-ft2", state=tensors(1, scale=1.01))}
        bob.add(folders["ft2"], name="ft2", parent="base")
        sync.push(bob, "origin", ["ft2"])
        assert remote_objects(url) == needs(bob, "ft2")
        assert_whole(url, tmp_path, folders, "carol")

    def test_a_delete_after_someone_else_pushed_is_refused(self, alice, url, tmp_path) -> None:
        family(alice, tmp_path)
        sync.push(alice)
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        bob.add(tensors(31), name="ft", message="bob's")
        sync.push(bob)
        head = remote_of(url).head("ft")[0]
        one_line_error(cli(alice, "push", "origin", "--delete", "ft"), "not deleting ft on origin", "moved")
        assert remote_of(url).head("ft")[0] == head == bob.refs.get("ft")
        one_line_error(cli(alice, "push", "origin", "--delete", "nope"), "no such model")
        sync.fetch(alice)
        code, out, err = cli(alice, "push", "origin", "--delete", "ft")
        assert code == 0 and "deleted" in out, err
        assert remote_of(url).head("ft") == (None, None) and "ft" not in remote_of(url).model_names()
        assert alice.refs.get("ft") is not None  # a remote delete leaves this repository's model

    def test_a_delete_swaps_the_ref_only_from_the_token_it_read(self, alice, url, tmp_path) -> None:
        family(alice, tmp_path)
        sync.push(alice)
        remote = remote_of(url)
        head, token = remote.head("ft")
        alice.add(tensors(32), name="ft", message="moved")
        sync.push(alice)  # between the delete's read and its swap
        with pytest.raises(RemoteConflictError):
            remote.delete_head("ft", expected=head, token=token)
        assert remote.head("ft")[0] == alice.refs.get("ft")

    def test_another_gc_holding_the_lock_is_refused_and_a_stale_lock_is_taken_over(self, alice, url, tmp_path):
        family(alice, tmp_path)
        sync.push(alice)
        backend = remote_of(url).backend
        backend.write(GC_LOCK, json.dumps({"format": 1, "beat": time.time()}).encode())
        one_line_error(cli(alice, "gc", "--remote", "origin", "--expire", "now"), "another gc is running")
        backend.write(GC_LOCK, json.dumps({"format": 1, "beat": time.time() - GC_STALE - 1}).encode())
        assert gc_json(alice, "--expire", "now")["removed"] == []
        assert not backend.exists(GC_LOCK)

    def test_a_delete_killed_after_its_tombstone_reads_as_deleted_and_is_finished_later(
        self, alice, url, tmp_path, env
    ) -> None:
        folders = family(alice, tmp_path)
        sync.push(alice)
        killed = subprocess.run(
            [*MGIT, "-C", str(alice.root), "push", "--delete", "solo"],
            env={**env, "MGIT_CRASH_AT": "delete-after-tombstone"},
            capture_output=True,
            timeout=120,
        )
        assert killed.returncode == -9
        remote = remote_of(url)
        assert remote.backend.read(REFS + "solo", limit=100) == TOMBSTONE
        assert remote.head("solo") == (None, None) and set(remote.heads()) == {"base", "ft"}
        sync.push(alice, "origin", ["solo"])  # the name is free again: the push finishes the delete
        assert remote.head("solo")[0] == alice.refs.get("solo")
        assert_whole(url, tmp_path, folders, "bob")


def packed_objects(url: str) -> dict[str, set[str]]:
    """{data pack id: the objects its index names} (indexes read afresh)."""
    remote = remote_of(url)
    try:
        remote.packed(refresh=True)
        return {pid: {o for o, _, _ in index.entries} for pid, index in remote.pack_indexes().items()}
    finally:
        remote.close()


def test_a_gc_repacks_a_data_pack_without_its_garbage_and_deletes_a_pack_all_garbage(
    s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    """A pack holding garbage and objects still needed is replaced by one holding only the
    latter; a pack all garbage goes whole; `--dry-run` counts packed garbage and its bytes."""
    url = f"{s3_bucket.url}/team/packed"
    sync.init_bare(url)  # a bucket: small objects travel in data packs
    alice = Repo.init(tmp_path / "alice")
    sync.add_remote(alice, "origin", url)
    folders = family(alice, tmp_path)
    sync.push(alice)
    alice.add(make_model(tmp_path / "src-late", state=tensors(77, width=20)), name="late")
    sync.push(alice)  # a second pack, of late's objects only
    first, late_pack = sorted(packed_objects(url).items(), key=lambda p: len(p[1]), reverse=True)
    assert not list(remote_of(url).backend.list("objects/"))  # every object travelled in a pack
    kept = needs(alice, "base", "ft")
    only_solo, only_late = needs(alice, "solo") - kept, late_pack[1]
    assert only_solo < first[1] and kept <= first[1]
    for name in ("solo", "late"):
        alice.rm(name)
    sync.delete_remote_models(alice, "origin", ["solo", "late"])

    would = gc_json(alice, "--dry-run", "--expire", "now")
    sizes = {o: alice.store.stored_size(o) for o in only_solo | only_late}  # stored bytes, as packed
    assert set(would["removed"]) == set(sizes) and would["removed_bytes"] == sum(sizes.values())
    assert packed_objects(url) == dict([first, late_pack])  # a dry run touches nothing

    done = gc_json(alice, "--expire", "now")
    assert set(done["removed"]) == set(sizes) and done["kept"] == len(kept)
    after = packed_objects(url)
    assert list(after.values()) == [kept] and first[0] not in after and late_pack[0] not in after
    left = set(remote_of(url).backend.list("packs/"))
    assert not {k for k in left if k.endswith((".objpack", ".objidx"))} - {
        f"packs/{p}.{x}" for p in after for x in ("objpack", "objidx")
    }
    del folders["solo"]
    assert_whole(url, tmp_path, folders, "bob")
    assert gc_json(alice, "--expire", "now")["removed"] == []  # nothing left; the new pack stays
    assert packed_objects(url) == after


def pushed_to_packs(tmp_path: Path) -> tuple[str, Repo]:
    """A folder remote laid out with data packs, and alice, who pushed the family to it."""
    url = str(tmp_path / "remote.mgit")
    sync.init_bare(url, packs=True)
    alice = Repo.init(tmp_path / "alice")
    sync.add_remote(alice, "origin", url)
    family(alice, tmp_path)
    sync.push(alice)
    return url, alice


def test_garbage_in_a_pack_too_large_to_rewrite_is_kept_and_not_reported(tmp_path: Path, monkeypatch) -> None:
    """A pack is rewritten only when small (repack's SMALL): a gc that may not rewrite the one
    pack holding garbage and kept objects removes nothing and says so; one that may, does."""
    url, alice = pushed_to_packs(tmp_path)
    only_solo = needs(alice, "solo") - needs(alice, "base", "ft")
    sync.delete_remote_models(alice, "origin", ["solo"])
    before = packed_objects(url)
    assert len(before) == 1 and only_solo < next(iter(before.values()))
    monkeypatch.setattr(remote_gc, "SMALL", 0)  # every pack counts as large
    assert sync.gc_remote(alice, expire=0.0).removed == []
    assert packed_objects(url) == before
    monkeypatch.undo()
    deleted: list[str] = []
    real_delete = FolderBackend.delete
    monkeypatch.setattr(FolderBackend, "delete", lambda self, key: deleted.append(key) or real_delete(self, key))
    assert set(sync.gc_remote(alice, expire=0.0).removed) == only_solo
    assert remote_objects(url) == needs(alice, "base", "ft")
    sync.delete_remote_models(alice, "origin", ["base", "ft"])
    assert set(sync.gc_remote(alice, expire=0.0).removed) == needs(alice, "base", "ft")
    assert packed_objects(url) == {} and remote_objects(url) == set()
    gone = [k for k in deleted if k.endswith((".objidx", ".objpack"))]
    assert len(gone) == 4  # the repacked pack and its index, then the new one, all garbage
    for key in gone:  # every index before its pack
        if key.endswith(".objpack"):
            assert gone.index(key.replace(".objpack", ".objidx")) < gone.index(key)


def test_a_pack_no_index_names_goes_only_once_older_than_a_lease_lives(tmp_path: Path) -> None:
    url, alice = pushed_to_packs(tmp_path)
    before = packed_objects(url)
    old, new = (tmp_path / "remote.mgit" / "packs" / f"{c * 64}.objpack" for c in "ab")
    for pack in (old, new):
        pack.write_bytes(b"a push killed before its index")
    os.utime(old, (time.time() - LEASE_TTL - 60,) * 2)
    os.utime(new, (time.time() - LEASE_TTL + 600,) * 2)  # a push may still be writing its index
    assert sync.gc_remote(alice, expire=0.0).removed == []
    assert not old.exists() and new.exists() and packed_objects(url) == before


def test_a_gc_learns_delta_bases_from_headers_read_by_range(tmp_path: Path, monkeypatch) -> None:
    """A loose tensor's payload is never downloaded by a gc: its header comes by ranged reads,
    and the delta bases it names are kept."""
    url = str(tmp_path / "remote.mgit")
    sync.init_bare(url)  # a folder: every object loose
    alice = Repo.init(tmp_path / "alice")
    sync.add_remote(alice, "origin", url)
    folders = family(alice, tmp_path)
    sync.push(alice)
    versions = [alice.store.get_version(alice.refs.get(n)) for n in ("base", "ft")]
    tensor_ids = {t.object for v in versions for t in alice.store.get_manifest(v.manifest).tensors()}
    deltas = {o for o in tensor_ids if alice.store.header(o).bases}
    assert deltas  # ft is stored against base
    whole: list[str] = []
    ranged: set[str] = set()
    real_read, real_range = FolderBackend.read, FolderBackend.read_range

    def read(self, key, *, limit):
        whole.append(key)
        return real_read(self, key, limit=limit)

    def read_range(self, key, start, length):
        ranged.add(key)
        return real_range(self, key, start, length)

    monkeypatch.setattr(FolderBackend, "read", read)
    monkeypatch.setattr(FolderBackend, "read_range", read_range)
    done = sync.gc_remote(alice, expire=0.0)
    assert done.removed == [] and done.kept == len(needs(alice, "base", "ft", "solo"))
    assert not {object_key(o) for o in tensor_ids} & set(whole)
    assert {object_key(o) for o in deltas} <= ranged
    monkeypatch.undo()
    assert_whole(url, tmp_path, folders, "bob")


class TestFolderRemoteGc(OnFolder, RemoteGcContract):
    """The contract on a folder, and two tests the client alone decides, once: fetch --prune
    and a mirror dropping what the remote's refs no longer name (refs are listed by every
    backend's contract), and a lease that does not parse stopping the gc (any backend hands
    back the same bytes)."""

    def test_fetch_prune_and_a_mirror_drop_models_deleted_on_the_remote(self, alice, url, tmp_path) -> None:
        family(alice, tmp_path)
        sync.push(alice)
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        mirror = open_mirror(url, root=tmp_path / "mirrors")
        assert set(mirror.repo.refs.all()) == {"base", "ft", "solo"}
        sync.delete_remote_models(alice, "origin", ["solo"])
        tracking = connect(bob, "origin").tracking
        assert sync.fetch(bob).models == [] and "solo" in tracking.all()  # without --prune: kept
        code, out, err = cli(bob, "fetch", "--prune", "--json")
        assert code == 0, err
        assert [(m["model"], m["status"]) for m in json.loads(out)["models"]] == [("solo", "deleted")]
        assert set(tracking.all()) == {"base", "ft"} and bob.refs.get("solo") is not None
        again = open_mirror(url, root=tmp_path / "mirrors")
        assert set(again.repo.refs.all()) == {"base", "ft"} and "solo" in again.moved

    def test_a_lease_that_is_not_one_stops_the_gc_before_it_deletes(self, alice, url, tmp_path) -> None:
        family(alice, tmp_path)
        sync.push(alice)
        sync.delete_remote_models(alice, "origin", ["solo"])
        before = remote_objects(url)
        remote_of(url).backend.write(f"{LEASES}{'ab' * 16}", b"not zstd at all")
        one_line_error(cli(alice, "gc", "--remote", "origin", "--expire", "now"), "not a readable lease")
        assert remote_objects(url) == before and not remote_of(url).backend.exists(GC_LOCK)


class TestS3RemoteGc(OnS3, RemoteGcContract):
    pass  # laid out as `mgit init --bare` lays a bucket: small objects in data packs


@requires_azurite
class TestAzureRemoteGc(OnAzure, RemoteGcContract):
    pass


class TestGCSRemoteGc(OnGCS, RemoteGcContract):
    pass


def test_a_grace_period_or_options_that_make_no_sense_are_refused(tmp_path: Path) -> None:
    sync.init_bare(str(tmp_path / "remote.mgit"))
    repo = Repo.init(tmp_path / "alice")
    sync.add_remote(repo, "origin", str(tmp_path / "remote.mgit"))
    for bad in ("soon", "2 weeks", "-1d", "10y"):
        one_line_error(cli(repo, "gc", "--remote", "origin", "--expire", bad), "not a grace period")
    code, _, err = cli(repo, "push", "origin", "--delete", "a", "--prune")
    assert code == 2 and "--delete takes no models" in err
    one_line_error(cli(repo, "gc", "--remote", "nowhere"), "nowhere")
    assert not (tmp_path / "remote.mgit" / "gc").exists()  # nothing was locked or marked
