"""The object store contract (mgit.testing.store) run against every backend: files, memory,
a lazy clone's store over a folder remote, a fetch's quarantine over a repository's store,
and a remote's objects read through the contract; and what only one backend does."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from mgit.errors import CorruptObjectError, ReceivedCorruptError
from mgit.index.catalog import Catalog
from mgit.remotes.folder import FolderBackend
from mgit.remotes.repository import RemoteRepository
from mgit.store.base import ObjectStore
from mgit.store.lazy import LazyStore
from mgit.store.local import LocalStore
from mgit.store.memory import MemoryStore
from mgit.store.objectformat import MAGIC
from mgit.store.overlay import OverlayStore
from mgit.store.remote import RemoteStore
from mgit.testing.store import Damage, StoreContract


def rewrite(store: LocalStore, oid: str, fn: Damage) -> None:
    """Replace an object file's bytes `raw` with `fn(raw)` (object files are read-only)."""
    path = store.path_of(oid)
    raw = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(fn(raw))


@pytest.fixture
def folder_remote(tmp_path: Path) -> Iterator[RemoteRepository]:
    """An empty bare repository in a folder, reached as a remote."""
    (tmp_path / "remote.mgit").mkdir()
    remote = RemoteRepository(FolderBackend(tmp_path / "remote.mgit"))
    remote.init_bare()
    yield remote
    remote.close()


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalStore:
        return LocalStore(tmp_path / "objects")

    def damage(self, store: ObjectStore, oid: str, fn: Damage) -> None:
        assert isinstance(store, LocalStore)
        rewrite(store, oid, fn)

    def test_layout_and_read_only_files(self, store: LocalStore) -> None:
        oid = store.put_blob(b"hello").oid
        path = store.root / oid[:2] / oid[2:]
        assert path.is_file() and path.read_bytes().startswith(MAGIC)
        assert path.stat().st_mode & 0o222 == 0
        assert not store.temporary_files()

    def test_staged_records_are_invisible_until_placed_and_survive_a_removed_folder(
        self, store: LocalStore, tmp_path: Path
    ) -> None:
        """`stage` writes a fetch's verified records beside their place, read-only, under
        temporary names (leftovers gc removes, never objects); `place` renames them in. A
        fan-out folder removed after the store saw it is made again."""
        source = LocalStore(tmp_path / "elsewhere")
        oids = [source.put_blob(f"record {i}".encode()).oid for i in range(3)]
        raw = {o: source.read_bytes(o) for o in oids}
        staged = store.stage({oids[0]: raw[oids[0]]})
        assert not store.has(oids[0]) and list(store.ids()) == [] and len(store.temporary_files()) == 1
        store.place(oids[0], staged[0])
        store.sync()
        assert store.has(oids[0])
        store.delete(oids[0])
        (store.root / oids[0][:2]).rmdir()  # (gone behind the store's back)
        for oid, tmp in zip(oids, store.stage(raw), strict=True):
            store.place(oid, tmp)
        assert sorted(store.ids()) == sorted(oids) and not store.temporary_files()
        assert [bytes(store.get(o)[1]) for o in oids] == [f"record {i}".encode() for i in range(3)]
        assert all(store.path_of(o).stat().st_mode & 0o222 == 0 for o in oids)

    def test_header_reads_only_the_header(self, store: LocalStore) -> None:
        oid = store.put_tensor("F32", (1000,), np.zeros(1000, np.float32).view(np.uint8)).oid
        path = store.path_of(oid)
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:-5])  # payload cut: get() fails, header() does not
        assert store.header(oid).size == 4000
        with pytest.raises(CorruptObjectError):
            store.get(oid)


class TestMemoryStore(StoreContract):
    @pytest.fixture
    def store(self) -> MemoryStore:
        return MemoryStore()

    def damage(self, store: ObjectStore, oid: str, fn: Damage) -> None:
        assert isinstance(store, MemoryStore)
        store.records[oid] = fn(store.records[oid])


class RemoteRows:
    """The rows a clone's catalog keeps of its remote's objects (`mgit.store.lazy.ObjectIndex`),
    read from the remote's own files."""

    def __init__(self, there: LocalStore) -> None:
        self.there = there

    def sizes_and_bases(self, oids: Iterable[str]) -> dict[str, tuple[int, tuple[str, ...]]]:
        return {o: (self.there.header(o).size, tuple(self.there.header(o).bases)) for o in oids if self.there.has(o)}

    def index_objects(self, store: ObjectStore, oids: Iterable[str]) -> None:
        pass


