"""The object store contract as tests: content addressing, deduplication, verification on
read, and clear errors for damaged or missing objects, run against any `ObjectStore`.

A backend's tests subclass `StoreContract` and supply what only they can know:

    class TestFolderStore(StoreContract):
        @pytest.fixture
        def store(self, tmp_path: Path) -> FolderStore:
            return FolderStore(tmp_path / "objects")

        def damage(self, store: FolderStore, oid: str, fn: Damage) -> None:
            ...  # replace the stored record `raw` of `oid` with `fn(raw)`

A store that cannot do everything declares it, and the tests of what it cannot do are
skipped with the reason, never passed without running:

- `writable = False` (a read-only view: a remote's objects, a fetch's quarantine over a
  repository): the subclass also supplies `writer(store)`, the store behind it that the tests
  put their objects into; they are read back through the store under test. The tests of
  writing itself (ids of what is put, deduplication, delete) are skipped, and
  `test_a_store_writes_exactly_when_it_says_it_does` checks that a write really fails.
- `lists_ids = False` (a store that cannot list what it holds): the tests of `ids()` are
  skipped.
"""

from __future__ import annotations

import inspect
import json
import struct
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import numpy as np
import pytest

from mgit.errors import CorruptObjectError, MissingObjectError
from mgit.store.base import ObjectStore
from mgit.store.objectformat import MAGIC, ObjectHeader
from mgit.store.objects import object_id, tensor_meta

Damage = Callable[[bytes], bytes]
Test = TypeVar("Test", bound=Callable[..., Any])


def writes(test: Test) -> Test:
    """A test of writing itself: skipped for a store that declares `writable = False`."""
    test.store_needs = (*getattr(test, "store_needs", ()), "writable")  # type: ignore[attr-defined]
    return test


def lists(test: Test) -> Test:
    """A test of `ids()`: skipped for a store that declares `lists_ids = False`."""
    test.store_needs = (*getattr(test, "store_needs", ()), "lists_ids")  # type: ignore[attr-defined]
    return test


