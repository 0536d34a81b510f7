"""The heads index (`refs/heads.json`, mgit.remotes.heads): every model's head in one object,
a hint checked against a listing of the refs. One contract class runs on a folder, on S3
(moto's server), on GCS (gcp-storage-emulator) and on Azure (Azurite).

What is shown: a push writes it; a no-op push and a clone read the heads without a request
per ref and a no-op push writes nothing; an index made stale by an older mgit, or by a push
killed after its refs moved, or one that lies, never gives a wrong head (except on Azure,
below) and never makes a push lose another's ref; two real processes racing leave it right.
"""

# ruff: noqa: F811

from __future__ import annotations

import contextlib
import importlib
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from azurite import OnAzure, azure_container, azurite_server  # noqa: F401
from conftest import MGIT, OnFolder, run_cli, tensors
from gcsemulator import OnGCS, gcs_bucket, gcs_emulator  # noqa: F401
from s3server import OnS3, s3_bucket, s3_server  # noqa: F401

from mgit import Repo, sync
from mgit.errors import PushRefusedError
from mgit.remotes import RemoteSpec, heads, open_backend
from mgit.remotes.base import Backend
from mgit.remotes.repository import READ_EACH, RemoteRepository

MODELS = [f"m{i}" for i in range(READ_EACH + 3)]  # more than a push reads ref by ref


def remote_of(url: str) -> RemoteRepository:
    return RemoteRepository(open_backend(RemoteSpec(url)))


def refs_on(url: str) -> dict[str, str]:
    """The truth: every ref read on its own."""
    remote = remote_of(url)
    try:
        return {n: h for n, (h, _) in remote.heads(exact=True).items()}
    finally:
        remote.close()


def index_on(url: str) -> dict[str, str]:
    return {n: v for n, (v, _) in heads.read_index(remote_of(url).backend)[0].items()}


def backend_classes() -> list[type[Backend]]:
    from mgit.remotes.folder import FolderBackend

    classes: list[type[Backend]] = [FolderBackend]
    for module, name in (
        ("mgit.remotes.s3", "S3Backend"),
        ("mgit.remotes.objectstore", "ObjectStoreBackend"),
        ("mgit.remotes.gcs", "GCSBackend"),
    ):
        with contextlib.suppress(ImportError):  # (their clients are in the dev extras)
            classes.append(getattr(importlib.import_module(module), name))
    return classes


