"""Add's write path (mgit.repo.ingest): a family added through every kind of object it writes
(a file over a block, a blocked tensor, deltas, a lossy step) is stored as pinned here, and
the pool writes exactly what a serial `put` of each object writes, whatever the jobs."""

from __future__ import annotations

import json
from pathlib import Path

import blake3
import numpy as np
import pytest
from safetensors.numpy import save_file

from mgit import Repo
from mgit.formats.folder import scan_path
from mgit.repo.ingest import DeltaPlan, write_snapshot
from mgit.store.base import ObjectStore
from mgit.store.memory import MemoryStore

SMALL = 64 << 10  # the store's block size here: the 200 KiB tensor and the 200 KB file are blocked


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ObjectStore, "block_bytes", SMALL)


def weights(change: float = 0.0, seed: int = 1) -> dict[str, np.ndarray]:
    """Weights from integer hashing alone (IEEE arithmetic rounds it the same everywhere, so
    the ids pinned below depend on no library's random stream), each float tensor moved by
    `change` times noise of its own `seed`."""

    def noise(shape: tuple[int, ...], k: int) -> np.ndarray:
        x = np.arange(int(np.prod(shape)), dtype=np.uint64).reshape(shape)
        return ((x * np.uint64(2654435761) + np.uint64(k)) % np.uint64(1 << 32)).astype(np.float64) / 2**32 - 0.5

    def tensor(shape: tuple[int, ...], k: int) -> np.ndarray:
        return (noise(shape, k) + change * noise(shape, k * 7919 + seed)).astype(np.float32)

    return {
        "big.weight": tensor((256, 200), 1),
        "w": tensor((64, 64), 2),
        "bias": tensor((64,), 3),
        "ids": np.arange(16, dtype=np.int64),
    }


def folder(path: Path, state: dict[str, np.ndarray]) -> Path:
    path.mkdir(parents=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps({"model_type": "toy"}))
    (path / "tokenizer.bin").write_bytes((np.arange(200_000) * 7 % 251).astype(np.uint8).tobytes())
    return path


# Each version's manifest id, and each tensor's chain (its first codec) and whether it is blocked.
PINNED = {
    "base": (
        "a96961947c78471bb9168db90b5d3c5b381c78c1e9a92c87674111052b2c5872",
        {
            "big.weight": ("byteplanes", True),
            "w": ("byteplanes", False),
            "bias": ("byteplanes", False),
            "ids": ("zstd", False),
        },
    ),
    "ft": (
        "3e5a3ec23648285863f78fe3596eb184d1e6618c1b1715447ad943818520e92b",
        {
            "big.weight": ("sub_delta", True),
            "w": ("sub_delta", False),
            "bias": ("sub_delta", False),
            "ids": ("zstd", False),
        },
    ),
    # Every float tensor stored lossily, coded whole; the reconstructions of the matrices cost less
    # as deltas than as the quantized step that made them.
    "lossy": (
        "cf6ab9cd1ff6d89229cd28ca3d8c0ba8ecab4423fb33fa72987f7ce96b45c4fd",
        {
            "big.weight": ("sub_delta", False),
            "w": ("sub_delta", False),
            "bias": ("quantized_delta", False),
            "ids": ("zstd", False),
        },
    ),
}


def chains(repo: Repo, ref: str) -> dict[str, tuple[str, bool]]:
    out = {}
    for t in repo.manifest(ref).tensors():
        header = repo.store.header(t.object)
        out[t.name] = (header.codec_names.split("+")[0], header.blocks > 0)
    return out


def test_a_family_is_stored_as_pinned(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path / "work")
    repo.add(folder(tmp_path / "base", weights()), name="base")
    repo.add(folder(tmp_path / "ft", weights(1e-3)), name="ft", parent="base")
    lossy = repo.add(folder(tmp_path / "lossy", weights(1e-2, seed=2)), name="lossy", parent="ft", lossy=1e-3)
    assert lossy.lossy is not None and lossy.lossy["tensors"] == 3 and lossy.lossless_reason is None
    found = {name: (repo.version(name).manifest, chains(repo, name)) for name in ("base", "ft", "lossy")}
    assert found == PINNED


@pytest.mark.parametrize("small", [1 << 10, 64 << 10])
@pytest.mark.parametrize("lossy", [None, 1e-3])
def test_each_file_digest_is_its_bytes_blake3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lossy, small) -> None:
    """The digest a version records of each file is blake3 of the bytes its checkout gives
    back, however each tensor's bytes went into it: as it was read (a blocked one in the same
    pass as its id, in pieces smaller than it here), or as it came back (one too large to read
    early, the tensors after it until the digest caught up, every one of a lossy add)."""
    monkeypatch.setattr("mgit.repo.file_digest.HASH_PIECE", 4096)
    monkeypatch.setattr("mgit.repo.file_digest.FileDigest.SMALL", small)
    mid = np.linspace(-1, 1, 8192, dtype=np.float32)  # 32 KiB, first in the file: early only when small is 64 KiB
    repo = Repo.init(tmp_path / "work")
    repo.add(folder(tmp_path / "base", {**weights(), "a.mid": mid}), name="base")
    src = folder(tmp_path / "ft", {**weights(1e-2, seed=2), "a.mid": mid * 1.01})
    repo.add(src, name="ft", parent="base", lossy=lossy)
    out = tmp_path / "out"
    repo.checkout("ft", out)
    for entry in repo.manifest("ft").files:
        assert entry.digest == blake3.blake3((out / entry.path).read_bytes()).hexdigest()
        same = (out / entry.path).read_bytes() == (src / entry.path).read_bytes()
        assert same or (lossy and entry.path == "model.safetensors")
    for entry in repo.manifest("base").files:
        assert entry.digest == blake3.blake3((tmp_path / "base" / entry.path).read_bytes()).hexdigest()


@pytest.mark.parametrize("jobs", [1, 3])
def test_the_pool_writes_what_a_serial_put_writes(tmp_path: Path, jobs: int) -> None:
    base, ft = folder(tmp_path / "base", weights()), folder(tmp_path / "ft", weights(1e-3))
    pooled, serial = MemoryStore(), MemoryStore()
    first, _ = write_snapshot(pooled, scan_path(base), jobs=jobs)
    plan = DeltaPlan.from_parents([first], max_depth=4)
    manifest, stats = write_snapshot(pooled, scan_path(ft), jobs=jobs, plan=plan)
    for path in (base, ft):
        for f in scan_path(path).files:
            if not f.is_safetensors:
                serial.put_blob(f.blob_data())
                continue
            assert f.layout is not None
            serial.put_blob(f.layout.header)
            for span, data in f.tensor_data():
                serial.put_tensor(
                    span.dtype, span.shape, data, max_depth=4, bases=plan.candidates(span.name) if path == ft else ()
                )
    assert pooled.records == serial.records
    assert stats.tensors == 4 and stats.files == 3
    blocked = [t for t in manifest.tensors() if pooled.header(t.object).blocks]
    assert [t.name for t in blocked] == ["big.weight"]
    assert pooled.header(blocked[0].object).bases  # a blocked delta
