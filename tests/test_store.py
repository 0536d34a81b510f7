"""The object store contract, run against every backend: content addressing, deduplication,
verify-on-read, and clear errors for damaged or missing objects."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.store.base import ObjectStore
from mgit.store.local import LocalStore
from mgit.store.memory import MemoryStore
from mgit.store.objectformat import MAGIC, ObjectHeader
from mgit.store.objects import object_id, tensor_meta


class StoreContract:
    """Subclasses supply `store` and `damage(store, oid, fn)` (rewrite an object's record)."""

    def damage(self, store: ObjectStore, oid: str, fn) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def test_tensor_roundtrip_and_id(self, store: ObjectStore) -> None:
        data = np.arange(100, dtype=np.float32)
        res = store.put_tensor("F32", (10, 10), data.view(np.uint8))
        assert res.new and res.oid == object_id("tensor", tensor_meta("F32", (10, 10)), data.tobytes())
        header, out = store.get(res.oid)
        assert header.kind == "tensor" and header.meta == {"dtype": "F32", "shape": [10, 10]}
        assert out.tobytes() == data.tobytes()
        assert header.codec_names == "byteplanes+zstd"

    def test_identical_content_is_stored_once(self, store: ObjectStore) -> None:
        data = np.ones(1000, np.float32).view(np.uint8)
        first = store.put_tensor("F32", (1000,), data)
        second = store.put_tensor("F32", (1000,), data.copy())
        assert first.oid == second.oid and first.new and not second.new
        assert list(store.ids()).count(first.oid) == 1

    def test_same_bytes_other_shape_is_another_object(self, store: ObjectStore) -> None:
        data = np.ones(16, np.float32).view(np.uint8)
        assert store.put_tensor("F32", (16,), data).oid != store.put_tensor("F32", (4, 4), data).oid
        assert store.put_tensor("F32", (16,), data).oid != store.put_tensor("I32", (16,), data).oid

    def test_incompressible_data_is_kept_raw(self, store: ObjectStore) -> None:
        data = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
        res = store.put_blob(data)
        assert store.header(res.oid).codec_names == "raw"
        assert store.get(res.oid)[1].tobytes() == data.tobytes()

    def test_records(self, store: ObjectStore) -> None:
        res = store.put_record("manifest", {"b": 1, "a": [1, 2]})
        assert store.get_record(res.oid, "manifest") == {"a": [1, 2], "b": 1}
        with pytest.raises(CorruptObjectError, match="expected a version"):
            store.get_record(res.oid, "version")

    def test_missing_object(self, store: ObjectStore) -> None:
        with pytest.raises(MissingObjectError, match="missing"):
            store.get("ab" * 32)

    def test_flipped_payload_byte_is_detected(self, store: ObjectStore) -> None:
        data = np.random.default_rng(1).standard_normal(2000).astype(np.float32).view(np.uint8)
        oid = store.put_tensor("F32", (2000,), data).oid

        def flip(raw: bytes) -> bytes:
            b = bytearray(raw)
            b[-10] ^= 0x01
            return bytes(b)

        self.damage(store, oid, flip)
        with pytest.raises(CorruptObjectError, match=oid[:16]):
            store.get(oid)

    def test_raw_object_with_changed_content_is_detected(self, store: ObjectStore) -> None:
        data = np.random.default_rng(2).integers(0, 256, 512, dtype=np.uint8)
        oid = store.put_blob(data).oid
        self.damage(store, oid, lambda raw: raw[:-1] + bytes([raw[-1] ^ 0xFF]))
        with pytest.raises(CorruptObjectError, match="does not hash to its id"):
            store.get(oid)

    @pytest.mark.parametrize(
        ("mutate", "message"),
        [
            (lambda raw: b"NOTMGIT!" + raw[8:], "bad magic"),
            (lambda raw: raw[:8] + struct.pack("<I", 1 << 30) + raw[12:], "header length"),
            (lambda raw: raw[:12], "header length"),
            (lambda raw: raw[:12] + b"[" + raw[13:], "unreadable header"),
        ],
        ids=["magic", "huge-header", "truncated", "bad-json"],
    )
    def test_damaged_headers_are_detected(self, store: ObjectStore, mutate, message: str) -> None:
        oid = store.put_blob(b"config" * 100).oid
        self.damage(store, oid, mutate)
        with pytest.raises(CorruptObjectError, match=message):
            store.get(oid)

    def test_tensor_header_that_lies_about_size_is_detected(self, store: ObjectStore) -> None:
        oid = store.put_tensor("F32", (4,), np.zeros(4, np.float32).view(np.uint8)).oid

        def lie(raw: bytes) -> bytes:
            (n,) = struct.unpack("<I", raw[8:12])
            header = json.loads(raw[12 : 12 + n])
            header["meta"]["shape"] = [1 << 40]
            body = json.dumps(header).encode()
            return MAGIC + struct.pack("<I", len(body)) + body + raw[12 + n :]

        self.damage(store, oid, lie)
        with pytest.raises(CorruptObjectError, match="does not match its size"):
            store.get(oid)

    def test_unknown_codec_in_header(self, store: ObjectStore) -> None:
        oid = store.put_blob(b"x" * 1000).oid

        def swap(raw: bytes) -> bytes:
            return raw.replace(b'"name":"zstd"', b'"name":"zzzz"')

        self.damage(store, oid, swap)
        with pytest.raises(CorruptObjectError, match="unknown codec 'zzzz'"):
            store.get(oid)

    @pytest.mark.parametrize("chain", [[{"name": "zstd", "configuration": {"level": 1}}],
                                       [{"name": "pco", "configuration": {"dtype": "<u8", "level": 8}}],
                                       [{"name": "byteplanes", "configuration": {"itemsize": 8}}]])  # fmt: skip
    def test_a_declared_size_the_record_cannot_hold_is_refused_before_allocating(self, store: ObjectStore,
                                                                               chain: list) -> None:  # fmt: skip
        # A forged header claims 1 TiB behind a 64-byte payload: no codec expands 64 bytes that far.
        size = 1 << 40
        header = ObjectHeader("tensor", {"dtype": "U8", "shape": [size]}, size, chain)
        oid = "ab" * 32
        store.write_record(oid, [header.to_bytes(), b"\x00" * 64])
        with pytest.raises(CorruptObjectError, match="declares 1099511627776 bytes, more than its 64 stored bytes"):
            store.get(oid)

    def test_put_offers_no_way_to_store_content_under_an_unchecked_id(self, store: ObjectStore) -> None:
        import inspect

        assert not {"oid", "chain"} & set(inspect.signature(store.put).parameters)

    def test_delete_and_ids(self, store: ObjectStore) -> None:
        a = store.put_blob(b"a" * 10).oid
        b = store.put_blob(b"b" * 10).oid
        assert set(store.ids()) == {a, b}
        store.delete(a)
        assert set(store.ids()) == {b} and not store.has(a)


class TestLocalStore(StoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalStore:
        return LocalStore(tmp_path / "objects")

    def damage(self, store: LocalStore, oid: str, fn) -> None:
        path = store.path_of(oid)
        raw = path.read_bytes()
        path.chmod(0o644)
        path.write_bytes(fn(raw))

    def test_layout_and_read_only_files(self, store: LocalStore) -> None:
        oid = store.put_blob(b"hello").oid
        path = store.root / oid[:2] / oid[2:]
        assert path.is_file() and path.read_bytes().startswith(MAGIC)
        assert path.stat().st_mode & 0o222 == 0
        assert not store.temporary_files()

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

    def damage(self, store: MemoryStore, oid: str, fn) -> None:
        store.records[oid] = fn(store.records[oid])


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