class Requests:
    """Counts a backend's calls by (method, first two parts of the key) across every backend
    class; not the reads inside `list_tokens` (a folder's reads its refs, local files)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[tuple[str, str]] = Counter()
        self.inside = threading.local()
        for cls in backend_classes():
            for method in ("read", "read_versioned", "read_into", "list_info", "list_tokens", "write", "write_if"):
                if method in vars(cls) or method == "list_tokens":
                    monkeypatch.setattr(cls, method, self._counting(method, getattr(cls, method)))

    def _counting(self, name: str, original: Any) -> Any:
        def wrapper(backend: Backend, key: str, *args: Any, **kwargs: Any) -> Any:
            if getattr(self.inside, "listing", False):
                return original(backend, key, *args, **kwargs)
            self.calls[(name, "/".join(key.split("/")[:2]))] += 1
            self.inside.listing = name == "list_tokens"
            try:
                return original(backend, key, *args, **kwargs)
            finally:
                self.inside.listing = False

        return wrapper

    def of(self, *methods: str, under: str = "") -> int:
        return sum(n for (m, key), n in self.calls.items() if m in methods and key.startswith(under))


def team(repo: Repo) -> None:
    """MODELS, each with two versions (the second the head)."""
    for i, name in enumerate(MODELS):
        repo.add(tensors(i + 1, width=8), name=name)
        repo.add(tensors(i + 101, width=8), name=name)


class HeadsIndexContract:
    @pytest.fixture
    def alice(self, tmp_path: Path, url: str) -> Repo:
        repo = Repo.init(tmp_path / "alice")
        sync.add_remote(repo, "origin", url)
        team(repo)
        sync.push(repo)
        return repo

    def test_a_push_writes_the_index_of_every_head_beside_the_refs(self, alice: Repo, url: str) -> None:
        assert index_on(url) == refs_on(url) == alice.refs.all()
        data = remote_of(url).backend.read(heads.HEADS_KEY, limit=1 << 20)
        assert json.loads(data)["format"] == 1 and sorted(json.loads(data)["heads"]) == MODELS

    def test_a_no_op_push_reads_no_ref_on_its_own_and_writes_nothing(
        self, alice: Repo, url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen = Requests(monkeypatch)
        result = sync.push(alice)
        assert {u.status for u in result.models} == {"up-to-date"}
        assert seen.of("write", "write_if") == 0, seen.calls  # no lease, no pack, no index
        assert seen.of("read", "read_versioned", under="refs/models") == 0, seen.calls
        assert seen.of("list_tokens") == 1 and seen.of("read_versioned", under="refs/heads.json") == 1

    def test_a_clone_reads_the_heads_from_the_index(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        seen = Requests(monkeypatch)
        sync.clone(url, tmp_path / "bob", lazy=True)
        assert Repo(tmp_path / "bob").refs.all() == alice.refs.all()
        assert seen.of("read", "read_versioned", under="refs/models") == 0, seen.calls

    def test_an_index_an_older_mgit_left_stale_gives_the_refs_and_the_next_push_mends_it(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        bob.add(tensors(500, width=8), name="m1")
        with monkeypatch.context() as older:  # an mgit that knows no index moves the ref only
            older.setattr(RemoteRepository, "refresh_heads", lambda self, known: True)
            sync.push(bob)
        assert index_on(url)["m1"] == alice.refs.get("m1") != refs_on(url)["m1"] == bob.refs.get("m1")
        sync.clone(url, tmp_path / "carol", lazy=True)
        assert Repo(tmp_path / "carol").refs.all() == refs_on(url) == bob.refs.all()
        alice.add(tensors(501, width=8), name="m1")  # alice's head is behind the remote's now
        with pytest.raises(PushRefusedError):
            sync.push(alice)
        assert refs_on(url)["m1"] == bob.refs.get("m1")
        bob.add(tensors(502, width=8), name="m2")
        sync.push(bob)  # a push by this mgit writes the index right again
        assert index_on(url) == refs_on(url) == bob.refs.all()

    def test_a_lying_index_never_makes_a_push_lose_a_ref_nor_a_clone_take_it(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        backend = remote_of(url).backend
        older = alice.log("m1")[-1].id  # m1's first version
        entries, token = heads.read_index(backend)
        entries["m1"] = (older, entries["m1"][1])  # the ref's true token, paired with another version
        backend.write_if(heads.HEADS_KEY, heads.to_bytes(entries), token=token)
        if not self.md5_listed:
            pytest.skip("Azure's listing (through obstore) has no MD5: the pairing of a token is taken as written")
        sync.clone(url, tmp_path / "bob", lazy=True)
        assert Repo(tmp_path / "bob").refs.get("m1") == alice.refs.get("m1")

    def test_a_push_from_a_lying_head_is_judged_on_the_ref_itself(self, alice: Repo, url: str, tmp_path: Path) -> None:
        sync.clone(url, tmp_path / "carol")  # carol will build on m1's first version
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        first = alice.log("m1")[-1].id
        bob.add(tensors(600, width=8), name="m1")
        sync.push(bob)  # the remote's m1 is bob's now
        backend = remote_of(url).backend
        entries, token = heads.read_index(backend)
        entries["m1"] = (first, entries["m1"][1])  # says m1 is at its first version, with the ref's token
        backend.write_if(heads.HEADS_KEY, heads.to_bytes(entries), token=token)
        carol = Repo(tmp_path / "carol")
        carol.refs.update("m1", first, expected=alice.refs.get("m1"))
        carol.sync_catalog()
        carol.add(tensors(601, width=8), name="m1")  # a fast-forward of what the index claims
        with pytest.raises(PushRefusedError):
            sync.push(carol)
        assert refs_on(url)["m1"] == bob.refs.get("m1")

    def test_a_push_killed_after_its_refs_moved_leaves_a_stale_index_that_costs_nothing_wrong(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str]
    ) -> None:
        alice.add(tensors(700, width=8), name="m3")
        killed = subprocess.run(
            [*MGIT, "-C", str(alice.root), "push"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "MGIT_CRASH_AT": "push-before-heads-index"},
        )
        assert killed.returncode == -signal.SIGKILL
        assert refs_on(url)["m3"] == alice.refs.get("m3") != index_on(url)["m3"]
        sync.clone(url, tmp_path / "bob", lazy=True)
        assert Repo(tmp_path / "bob").refs.all() == alice.refs.all()

    def test_two_processes_moving_refs_at_once_leave_the_index_right(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str]
    ) -> None:
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        alice.add(tensors(800, width=8), name="m0")
        bob.add(tensors(801, width=8), name="m4")
        go = tmp_path / "go"
        first = subprocess.Popen(  # alice's refs move, then she waits before writing the index
            [*MGIT, "-C", str(alice.root), "push"],
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "MGIT_STALL_AT": "push-before-heads-index", "MGIT_STALL_FILE": str(go)},
        )
        deadline = time.monotonic() + 120
        while not Path(f"{go}.reached").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()  # type: ignore[union-attr]
            time.sleep(0.05)
        code, _, err = run_cli("-C", str(bob.root), "push", "origin", *MODELS[1:])  # this process (not m0: alice's)
        assert code == 0, err
        go.touch()
        assert first.wait(timeout=120) == 0, first.stderr.read()  # type: ignore[union-attr]
        truth = refs_on(url)
        assert truth["m0"] == alice.refs.get("m0") and truth["m4"] == bob.refs.get("m4")
        assert index_on(url) == truth
        sync.clone(url, tmp_path / "carol", lazy=True)
        assert Repo(tmp_path / "carol").refs.all() == truth

    def test_a_deleted_model_leaves_the_index(self, alice: Repo, url: str, tmp_path: Path) -> None:
        sync.delete_remote_models(alice, "origin", ["m2"])
        assert "m2" not in index_on(url) and index_on(url) == refs_on(url)
        sync.clone(url, tmp_path / "bob", lazy=True)
        assert "m2" not in Repo(tmp_path / "bob").refs.all()


def test_a_damaged_index_is_read_as_none() -> None:
    vid = "a" * 64
    good = heads.to_bytes({"m": (vid, "t")})
    assert heads.parse(good) == {"m": (vid, "t")}
    for bad in (
        b"",
        b"{",
        b"[]",
        b'{"format": 2, "heads": {}}',
        b'{"format": 1, "heads": {"../x": ["' + b"a" * 64 + b'", "t"]}}',
    ):
        assert heads.parse(bad) == {}
    assert heads.parse(good.replace(vid.encode(), b"not-a-version")) == {}
    two = heads.to_bytes({"m": (vid, "t"), "n": (vid, "u")})
    assert heads.parse(two.replace(b'"u"', b"7")) == {}  # one bad entry: no index at all


def test_an_index_past_its_bound_is_not_read_and_the_refs_are(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mgit.remotes.folder import FolderBackend

    (tmp_path / "r").mkdir()
    backend = FolderBackend(tmp_path / "r", url=str(tmp_path / "r"))
    remote = RemoteRepository(backend)
    vids = {f"m{i}": f"{i:x}".rjust(64, "c") for i in range(READ_EACH + 2)}
    for name, vid in vids.items():
        backend.write_if(f"refs/models/{name}", f"{vid}\n".encode(), token=None)
    backend.write_if(heads.HEADS_KEY, heads.to_bytes({n: ("d" * 64, "x") for n in vids}) + b" " * 4096, token=None)
    monkeypatch.setattr(heads, "MAX_HEADS", 2048)
    assert heads.read_index(backend) == ({}, None)
    assert {n: v for n, (v, _) in remote.heads().items()} == vids


class TestFolderHeadsIndex(OnFolder, HeadsIndexContract):
    md5_listed = True


class TestS3HeadsIndex(OnS3, HeadsIndexContract):
    md5_listed = True


class TestGCSHeadsIndex(OnGCS, HeadsIndexContract):
    md5_listed = True


class TestAzureHeadsIndex(OnAzure, HeadsIndexContract):
    md5_listed = False


def test_a_writer_that_loses_the_race_for_the_index_merges_into_the_winners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two refreshes interleaved on one folder: the second writes the index between the first's
    read of it and its write; the first's compare-and-swap fails, and it tries again on top."""
    from mgit.remotes.folder import FolderBackend

    backend = FolderBackend(tmp_path / "remote", url=str(tmp_path / "remote"))
    (tmp_path / "remote").mkdir()
    a, b = "a" * 64, "b" * 64
    token_a = backend.write_if("refs/models/x", f"{a}\n".encode(), token=None)
    token_b = backend.write_if("refs/models/y", f"{b}\n".encode(), token=None)
    remote = RemoteRepository(backend)
    original, raced = FolderBackend.write_if, []

    def racing(self: Backend, key: str, data: bytes, *, token: str | None) -> str | None:
        if key == heads.HEADS_KEY and not raced:
            raced.append(key)
            assert remote.refresh_heads({"y": (b, token_b)})  # the other writer lands first
        return original(self, key, data, token=token)

    monkeypatch.setattr(FolderBackend, "write_if", racing)
    assert remote.refresh_heads({"x": (a, token_a)}) and raced
    assert heads.read_index(backend)[0] == {"x": (a, token_a), "y": (b, token_b)}
    writes = []
    monkeypatch.setattr(FolderBackend, "write_if", lambda self, key, data, *, token: writes.append(key))
    assert remote.refresh_heads({}) and writes == []  # right already: nothing written


