"""Sharing a repository: remotes on a folder, on S3 (moto's server), on GCS (gcp-storage-emulator)
and on Azure (Azurite), each emulator a real HTTP server process; push, fetch, pull, clone and
lazy clone. One contract class runs against every kind.

Round trips are compared by hash; what travels is counted (objects, bytes, write requests);
races are real processes pushing at once; kills are SIGKILL at named points; hostile remotes
are forged on disk or in the bucket.
"""

# ruff: noqa: F811

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from azurite import AzureContainer, OnAzure, azure_container, azurite_server, requires_azurite  # noqa: F401
from conftest import MGIT, OnFolder, copy_user_code, make_model, run_cli, sha256_tree, tensors
from gcsemulator import NO_PRECONDITIONS, GCSBucket, OnGCS, gcs_bucket, gcs_emulator  # noqa: F401
from s3server import FaultProxy, OnS3, S3Bucket, s3_bucket, s3_server  # noqa: F401

from mgit import Repo, sync
from mgit.checks import Checks, Condition
from mgit.errors import RemoteConflictError
from mgit.remotes import RemoteSpec, open_backend
from mgit.remotes.base import Backend
from mgit.remotes.repository import RemoteRepository
from mgit.store.base import ObjectStore


def finetune(seed: int, base_seed: int = 1, scale: float = 1e-3) -> dict[str, np.ndarray]:
    """A small change of `tensors(base_seed)`: stored as deltas against it."""
    rng = np.random.default_rng(seed)
    return {
        k: (v + rng.standard_normal(v.shape).astype(v.dtype) * np.float32(scale)) if v.dtype == np.float32 else v
        for k, v in tensors(base_seed, width=64).items()
    }


def add_family(repo: Repo, tmp: Path) -> dict[str, Path]:
    """base, ft (a fine-tune of base, with a tag and a recipe) and q (ft's int8-ish copy)."""
    folders = {
        "base": make_model(tmp / "src-base", state=tensors(1, width=64)),
        "ft": make_model(tmp / "src-ft", state=finetune(2)),
    }
    copy_user_code(repo.root, "tune", "recipes.py")
    repo.add(folders["base"], name="base", message="pretrained")
    repo.add(
        folders["ft"], name="ft", parent="base", tags={"task": "demo"}, recipe="recipes.py:tune", params={"scale": 2}
    )
    return folders


def mgit_cli(repo_root: Path, *args: str) -> tuple[int, str, str]:
    return run_cli("-C", str(repo_root), *args)


def one_line_error(result: tuple[int, str, str], *fragments: str) -> str:
    code, out, err = result
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, (f, err)
    return err


def objects_and_refs(repo: Repo) -> dict[str, Any]:
    """What a repository holds, to show that a failed fetch kept nothing."""
    files = sorted(
        p.relative_to(repo.dir).as_posix()
        for sub in ("objects", "refs")
        for p in (repo.dir / sub).rglob("*")
        if p.is_file()
    )
    return {"files": files, "heads": repo.refs.all()}