class TestLazyStore(StoreContract):
    """A lazy clone's store: what is written or fetched lives in its folder, like any
    repository's; what it lacks comes from its remote when first read."""

    @pytest.fixture
    def store(self, tmp_path: Path, folder_remote: RemoteRepository) -> LazyStore:
        (tmp_path / "clone").mkdir(exist_ok=True)
        index = Catalog(tmp_path / "clone" / "catalog.sqlite")  # the clone's own: rows of what it knows
        return LazyStore(tmp_path / "clone" / "objects", remote=lambda: folder_remote, index=index, fsync=False)

    def damage(self, store: ObjectStore, oid: str, fn: Damage) -> None:
        assert isinstance(store, LazyStore)
        rewrite(store, oid, fn)

    @staticmethod
    def on_remote(store: LazyStore, remote: RemoteRepository, root: Path) -> LocalStore:
        """The remote's objects as a store to put into (a folder remote keeps object files as
        a repository does), and the lazy store told what the remote holds (its catalog's rows,
        in a clone)."""
        there = LocalStore(root / "objects", fsync=False)
        store.index = RemoteRows(there)
        return there

    def test_an_object_only_on_the_remote_is_fetched_when_read_and_kept(
        self, store: LazyStore, folder_remote: RemoteRepository, tmp_path: Path
    ) -> None:
        there = self.on_remote(store, folder_remote, tmp_path / "remote.mgit")
        data = np.random.default_rng(3).standard_normal(500).astype(np.float32)
        oid = there.put_tensor("F32", (500,), data.view(np.uint8)).oid
        assert not store.has(oid) and store.promised(oid) == ()
        assert store.get(oid)[1].tobytes() == data.tobytes()
        assert store.has(oid) and store.fetched.objects == 1
        assert store.get(oid)[1].tobytes() == data.tobytes() and store.fetched.objects == 1  # kept: not again

    def test_an_object_damaged_on_the_remote_is_refused_and_not_kept(
        self, store: LazyStore, folder_remote: RemoteRepository, tmp_path: Path
    ) -> None:
        there = self.on_remote(store, folder_remote, tmp_path / "remote.mgit")
        oid = there.put_blob(np.random.default_rng(4).integers(0, 256, 512, dtype=np.uint8)).oid
        rewrite(there, oid, lambda raw: raw[:-1] + bytes([raw[-1] ^ 0xFF]))
        with pytest.raises(ReceivedCorruptError, match="does not hash to its id"):
            store.get(oid)
        assert not store.has(oid)


class TestOverlayStore(StoreContract):
    """A fetch's view: the quarantine first, then the repository's store; it writes nothing
    (a fetch writes into the quarantine) and lists nothing (a fetch knows what arrived)."""

    writable = False
    lists_ids = False

    @pytest.fixture
    def store(self, tmp_path: Path) -> OverlayStore:
        return OverlayStore(LocalStore(tmp_path / "incoming", fsync=False), LocalStore(tmp_path / "objects"))

    def writer(self, store: ObjectStore) -> ObjectStore:
        assert isinstance(store, OverlayStore)
        return store.quarantine

    def damage(self, store: ObjectStore, oid: str, fn: Damage) -> None:
        assert isinstance(store, OverlayStore)
        rewrite(store.quarantine, oid, fn)

    def test_a_delta_in_the_quarantine_reads_its_base_from_the_repository(self, store: OverlayStore) -> None:
        rng = np.random.default_rng(5)
        base = rng.standard_normal(4096).astype(np.float32)
        tuned = base + rng.standard_normal(4096).astype(np.float32) * np.float32(1e-3)
        base_oid = store.store.put_tensor("F32", (4096,), base.view(np.uint8)).oid
        tuned_oid = store.store.put_tensor("F32", (4096,), tuned.view(np.uint8), bases=[base_oid]).oid
        store.quarantine.write_record(tuned_oid, [store.store.read_bytes(tuned_oid)])  # as if it arrived
        store.store.delete(tuned_oid)
        assert store.header(tuned_oid).bases == [base_oid] and not store.quarantine.has(base_oid)
        assert store.get(tuned_oid)[1].tobytes() == tuned.tobytes()
        assert store.decoded == {tuned_oid, base_oid}  # both were read to be decoded, and so verified


class TestRemoteStore(StoreContract):
    """A remote's objects through the contract (what fsck of a remote reads): read-only."""

    writable = False

    @pytest.fixture
    def store(self, folder_remote: RemoteRepository) -> RemoteStore:
        return RemoteStore(folder_remote)

    def writer(self, store: ObjectStore) -> ObjectStore:
        assert isinstance(store, RemoteStore) and isinstance(store.remote, RemoteRepository)
        backend = store.remote.backend
        assert isinstance(backend, FolderBackend)
        return LocalStore(backend.root / "objects", fsync=False)  # a folder remote's object files

    def damage(self, store: ObjectStore, oid: str, fn: Damage) -> None:
        writer = self.writer(store)
        assert isinstance(writer, LocalStore)
        rewrite(writer, oid, fn)


# --- records: what a manifest may hold ------------------------------------------------------------
@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a\\b", "./x", "a//b", "x\x00", ""])
def test_a_manifest_path_that_could_escape_is_refused_when_read(path: str) -> None:
    from mgit.store.objects import FileEntry, RecordError

    entry = {"path": path, "type": "blob", "size": 1, "digest": "0" * 64, "object": "1" * 64}
    with pytest.raises(RecordError, match="refusing path"):
        FileEntry.from_json(entry)
    assert FileEntry.from_json({**entry, "path": "sub/ok.txt"}).path == "sub/ok.txt"


def test_a_manifest_listing_a_file_twice_is_refused() -> None:
    from mgit.store.objects import Manifest, RecordError

    entry = {"path": "a.txt", "type": "blob", "size": 1, "digest": "0" * 64, "object": "1" * 64}
    with pytest.raises(RecordError, match="listed twice"):
        Manifest.from_json({"format": 1, "files": [entry, entry]})


def test_a_forged_manifest_path_is_a_corrupt_object_on_read() -> None:
    from mgit.store.objects import FileEntry, Manifest

    store = MemoryStore()
    bad = FileEntry("../evil", "blob", 1, "0" * 64, "1" * 64)
    oid = store.put_record("manifest", Manifest((bad,)).to_json()).oid
    with pytest.raises(CorruptObjectError, match="refusing path '../evil'"):
        store.get_manifest(oid)
