"""`mgit merge --adapter`: an adapter merged into its base as peft's `merge_and_unload` does
(LoRA, DoRA, IA3; bit for bit), a LoRA's matrices stored as the base's plus the adapter's B A, recorded
as a recipe that `mgit cascade` re-runs on a new base version; other types refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import fsck_ok, mgit_json, needs_torch, one_line_error, run_cli

from mgit import Repo

pytest.importorskip("peft")
pytestmark = needs_torch


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch
    from peft_family import make_adapter, make_base
    from transformers import AutoModel

    root = tmp_path_factory.mktemp("peft-merge")
    base = make_base(root / "base")
    out = {"base": base}
    for kind in ("lora", "dora", "ia3", "loha"):
        out[kind] = make_adapter(base, root / kind, kind=kind, seed=7, base_name="tiny-base")
    model = AutoModel.from_pretrained(base)  # a new version of the base: every weight moved a little
    with torch.no_grad():
        g = torch.Generator().manual_seed(9)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-3)
    model.save_pretrained(root / "base2")
    out["base2"] = root / "base2"
    return out


@pytest.fixture()
def family(tmp_path: Path, folders: dict[str, Path]) -> Path:
    root = tmp_path / "repo"
    Repo.init(root)
    for name, folder in (("tiny-base", "base"), ("lora", "lora"), ("dora", "dora"), ("ia3", "ia3"), ("loha", "loha")):
        code, _, err = run_cli("add", str(folders[folder]), "--name", name, cwd=root)
        assert code == 0, err
    return root


def _equal_to_peft(root: Path, ref: str, base_dir: Path, adapter_dir: Path, out: Path) -> int:
    """The checked-out merged model holds peft's merged tensors, bit for bit; how many the merge changed."""
    import torch
    from peft_family import merged_by_peft
    from safetensors.torch import load_file

    Repo(root).checkout(ref, out)
    ours, expected = load_file(out / "model.safetensors"), merged_by_peft(base_dir, adapter_dir)
    base = load_file(base_dir / "model.safetensors")
    assert ours.keys() == expected.keys()
    assert [n for n in expected if not torch.equal(ours[n], expected[n])] == []
    return sum(not torch.equal(base[n], expected[n]) for n in expected)