class Writes:
    """Counts write requests to any remote backend (monkeypatched on the classes)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: Counter[str] = Counter()
        from mgit.remotes.folder import FolderBackend

        classes: list[type[Backend]] = [FolderBackend]
        try:
            from mgit.remotes.s3 import S3Backend

            classes.append(S3Backend)
        except ImportError:  # pragma: no cover - boto3 is in the dev extras
            pass
        for module, name in (("mgit.remotes.objectstore", "ObjectStoreBackend"), ("mgit.remotes.gcs", "GCSBackend")):
            with contextlib.suppress(ImportError):  # (their clients are in the dev extras)
                classes.append(getattr(importlib.import_module(module), name))
        for cls in classes:
            for method in ("write", "write_if"):
                original = getattr(cls, method)
                monkeypatch.setattr(cls, method, self._counting(method, original))

    def _counting(self, name: str, original: Any) -> Any:
        def wrapper(backend: Backend, key: str, *args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            self.calls[key.split("/")[0]] += 1
            return original(backend, key, *args, **kwargs)

        return wrapper

    @property
    def total(self) -> int:
        return sum(self.calls[m] for m in ("write", "write_if"))


class SharingContract:
    """Subclasses supply `url` (a fresh remote's URL, laid out by `mgit init --bare`) and
    `damage(url, key, fn)` (rewrite a key's bytes on the remote).

    What runs on every kind of remote is what depends on the backend: round trips, what
    travels (listing, existence), conditional writes (races, refused pushes), ranged reads
    (lazy clones, blocks, packs), damage as each store returns it, kills and resumes. What
    the client alone decides (pull's rebase, recorded code, a closure, forged records, the
    remote commands) runs once, in TestFolderRemote."""

    @pytest.fixture
    def url(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def damage(self, url: str, key: str, fn: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    @pytest.fixture
    def alice(self, tmp_path: Path, url: str) -> Repo:
        repo = Repo.init(tmp_path / "alice")
        sync.add_remote(repo, "origin", url)
        return repo

    # --- round trips and what travels --------------------------------------------------------
    def test_push_then_clone_gives_every_version_back_bit_exact(self, alice: Repo, url: str, tmp_path: Path) -> None:
        folders = add_family(alice, tmp_path)
        alice.add(folders["ft"], name="ft", message="again", tags={"task": "demo2"})  # a second version
        pushed = sync.push(alice)
        assert {m.model: m.status for m in pushed.models} == {"base": "new", "ft": "new"}
        assert pushed.versions == 3 and pushed.sent.objects > 0
        clone = sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        assert clone.models == ["base", "ft"] and bob.refs.all() == alice.refs.all()
        # An empty repository had nothing already: what came in the packs was received.
        assert clone.fetch.received.skipped == 0 and clone.fetch.received.objects == len(list(bob.store.ids()))
        for ref in ("base", "ft@1", "ft@2"):
            bob.checkout(ref, tmp_path / "out" / ref)
        assert sha256_tree(tmp_path / "out" / "base") == sha256_tree(folders["base"])
        assert sha256_tree(tmp_path / "out" / "ft@1") == sha256_tree(folders["ft"])
        # Lineage, tags, recipes and messages arrive with the records.
        assert [(v.message, v.tags) for v in bob.log("ft")] == [(v.message, v.tags) for v in alice.log("ft")]
        assert bob.lineage.parents("ft")[0].parent == "base"
        assert bob.version("ft").recipe == alice.version("ft").recipe
        assert bob.fsck().ok
        report = sync.fsck_remote(url)
        assert report.ok and report.versions_checked == 3 and report.refs_checked == 2

    def test_only_what_is_missing_travels_and_a_no_op_push_writes_nothing(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        folders = add_family(alice, tmp_path)
        first = sync.push(alice, "origin", ["base"])
        ft_new = alice.info("ft").new_bytes
        second = sync.push(alice, "origin", ["ft"])
        # The fine-tune travels as its deltas (plus its records and a recipe source): about
        # what it added to the store, far from a full copy.
        assert second.sent.bytes <= ft_new + 4096 < first.sent.bytes
        writes = Writes(monkeypatch)
        again = sync.push(alice)
        assert writes.total == 0 and again.sent.objects == 0
        assert {m.status for m in again.models} == {"up-to-date"}
        code, out, err = mgit_cli(alice.root, "push", "--json")
        assert code == 0, err
        assert json.loads(out)["sent"] == {"objects": 0, "bytes": 0, "skipped": 0, "skipped_bytes": 0}
        assert writes.total == 0
        del folders

    def test_a_push_whose_remote_head_is_not_an_ancestor_is_refused_unless_forced(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        alice.add(tensors(7), name="ft", message="alice's")
        assert mgit_cli(alice.root, "push")[0] == 0
        bob.add(tensors(8), name="ft", message="bob's")
        one_line_error(mgit_cli(bob.root, "push"), "ft on origin has @2 that you do not have", "mgit pull")
        assert sync.remote_show(bob).models[1].state == "diverged"
        code, out, err = mgit_cli(bob.root, "push", "--force", "--json")
        assert code == 0, err
        [forced] = [m for m in json.loads(out)["models"] if m["model"] == "ft"]
        assert forced["status"] == "forced" and "drops 1 version of origin's history, up to @2" in forced["note"]

    def test_objects_coded_in_blocks_travel_and_check_out_bit_exact(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setattr(ObjectStore, "block_bytes", 64 << 10)  # so that small tensors have many blocks
        rng = np.random.default_rng(4)
        w = rng.standard_normal(150_000).astype(np.float32)
        folders = {
            "base": make_model(tmp_path / "b", state={"w": w}),
            "ft": make_model(tmp_path / "f", state={"w": w * np.float32(1.0001)}),
        }
        alice.add(folders["base"], name="base")
        alice.add(folders["ft"], name="ft", parent="base")
        ft_w = next(t.object for f in alice.manifest("ft").files for t in f.tensors)
        assert alice.store.header(ft_w).blocks == 64 << 10 and alice.store.header(ft_w).depth == 1
        sync.push(alice)
        assert sync.fsck_remote(url).ok
        bob = Repo(sync.clone(url, tmp_path / "bob").path)
        lazy = Repo(sync.clone(url, tmp_path / "lazy", lazy=True).path)
        for repo in (bob, lazy):
            for name, folder in folders.items():
                repo.checkout(name, tmp_path / repo.root.name / name)
                assert sha256_tree(tmp_path / repo.root.name / name) == sha256_tree(folder)
            assert repo.fsck().ok

    # --- lazy clones ---------------------------------------------------------------------------
    def test_a_lazy_clone_works_offline_and_fetches_exactly_what_it_reads(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        folders = add_family(alice, tmp_path)
        alice.add(make_model(tmp_path / "other", state=tensors(20, width=64)), name="other")
        sync.push(alice)
        clone = sync.clone(url, tmp_path / "lazy", lazy=True)
        lazy = Repo(tmp_path / "lazy")
        assert clone.lazy and lazy.lazy
        records = {
            o
            for v in lazy.chain(lazy.resolve("ft")) + [lazy.resolve("base"), lazy.resolve("other")]
            for o in {v} | lazy.store.get_version(v).linked_objects()
        }
        assert set(lazy.store.ids()) == records  # records only: no tensor, no file blob
        with self.offline(url, monkeypatch):
            for command in (
                ["ls"],
                ["log", "ft"],
                ["show", "ft"],
                ["lineage"],
                ["graph", "--json"],
                ["du"],
                ["lineage", "suggest", str(folders["ft"])],
            ):
                code, out, err = mgit_cli(lazy.root, *command)
                assert code == 0, (command, err)
            du = lazy.du()
            assert du.remote_only_bytes > 0 and du.local_bytes is not None
        before = set(lazy.store.ids())
        lazy.checkout("ft", tmp_path / "out")
        assert sha256_tree(tmp_path / "out") == sha256_tree(folders["ft"])
        fetched = set(lazy.store.ids()) - before
        needed = {o for o in alice.manifest("ft").object_ids()}
        stack = list(needed)
        while stack:
            for base in alice.store.header(stack.pop()).bases:
                needed.add(base)
                stack.append(base)
        assert fetched == needed - before  # exactly what it reads, with the bases
        assert alice.manifest("other").object_ids() - needed - before  # other's own objects: never fetched
        with self.offline(url, monkeypatch):
            lazy.checkout("ft", tmp_path / "again")  # what it fetched is kept
        assert lazy.fsck().ok and lazy.du().remote_only_bytes < du.remote_only_bytes

    def offline(self, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_fetch_objects_readies_a_lazy_clone_for_work_offline_and_clone_can_take_some_models(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        folders = add_family(alice, tmp_path)
        alice.add(make_model(tmp_path / "other", state=tensors(20, width=64)), name="other")
        sync.push(alice)
        lazy = Repo(sync.clone(url, tmp_path / "lazy", lazy=True).path)
        code, out, err = mgit_cli(lazy.root, "fetch", "--objects", "ft", "--json")
        assert code == 0 and json.loads(out)["objects"] > 0, err
        with self.offline(url, monkeypatch):
            lazy.checkout("ft", tmp_path / "out")
            # Not fetched, and the remote is out of reach: said as that, not as damage here.
            err = one_line_error(mgit_cli(lazy.root, "checkout", "other", "-o", str(tmp_path / "other-out")))
            assert re.search(
                r"object [0-9a-f]{16} \(used by other@1\) is not fetched yet, and the remote "
                r"\S+ cannot be reached: .+\. Nothing here is damaged",
                err,
            ), err
            assert "fsck" not in err and "restore" not in err
            assert lazy.fsck().ok
        assert sha256_tree(tmp_path / "out") == sha256_tree(folders["ft"])
        some = sync.clone(url, tmp_path / "some", models="f*")
        picked = Repo(some.path)
        assert some.models == ["ft"] and list(picked.refs.all()) == ["ft"]
        picked.checkout("ft", tmp_path / "out2")  # its base's tensors came along: ft is stored against them
        assert sha256_tree(tmp_path / "out2") == sha256_tree(folders["ft"]) and picked.fsck().ok
        own = (
            alice.manifest("other").object_ids()
            - alice.manifest("ft").object_ids()
            - alice.manifest("base").object_ids()
        )
        assert own and not any(picked.store.has(o) for o in own)  # the models not asked for stay there

    def test_a_lazy_clone_pushes_what_it_adds_and_fetches_nothing_more_to_do_it(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        lazy = Repo(sync.clone(url, tmp_path / "lazy", lazy=True).path)
        newer = make_model(tmp_path / "ft3", state=finetune(3))
        lazy.add(newer, name="ft", message="from the lazy clone")  # encoded against ft@1's tensors: fetched
        before = set(lazy.store.ids())
        pushed = sync.push(lazy)
        assert set(lazy.store.ids()) == before and pushed.models[1].status == "fast-forward"
        bob = Repo(sync.clone(url, tmp_path / "bob").path)
        bob.checkout("ft", tmp_path / "out")
        assert sha256_tree(tmp_path / "out") == sha256_tree(newer) and bob.fsck().ok

    # --- nothing from a remote is trusted -----------------------------------------------------
    @pytest.mark.parametrize("damage", ["flip", "truncate"])
    def test_a_damaged_object_is_refused_and_nothing_is_kept(
        self, alice: Repo, url: str, tmp_path: Path, damage: str
    ) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        victim = next(t.object for t in alice.manifest("ft").tensors())
        said = f"object {victim[:16]} from {url} is corrupt"
        remote = RemoteRepository(open_backend(RemoteSpec(url)))
        where = remote.packed().get(victim)
        remote.close()
        if where is None:  # a loose object
            fn = (lambda b: b[:-1] + bytes([b[-1] ^ 0xFF])) if damage == "flip" else (lambda b: b[: len(b) // 2])
            self.damage(url, f"objects/{victim[:2]}/{victim[2:]}", fn)
        elif damage == "flip":  # in a data pack: its last byte, taken out of the pack by a ranged read
            end = where[1] + where[2]
            self.damage(url, f"packs/{where[0]}.objpack", lambda b: b[: end - 1] + bytes([b[end - 1] ^ 0xFF]) + b[end:])
        else:  # its index entry cut to half its length: what comes out is the object truncated
            index = lambda b: json.dumps(  # noqa: E731
                {
                    **json.loads(b),
                    "objects": [[o, at, n // 2 if o == victim else n] for o, at, n in json.loads(b)["objects"]],
                }
            ).encode()
            self.damage(url, f"packs/{where[0]}.objidx", index)
        bob = Repo.init(tmp_path / "bob")
        sync.add_remote(bob, "origin", url)
        before = objects_and_refs(bob)
        if where is None or damage != "flip":
            one_line_error(mgit_cli(bob.root, "fetch"), said, "nothing was kept, the local repository is unchanged")
        else:  # a range that covers the whole pack is checked against the pack's name first
            err = one_line_error(mgit_cli(bob.root, "fetch"), "nothing was kept, the local repository is unchanged")
            assert said in err or (where[0][:16] in err and url in err), err
        assert objects_and_refs(bob) == before
        assert not (bob.dir / "incoming").exists() or not any((bob.dir / "incoming").iterdir())

    # --- races and kills ------------------------------------------------------------------------
    def test_two_pushes_of_one_model_at_once_land_exactly_one(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str]
    ) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        clones = []
        for who in ("bob", "carol"):
            sync.clone(url, tmp_path / who)
            repo = Repo(tmp_path / who)
            repo.add(tensors(len(clones) + 30), name="ft", message=who)
            clones.append(repo)
        procs = [
            subprocess.Popen(
                [*MGIT, "-C", str(r.root), "push"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
            )
            for r in clones
        ]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]  # type: ignore[union-attr]
        assert sorted(code for code, _ in results) == [0, 1], results
        loser = next(err for code, err in results if code == 1)
        assert loser.startswith("Error: ") and loser.count("\n") == 1, loser
        winner = clones[[code for code, _ in results].index(0)]
        assert sync.remote_show(winner).models[1].state == "same"
        assert sync.fsck_remote(url).ok

    def test_pushes_of_different_models_at_once_both_land(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str]
    ) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        repos = []
        for who, model in (("bob", "b-model"), ("carol", "c-model")):
            sync.clone(url, tmp_path / who)
            repo = Repo(tmp_path / who)
            repo.add(tensors(len(repos) + 40), name=model, parent="base")
            repos.append(repo)
        procs = [
            subprocess.Popen([*MGIT, "-C", str(r.root), "push"], stderr=subprocess.PIPE, text=True, env=env)
            for r in repos
        ]
        assert [p.wait(timeout=120) for p in procs] == [0, 0]
        fresh = sync.clone(url, tmp_path / "dave")
        assert fresh.models == ["b-model", "base", "c-model", "ft"] and Repo(tmp_path / "dave").fsck().ok

    @pytest.mark.parametrize("point", ["push-after-objects", "push-before-refs", "push-between-refs"])
    def test_a_killed_push_leaves_the_remote_consistent_and_resumes(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str], point: str
    ) -> None:
        add_family(alice, tmp_path)
        killed = subprocess.run(
            [*MGIT, "-C", str(alice.root), "push"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "MGIT_CRASH_AT": point},
        )
        assert killed.returncode == -signal.SIGKILL
        report = sync.fsck_remote(url)
        assert report.ok  # no ref names a missing object
        code, out, err = mgit_cli(alice.root, "push", "--json")  # the next run (here: no process to start)
        assert code == 0, err
        result = json.loads(out)
        assert result["sent"]["objects"] == 0 or point == "push-after-objects" and result["sent"]["skipped"] > 0
        sync.clone(url, tmp_path / "bob")
        assert Repo(tmp_path / "bob").refs.all() == alice.refs.all()

    @pytest.mark.parametrize(
        "point", ["fetch-after-download", "fetch-records-staged", "fetch-after-promote", "clone-before-heads"]
    )
    def test_a_killed_clone_leaves_it_consistent_and_resumes(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str], point: str
    ) -> None:
        folders = add_family(alice, tmp_path)
        sync.push(alice)
        target = tmp_path / "bob"
        killed = subprocess.run(
            [*MGIT, "clone", url, str(target)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "MGIT_CRASH_AT": point},
        )
        assert killed.returncode == -signal.SIGKILL
        assert Repo(target).fsck().ok and Repo(target).refs.all() == {}
        if point == "fetch-after-download":  # the quarantine is left, nothing of it kept; gc removes it
            assert any((target / ".mgit" / "incoming").iterdir())
            assert Repo(target).gc().leftovers == 1 and not any((target / ".mgit" / "incoming").iterdir())
        if point == "fetch-records-staged":  # records written beside their place, none renamed in: leftovers
            staged = Repo(target).store.temporary_files()
            assert staged and list(Repo(target).store.ids()) == []
            assert Repo(target).gc().leftovers == len(staged) + 1 and Repo(target).store.temporary_files() == []
        code, out, err = run_cli("clone", url, str(target), "--json")  # the next run (here: no process to start)
        assert code == 0, err
        bob = Repo(target)
        bob.checkout("ft", tmp_path / "out")
        assert sha256_tree(tmp_path / "out") == sha256_tree(folders["ft"]) and bob.fsck().ok
        if point == "fetch-after-promote":  # everything had arrived: nothing travels again
            assert json.loads(out)["fetch"]["received"]["objects"] == 0


def _evals(repo: Repo) -> str:
    copy_user_code(repo.root, "tune", "evals.py")
    return "evals.py:size"


class TestFolderRemote(OnFolder, SharingContract):
    """The contract on a folder, and the tests whose outcome the client alone decides, once:
    pull's rebase, recorded code run on a teammate's machine, a delta's base in the closure of
    a push, forged records refused, the remote commands. A remote reached through S3, GCS or
    Azure stores and lists the same keys for them (the contract shows it), so running them
    there again would test the same client code at four times the cost."""

    def damage(self, url: str, key: str, fn: Any) -> None:
        path = Path(url) / key
        data = path.read_bytes()
        path.chmod(0o644)
        path.write_bytes(fn(data))

    def offline(self, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        return _moved_away(Path(url))

    def test_a_folder_remote_is_a_bare_repository(self, alice: Repo, url: str, tmp_path: Path) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        code, out, err = run_cli("-C", url, "fsck", "--json")
        assert code == 0 and json.loads(out)["ok"], err
        code, out, _ = run_cli("fsck", url, "--json")
        assert code == 0 and json.loads(out)["versions_checked"] == 2
        bare = Repo(url)
        assert bare.bare and bare.refs.all() == alice.refs.all()

    def test_a_record_of_two_gigabytes_is_refused_before_reading_it(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        vid = alice.resolve("ft")
        path = Path(url) / "objects" / vid[:2] / vid[2:]
        path.chmod(0o644)
        with open(path, "r+b") as fh:
            fh.truncate(2 << 30)  # sparse: 2 GiB on paper
        shutil.rmtree(Path(url) / "packs")  # records are read one by one, as from a remote without packs
        bob = Repo.init(tmp_path / "bob")
        sync.add_remote(bob, "origin", url)
        one_line_error(mgit_cli(bob.root, "fetch"), f"objects/{vid[:2]}/{vid[2:]}", "2147483648 bytes")
        assert bob.refs.all() == {} and list(bob.store.ids()) == []

    def test_a_pack_whose_records_do_not_match_their_ids_is_refused(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        import base64

        import blake3
        import zstandard

        add_family(alice, tmp_path)
        sync.push(alice)
        [pack] = list((Path(url) / "packs").iterdir())
        body = json.loads(zstandard.ZstdDecompressor().decompress(pack.read_bytes()))
        vid = alice.resolve("ft")
        raw = bytearray(base64.b64decode(body["records"][vid]))
        raw[-1] ^= 1
        body["records"][vid] = base64.b64encode(bytes(raw)).decode()
        data = zstandard.ZstdCompressor(write_content_size=True).compress(json.dumps(body).encode())
        pack.unlink()
        (pack.parent / f"{blake3.blake3(data).hexdigest()}.mgpack").write_bytes(data)
        bob = Repo.init(tmp_path / "bob")
        sync.add_remote(bob, "origin", url)
        one_line_error(mgit_cli(bob.root, "fetch"), f"object {vid[:16]} from {url} is corrupt")
        assert bob.refs.all() == {} and list(bob.store.ids()) == []

    def test_init_bare_refuses_a_folder_in_use_and_urls_with_credentials(self, tmp_path: Path) -> None:
        (tmp_path / "used").mkdir()
        (tmp_path / "used" / "file").write_text("x")
        one_line_error(run_cli("init", "--bare", str(tmp_path / "used")), "exists and is not empty")
        repo = Repo.init(tmp_path / "r")
        err = one_line_error(
            mgit_cli(repo.root, "remote", "add", "o", "s3://AKIAXXX:secret@bucket/p"),
            "refusing a remote URL that holds credentials",
        )
        assert "secret" not in err and "AKIAXXX" not in err
        assert "secret" not in (repo.dir / "config.json").read_text()

    def test_a_delta_never_arrives_without_its_base(self, alice: Repo, url: str, tmp_path: Path) -> None:
        folders = add_family(alice, tmp_path)
        sync.push(alice, "origin", ["ft"])  # base (the model) is not pushed; its tensors are ft's bases
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        assert list(bob.refs.all()) == ["ft"]
        bob.checkout("ft", tmp_path / "out")
        assert sha256_tree(tmp_path / "out") == sha256_tree(folders["ft"])
        assert bob.fsck().ok and bob.lineage.node("base").removed  # the parent, known by its version

    def test_pull_replays_local_versions_after_the_remotes(self, alice: Repo, url: str, tmp_path: Path) -> None:
        add_family(alice, tmp_path)
        sync.push(alice)
        sync.clone(url, tmp_path / "bob")
        bob = Repo(tmp_path / "bob")
        alice.add(tensors(7), name="ft", message="alice's")
        sync.push(alice)
        bob.add(tensors(8), name="ft", message="bob's")
        bob.add(tensors(9), name="ft-child", parent="ft", relation="quantize")  # derived from bob's version
        Checks(bob).attach("ft", _evals(bob), name="size")
        Checks(bob).run(["ft"])
        one_line_error(mgit_cli(bob.root, "pull", "--ff-only"), "ft has versions here and on origin")
        code, out, err = mgit_cli(bob.root, "pull")
        assert code == 0, err
        assert "renumbered ft@2 -> ft@3" in out
        assert [v.message for v in bob.log("ft")] == ["bob's", "alice's", ""]
        assert bob.lineage.parents("ft-child")[0].parent_version == bob.resolve("ft")  # the link follows
        assert bob.lineage.parents("ft-child")[0].stale is False
        assert Checks(bob).recorded(bob.resolve("ft"), "size") is not None  # results follow their versions
        assert sync.push(bob).models[1].status == "fast-forward"
        alice_pull = sync.pull(alice)
        assert alice.refs.all() == bob.refs.all() and alice_pull.renumbered == []
        # Registrations and results recorded by bob arrive at alice's, saying where they were recorded.
        [outcome] = Checks(alice).show("ft")
        assert outcome.test == "size" and outcome.origin and outcome.status == "pass"

    def test_recipes_and_tests_run_from_their_recorded_source_on_a_teammates_machine(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        add_family(alice, tmp_path)
        Checks(alice).attach("ft", _evals(alice), name="size", conditions=[Condition("files", "min", 1)], inherit=True)
        alice.add(make_model(tmp_path / "base2", state=tensors(11, width=64)), name="base")
        sync.push(alice)
        sync.clone(url, tmp_path / "bob")  # bob has neither recipes.py nor evals.py
        bob = Repo(tmp_path / "bob")
        assert not (bob.root / "recipes.py").exists() and not (bob.root / "evals.py").exists()
        code, out, err = mgit_cli(bob.root, "cascade", "base", "--trust-remote-code")  # alice's code
        assert code == 0, err
        assert bob.version("ft").message.startswith("cascade from base@2")
        bob.checkout("ft", tmp_path / "out")
        assert json.loads((tmp_path / "out" / "config.json").read_text()) == {"scale": 2}  # the recipe ran
        result = Checks(bob).run(["ft"])
        assert result.outcomes[0].passed and "ran from the source recorded" in result.notes[0]

    def test_a_forged_manifest_path_and_a_ref_to_a_missing_version_are_refused(
        self, alice: Repo, url: str, tmp_path: Path
    ) -> None:
        from mgit.store.memory import MemoryStore
        from mgit.store.objects import FileEntry, Manifest, Version

        forged = MemoryStore()
        blob = forged.put_blob(b"pwned").oid
        bad = Manifest((FileEntry("../evil.txt", "blob", 5, "0" * 64, blob),)).to_json()
        manifest = forged.put_record("manifest", bad).oid
        vid = forged.put_record(
            "version", Version("evil", manifest, author="x", time="2024-01-01T00:00:00Z").to_json()
        ).oid
        backend = sync.connection.connect(alice, "origin").remote.backend
        for oid in (blob, manifest, vid):
            backend.write(f"objects/{oid[:2]}/{oid[2:]}", forged.read_record(oid))
        backend.write_if("refs/models/evil", f"{vid}\n".encode(), token=None)
        backend.write_if("refs/models/ghost", f"{'ab' * 32}\n".encode(), token=None)
        before = objects_and_refs(alice)
        err = one_line_error(mgit_cli(alice.root, "fetch", "--models", "evil"), "refusing path '../evil.txt'")
        assert manifest[:16] in err
        one_line_error(mgit_cli(alice.root, "fetch", "--models", "ghost"), "abababababababab", "missing")
        assert objects_and_refs(alice) == before and not (tmp_path / "evil.txt").exists()

    @pytest.mark.parametrize(
        "point", ["fetch-object-kept:1", "fetch-object-kept:4", "fetch-object-kept:6", "fetch-after-promote"]
    )
    def test_a_lazy_clone_killed_while_keeping_records_holds_no_version_without_its_history(
        self, alice: Repo, url: str, tmp_path: Path, env: dict[str, str], point: str
    ) -> None:
        """Killed after the nth record it verified was renamed into objects/ (records from
        metadata packs: written beside their place, synced, renamed in), or after all were:
        every record there is whole, every version there has its manifest and the versions it
        links to there (the next fetch walks back from the heads only to versions it lacks),
        fsck finds nothing wrong, and the next run completes the clone (with the catalog rows
        of the objects of the versions the killed run kept)."""
        folders = add_family(alice, tmp_path)
        alice.add(make_model(tmp_path / "src-ft2", state=tensors(7, width=64)), name="ft", message="again")
        sync.push(alice)
        target = tmp_path / "bob"
        killed = subprocess.run(
            [*MGIT, "clone", url, str(target), "--lazy"],
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "MGIT_CRASH_AT": point},
        )
        assert killed.returncode == -signal.SIGKILL, killed.stderr
        left = Repo(target)
        kept = set(left.store.ids())
        nth = point.partition(":")[2]
        assert (len(kept) == int(nth) if nth else len(kept) > 6) and left.refs.all() == {}
        for oid in kept:
            header = left.store.header(oid)
            if header.kind == "version":
                version = left.store.get_version(oid)  # (read whole: verified against its id)
                assert version.manifest in kept and set(version.linked_versions()) <= kept
            else:
                left.store.get(oid)
        assert left.fsck().ok
        code, out, err = run_cli("clone", url, str(target), "--lazy", "--json")
        assert code == 0, err
        bob = Repo(target)
        assert bob.refs.all() == alice.refs.all() and [v.id for v in bob.log("ft")] == [v.id for v in alice.log("ft")]
        bob.checkout("ft@1", tmp_path / "out")
        assert sha256_tree(tmp_path / "out") == sha256_tree(folders["ft"]) and bob.fsck().ok

    def test_remote_commands(self, alice: Repo, url: str, tmp_path: Path) -> None:
        code, out, _ = mgit_cli(alice.root, "remote", "ls", "--json")
        assert code == 0 and json.loads(out)[0]["name"] == "origin" and json.loads(out)[0]["url"] == url
        add_family(alice, tmp_path)
        mgit_cli(alice.root, "push", "origin", "base")
        code, out, _ = mgit_cli(alice.root, "remote", "show", "origin", "--json")
        states = {m["model"]: m["state"] for m in json.loads(out)["models"]}
        assert code == 0 and states == {"base": "same", "ft": "local only"}
        code, out, _ = mgit_cli(alice.root, "remote", "show")
        assert code == 0 and "local only" in out
        code, out, _ = mgit_cli(alice.root, "remote", "rm", "origin")
        assert code == 0 and "removed remote origin" in out
        one_line_error(mgit_cli(alice.root, "push"), "no remote named 'origin'", "mgit remote add")


class _moved_away:
    """A folder remote made unreachable for the length of a `with` block."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.aside = folder, folder.with_name(folder.name + ".away")

    def __enter__(self) -> None:
        shutil.move(self.folder, self.aside)

    def __exit__(self, *exc: object) -> None:
        shutil.move(self.aside, self.folder)


class TestS3Remote(OnS3, SharingContract):
    @pytest.fixture(autouse=True)
    def _bucket(self, s3_bucket: S3Bucket) -> None:
        self.bucket = s3_bucket

    def damage(self, url: str, key: str, fn: Any) -> None:
        client, name = self.bucket.client(), self.bucket.name
        full = f"team/models/{key}"
        data = client.get_object(Bucket=name, Key=full)["Body"].read()
        client.put_object(Bucket=name, Key=full, Body=fn(data))

    def offline(self, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        return _unreachable(monkeypatch)

    def test_init_bare_needs_an_existing_bucket(self, s3_bucket: S3Bucket, tmp_path: Path) -> None:
        one_line_error(run_cli("init", "--bare", "s3://no-such-bucket-here/x"), "no-such-bucket-here")
        client = s3_bucket.client()
        assert "no-such-bucket-here" not in [b["Name"] for b in client.list_buckets()["Buckets"]]
        code, out, err = run_cli("init", "--bare", f"{s3_bucket.url}/fresh", "--json")
        assert code == 0 and json.loads(out)["path"] == f"{s3_bucket.url}/fresh", err
        one_line_error(run_cli("init", "--bare", f"{s3_bucket.url}/fresh"), "already exists")

    def test_retries_ride_out_a_flaky_endpoint_and_give_up_in_one_line(
        self, alice: Repo, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        folders = add_family(alice, tmp_path)
        for i, mode in enumerate(("503", "500", "drop")):
            with FaultProxy(self.bucket.endpoint, every=3, mode=mode) as proxy:
                monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
                monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
                alice.add(tensors(50 + i), name="ft", message=mode)
                assert mgit_cli(alice.root, "push")[0] == 0
                assert proxy.faults > 0
        with FaultProxy(self.bucket.endpoint, every=1, mode="503") as proxy:
            monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
            monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.endpoint)
            monkeypatch.setenv("MGIT_S3_ATTEMPTS", "2")
            one_line_error(run_cli("clone", url, str(tmp_path / "bob")), "did not answer")
        monkeypatch.setenv("AWS_ENDPOINT_URL", self.bucket.endpoint)
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", self.bucket.endpoint)
        sync.clone(url, tmp_path / "carol")
        carol = Repo(tmp_path / "carol")
        assert [v.message for v in carol.log("ft")][:3] == ["drop", "500", "503"] and carol.fsck().ok
        del folders


@requires_azurite
class TestAzureRemote(OnAzure, SharingContract):
    def damage(self, url: str, key: str, fn: Any) -> None:
        from mgit.remotes.objectstore import ObjectStoreBackend

        backend = ObjectStoreBackend.azure(url)
        backend.write(key, fn(backend.read(key, limit=1 << 30)))

    def offline(self, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        return _azure_unreachable()

    def test_init_bare_needs_an_existing_container(self, azure_container: AzureContainer) -> None:
        one_line_error(run_cli("init", "--bare", "az://no-such-container-here/x"), "no-such-container-here")
        code, out, err = run_cli("init", "--bare", f"{azure_container.url}/fresh", "--json")
        assert code == 0 and json.loads(out)["path"] == f"{azure_container.url}/fresh", err
        one_line_error(run_cli("init", "--bare", f"{azure_container.url}/fresh"), "already exists")


@pytest.mark.skipif(
    not (importlib.util.find_spec("google.cloud.storage") and importlib.util.find_spec("gcp_storage_emulator")),
    reason="needs the gcs extra (google-cloud-storage) and gcp-storage-emulator",
)
class TestGCSRemote(OnGCS, SharingContract):
    def damage(self, url: str, key: str, fn: Any) -> None:
        from mgit.remotes.gcs import GCSBackend

        backend = GCSBackend(url)
        backend.write(key, fn(backend.read(key, limit=1 << 30)))

    def offline(self, url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
        return _gcs_unreachable()

    @pytest.mark.skip(reason=NO_PRECONDITIONS + ": whether both pushes land is timing, so the race proves nothing here")
    def test_two_pushes_of_one_model_at_once_land_exactly_one(self, alice, url, tmp_path, env) -> None:
        super().test_two_pushes_of_one_model_at_once_land_exactly_one(alice, url, tmp_path, env)

    def test_init_bare_needs_an_existing_bucket(self, gcs_bucket: GCSBucket) -> None:
        one_line_error(run_cli("init", "--bare", "gs://no-such-bucket-here/x"), "no-such-bucket-here")
        code, out, err = run_cli("init", "--bare", f"{gcs_bucket.url}/fresh", "--json")
        assert code == 0 and json.loads(out)["path"] == f"{gcs_bucket.url}/fresh", err

    @pytest.mark.xfail(reason=NO_PRECONDITIONS + ": a second init --bare lays config.json again", strict=True)
    def test_init_bare_refuses_a_remote_that_exists(self, gcs_bucket: GCSBucket) -> None:
        assert run_cli("init", "--bare", f"{gcs_bucket.url}/fresh")[0] == 0
        one_line_error(run_cli("init", "--bare", f"{gcs_bucket.url}/fresh"), "already exists")


class _gcs_unreachable:
    """The GCS emulator's address pointed at a port where nothing listens, for a `with` block."""

    NAMES = ("STORAGE_EMULATOR_HOST", "MGIT_REMOTE_RETRY_SECONDS")

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.NAMES}
        os.environ["STORAGE_EMULATOR_HOST"] = "http://127.0.0.1:9"
        os.environ["MGIT_REMOTE_RETRY_SECONDS"] = "0"

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _azure_unreachable:
    """Azure's endpoint pointed at a port where nothing listens, for a `with` block."""

    NAMES = ("AZURE_STORAGE_CONNECTION_STRING", "MGIT_REMOTE_RETRIES")

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in self.NAMES}
        os.environ["AZURE_STORAGE_CONNECTION_STRING"] = re.sub(
            r"BlobEndpoint=http://[^/]+", "BlobEndpoint=http://127.0.0.1:9", self.saved[self.NAMES[0]] or ""
        )
        os.environ["MGIT_REMOTE_RETRIES"] = "0"

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _unreachable:
    """The S3 endpoint pointed at a port where nothing listens, for a `with` block."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch

    def __enter__(self) -> None:
        self.saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "MGIT_S3_ATTEMPTS")}
        for key in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            os.environ[key] = "http://127.0.0.1:9"
        os.environ["MGIT_S3_ATTEMPTS"] = "1"

    def __exit__(self, *exc: object) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_remote_conflict_is_an_error_with_a_hint() -> None:
    exc = RemoteConflictError("s3://b/p", "refs/models/ft")
    assert "changed while it was being updated" in str(exc) and exc.hint


def test_a_fetch_of_some_models_then_of_the_rest_brings_every_object(tmp_path: Path) -> None:
    """A pack describes every version one push sent; a fetch of some models must not keep
    the records of the others without their objects (a later fetch took those versions for
    ones it had, and left their tensors behind)."""
    alice = Repo.init(tmp_path / "alice")
    alice.add(tensors(1), name="a")
    alice.add(finetune(2), name="b", parent="a")
    remote = tmp_path / "team.mgit"
    sync.init_bare(str(remote))
    sync.add_remote(alice, "origin", str(remote))
    sync.push(alice)  # one pack: the records of a and b
    sync.clone(str(remote), tmp_path / "bob", models="a")
    bob = Repo(tmp_path / "bob")
    assert set(bob.refs.all()) == {"a"}
    sync.pull(bob)
    assert bob.refs.all() == alice.refs.all()
    assert bob.fsck().ok
    assert bob.load_state_dict("b")["layer.0.weight"].tobytes() == finetune(2)["layer.0.weight"].tobytes()
