"""Decoded tensors kept for reuse: a delta base shared by several tensors is decoded once per
checkout or add, a session (`Repo.caching`) decodes a family's shared parent once, and the
budget, read-only sharing and verification hold under threads."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import sha256_tree

from mgit import Repo
from mgit.errors import CorruptObjectError
from mgit.store.cache import DecodedCache
from mgit.store.objectformat import ObjectHeader


def header(n: int) -> ObjectHeader:
    return ObjectHeader("tensor", {"dtype": "U8", "shape": [n]}, n, [])


def test_least_recently_used_goes_first_within_the_budget() -> None:
    cache = DecodedCache(300)
    for name in "abc":
        cache.put(name, (header(100), np.zeros(100, np.uint8)))
    assert cache.lookup("a") is not None  # a is now the most recent
    cache.put("d", (header(100), np.zeros(100, np.uint8)))
    assert cache.lookup("b") is None and cache.lookup("a") is not None and cache.lookup("d") is not None
    assert cache.nbytes == 300
    cache.put("huge", (header(200), np.zeros(200, np.uint8)))  # over half the budget: never kept
    assert cache.lookup("huge") is None and cache.nbytes == 300


def test_entries_are_read_only_and_records_are_not_kept() -> None:
    cache = DecodedCache(1 << 20)
    arr = np.ones(10, np.uint8)
    cache.put("t", (header(10), arr))
    with pytest.raises(ValueError, match="read-only"):
        cache.lookup("t")[1][0] = 5
    cache.put("m", (ObjectHeader("manifest", {}, 10, []), np.ones(10, np.uint8)))
    assert cache.lookup("m") is None


def test_threads_racing_on_one_cache_keep_it_within_budget() -> None:
    cache = DecodedCache(64 * 1000)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(2000):
                key = str(rng.integers(200))
                if cache.lookup(key) is None:
                    cache.put(key, (header(1000), np.full(1000, int(key) % 256, np.uint8)))
                found = cache.lookup(key)
                assert found is None or found[1][0] == int(key) % 256
                assert cache.nbytes <= cache.max_bytes
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.nbytes == sum(a.nbytes for _, a in cache._items.values()) <= cache.max_bytes


def count_reads(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    reads: Counter[str] = Counter()
    original = repo.store.read_record
    monkeypatch.setattr(repo.store, "read_record", lambda oid: reads.update([oid]) or original(oid))
    return reads


def int8_family(repo: Repo) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A float32 parent and its per-row int8 copy: each int8 weight and its scales are
    derived from the same parent tensor."""
    rng = np.random.default_rng(0)
    parent = {f"layer.{i}.weight": rng.standard_normal((64, 64)).astype(np.float32) for i in range(3)}
    child: dict[str, np.ndarray] = {}
    for name, w in parent.items():
        scale = (np.abs(w).max(axis=1) / np.float32(127)).astype(np.float32)
        child[name] = np.clip(np.rint(w / scale[:, None]), -127, 127).astype(np.int8)
        child[name + "_scale"] = scale
    repo.add(parent, name="base")
    repo.add(child, name="base-int8", parent=["base"], relation="quantize")
    return parent, child


def test_a_base_shared_by_two_tensors_is_decoded_once_per_checkout(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent, child = int8_family(repo)
    codecs = {
        t.name: repo.store.header(t.object).codec_names for f in repo.manifest("base-int8").files for t in f.tensors
    }
    assert all(c.startswith(("quantize_int8", "absmax_scale")) for c in codecs.values()), codecs
    reads = count_reads(repo, monkeypatch)
    repo.checkout("base-int8", tmp_path / "out")
    base_objects = {t.object for f in repo.manifest("base").files for t in f.tensors}
    assert {oid: reads[oid] for oid in base_objects} == dict.fromkeys(base_objects, 1)
    out = repo.load_state_dict("base-int8")
    assert all(np.array_equal(out[k], v) for k, v in child.items())


def test_a_session_decodes_a_shared_parent_once_and_gives_the_same_bytes(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    int8_family(repo)
    cold = {
        ref: sha256_tree(Path(repo.checkout(ref, tmp_path / f"cold-{ref}").out_dir)) for ref in ("base", "base-int8")
    }
    reads = count_reads(repo, monkeypatch)
    with repo.caching() as cache:
        warm = {
            ref: sha256_tree(Path(repo.checkout(ref, tmp_path / f"warm-{ref}").out_dir))
            for ref in ("base", "base-int8")
        }
        tensor_objects = {
            t.object for ref in ("base", "base-int8") for f in repo.manifest(ref).files for t in f.tensors
        }
        assert all(reads[oid] == 1 for oid in tensor_objects)  # the parent decoded once for both checkouts
        before = reads.copy()
        repo.checkout("base-int8", tmp_path / "again")
        assert all(reads[oid] == before[oid] for oid in tensor_objects)  # no tensor read again
        assert cache.hits > 0
        arrays = repo.load_state_dict("base")
        arrays["layer.0.weight"][0, 0] = 42.0  # a caller's copy: the cached tensor stays as it was
    assert warm == cold
    before = reads.copy()
    repo.checkout("base-int8", tmp_path / "after")  # the session is over: decoded again
    assert all(reads[oid] > before[oid] for oid in {t.object for f in repo.manifest("base").files for t in f.tensors})
    assert repo.load_state_dict("base")["layer.0.weight"][0, 0] != 42.0


def test_a_session_still_verifies_what_it_decodes(repo: Repo, tmp_path: Path) -> None:
    parent, _ = int8_family(repo)
    victim = next(t.object for f in repo.manifest("base").files for t in f.tensors)
    path = repo.store.path_of(victim)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.chmod(0o644)
    path.write_bytes(bytes(raw))
    with repo.caching(), pytest.raises(CorruptObjectError, match=victim[:12]):
        repo.checkout("base-int8", tmp_path / "out")


def test_threads_wanting_the_same_object_decode_it_once() -> None:
    cache = DecodedCache(1 << 20)
    calls: list[int] = []
    gate = threading.Event()

    def slow_decode() -> tuple[ObjectHeader, np.ndarray]:
        calls.append(1)
        gate.wait(5)
        return header(10), np.arange(10, dtype=np.uint8)

    results: list[np.ndarray] = []
    threads = [
        threading.Thread(target=lambda: results.append(cache.get_or_decode("x", slow_decode)[1])) for _ in range(4)
    ]
    for t in threads:
        t.start()
    while cache.misses + cache.hits < 4:  # every thread has asked (one decodes, three wait)
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(results) == 4 and all(r is results[0] for r in results)
    assert (cache.misses, cache.hits) == (1, 3)


def test_a_failed_decode_fails_every_waiter_and_is_not_kept() -> None:
    cache = DecodedCache(1 << 20)
    gate = threading.Event()

    def broken() -> tuple[ObjectHeader, np.ndarray]:
        gate.wait(5)
        raise CorruptObjectError("ab" * 32, "its content does not hash to its id")

    errors: list[BaseException] = []

    def ask() -> None:
        try:
            cache.get_or_decode("x", broken)
        except CorruptObjectError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    while cache.misses + cache.hits < 3:
        threading.Event().wait(0.01)
    gate.set()
    for t in threads:
        t.join()
    assert len(errors) == 3 and cache.lookup("x") is None
    assert cache.get_or_decode("x", lambda: (header(1), np.zeros(1, np.uint8)))[1].tolist() == [0]