def test_a_few_heads_of_a_remote_of_very_many_are_read_ref_by_ref(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer names than the listing would take pages (the index says how many models there
    are): a GET each, no listing; more: one listing and the index."""
    from mgit.remotes.folder import FolderBackend
    from mgit.remotes.repository import LIST_PAGE

    (tmp_path / "r").mkdir()
    backend = FolderBackend(tmp_path / "r", url=str(tmp_path / "r"))
    remote = RemoteRepository(backend)
    real = {f"m{i}": f"{i:x}".rjust(64, "a") for i in range(6)}
    known = {n: (v, backend.write_if(f"refs/models/{n}", f"{v}\n".encode(), token=None)) for n, v in real.items()}
    many = {f"x{i}": ("b" * 64, "t") for i in range(6 * LIST_PAGE)}  # (a lying count: refs not there)
    backend.write_if(heads.HEADS_KEY, heads.to_bytes({**known, **many}), token=None)
    seen = Requests(monkeypatch)
    assert {n: v for n, (v, _) in remote.heads(list(real)).items()} == real
    assert seen.of("list_tokens") == 0 and seen.of("read_versioned", under="refs/models") == 6
    backend.write_if(heads.HEADS_KEY, heads.to_bytes(known), token=heads.read_index(backend)[1])
    assert {n: v for n, (v, _) in remote.heads(list(real)).items()} == real
    assert seen.of("list_tokens") == 1 and seen.of("read_versioned", under="refs/models") == 6
