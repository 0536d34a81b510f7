"""Repository verbs through the Python API: round trips by hash, refs, history, deduplication,
sizes, removal and garbage collection, integrity checks, the catalog."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import add_lineage, make_model, sha256_tree, tensors
from safetensors.numpy import load_file, save_file

from mgit import (
    CorruptObjectError,
    MgitError,
    MissingObjectError,
    Repo,
    RepoNotFoundError,
    UnknownRefError,
)
from mgit.errors import OutputNotEmptyError, RepoExistsError, StrayFilesError


def test_folder_roundtrip_is_byte_identical(repo: Repo, tmp_path: Path) -> None:
    src = make_model(tmp_path / "m", seed=1)
    res = repo.add(src, name="m")
    assert res.created and res.seq == 1 and res.files == 3 and res.tensors == 6
    repo.checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def test_sharded_safetensors_with_index_roundtrip(repo: Repo, tmp_path: Path) -> None:
    src = tmp_path / "sharded"
    src.mkdir()
    state = tensors(3, layers=4)
    names = sorted(state)
    shards = {"model-00001-of-00002.safetensors": names[:4], "model-00002-of-00002.safetensors": names[4:]}
    for fname, keys in shards.items():
        save_file({k: state[k] for k in keys}, str(src / fname), metadata={"format": "pt"})
    index = {"metadata": {"total_size": 0}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (src / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    repo.add(src, name="sharded")
    repo.checkout("sharded", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)
    loaded = repo.load_state_dict("sharded")
    assert set(loaded) == set(state)
    assert all(np.array_equal(loaded[k], state[k]) for k in state)


def test_single_safetensors_file_and_odd_header_kept(repo: Repo, tmp_path: Path) -> None:
    # Header key order and padding chosen by another writer must survive byte for byte.
    import struct

    a = np.arange(6, dtype=np.float16)
    header = {"b": {"dtype": "F16", "shape": [6], "data_offsets": [0, 12]}, "__metadata__": {"z": "1", "a": "2"}}
    body = json.dumps(header, indent=1).encode() + b"    "
    path = tmp_path / "odd.safetensors"
    path.write_bytes(struct.pack("<Q", len(body)) + body + a.tobytes())
    repo.add(path, name="odd")
    repo.checkout("odd", tmp_path / "out")
    assert (tmp_path / "out" / "odd.safetensors").read_bytes() == path.read_bytes()


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_state_dict_add_and_load(repo: Repo, tmp_path: Path, framework: str) -> None:
    state = tensors(4)
    if framework == "torch":
        torch = pytest.importorskip("torch")
        state = {k: torch.from_numpy(v) for k, v in state.items()}
        state["half"] = torch.arange(5, dtype=torch.bfloat16)
    repo.add(state, name="sd")
    loaded = repo.load_state_dict("sd", framework="pt" if framework == "torch" else "np")
    assert set(loaded) == set(state)
    for k, v in state.items():
        if framework == "torch":
            assert loaded[k].dtype == v.dtype and bool((loaded[k] == v).all())
        else:
            assert loaded[k].dtype == v.dtype and np.array_equal(loaded[k], v)
    repo.checkout("sd", tmp_path / "out")
    if framework == "numpy":
        assert {k: v.tolist() for k, v in load_file(tmp_path / "out" / "model.safetensors").items()} == {
            k: v.tolist() for k, v in state.items()
        }


def test_open_decodes_lazily(repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tensors(5)
    repo.add(state, name="lazy")
    reader = repo.open("lazy")
    calls = []
    original = repo.store.get
    monkeypatch.setattr(repo.store, "get", lambda oid, **kw: calls.append(oid) or original(oid, **kw))
    assert set(reader) == set(state) and len(reader) == len(state)
    assert calls == []
    assert np.array_equal(reader["layer.1.weight"], state["layer.1.weight"])
    assert len(calls) == 1


def test_versions_predecessors_and_refs(repo: Repo, tmp_path: Path) -> None:
    v1 = repo.add(make_model(tmp_path / "a1", seed=1), name="m", message="one")
    v2 = repo.add(make_model(tmp_path / "a2", seed=2), name="m", message="two")
    v3 = repo.add(make_model(tmp_path / "a3", seed=3), name="m", message="three")
    assert [v.seq for v in repo.log("m")] == [3, 2, 1]
    assert [v.message for v in repo.log("m")] == ["three", "two", "one"]
    assert repo.version(v3.version).predecessor == v2.version
    assert repo.resolve("m") == v3.version
    assert repo.resolve("m@1") == v1.version
    assert repo.resolve(f"m@{v2.version[:8]}") == v2.version
    assert repo.resolve(v1.version[:10]) == v1.version
    assert [v.seq for v in repo.log("m@2")] == [2, 1]
    with pytest.raises(UnknownRefError, match="has 3 versions"):
        repo.resolve("m@4")
    with pytest.raises(UnknownRefError, match="no model named 'n'"):
        repo.resolve("n")
    with pytest.raises(UnknownRefError, match="Did you mean 'm-base'"):
        repo.add(make_model(tmp_path / "b", seed=9), name="m-base")
        repo.resolve("m-bsae")


def test_identical_content_is_a_noop(repo: Repo, tmp_path: Path) -> None:
    src = make_model(tmp_path / "m", seed=1)
    first = repo.add(src, name="m")
    again = repo.add(src, name="m")
    assert not again.created and again.version == first.version and again.seq == 1
    assert len(repo.log("m")) == 1


def test_parents_are_recorded_and_inherited(repo: Repo, tmp_path: Path) -> None:
    base = repo.add(make_model(tmp_path / "base", seed=0), name="base")
    ft = repo.add(make_model(tmp_path / "ft", seed=1), name="ft", parent="base", relation="finetune")
    assert [(p.model, p.seq, p.relation) for p in ft.parents] == [("base", 1, "finetune")]
    ft2 = repo.add(make_model(tmp_path / "ft2", seed=2), name="ft")
    assert repo.version(ft2.version).parents == repo.version(ft.version).parents
    merged = repo.add(make_model(tmp_path / "mg", seed=3), name="mg", parent=["base", "ft@1"], relation="merge")
    assert [p.version for p in repo.version(merged.version).parents] == [base.version, ft.version]
    with pytest.raises(UnknownRefError):
        repo.add(make_model(tmp_path / "x", seed=4), name="x", parent="nope")
    assert "x" not in {m.name for m in repo.ls()}


def test_deduplication_across_models(repo: Repo, tmp_path: Path) -> None:
    state = tensors(1)
    make_model(tmp_path / "a", state=state)
    changed = dict(state)
    changed["layer.0.weight"] = state["layer.0.weight"] + 1
    make_model(tmp_path / "b", state=changed)
    repo.add(tmp_path / "a", name="a")
    res = repo.add(tmp_path / "b", name="b", parent="a")
    assert res.tensors_new == 1  # only the changed tensor is new
    du = repo.du()
    usage = {m.name: m for m in du.models}
    assert du.logical_bytes == usage["a"].logical_bytes + usage["b"].logical_bytes
    assert du.stored_bytes < usage["a"].stored_bytes + usage["b"].stored_bytes
    shown = repo.show("b")
    assert shown.shared_objects >= 5
    # The storage table covers what `stored` counts: the files' objects, the manifest, the record.
    assert sum(s.objects for s in shown.storage) == len(repo.manifest("b").object_ids()) + 2
    assert sum(s.stored_bytes for s in shown.storage) == shown.version.stored_bytes


def test_show_counts(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "m", seed=1), name="m", tags={"stage": "dev"})
    s = repo.show("m")
    state = tensors(1)
    assert s.version.params == sum(v.size for v in state.values())
    assert s.dtypes == {"F32": sum(v.size for k, v in state.items() if v.dtype == np.float32), "I64": 8}
    assert s.version.tags == {"stage": "dev"}
    assert {f.path for f in s.files} == {"model.safetensors", "config.json", "tokenizer/vocab.txt"}
    assert s.version.logical_bytes == sum((tmp_path / "m" / f.path).stat().st_size for f in s.files)


def test_checkout_refuses_non_empty_folder(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "m"), name="m")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(OutputNotEmptyError, match="--force"):
        repo.checkout("m", out)
    with pytest.raises(StrayFilesError, match="holds 1 file that m@1 does not: keep.txt"):
        repo.checkout("m", out, force=True)  # the folder would not be the version
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    done = repo.checkout("m", out, clean=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").exists()
    assert any(n.startswith("removed 1 file that m@1 does not hold: keep.txt") for n in done.notes)


def test_rm_and_gc(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "a", seed=1), name="a")
    repo.add(make_model(tmp_path / "b", seed=2), name="b")
    before = set(repo.store.ids())
    removed = repo.rm("b")
    assert removed.versions == 1 and [m.name for m in repo.ls()] == ["a"]
    assert set(repo.store.ids()) == before  # objects stay until gc
    dry = repo.gc(dry_run=True)
    assert dry.removed and set(repo.store.ids()) == before
    done = repo.gc()
    assert sorted(done.removed) == sorted(dry.removed)
    assert set(repo.store.ids()) == before - set(done.removed)
    assert repo.fsck().ok
    repo.checkout("a", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "a")
    with pytest.raises(UnknownRefError):
        repo.rm("b")


def test_gc_keeps_parents_of_live_models(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "base", seed=1), name="base")
    repo.add(make_model(tmp_path / "ft", seed=2), name="ft", parent="base")
    repo.rm("base", force=True)
    repo.gc()
    assert repo.fsck().ok
    parent = repo.log("ft")[0].parents[0]
    assert parent.model == "base"
    assert repo.version(parent.version).model == "base"


def test_corrupt_object_is_named_with_its_users(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "m", seed=1), name="m")
    repo.add(make_model(tmp_path / "m", seed=1), name="copy")
    entry = next(t for t in repo.manifest("m").tensors() if t.name == "layer.0.weight")
    path = repo.store.path_of(entry.object)
    path.chmod(0o644)
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 0x10
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptObjectError) as info:
        repo.checkout("m", tmp_path / "out")
    assert entry.object[:16] in str(info.value) and "copy@1" in str(info.value) and "m@1" in str(info.value)
    assert not (tmp_path / "out" / "model.safetensors").exists()
    report = repo.fsck()
    assert not report.ok
    assert [p.object for p in report.problems] == [entry.object]
    assert set(report.problems[0].used_by) == {"m@1", "copy@1"}


def test_missing_object_is_reported(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "m", seed=1), name="m")
    entry = repo.manifest("m").files[0]
    repo.store.delete(entry.object)
    with pytest.raises(MissingObjectError, match="m@1"):
        repo.checkout("m", tmp_path / "out")
    report = repo.fsck()
    assert [(p.object, p.kind) for p in report.problems] == [(entry.object, "missing")]
    assert repo.gc().removed == []  # a missing leaf does not make collection unsafe


def test_gc_refuses_when_a_record_is_unreadable(repo: Repo, tmp_path: Path) -> None:
    """Without the manifest gc cannot know which objects are in use: it must delete nothing."""
    repo.add(make_model(tmp_path / "m", seed=1), name="m")
    repo.store.delete(repo.version("m").manifest)
    before = set(repo.store.ids())
    with pytest.raises(MgitError, match="cannot collect garbage"):
        repo.gc()
    assert set(repo.store.ids()) == before


def test_catalog_rebuild_gives_the_same_answers(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "a", seed=1), name="a")
    repo.add(make_model(tmp_path / "b", seed=2), name="a")
    repo.add(make_model(tmp_path / "c", seed=3), name="c", parent="a@1")
    before = ([m.to_json() for m in repo.ls()], [v.to_json() for v in repo.log("a")], repo.du().to_json())
    repo.rebuild_catalog()
    after = ([m.to_json() for m in repo.ls()], [v.to_json() for v in repo.log("a")], repo.du().to_json())
    assert after == before
    assert repo.catalog.migrate() == []  # migrations are recorded and not applied twice


def test_catalog_catches_up_with_refs(repo: Repo, tmp_path: Path) -> None:
    """A writer killed after moving its ref but before indexing: the next open indexes it."""
    repo.add(make_model(tmp_path / "a", seed=1), name="a")
    other = Repo.init(tmp_path / "other")
    res = other.add(make_model(tmp_path / "b", seed=2), name="b")
    for oid in other.store.ids():
        src = other.store.path_of(oid)
        dst = repo.store.path_of(oid)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)
    repo.refs.update("b", res.version, expected=None)
    reopened = Repo(repo.dir)
    assert [m.name for m in reopened.ls()] == ["a", "b"]
    assert reopened.log("b")[0].id == res.version
    assert reopened.fsck().ok


def test_discovery_from_subfolders_and_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Repo.init(tmp_path / "proj")
    sub = tmp_path / "proj" / "a" / "b"
    sub.mkdir(parents=True)
    assert Repo(sub).dir == tmp_path / "proj" / ".mgit"
    monkeypatch.chdir(sub)
    assert Repo().dir == (tmp_path / "proj" / ".mgit").resolve()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RepoNotFoundError, match="mgit init"):
        Repo()
    monkeypatch.setenv("MGIT_DIR", str(tmp_path / "proj"))
    assert Repo().dir == tmp_path / "proj" / ".mgit"
    with pytest.raises(RepoExistsError):
        Repo.init(tmp_path / "proj")


def test_newer_repository_format_is_refused(repo: Repo) -> None:
    config = json.loads((repo.dir / "config.json").read_text())
    config["format"] = 99
    (repo.dir / "config.json").chmod(0o644)
    (repo.dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(MgitError, match="format 99 is not supported"):
        Repo(repo.dir)


def test_gc_removes_leftovers_of_interrupted_ref_writes(repo: Repo, tmp_path: Path) -> None:
    repo.add(make_model(tmp_path / "m", seed=1), name="m")
    (repo.dir / "refs" / "models" / ".tmp-123-abc-m").write_text("half")
    (repo.dir / "objects" / "ab").mkdir(exist_ok=True)
    (repo.dir / "objects" / "ab" / ".tmp-123-def-x").write_bytes(b"half")
    assert repo.fsck().leftovers == 2 and repo.fsck().ok
    assert [m.name for m in repo.ls()] == ["m"]
    assert repo.gc().leftovers == 2
    assert repo.fsck().leftovers == 0


# --- references: `NAME@DIGITS` ------------------------------------------------------------------
def test_a_digit_only_selector_is_a_sequence_number_else_an_id_prefix(repo: Repo) -> None:
    # Versions until one id starts with four decimal digits (about one in seven does).
    for i in range(200):
        repo.add({"w": np.full(4, i, np.float32)}, name="m")
        head = repo.resolve("m")
        if head[:4].isdigit():
            break
    else:
        pytest.skip("no version id began with four digits")
    count = len(repo.log("m"))
    assert int(head[:4]) > count  # no version has that number: the digits are an id prefix
    assert repo.resolve(f"m@{head[:4]}") == head
    assert repo.resolve(f"m@{head[:8]}") == head
    assert repo.resolve("m@1") == repo.log("m")[-1].id  # short digits are always a number


def test_a_selector_that_is_both_a_number_and_an_id_prefix_names_both() -> None:
    from mgit.index.refspec import pick_version

    ids = ["0003" + "a" * 60, "1" * 64, "0003" + "b" * 60]  # newest first: @3 is "0003a..."
    chain = list(zip(ids, [3, 2, 1], strict=True))
    assert pick_version("m@2", "m", chain, "2") == "1" * 64
    with pytest.raises(
        UnknownRefError, match=r"ambiguous \(version 3 \(0003aaaaaaaa\), id 0003aaaaaaaa, id 0003bbbbbbbb\)"
    ):
        pick_version("m@0003", "m", chain, "0003")
    assert pick_version("m@0003b", "m", chain, "0003b") == "0003" + "b" * 60
    with pytest.raises(UnknownRefError, match="has 3 versions; no version"):
        pick_version("m@7", "m", chain, "7")


def test_an_unreadable_config_is_one_error_with_a_hint(repo: Repo) -> None:
    from mgit.errors import RepoConfigError

    (repo.dir / "config.json").write_text("{not json")
    with pytest.raises(RepoConfigError, match="unreadable repository config") as caught:
        Repo(repo.root)
    assert caught.value.hint


# --- reading tensors: ModelReader is a Mapping --------------------------------------------------
def test_reader_membership_decodes_nothing_and_get_has_a_default(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tensors(5)
    repo.add(state, name="m")
    reader = repo.open("m")
    reads: list[str] = []
    original = repo.store.read_record
    monkeypatch.setattr(repo.store, "read_record", lambda oid: reads.append(oid) or original(oid))
    assert "embed.weight" in reader and "nope" not in reader
    assert reads == []
    assert reader.get("nope") is None and reader.get("nope", 5) == 5
    with pytest.raises(KeyError):
        reader["nope"]
    assert np.array_equal(reader.get("embed.weight"), state["embed.weight"]) and len(reads) == 1


def test_a_rebuilt_file_that_misses_its_digest_is_refused(repo: Repo, tmp_path: Path) -> None:
    from mgit.errors import ChecksumMismatchError
    from mgit.store.objects import FileEntry, Manifest, Version

    data = b"hello"
    oid = repo.store.put_blob(data).oid
    entry = FileEntry("a.txt", "blob", len(data), "0" * 64, oid)  # a digest that is not the file's
    manifest = repo.store.put_record("manifest", Manifest((entry,)).to_json()).oid
    vid = repo.store.put_record(
        "version", Version("m", manifest, author="x", time="2024-01-01T00:00:00Z").to_json()
    ).oid
    repo.refs.update("m", vid, expected=None)
    with pytest.raises(ChecksumMismatchError, match="a.txt does not match the digest recorded at add time"):
        repo.checkout("m", tmp_path / "out")
    assert not (tmp_path / "out" / "a.txt").exists()


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_gc_refuses_while_a_reachable_tensor_is_damaged(repo: Repo, tmp_path: Path, damage: str) -> None:
    from mgit.errors import GcRefusedError

    repo.add(make_model(tmp_path / "a", seed=1), name="a")
    repo.add(make_model(tmp_path / "b", seed=2), name="b")
    repo.rm("b")  # garbage to collect
    victim = next(t.object for t in repo.manifest("a").tensors())
    path = repo.store.path_of(victim)
    if damage == "missing":
        path.unlink()
    else:
        path.chmod(0o644)
        path.write_bytes(b"MGITOBJ\x01" + b"\xff" * 4)
    before = set(repo.store.ids())
    with pytest.raises(GcRefusedError, match=f"object {victim[:16]} is {damage}"):
        repo.gc()
    assert set(repo.store.ids()) == before


def test_du_per_model_is_each_chain_measured_on_its_own(repo: Repo) -> None:
    # du reads every model at once (a few queries); each figure is what the chain alone gives.
    add_lineage(repo, "base", "ft <- base", "ft", "q <- ft : quantize", "old", "kid <- old", "base")
    repo.rm("old", force=True)
    du = repo.du()
    assert [m.name for m in du.models] == ["base", "ft", "kid", "q"]
    for m in du.models:
        chain = repo.chain(repo.resolve(m.name))
        assert m.versions == len(chain)
        assert (m.objects, m.stored_bytes) == repo.catalog.physical_bytes(chain)
        assert m.tensor_storage == repo.catalog.tensor_storage(chain)
        assert m.logical_bytes == sum(v.logical_bytes for v in repo.log(m.name))
    live = sorted({v for m in du.models for v in repo.chain(repo.resolve(m.name))})
    assert (du.objects, du.stored_bytes) == repo.catalog.physical_bytes(live)
    assert repo.catalog.model_usage({"none": []})[0].to_json() == {
        "name": "none",
        "versions": 0,
        "logical_bytes": 0,
        "stored_bytes": 0,
        "objects": 0,
        "tensor_storage": {},
        "reduction": 0.0,
    }


def test_a_model_others_were_built_on_is_removed_only_with_force(tmp_path: Path) -> None:
    from conftest import run_cli

    from mgit.errors import RemoveRefusedError

    repo = Repo.init(tmp_path)
    repo.add(tensors(1), name="ft")
    for child in ("ft-fp16", "ft-int8"):
        repo.add(tensors(2), name=child, parent="ft")
    with pytest.raises(RemoveRefusedError, match="ft has 2 models built on it: ft-fp16, ft-int8") as caught:
        repo.rm("ft")
    assert "mgit rm ft --force" in str(caught.value.hint) and "ft" in repo.refs.all()
    code, out, err = run_cli("rm", "ft", cwd=tmp_path)
    assert code == 1 and out == "" and "Error: ft has 2 models built on it" in err and "ft" in repo.refs.all()
    code, out, err = run_cli("rm", "ft", "--force", "--json", cwd=tmp_path)
    assert code == 0, err
    assert "ft" not in repo.refs.all() and repo.rm("ft-fp16").model == "ft-fp16"  # a leaf needs no --force
