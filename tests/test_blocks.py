"""Content coded in independent blocks (docs/format.md, "Blocks"): large tensors are stored as
frames of blocks, each decoding from the same blocks of its bases, so add and checkout work
a block at a time in parallel; objects coded whole stay readable and usable as bases;
forged block layouts are refused; a failure while blocks are written leaves nothing behind.

Most tests lower the store's block size to 64 KiB so that small tensors have many blocks;
the end-to-end ones through the CLI use tensors over the real 4 MiB."""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_cli, sha256_tree

from mgit import Repo
from mgit.errors import CorruptObjectError, StorageFullError
from mgit.store.base import ObjectStore
from mgit.store.cache import DecodedCache
from mgit.store.local import LocalStore
from mgit.store.memory import MemoryStore
from mgit.store.objectformat import BLOCK_BYTES, FRAME, MAGIC, PREFIX

SMALL = 64 << 10


@pytest.fixture
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(ObjectStore, "block_bytes", SMALL)
    return SMALL


def generations(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    """float32 weights and `n` - 1 fine-tunes, each its predecessor plus 0.1% noise."""
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal(size).astype(np.float32)]
    for _ in range(n - 1):
        out.append((out[-1] * (1 + rng.standard_normal(size).astype(np.float32) * np.float32(1e-3))).astype(np.float32))
    return out


def as_bytes(a: np.ndarray) -> np.ndarray:
    return a.reshape(-1).view(np.uint8)


