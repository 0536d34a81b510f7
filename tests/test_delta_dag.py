"""Delta bases that form a DAG: objects each coded against both objects of the level below
(two `xor_delta` bases, every object's id valid), planted in a folder remote under a real
model's tensor. Reading the top once costs one decode per object, not one per path (2^depth);
a depth that is not one more than the deepest base's, a blob with bases, and a read past the
decode bound are refused. Decodes are counted, not timed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bombs import plant
from conftest import make_model, sha256_tree

from mgit import Repo, sync
from mgit.codecs import CodecContext, XorDeltaCodec, ZstdCodec, chain_to_list, encode_chain
from mgit.errors import CorruptObjectError
from mgit.store.objectformat import ObjectHeader
from mgit.store.objects import TensorEntry, object_hasher
from mgit.store.reader import as_array

GUARD = 20_000  # decodes after which a read is plainly exponential: the test stops it


def oid_of(kind: str, meta: dict, content: bytes) -> str:
    hasher = object_hasher(kind, meta)
    hasher.update(content)
    return hasher.hexdigest()


def plant_dag(
    remote: Path,
    top: str,
    top_content: bytes,
    depth: int,
    *,
    kind: str = "tensor",
    meta: dict | None = None,
    top_depth: int | None = None,
) -> list[str]:
    """Levels 0 .. depth-1 of two objects each (level 0 standalone, level i coded against both
    of level i-1), and `top` (whose content is `top_content`) coded against both of the last.
    Returns every id planted."""
    meta = {"dtype": "I64", "shape": [8]} if meta is None else meta
    rng = np.random.default_rng(depth)
    contents: dict[str, bytes] = {}
    level: list[str] = []
    planted = []
    for i in range(depth + 1):
        pair = (
            [(top, top_content)]
            if i == depth
            else [(oid_of(kind, meta, c), c) for c in (rng.bytes(len(top_content)) for _ in range(2))]
        )
        for oid, content in pair:
            chain = [*(XorDeltaCodec(base=b) for b in level), ZstdCodec(level=1)]
            payload = encode_chain(chain, content, CodecContext(len(content), load_object=contents.__getitem__))
            d = top_depth if i == depth and top_depth is not None else i
            plant(remote, oid, ObjectHeader(kind, meta, len(content), chain_to_list(chain), depth=d), payload)
            contents[oid] = content
            planted.append(oid)
        level = [oid for oid, _ in pair]
    return planted


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, str, bytes]:
    """A remote with a real model pushed; the id and content of its `position_ids` tensor."""
    remote = tmp_path / "team.mgit"
    sync.init_bare(str(remote))
    model = make_model(tmp_path / "model")
    pusher = Repo.init(tmp_path / "pusher")
    pusher.add(model, name="m")
    sync.add_remote(pusher, "origin", str(remote))
    sync.push(pusher, "origin")
    entry = next(t for t in pusher.manifest("m").tensors() if t.name == "position_ids")
    content = np.arange(8, dtype="<i8").tobytes()
    assert oid_of("tensor", {"dtype": "I64", "shape": [8]}, content) == entry.object
    return remote, model, entry.object, content


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times an xor_delta was decoded (the guard stops a read gone exponential)."""
    count = [0]
    real = XorDeltaCodec.decode

    def counted(self: XorDeltaCodec, data: object, ctx: CodecContext) -> object:
        count[0] += 1
        assert count[0] < GUARD, "decodes grow as the paths through the bases, not as the objects"
        return real(self, data, ctx)

    monkeypatch.setattr(XorDeltaCodec, "decode", counted)
    return count


@pytest.mark.parametrize("depth", [16, 40])
def test_clone_and_checkout_decode_each_base_once(
    setup: tuple[Path, Path, str, bytes], decodes: list[int], tmp_path: Path, depth: int
) -> None:
    remote, model, top, content = setup
    plant_dag(remote, top, content, depth)
    objects = 2 * depth + 1  # the top and both objects of each level below it (the first standalone)
    coded = 2 * (objects - 2)  # xor_delta decodes of one pass: two per coded object
    sync.clone(str(remote), tmp_path / "full")
    assert decodes[0] <= 2 * coded  # each once as a base (and, in parallel, maybe once more on its own)
    decodes[0] = 0
    Repo(tmp_path / "full").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(model)
    assert decodes[0] <= coded

    decodes[0] = 0
    sync.clone(str(remote), tmp_path / "lazy", lazy=True)
    Repo(tmp_path / "lazy").checkout("m", tmp_path / "out-lazy")
    assert sha256_tree(tmp_path / "out-lazy") == sha256_tree(model)
    assert decodes[0] <= 3 * coded  # the fetch's verification, then the checkout's decode
    decodes[0] = 0
    assert Repo(tmp_path / "lazy").open("m")["position_ids"].tobytes() == content
    assert decodes[0] <= coded