class StoreContract:
    """Subclasses supply the `store` fixture and `damage`; read-only stores also `writer`."""

    writable: ClassVar[bool] = True
    lists_ids: ClassVar[bool] = True

    @pytest.fixture
    def store(self) -> ObjectStore:  # pragma: no cover - supplied by each backend's tests
        raise NotImplementedError(f"{type(self).__name__} must supply a `store` fixture")

    def damage(self, store: ObjectStore, oid: str, fn: Damage) -> None:  # pragma: no cover - abstract
        """Replace the stored record `raw` of `oid` with `fn(raw)`, behind the store's back."""
        raise NotImplementedError(f"{type(self).__name__} must say how to damage a stored object")

    def writer(self, store: ObjectStore) -> ObjectStore:
        """The store the tests put their objects into: `store` itself, unless it is read-only."""
        if not self.writable:  # pragma: no cover - a read-only store's tests must say
            raise NotImplementedError(f"{type(self).__name__} is read-only: it must supply `writer`")
        return store

    @pytest.fixture(autouse=True)
    def _skip_what_the_store_cannot_do(self, request: pytest.FixtureRequest) -> None:
        for needs in getattr(request.function, "store_needs", ()):
            if not getattr(self, needs):
                pytest.skip(f"{type(self).__name__} declares {needs} = False")

    # --- writing ---------------------------------------------------------------------------
    @writes
    def test_identical_content_is_stored_once(self, store: ObjectStore) -> None:
        data = np.ones(1000, np.float32).view(np.uint8)
        first = store.put_tensor("F32", (1000,), data)
        second = store.put_tensor("F32", (1000,), data.copy())
        assert first.oid == second.oid and first.new and not second.new
        if self.lists_ids:
            assert list(store.ids()).count(first.oid) == 1

    @writes
    def test_same_bytes_other_shape_is_another_object(self, store: ObjectStore) -> None:
        data = np.ones(16, np.float32).view(np.uint8)
        assert store.put_tensor("F32", (16,), data).oid != store.put_tensor("F32", (4, 4), data).oid
        assert store.put_tensor("F32", (16,), data).oid != store.put_tensor("I32", (16,), data).oid

    @writes
    def test_delete(self, store: ObjectStore) -> None:
        a = store.put_blob(b"a" * 10).oid
        b = store.put_blob(b"b" * 10).oid
        store.delete(a)
        assert not store.has(a) and store.has(b)
        with pytest.raises(MissingObjectError):
            store.get(a)
        if self.lists_ids:
            assert set(store.ids()) == {b}

    def test_a_store_writes_exactly_when_it_says_it_does(self, store: ObjectStore) -> None:
        data = b"stored only where stores write" * 10
        if self.writable:
            assert store.has(store.put_blob(data).oid)
            return
        with pytest.raises(NotImplementedError):
            store.put_blob(data)
        assert not store.has(object_id("blob", {}, data))

    def test_put_offers_no_way_to_store_content_under_an_unchecked_id(self, store: ObjectStore) -> None:
        assert not {"oid", "chain"} & set(inspect.signature(store.put).parameters)

    # --- reading what was written ------------------------------------------------------------
    def test_tensor_roundtrip_and_id(self, store: ObjectStore) -> None:
        data = np.arange(100, dtype=np.float32)
        res = self.writer(store).put_tensor("F32", (10, 10), data.view(np.uint8))
        assert res.new and res.oid == object_id("tensor", tensor_meta("F32", (10, 10)), data.tobytes())
        assert store.has(res.oid)
        header, out = store.get(res.oid)
        assert header.kind == "tensor" and header.meta == {"dtype": "F32", "shape": [10, 10]}
        assert out.tobytes() == data.tobytes()
        assert header.codec_names == "byteplanes+zstd"

    def test_incompressible_data_is_kept_raw(self, store: ObjectStore) -> None:
        data = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8)
        res = self.writer(store).put_blob(data)
        assert store.header(res.oid).codec_names == "raw"
        assert store.get(res.oid)[1].tobytes() == data.tobytes()

    def test_records(self, store: ObjectStore) -> None:
        res = self.writer(store).put_record("manifest", {"b": 1, "a": [1, 2]})
        assert store.get_record(res.oid, "manifest") == {"a": [1, 2], "b": 1}
        with pytest.raises(CorruptObjectError, match="expected a version"):
            store.get_record(res.oid, "version")

    @lists
    def test_ids_lists_every_object_once(self, store: ObjectStore) -> None:
        put = self.writer(store)
        a, b = put.put_blob(b"a" * 10).oid, put.put_blob(b"b" * 10).oid
        assert sorted(store.ids()) == sorted({a, b})

    def test_missing_object(self, store: ObjectStore) -> None:
        assert not store.has("ab" * 32)
        with pytest.raises(MissingObjectError, match="missing"):
            store.get("ab" * 32)

    # --- damage is detected -----------------------------------------------------------------
    def test_flipped_payload_byte_is_detected(self, store: ObjectStore) -> None:
        data = np.random.default_rng(1).standard_normal(2000).astype(np.float32).view(np.uint8)
        oid = self.writer(store).put_tensor("F32", (2000,), data).oid

        def flip(raw: bytes) -> bytes:
            b = bytearray(raw)
            b[-10] ^= 0x01
            return bytes(b)

        self.damage(store, oid, flip)
        with pytest.raises(CorruptObjectError, match=oid[:16]):
            store.get(oid)

    def test_raw_object_with_changed_content_is_detected(self, store: ObjectStore) -> None:
        data = np.random.default_rng(2).integers(0, 256, 512, dtype=np.uint8)
        oid = self.writer(store).put_blob(data).oid
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
    def test_damaged_headers_are_detected(self, store: ObjectStore, mutate: Damage, message: str) -> None:
        oid = self.writer(store).put_blob(b"config" * 100).oid
        self.damage(store, oid, mutate)
        with pytest.raises(CorruptObjectError, match=message):
            store.get(oid)

    def test_tensor_header_that_lies_about_size_is_detected(self, store: ObjectStore) -> None:
        oid = self.writer(store).put_tensor("F32", (4,), np.zeros(4, np.float32).view(np.uint8)).oid

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
        oid = self.writer(store).put_blob(b"x" * 1000).oid
        self.damage(store, oid, lambda raw: raw.replace(b'"name":"zstd"', b'"name":"zzzz"'))
        with pytest.raises(CorruptObjectError, match="unknown codec 'zzzz'"):
            store.get(oid)

    @pytest.mark.parametrize(
        "chain",
        [
            [{"name": "zstd", "configuration": {"level": 1}}],
            [{"name": "pco", "configuration": {"dtype": "<u8", "level": 8}}],
            [{"name": "byteplanes", "configuration": {"itemsize": 8}}],
        ],
    )
    def test_a_declared_size_the_record_cannot_hold_is_refused_before_allocating(
        self, store: ObjectStore, chain: list[dict[str, Any]]
    ) -> None:
        # A forged header claims 1 TiB behind a 64-byte payload: no codec expands 64 bytes that far.
        size = 1 << 40
        header = ObjectHeader("tensor", {"dtype": "U8", "shape": [size]}, size, chain)
        oid = "ab" * 32
        self.writer(store).write_record(oid, [header.to_bytes(), b"\x00" * 64])
        with pytest.raises(CorruptObjectError, match="declares 1099511627776 bytes, more than its 64 stored bytes"):
            store.get(oid)
