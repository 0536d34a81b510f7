"""Lossless deltas against related tensors: bit-exact round trips for any bytes, the smallest
encoding wins, chains stay within their depth bound, and a damaged or missing base is caught."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, sha256_tree
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit import CorruptObjectError, MissingObjectError, Repo
from mgit.codecs import CodecContext, SubDeltaCodec, XorDeltaCodec, decode_chain, encode_chain
from mgit.formats.safetensors import DTYPES
from mgit.store.codec_policy import SAMPLE_FROM, delta_chains
from mgit.store.memory import MemoryStore

BASE = "ab" * 32


@st.composite
def data_and_base(draw: st.DrawFn) -> tuple[str, bytes, bytes]:
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    size = DTYPES[dtype][0]
    n, m = draw(st.integers(0, 40)), draw(st.integers(0, 40))  # base may be shorter or longer
    return (
        dtype,
        draw(st.binary(min_size=n * size, max_size=n * size)),
        draw(st.binary(min_size=m * size, max_size=m * size)),
    )


@settings(max_examples=300, deadline=None)
@given(data_and_base())
def test_delta_chains_roundtrip_any_bytes(sample: tuple[str, bytes, bytes]) -> None:
    dtype, data, base = sample
    count = len(data) // DTYPES[dtype][0]
    for chain in delta_chains(BASE, {"dtype": dtype, "shape": [count]}):
        ctx = CodecContext(len(data), lambda oid: np.frombuffer(base, np.uint8))
        encoded = encode_chain(chain, np.frombuffer(data, np.uint8), ctx)
        assert bytes(np.asarray(decode_chain(chain, encoded, ctx)).reshape(-1)) == data


def test_sub_delta_zigzag_makes_small_differences_small() -> None:
    base = np.array([1000, 1000, 1000], dtype="<u4")
    data = np.array([1001, 999, 1000], dtype="<u4")
    ctx = CodecContext(12, lambda oid: base.view(np.uint8))
    out = SubDeltaCodec(base=BASE, itemsize=4).encode(data.view(np.uint8), ctx)
    assert out.view("<u4").tolist() == [2, 1, 0]  # +1 -> 2, -1 -> 1, 0 -> 0


def test_special_floats_survive_a_delta() -> None:
    base = np.array([1.0, -0.0, np.inf, np.nan, 1e-45], dtype=np.float32)
    data = np.array([np.nan, 0.0, -np.inf, 1.0, -1e-45], dtype=np.float32)
    data.view(np.uint32)[0] = 0x7FC0BEEF  # a NaN payload
    for codec in (XorDeltaCodec(base=BASE), SubDeltaCodec(base=BASE, itemsize=4)):
        ctx = CodecContext(data.nbytes, lambda oid: base.view(np.uint8))
        decoded = codec.decode(codec.encode(data.view(np.uint8), ctx), ctx)
        assert bytes(decoded) == data.tobytes()


def finetuned(base: np.ndarray, seed: int, scale: float = 1e-3) -> np.ndarray:
    noise = np.random.default_rng(seed).standard_normal(base.shape).astype(np.float32)
    return (base * (1 + scale * noise)).astype(np.float32)


@pytest.mark.parametrize("n", [4096, SAMPLE_FROM // 4 + 1000], ids=["small", "sampled"])
def test_store_picks_a_delta_when_it_is_smaller(n: int) -> None:
    store = MemoryStore()
    base = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    b = store.put_tensor("F32", (n,), base.view(np.uint8))
    child = finetuned(base, 1)
    alone = MemoryStore().put_tensor("F32", (n,), child.view(np.uint8))
    res = store.put_tensor("F32", (n,), child.view(np.uint8), bases=[b.oid])
    header = store.header(res.oid)
    assert header.bases == [b.oid] and header.depth == 1
    assert res.stored_size < 0.7 * alone.stored_size
    assert store.get(res.oid)[1].tobytes() == child.tobytes()


def test_unrelated_base_loses_to_standalone() -> None:
    store = MemoryStore()
    zeros = np.zeros(8192, np.float32)
    b = store.put_tensor(
        "F32", (8192,), np.random.default_rng(0).standard_normal(8192).astype(np.float32).view(np.uint8)
    )
    res = store.put_tensor("F32", (8192,), zeros.view(np.uint8), bases=[b.oid])
    assert store.header(res.oid).bases == [] and store.header(res.oid).depth == 0


def test_other_dtype_or_deep_base_is_not_used() -> None:
    store = MemoryStore()
    base = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    as_int = store.put_tensor("I32", (4096,), base.view(np.uint8))
    res = store.put_tensor("F32", (4096,), finetuned(base, 1).view(np.uint8), bases=[as_int.oid])
    assert store.header(res.oid).bases == []
    oid, current = store.put_tensor("F32", (4096,), base.view(np.uint8)).oid, base
    for step in range(1, 8):
        current = finetuned(current, step)
        oid = store.put_tensor("F32", (4096,), current.view(np.uint8), bases=[oid], max_depth=3).oid
        assert store.header(oid).depth <= 3
        assert store.get(oid)[1].tobytes() == current.tobytes()


def test_a_derived_leaf_may_go_one_link_past_the_bound() -> None:
    # base@1 (0) -> base@2 (1) -> a fine-tune of base@2 (2, the bound): an int8 copy and a
    # pruning of that fine-tune end the family one link further; a delta of it may not.
    store = MemoryStore()
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 256)) * 0.05).astype(np.float32)
    oid = store.put_tensor("F32", w.shape, w.view(np.uint8)).oid
    for step in (1, 2):
        w = finetuned(w, step, scale=1e-5)
        oid = store.put_tensor("F32", w.shape, w.view(np.uint8), bases=[oid], max_depth=2).oid
    assert store.header(oid).depth == 2
    scale = np.abs(w).max(axis=1, keepdims=True) / 127
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    pruned = np.where(np.abs(w) >= np.median(np.abs(w)), w, np.float32(0))
    for dtype, child in (("I8", q), ("F32", pruned)):
        res = store.put_tensor(dtype, child.shape, child.view(np.uint8), bases=[oid], max_depth=2)
        header = store.header(res.oid)
        assert header.depth == 3 and header.bases == [oid] and header.codecs[0]["name"] in ("quantize_int8", "patch")
        assert res.stored_size < child.nbytes / 10
        assert store.get(res.oid)[1].tobytes() == child.tobytes()
        # Nothing is encoded against a leaf: a change of it is stored on its own.
        nxt = store.put_tensor(
            dtype, child.shape, (child + 1).astype(child.dtype).view(np.uint8), bases=[res.oid], max_depth=2
        )
        assert store.header(nxt.oid).bases == []
    ft = finetuned(w, 9, scale=1e-5)
    res = store.put_tensor("F32", ft.shape, ft.view(np.uint8), bases=[oid], max_depth=2)
    assert store.header(res.oid).bases == []  # an ordinary delta stays within the bound


def write_state(path: Path, state: dict[str, np.ndarray]) -> Path:
    return make_model(path, state=state)


def family_state(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "embed.weight": rng.standard_normal((300, 64)).astype(np.float32),
        "layer.0.weight": rng.standard_normal((64, 64)).astype(np.float32),
    }


def test_finetune_costs_a_fraction_of_its_parent(repo: Repo, tmp_path: Path) -> None:
    base = family_state()
    repo.add(write_state(tmp_path / "base", base), name="base")
    child = {k: finetuned(v, 7) for k, v in base.items()}
    res = repo.add(write_state(tmp_path / "ft", child), name="ft", parent="base")
    base_cost = repo.log("base")[0].new_bytes
    assert res.new_bytes < 0.7 * base_cost
    repo.checkout("ft", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "ft")
    codecs = {s.codec for s in repo.show("ft").storage}
    assert any(c.startswith(("xor_delta", "sub_delta")) for c in codecs)


def test_grown_embedding_deltas_against_the_shared_rows(repo: Repo, tmp_path: Path) -> None:
    base = family_state()
    repo.add(write_state(tmp_path / "base", base), name="base")
    grown = dict(base)
    extra = np.random.default_rng(3).standard_normal((20, 64)).astype(np.float32)
    grown["embed.weight"] = np.concatenate([finetuned(base["embed.weight"], 5), extra])
    repo.add(write_state(tmp_path / "grown", grown), name="grown", parent="base")
    entry = next(t for t in repo.manifest("grown").tensors() if t.name == "embed.weight")
    assert repo.store.header(entry.object).bases  # a delta despite the new shape
    repo.checkout("grown", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "grown")


def test_history_stays_within_the_depth_bound(repo: Repo, tmp_path: Path) -> None:
    config = json.loads((repo.dir / "config.json").read_text())
    config["delta_max_depth"] = 2
    (repo.dir / "config.json").chmod(0o644)
    (repo.dir / "config.json").write_text(json.dumps(config))
    repo = Repo(repo.dir)
    state = family_state()
    trees = []
    for step in range(7):
        state = {k: finetuned(v, step) for k, v in state.items()}
        trees.append(sha256_tree(write_state(tmp_path / f"v{step}", state)))
        repo.add(tmp_path / f"v{step}", name="m")
    depths = [repo.store.header(t.object).depth for v in repo.log("m") for t in repo.manifest(v.id).tensors()]
    assert max(depths) == 2 and 0 in depths[:-2]  # bounded, and chains restart
    for seq, tree in enumerate(trees, 1):
        repo.checkout(f"m@{seq}", tmp_path / f"out{seq}")
        assert sha256_tree(tmp_path / f"out{seq}") == tree


def test_damaged_or_missing_base_is_detected(repo: Repo, tmp_path: Path) -> None:
    base = family_state()
    repo.add(write_state(tmp_path / "base", base), name="base")
    repo.add(write_state(tmp_path / "ft", {k: finetuned(v, 1) for k, v in base.items()}), name="ft", parent="base")
    entry = next(t for t in repo.manifest("ft").tensors() if repo.store.header(t.object).bases)
    base_oid = repo.store.header(entry.object).bases[0]
    path = repo.store.path_of(base_oid)
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x04
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptObjectError, match=base_oid[:16]):
        repo.load_state_dict("ft")
    report = repo.fsck()
    assert base_oid in {p.object for p in report.problems}
    path.unlink()
    with pytest.raises(MissingObjectError, match=base_oid[:16]):
        repo.checkout("ft", tmp_path / "out")
    assert any(p.object == base_oid and p.kind == "missing" for p in repo.fsck().problems)


def test_gc_keeps_bases_of_a_removed_parent(repo: Repo, tmp_path: Path) -> None:
    base = family_state()
    repo.add(write_state(tmp_path / "base", base), name="base")
    repo.add(write_state(tmp_path / "ft", {k: finetuned(v, 1) for k, v in base.items()}), name="ft", parent="base")
    repo.rm("base", force=True)
    repo.gc()
    assert repo.fsck().ok
    repo.checkout("ft", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "ft")


def test_show_and_du_say_how_tensors_are_stored(repo: Repo, tmp_path: Path) -> None:
    base = family_state()
    repo.add(write_state(tmp_path / "base", base), name="base")
    child = {"embed.weight": base["embed.weight"], "layer.0.weight": finetuned(base["layer.0.weight"], 2)}
    repo.add(write_state(tmp_path / "ft", child), name="ft", parent="base")
    assert repo.show("base").tensor_storage == {"standalone": 2}
    assert repo.show("ft").tensor_storage == {"deduplicated": 1, "delta": 1}
    usage = {m.name: m.tensor_storage for m in repo.du().models}
    assert usage == {"base": {"standalone": 2}, "ft": {"deduplicated": 1, "delta": 1}}