def test_a_read_decoding_more_objects_than_the_bound_is_refused(
    setup: tuple[Path, Path, str, bytes], decodes: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    remote, _, top, content = setup
    plant_dag(remote, top, content, 12)
    sync.clone(str(remote), tmp_path / "full")
    decodes[0] = 0
    import mgit.store.decoding

    monkeypatch.setattr(mgit.store.decoding, "MAX_READ_DECODES", 20)  # 25 objects under the top
    repo = Repo(tmp_path / "full")
    with pytest.raises(
        CorruptObjectError, match=f"object {top[:16]} is corrupt: reading it decodes more than 20 objects"
    ):
        repo.open("m")["position_ids"]
    assert decodes[0] < 40


def test_a_depth_that_is_not_one_more_than_the_deepest_base_is_refused(
    setup: tuple[Path, Path, str, bytes], tmp_path: Path
) -> None:
    remote, _, top, content = setup
    plant_dag(remote, top, content, 6, top_depth=1)  # its bases have depth 5
    with pytest.raises(CorruptObjectError, match="it declares delta depth 1, its deepest base has 5"):
        sync.clone(str(remote), tmp_path / "full")
    kept = tmp_path / "full" / ".mgit" / "objects"
    assert not kept.exists() or not [p for p in kept.rglob("*") if p.is_file()]


def test_a_depth_lie_on_disk_is_refused_on_read(setup: tuple[Path, Path, str, bytes], tmp_path: Path) -> None:
    remote, _, top, content = setup
    sync.clone(str(remote), tmp_path / "full")
    repo = Repo(tmp_path / "full")
    plant_dag(repo.dir, top, content, 4, top_depth=2)  # into the repository itself (objects/ under .mgit)
    with pytest.raises(CorruptObjectError, match="it declares delta depth 2, its deepest base has 3"):
        Repo(tmp_path / "full").checkout("m", tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_blobs_coded_against_bases_are_refused(setup: tuple[Path, Path, str, bytes], tmp_path: Path) -> None:
    remote, _, _, _ = setup
    repo = Repo(remote)
    entry = next(f for f in repo.manifest("m").files if f.path == "config.json")
    data = (Path(setup[1]) / "config.json").read_bytes()
    plant_dag(remote, entry.object, data, 3, kind="blob", meta={})
    with pytest.raises(
        CorruptObjectError, match=f"object {entry.object[:16]} from .* is corrupt \\(a blob names delta bases"
    ) as refused:
        sync.clone(str(remote), tmp_path / "full")
    assert "the local repository is unchanged" in str(refused.value)


def test_writers_never_code_against_a_base_a_read_would_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small tensor whose parent is far larger (a scale and its weight) is stored on its
    own when reading it through that parent would pass the read bound."""
    import mgit.store.writer

    monkeypatch.setattr(mgit.store.writer, "READ_FLOOR", 4096)
    repo = Repo.init(tmp_path / "r")
    big = np.zeros(1 << 16, np.float32)
    base = repo.store.put_tensor("F32", big.shape, big).oid
    small = np.zeros(4, np.float32)  # what an XOR against the base's first bytes codes in nothing
    res = repo.store.put_tensor("F32", small.shape, small, bases=[base])
    assert repo.store.header(res.oid).bases == []
    assert as_array(repo.store, TensorEntry("s", "F32", (4,), res.oid)).tobytes() == small.tobytes()
    near = np.zeros(1 << 12, np.float32)  # within the bound: coded against it as before
    assert repo.store.header(repo.store.put_tensor("F32", near.shape, near, bases=[base]).oid).bases == [base]