@pytest.mark.parametrize("kind", ["lora", "dora", "ia3"])
def test_merge_adapter_equals_peft_merge_and_unload(
    family: Path, folders: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    code, out, err = run_cli("merge", "--adapter", kind, "--name", f"{kind}-merged", cwd=family)
    assert code == 0, err
    assert f"{kind}-merged@1" in out and "merge of tiny-base@1, " + f"{kind}@1" in out
    assert _equal_to_peft(family, f"{kind}-merged", folders["base"], folders[kind], tmp_path / "out") >= 4
    info = mgit_json(family, "show", f"{kind}-merged")
    assert [(p["model"], p["relation"]) for p in info["version"]["parents"]] == [
        ("tiny-base", "merge"),
        (kind, "merge"),
    ]
    assert info["version"]["recipe"]["fn"] == "mgit.merging.adapters:merge"


def _stored_as_lora_merges(root: Path, ref: str, base: str) -> int:
    """The merged matrices are stored as their base plus the adapter's own B A (lora_merge), the
    other tensors are the base's objects; the bytes the merged version added."""
    rows = mgit_json(root, "show", ref, "--tensors")["tensors"]
    changed = [t for t in rows if t["name"].endswith(("query.weight", "value.weight"))]
    assert len(changed) == 4 and all(t["codec"].startswith("lora_merge") for t in changed), changed
    assert all(base in t["shared_with"] for t in rows if t not in changed)
    return int(mgit_json(root, "show", ref)["version"]["new_bytes"])


def test_a_merged_lora_is_stored_as_its_base_plus_the_adapters_product(family: Path, folders: dict[str, Path]) -> None:
    assert run_cli("merge", "--adapter", "lora", "--name", "lora-merged", cwd=family)[0] == 0
    adapter_file = (folders["lora"] / "adapter_model.safetensors").stat().st_size
    assert _stored_as_lora_merges(family, "lora-merged", "tiny-base@1") < adapter_file
    fsck_ok(family)


def test_a_model_merged_by_peft_and_added_with_base_and_adapter_as_parents_is_stored_the_same_way(
    family: Path, folders: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    from peft_family import merged_by_peft
    from safetensors.torch import save_file

    merged = tmp_path / "merged-by-peft"
    shutil.copytree(folders["base"], merged)
    save_file(merged_by_peft(folders["base"], folders["lora"]), merged / "model.safetensors", metadata={"format": "pt"})
    code, _, err = run_cli(
        "add", str(merged), "--name", "peft-merged", "-p", "tiny-base", "-p", "lora", "-r", "merge", cwd=family
    )
    assert code == 0, err
    adapter_file = (folders["lora"] / "adapter_model.safetensors").stat().st_size
    assert _stored_as_lora_merges(family, "peft-merged", "tiny-base@1") < adapter_file
    out = tmp_path / "out"
    Repo(family).checkout("peft-merged", out)
    assert (out / "model.safetensors").read_bytes() == (merged / "model.safetensors").read_bytes()
    fsck_ok(family)


def test_a_cascade_on_a_new_base_version_merges_again(family: Path, folders: dict[str, Path], tmp_path: Path) -> None:
    assert run_cli("merge", "--adapter", "lora", "--name", "lora-merged", cwd=family)[0] == 0
    assert run_cli("add", str(folders["base2"]), "--name", "tiny-base", cwd=family)[0] == 0
    code, out, err = run_cli("cascade", "tiny-base", cwd=family)
    assert code == 0, err + out
    assert "lora-merged@1 -> lora-merged@2" in out
    assert "lora" in out and "up-to-date" in out  # the adapter is kept as it is
    parents = mgit_json(family, "show", "lora-merged@2")["version"]["parents"]
    assert [p["ref"] if "ref" in p else f"{p['model']}@{p['seq']}" for p in parents] == ["tiny-base@2", "lora@1"]
    assert _equal_to_peft(family, "lora-merged@2", folders["base2"], folders["lora"], tmp_path / "out") >= 4
    adapter_file = (folders["lora"] / "adapter_model.safetensors").stat().st_size
    assert _stored_as_lora_merges(family, "lora-merged@2", "tiny-base@2") < adapter_file


def test_merging_another_type_or_a_model_that_is_no_adapter_is_refused(
    family: Path, folders: dict[str, Path], tmp_path: Path
) -> None:
    import shutil

    bare = tmp_path / "config-only"  # an adapter whose weights are not there (a .bin kept aside)
    bare.mkdir()
    shutil.copy(folders["lora"] / "adapter_config.json", bare)
    assert run_cli("add", str(bare), "--name", "bare", "--parent", "tiny-base", cwd=family)[0] == 0
    objects = sum(1 for p in (family / ".mgit" / "objects").rglob("*") if p.is_file())
    one_line_error(run_cli("merge", "--adapter", "bare", "--name", "m", cwd=family), "no module tensors to merge")
    one_line_error(run_cli("merge", "--adapter", "loha", "--name", "m", cwd=family), "LOHA adapter is not supported")
    one_line_error(run_cli("merge", "--adapter", "tiny-base", "--name", "m", cwd=family), "not a PEFT adapter")
    code, _, err = run_cli("merge", "--adapter", "lora", "a", "b", "--name", "m", cwd=family)
    assert code == 2 and "--adapter merges one adapter" in err
    assert sum(1 for p in (family / ".mgit" / "objects").rglob("*") if p.is_file()) == objects
    assert "m" not in {m["name"] for m in mgit_json(family, "ls")}


def test_diff_of_two_adapters_and_of_a_base_and_its_merge(
    family: Path, folders: dict[str, Path], tmp_path: Path
) -> None:
    from peft_family import make_adapter

    other = make_adapter(folders["base"], tmp_path / "lora2", kind="lora", r=4, seed=8, targets=["query", "key"])
    assert run_cli("add", str(other), "--name", "lora2", "--parent", "tiny-base", cwd=family)[0] == 0
    found = mgit_json(family, "diff", "lora", "lora2")["adapters"]
    assert found["same_base"] and found["a"]["rank"] == 8 and found["b"]["rank"] == 4
    assert found["only_in_a"] == ["encoder.layer.0.attention.self.value", "encoder.layer.1.attention.self.value"]
    assert found["only_in_b"] == ["encoder.layer.0.attention.self.key", "encoder.layer.1.attention.self.key"]
    query = found["modules"][0]
    assert query["module"] == "encoder.layer.0.attention.self.query" and query["rank"] == [8, 4]
    assert query["update_norm"][0] > 0 and query["rel_difference"] > 0.5  # independent updates
    code, out, _ = run_cli("diff", "lora", "lora2", cwd=family)
    assert code == 0 and "Modules: 2 in both, 2 only in A, 2 only in B" in out
    assert "Adapter B: LoRA, rank 4, alpha 8, 4 modules (key, query), base tiny-base@1" in out
    # a base against the adapter merged into it: the adapted matrices changed, by an update of rank 8
    assert run_cli("merge", "--adapter", "lora", "--name", "lora-merged", cwd=family)[0] == 0
    result = mgit_json(family, "diff", "tiny-base", "lora-merged")
    assert "adapters" not in result
    changed = [t for t in result["tensors"] if t["status"] == "changed"]
    assert len(changed) == 4 and {t["stats"]["rank"] for t in changed} == {8}


def test_an_adapter_added_beside_merges_of_its_base_goes_under_the_base(
    family: Path, folders: dict[str, Path], tmp_path: Path
) -> None:
    from peft_family import make_adapter

    assert run_cli("merge", "--adapter", "lora", "--name", "lora-merged", cwd=family)[0] == 0
    other = make_adapter(folders["base"], tmp_path / "lora3", kind="lora", seed=11, base_name="/elsewhere/unknown")
    code, out, err = run_cli("add", str(other), "--name", "lora3", cwd=family)
    assert code == 0, err
    assert "base tiny-base (of the stored models the adapter's modules fit, the others' ancestor)" in out + err
    assert mgit_json(family, "show", "lora3")["adapter"]["base"] == "tiny-base@1"


@pytest.mark.parametrize("kind", ["lora", "dora", "ia3"])
def test_bfloat16_bases_and_adapters_merge_as_peft_merges_them(tmp_path: Path, kind: str) -> None:
    import torch
    from peft_family import half_adapter, make_adapter, make_base

    base = make_base(tmp_path / "b16", dtype=torch.bfloat16)
    adapter = half_adapter(make_adapter(base, tmp_path / kind, kind=kind, seed=4))
    root = tmp_path / "repo"
    Repo.init(root)
    for name, folder in (("b16", base), (kind, adapter)):
        assert run_cli("add", str(folder), "--name", name, cwd=root)[0] == 0
    assert run_cli("merge", "--adapter", kind, "--name", "merged", cwd=root)[0] == 0
    assert _equal_to_peft(root, "merged", base, adapter, tmp_path / "out") >= 4


VARIANTS = {
    "gpt2-fan-in-fan-out": ("gpt2", {"targets": ["c_attn", "c_proj"], "fan_in_fan_out": True}),
    "embedding": ("bert", {"targets": ["word_embeddings", "query"]}),
    "modules-to-save": ("bert", {"modules_to_save": ["pooler.dense"]}),
    "rslora-and-patterns": ("bert", {"use_rslora": True, "rank_pattern": {"value": 4}, "alpha_pattern": {"query": 32}}),
    "lora-bias": ("bert", {"lora_bias": True}),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lora_variants_merge_as_peft_merges_them(tmp_path: Path, variant: str) -> None:
    """Conv1D layers (in x out), an embedding, a head saved whole, rsLoRA with per-module rank
    and alpha, a LoRA bias: each merged as peft merges it."""
    from peft_family import make_adapter, make_base

    arch, options = VARIANTS[variant]
    base = make_base(tmp_path / "base", arch=arch)
    adapter = make_adapter(base, tmp_path / "adapter", kind="lora", seed=2, **options)
    root = tmp_path / "repo"
    Repo.init(root)
    for name, folder in (("b", base), ("a", adapter)):
        assert run_cli("add", str(folder), "--name", name, cwd=root)[0] == 0
    assert run_cli("merge", "--adapter", "a", "--name", "m", cwd=root)[0] == 0
    assert _equal_to_peft(root, "m", base, adapter, tmp_path / "out") >= 3