@pytest.mark.parametrize("kind", ["local", "memory"])
def test_a_chain_of_blocked_deltas_reads_back_exactly_whole_and_block_by_block(
    tmp_path: Path, small_blocks: int, kind: str
) -> None:
    store = LocalStore(tmp_path / "objects") if kind == "local" else MemoryStore()
    size = 300_001  # not a whole number of blocks
    values = generations(3, size)
    oids: list[str] = []
    for v in values:
        oids.append(store.put_tensor("F32", (size,), as_bytes(v), bases=oids[-1:]).oid)
    headers = [store.header(o) for o in oids]
    assert [h.blocks for h in headers] == [SMALL] * 3
    assert [h.depth for h in headers] == [0, 1, 2]
    assert [h.codec_names.split("+")[0] for h in headers] == ["byteplanes", "sub_delta", "sub_delta"]
    assert headers[0].block_count == -(-size * 4 // SMALL) == 19
    for oid, v in zip(oids, values, strict=True):
        assert np.array_equal(store.get(oid)[1], as_bytes(v))
        for k in range(store.header(oid).block_count):
            start, stop = store.header(oid).block_span(k)
            assert np.array_equal(store.decode_block(oid, k), as_bytes(v)[start:stop]), k


def test_in_blocks_of_the_real_size_an_object_costs_what_it_costs_coded_whole() -> None:
    size = 3 * BLOCK_BYTES // 4 + 1000  # float32 values: three blocks and a bit
    values = generations(3, size, seed=1)
    stores = {"blocks": MemoryStore(), "whole": MemoryStore()}
    stores["whole"].block_bytes = 1 << 40
    stored: dict[str, list[int]] = {}
    for label, store in stores.items():
        oids: list[str] = []
        for v in values:
            oids.append(store.put_tensor("F32", (size,), as_bytes(v), bases=oids[-1:]).oid)
        assert [store.header(o).blocks for o in oids] == ([BLOCK_BYTES] * 3 if label == "blocks" else [0] * 3)
        stored[label] = [store.stored_size(o) for o in oids]
    for blocked, whole in zip(stored["blocks"], stored["whole"], strict=True):
        assert blocked <= whole * 1.002


class Tracking(MemoryStore):
    """A store that wants to know which bases a verified decode verified on the way (as a
    fetch's overlay does, so that it does not decode them again)."""

    tracks_verified = True

    def __init__(self) -> None:
        super().__init__()
        self.marked: list[str] = []

    def mark_verified(self, oid: str) -> None:
        self.marked.append(oid)


def test_a_verified_decode_of_a_delta_verifies_its_blocked_bases_on_the_way(small_blocks: int) -> None:
    store = Tracking()
    values = generations(3, 200_000, seed=4)
    oids: list[str] = []
    for v in values:
        oids.append(store.put_tensor("F32", (200_000,), as_bytes(v), bases=oids[-1:]).oid)
    store.get(oids[2])
    assert sorted(store.marked) == sorted(oids[:2])  # both links of the chain, each hashed as it passed
    store.marked.clear()
    store.get(oids[2], verify=False)
    assert store.marked == []  # nothing is vouched for by a decode that was not verified
    # A delta shorter than its base covers only part of it: the base is not vouched for.
    short = store.put_tensor("F32", (150_000,), as_bytes(values[1][:150_000]), bases=[oids[0]]).oid
    assert store.header(short).codec_names.startswith(("sub_delta", "xor_delta"))
    store.get(short)
    assert store.marked == []


def test_a_damaged_base_is_not_vouched_for_by_its_delta(small_blocks: int) -> None:
    store = Tracking()
    values = generations(2, 200_000, seed=4)
    base = store.put_tensor("F32", (200_000,), as_bytes(values[0])).oid
    ft = store.put_tensor("F32", (200_000,), as_bytes(values[1]), bases=[base]).oid
    raw = bytearray(store.records[base])
    table = store.block_table(base)
    at, n = table.spans[1]
    raw[table.start + at + n // 2] ^= 0x5A  # inside block 1's zstd data
    store.records[base] = bytes(raw)
    store.forget(base)
    with pytest.raises(CorruptObjectError):
        store.get(ft)
    assert store.marked == []


def test_a_block_of_a_delta_reads_only_that_block_of_it_and_of_its_bases(
    tmp_path: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "objects")
    values = generations(3, 200_000)
    oids: list[str] = []
    for v in values:
        oids.append(store.put_tensor("F32", (200_000,), as_bytes(v), bases=oids[-1:]).oid)
    store.block_table(oids[0]), store.block_table(oids[1]), store.block_table(oids[2])  # layouts read once
    reads: list[tuple[str, int]] = []
    whole: list[str] = []
    real_range, real_record = LocalStore.read_range, LocalStore.read_record
    monkeypatch.setattr(
        LocalStore, "read_range", lambda s, o, at, n: (reads.append((o, n)), real_range(s, o, at, n))[1]
    )
    monkeypatch.setattr(LocalStore, "read_record", lambda s, o: (whole.append(o), real_record(s, o))[1])
    block = store.decode_block(oids[2], 5)
    assert np.array_equal(block, as_bytes(values[2])[5 * SMALL : 6 * SMALL])
    assert whole == []
    assert [o for o, _ in reads] == [oids[2], oids[1], oids[0]]  # one read of one frame each
    assert all(n == store.block_table(o).spans[5][1] for o, n in reads)


def test_objects_coded_whole_stay_readable_and_are_bases_for_blocked_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path / "objects")
    values = generations(3, 100_000, seed=3)
    monkeypatch.setattr(ObjectStore, "block_bytes", 1 << 30)  # as written before blocks: whole
    old = store.put_tensor("F32", (100_000,), as_bytes(values[0])).oid
    assert store.header(old).blocks == 0
    monkeypatch.setattr(ObjectStore, "block_bytes", SMALL)
    new = store.put_tensor("F32", (100_000,), as_bytes(values[1]), bases=[old]).oid  # blocked, on a whole base
    monkeypatch.setattr(ObjectStore, "block_bytes", 2 * SMALL)  # another block size: bases decoded whole
    other = store.put_tensor("F32", (100_000,), as_bytes(values[2]), bases=[new]).oid
    assert [store.header(o).blocks for o in (new, other)] == [SMALL, 2 * SMALL]
    assert [store.header(o).codec_names.split("+")[0] for o in (new, other)] == ["sub_delta", "sub_delta"]
    fresh = LocalStore(tmp_path / "objects")  # nothing cached
    for oid, v in zip((old, new, other), values, strict=True):
        assert np.array_equal(fresh.get(oid)[1], as_bytes(v))
    assert np.array_equal(fresh.decode_block(other, 1), as_bytes(values[2])[2 * SMALL : 4 * SMALL])


def family_folders(tmp_path: Path, *, big: int) -> dict[str, Path]:
    """base, ft and ft2 model folders: a float32 matrix of `big` values, a float16 one of an
    odd size, small tensors under a block, all fine-tuned in turn."""
    f32 = generations(3, big, seed=5)
    half = [(v[: big // 2 + 1] * 0.5).astype(np.float16) for v in generations(3, big, seed=6)]
    folders = {}
    for i, name in enumerate(("base", "ft", "ft2")):
        state = {
            "w.weight": f32[i].reshape(-1, 1),
            "emb.weight": half[i],
            "bias": f32[i][:64].copy(),
            "ids": np.arange(100, dtype=np.int64),
        }
        folders[name] = make_model(tmp_path / name, state=state)
    return folders


def test_a_blocked_family_checks_out_bit_exact_and_checks_clean(tmp_path: Path, small_blocks: int) -> None:
    folders = family_folders(tmp_path, big=400_000)
    repo = Repo.init(tmp_path / "repo")
    repo.add(folders["base"], name="base")
    repo.add(folders["ft"], name="ft", parent="base")
    repo.add(folders["ft2"], name="ft2", parent="ft")
    manifest = repo.manifest("ft2")
    deepest = {t.name: repo.store.header(t.object) for f in manifest.files for t in f.tensors}
    assert deepest["w.weight"].blocks == SMALL and deepest["w.weight"].depth == 2
    assert deepest["bias"].blocks == 0  # under a block: coded whole, as before
    for name, folder in folders.items():
        out = repo.checkout(name, tmp_path / "out" / name).out_dir
        assert sha256_tree(Path(out)) == sha256_tree(folder)
    usage = {m.name: m for m in repo.du().models}
    assert usage["ft"].stored_bytes < usage["base"].stored_bytes / 2
    assert repo.fsck().ok
    state = repo.load_state_dict("ft2")
    assert np.array_equal(state["w.weight"].reshape(-1), generations(3, 400_000, seed=5)[2])


def test_a_large_file_that_is_not_safetensors_is_coded_in_blocks_too(tmp_path: Path, small_blocks: int) -> None:
    folder = make_model(tmp_path / "m", state={"w": np.zeros(10, np.float32)})
    rng = np.random.default_rng(2)
    (folder / "model.gguf").write_bytes(rng.integers(0, 16, 700_001, dtype=np.uint8).tobytes())  # compressible
    repo = Repo.init(tmp_path / "repo")
    repo.add(folder, name="m")
    entry = next(f for f in repo.manifest("m").files if f.path == "model.gguf")
    header = repo.store.header(entry.object)
    assert header.kind == "blob" and header.blocks == SMALL and header.block_count == 11
    assert repo.store.stored_size(entry.object) < 700_001 * 0.6
    assert sha256_tree(Path(repo.checkout("m", tmp_path / "out").out_dir)) == sha256_tree(folder)


def test_add_hashes_each_tensor_once_whatever_path_it_takes(
    tmp_path: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large tensors are hashed in file order before their chain is chosen; whether they are
    then coded in blocks as written or coded first (a cast from a float32 parent, measured
    whole), the writer must not hash them again."""
    import mgit.repo.ingest
    import mgit.store.objects
    import mgit.store.writer

    rng = np.random.default_rng(6)
    w = rng.standard_normal(200_000).astype(np.float32)
    base = make_model(tmp_path / "base", state={"w": w, "v": w[::-1].copy(), "b": w[:8].copy()})
    child = make_model(
        tmp_path / "child", state={"w": w.astype(np.float16), "v": w[::-1] * np.float32(1.001), "b": w[:8].copy()}
    )
    repo = Repo.init(tmp_path / "repo")
    repo.add(base, name="base")
    hashed: list[str] = []
    real = mgit.store.objects.object_hasher

    def counting(kind: str, meta: dict) -> object:
        if kind == "tensor" and sys._getframe(1).f_code.co_name in ("put", "prepare"):  # writers, not readers
            hashed.append(f"{meta['dtype']}{meta['shape']}")
        return real(kind, meta)

    monkeypatch.setattr(mgit.store.writer, "object_hasher", counting)
    monkeypatch.setattr(mgit.repo.ingest, "object_hasher", counting)
    repo.add(child, name="child", parent="base")
    codecs = {t.name: repo.store.header(t.object).codec_names for f in repo.manifest("child").files for t in f.tensors}
    assert codecs["w"].startswith("cast") and codecs["v"].startswith("sub_delta"), codecs
    assert sorted(hashed) == sorted(["F16[200000]", "F32[200000]", "F32[8]"])
    assert sha256_tree(Path(repo.checkout("child", tmp_path / "out").out_dir)) == sha256_tree(child)


def test_a_planned_cache_releases_a_base_after_its_last_use() -> None:
    from mgit.store.objectformat import ObjectHeader

    cache = DecodedCache(1 << 30, planned=True)
    cache.expect({"a": 2, "b": 1})
    decoded: list[str] = []

    def decode(oid: str) -> tuple[ObjectHeader, np.ndarray]:
        decoded.append(oid)
        return ObjectHeader("tensor", {}, 8, []), np.zeros(8, np.uint8)

    cache.get_or_decode("a", lambda: decode("a"))
    assert "a" in cache and cache.nbytes == 8  # kept for its second use
    for oid in ("b", "a", "c"):
        cache.get_or_decode(oid, lambda o=oid: decode(o))
    assert decoded == ["a", "b", "c"]  # a decoded once for both uses; b and c (one use, none) never kept
    assert cache.nbytes == 0 and "a" not in cache  # released after its last use


# --- forged layouts ----------------------------------------------------------------------------
def forge(store: LocalStore, oid: str, change) -> None:
    path = store.path_of(oid)
    raw = path.read_bytes()
    os.chmod(path, 0o644)
    path.write_bytes(change(raw))
    store.forget(oid)


def rewrite_header(raw: bytes, **fields: object) -> bytes:
    (n,) = struct.unpack("<I", raw[len(MAGIC) : PREFIX])
    header = json.loads(raw[PREFIX : PREFIX + n])
    header.update(fields)
    body = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(body)) + body + raw[PREFIX + n :]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: rewrite_header(raw, blocks=3 << 16), "malformed block size"),
        (lambda raw: rewrite_header(raw, blocks=True), "malformed block size"),
        (lambda raw: rewrite_header(raw, blocks=1 << 12), "malformed block size"),
        (lambda raw: rewrite_header(raw, blocks=1 << 40), "malformed block size"),
        (lambda raw: rewrite_header(raw, blocks=SMALL * 2), "follow its last block"),  # half as many blocks declared
        (lambda raw: raw[:-10], "runs past the end of its payload"),
        (lambda raw: raw + b"\0" * 3, "follow its last block"),
        (lambda raw: raw + FRAME.pack(1 << 30), "follow its last block"),
    ],
)
def test_a_forged_block_layout_is_a_corrupt_object(tmp_path: Path, small_blocks: int, change, message: str) -> None:
    store = LocalStore(tmp_path / "objects")
    oid = store.put_tensor("F32", (100_000,), as_bytes(generations(1, 100_000)[0])).oid
    forge(store, oid, change)
    with pytest.raises(CorruptObjectError, match=message):
        store.get(oid)
    with pytest.raises(CorruptObjectError, match=message):
        store.decode_block(oid, 0)


def test_a_payload_cut_inside_a_block_length_is_refused(tmp_path: Path, small_blocks: int) -> None:
    store = LocalStore(tmp_path / "objects")
    oid = store.put_tensor("F32", (100_000,), as_bytes(generations(1, 100_000)[0])).oid
    table = store.block_table(oid)
    at, n = table.spans[-1]
    forge(store, oid, lambda raw: raw[: table.start + at - FRAME.size + 2])
    with pytest.raises(CorruptObjectError, match="ends inside a block's length"):
        store.get(oid)


def test_a_checkout_through_a_damaged_base_block_names_the_base(tmp_path: Path, small_blocks: int) -> None:
    folders = family_folders(tmp_path, big=300_000)
    repo = Repo.init(tmp_path / "repo")
    repo.add(folders["base"], name="base")
    repo.add(folders["ft"], name="ft", parent="base")
    base = next(t.object for f in repo.manifest("base").files for t in f.tensors if t.name == "w.weight")
    store = repo.store
    assert isinstance(store, LocalStore)
    at, n = store.block_table(base).spans[3]
    start = store.block_table(base).start + at

    def flip(raw: bytes) -> bytes:  # a byte in the middle of block 3's zstd data
        mid = start + n // 2
        return raw[:mid] + bytes([raw[mid] ^ 0x5A]) + raw[mid + 1 :]

    forge(store, base, flip)
    with pytest.raises(CorruptObjectError) as caught:
        Repo(tmp_path / "repo").checkout("ft", tmp_path / "out")
    assert caught.value.args[0].startswith(f"object {base[:16]} is corrupt")
    assert not [p for p in (tmp_path / "out").rglob("*.safetensors")]  # nothing under its final name
    assert not [p for p in (tmp_path / "out").rglob(".tmp-*")]


# --- failures while blocks are written -----------------------------------------------------------
def test_a_block_that_fails_to_code_leaves_no_object_and_no_thread(
    tmp_path: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = family_folders(tmp_path, big=300_000)
    repo = Repo.init(tmp_path / "repo")
    before_threads = set(threading.enumerate())
    real = ObjectStore.encode_block

    def failing(self, encoding, buf, k, bases):  # type: ignore[no-untyped-def]
        if k == 3:
            raise RuntimeError("injected failure in block 3")
        return real(self, encoding, buf, k, bases)

    monkeypatch.setattr(ObjectStore, "encode_block", failing)
    with pytest.raises(RuntimeError, match="injected failure in block 3"):
        repo.add(folders["base"], name="base")
    # The add's own threads are gone: threads other tests left may end meanwhile, so count only new ones.
    assert set(threading.enumerate()) - before_threads == set()
    assert repo.store.temporary_files() == []
    big = [o for o in repo.store.ids() if repo.store.header(o).blocks]
    assert big == []  # no blocked object half-written under its id
    assert repo.ls() == []
    monkeypatch.setattr(ObjectStore, "encode_block", real)
    repo.add(folders["base"], name="base")
    assert sha256_tree(Path(repo.checkout("base", tmp_path / "out").out_dir)) == sha256_tree(folders["base"])


def test_a_writer_that_runs_out_of_space_stops_the_add_with_one_error(
    tmp_path: Path, small_blocks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders = family_folders(tmp_path, big=300_000)
    repo = Repo.init(tmp_path / "repo")
    real = LocalStore.write_record

    def full(self, oid, chunks):  # type: ignore[no-untyped-def]
        if isinstance(chunks, list):
            return real(self, oid, chunks)
        next(iter(chunks))  # a blocked object's writer: fails after its first chunk
        raise StorageFullError(str(self.path_of(oid)))

    monkeypatch.setattr(LocalStore, "write_record", full)
    done: list[BaseException] = []
    worker = threading.Thread(
        target=lambda: done.append(pytest.raises(StorageFullError, repo.add, folders["base"], name="base").value)
    )
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the add hung after its writer failed"
    assert len(done) == 1 and "no space left" in str(done[0])
    assert repo.ls() == []


# --- end to end, with the real block size ----------------------------------------------------
def test_cli_add_and_checkout_of_tensors_over_a_block(tmp_path: Path) -> None:
    big = BLOCK_BYTES // 4 + 12_345  # float32 values: two blocks, the second partly filled
    values = generations(2, big, seed=8)
    base = make_model(tmp_path / "base", state={"w": values[0], "small": values[0][:10].copy()})
    ft = make_model(tmp_path / "ft", state={"w": values[1], "small": values[0][:10].copy()})
    root = tmp_path / "repo"
    assert run_cli("init", str(root))[0] == 0
    assert run_cli("-C", str(root), "add", str(base), "--name", "base")[0] == 0
    assert run_cli("-C", str(root), "add", str(ft), "--name", "ft", "--parent", "base")[0] == 0
    for name, folder in (("base", base), ("ft", ft)):
        code, _, err = run_cli("-C", str(root), "checkout", name, "-o", str(tmp_path / f"out-{name}"))
        assert code == 0, err
        assert sha256_tree(tmp_path / f"out-{name}") == sha256_tree(folder)
    repo = Repo(root)
    header = repo.store.header(next(t.object for f in repo.manifest("ft").files for t in f.tensors if t.name == "w"))
    assert header.blocks == BLOCK_BYTES and header.block_count == 2 and header.depth == 1


# --- reused block buffers ---------------------------------------------------------------------
def test_a_block_buffer_is_reused_only_once_nothing_refers_to_it() -> None:
    # In a thread of its own: its buffers are that thread's (others' tests leave theirs free).
    with ThreadPoolExecutor(max_workers=1) as fresh:
        fresh.submit(_buffer_reuse).result()


def _buffer_reuse() -> None:
    from mgit.codecs.buffers import scratch

    def owner(a: np.ndarray) -> int:  # which buffer (by id: a reference would keep it in use)
        return id(a.base if a.base is not None else a)

    first = scratch(3 << 20)
    first[:] = 1
    view = first[10:20].view("<u2")  # a view keeps the buffer in use
    held = owner(first)
    del first
    second = scratch(3 << 20)
    assert owner(second) != held
    second[:] = 2
    assert (view == 0x0101).all()  # what the view sees was not overwritten
    del view
    third = scratch(2 << 20)
    assert owner(third) == held  # free now: reused, no new allocation
    # A buffer handed to another thread stays in use while that thread holds it.
    box: list[np.ndarray] = [third]
    del third
    done = threading.Event()
    release = threading.Event()

    def hold() -> None:
        kept = box.pop()
        done.set()
        release.wait(10)
        del kept

    worker = threading.Thread(target=hold)
    worker.start()
    done.wait(10)
    fourth = scratch(2 << 20)
    assert owner(fourth) != held
    release.set()
    worker.join(10)
    assert owner(scratch(2 << 20)) == held


def test_blocks_decoded_in_turn_give_each_caller_its_own_bytes(tmp_path: Path, small_blocks: int) -> None:
    """Decoded blocks come from reused buffers: a block a caller keeps must not change when
    later blocks are decoded."""
    store = LocalStore(tmp_path / "objects")
    values = generations(2, 600_000, seed=9)
    base = store.put_tensor("F32", (600_000,), as_bytes(values[0])).oid
    ft = store.put_tensor("F32", (600_000,), as_bytes(values[1]), bases=[base]).oid
    kept = [store.decode_block(ft, k) for k in range(store.header(ft).block_count)]
    assert np.array_equal(np.concatenate(kept), as_bytes(values[1]))


def test_large_buffers_are_reused_only_inside_their_context() -> None:
    """Buffers of whole large tensors are shared by the threads while `large_buffers` is
    open (a merge), reused once nothing refers to them, and released when it closes."""
    import weakref

    from mgit.codecs.buffers import POOLED_MAX, large_buffers, scratch

    size = POOLED_MAX + (1 << 20)
    a = scratch(size)
    outside = weakref.ref(a.base if a.base is not None else a)
    del a
    assert outside() is None  # outside the context: nothing keeps it
    with large_buffers():
        a = scratch(size)
        kept = weakref.ref(a.base)
        b = scratch(size)
        assert b.base is not kept()  # `a` is in use
        del a
        assert kept() is not None  # the pool keeps it, free
        with ThreadPoolExecutor(max_workers=1) as other:
            assert other.submit(lambda: scratch(size - 1000).base is kept()).result()  # for any thread
        assert scratch(size // 3).base is not kept()  # not for a much smaller one
        del b
    assert kept() is None  # released with the context
