"""PEFT adapters added as members of a family: recognised by their config, their base found
(by tag, name or weights) and made their lineage parent, shown; forged configs refused in one
line with nothing written; `mgit.load_pretrained` and `mgit.load(merged=True)` against peft's
own `PeftModel.from_pretrained` and `merge_and_unload` on the checked-out folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MGIT, mgit_json, needs_torch, one_line_error, run_cli, tensors

from mgit import Repo

pytest.importorskip("peft")
pytestmark = needs_torch


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from peft_family import make_adapter, make_base

    root = tmp_path_factory.mktemp("peft")
    base = make_base(root / "base")
    out = {"base": base, "other": make_base(root / "other", seed=5)}
    for kind in ("lora", "dora", "ia3", "loha"):
        out[kind] = make_adapter(base, root / kind, kind=kind, seed=1, base_name="somewhere/not-stored")
    out["named"] = make_adapter(base, root / "named", kind="lora", seed=2, base_name="tiny-base")
    out["tagged"] = make_adapter(base, root / "tagged", kind="lora", seed=3, base_name="org/tiny")
    return out


def _objects(root: Path) -> int:
    return sum(1 for p in (root / ".mgit" / "objects").rglob("*") if p.is_file())


@pytest.fixture()
def family(tmp_path: Path, folders: dict[str, Path]) -> Path:
    root = tmp_path / "repo"
    Repo.init(root)
    assert run_cli("add", str(folders["base"]), "--name", "tiny-base", "--tag", "hf.repo_id=org/tiny", cwd=root)[0] == 0
    return root


def test_adapters_are_added_under_the_base_their_weights_fit_and_shown(family: Path, folders: dict[str, Path]) -> None:
    # two stored models of the same architecture fit by shape: the adapter cannot choose between them
    assert run_cli("add", str(folders["other"]), "--name", "unrelated", cwd=family)[0] == 0
    one_line_error(
        run_cli("add", str(folders["lora"]), "--name", "lora", cwd=family), "2 stored models fit", "--parent"
    )
    code, out, err = run_cli("add", str(folders["lora"]), "--name", "lora", "--parent", "tiny-base", cwd=family)
    assert code == 0, err
    info = mgit_json(family, "show", "lora")
    assert [(p["model"], p["relation"]) for p in info["version"]["parents"]] == [("tiny-base", "adapter")]
    adapter = info["adapter"]
    assert adapter["type"] == "LoRA" and adapter["rank"] == 8 and adapter["alpha"] == 16
    assert adapter["target_modules"] == ["query", "value"] and adapter["modules"] == 4
    assert adapter["base"] == "tiny-base@1" and adapter["base_model_name_or_path"] == "somewhere/not-stored"
    code, out, _ = run_cli("show", "lora", cwd=family)
    assert "adapter: LoRA, rank 8, alpha 16, 4 modules (query, value), base tiny-base@1" in out


def test_the_base_is_found_by_weights_by_name_and_by_hf_repo_id_tag(family: Path, folders: dict[str, Path]) -> None:
    for name, kind, label in (("dora", "dora", "LoRA (DoRA)"), ("ia3", "ia3", "IA3"), ("loha", "loha", "LOHA")):
        code, out, err = run_cli("add", str(folders[kind]), "--name", name, cwd=family)
        assert code == 0, err
        assert f"{label} adapter: parent base tiny-base (the one stored model the adapter's modules fit)" in err + out
        info = mgit_json(family, "show", name)
        assert info["adapter"]["type"] == label and info["version"]["parents"][0]["relation"] == "adapter"
    assert mgit_json(family, "show", "ia3")["adapter"]["rank"] is None
    assert mgit_json(family, "show", "loha")["adapter"]["modules"] == 4
    # by name, then by the tag import-hf sets, even with another model of the same shapes stored
    assert run_cli("add", str(folders["other"]), "--name", "unrelated", cwd=family)[0] == 0
    code, out, err = run_cli("add", str(folders["named"]), "--name", "named", cwd=family)
    assert code == 0 and "base tiny-base (named by base_model_name_or_path)" in out + err
    code, out, err = run_cli("add", str(folders["tagged"]), "--name", "tagged", cwd=family)
    assert code == 0 and "base tiny-base (tagged hf.repo_id=org/tiny by base_model_name_or_path)" in out + err
    # --parent and --relation say otherwise
    code, _, err = run_cli(
        "add", str(folders["named"]), "--name", "n2", "--parent", "unrelated", "--relation", "finetune", cwd=family
    )
    assert code == 0, err
    assert [(p["model"], p["relation"]) for p in mgit_json(family, "show", "n2")["version"]["parents"]] == [
        ("unrelated", "finetune")
    ]


def test_no_stored_model_fits(tmp_path: Path, folders: dict[str, Path]) -> None:
    root = tmp_path / "repo"
    Repo.init(root)
    before = _objects(root)
    one_line_error(
        run_cli("add", str(folders["lora"]), "--name", "lora", cwd=root),
        "'somewhere/not-stored' names no stored model",
        "no stored model has the weights it adapts",
    )
    # a named model that does not fit is said as such
    Repo(root).add(tensors(0), name="tiny-base")  # another architecture under the name the adapter gives
    before = _objects(root)
    one_line_error(run_cli("add", str(folders["named"]), "--name", "n", cwd=root), "is tiny-base", "does not fit")
    assert _objects(root) == before and "n" not in {m["name"] for m in mgit_json(root, "ls")}


def _forge(src: Path, dst: Path, **changes: object) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "adapter_config.json").read_text())
    config.update(changes)
    (dst / "adapter_config.json").write_text(json.dumps(config))
    return dst


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"r": 0}, "r is not a rank"),
        ({"r": "eight"}, "r is not a rank"),
        ({"r": 4}, "has rank 8 where the config says r = 4"),
        ({"peft_type": "MAGIC"}, "unknown adapter type 'MAGIC'"),
        ({"target_modules": ["query", "value", "nowhere"]}, "target module 'nowhere' matches no tensor"),
        ({"target_modules": ["query"]}, "is not among its target_modules"),
        ({"target_modules": "(unclosed"}, "not a regular expression"),
        ({"target_modules": "(.*a+)+$"}, "repeats a repeated group"),
        ({"lora_alpha": "big"}, "lora_alpha is not a number"),
        ({"use_dora": True}, "has no DoRA magnitude"),
        ({"base_model_name_or_path": "tiny-base-gone"}, "names no stored model"),
    ],
)
def test_forged_configs_are_refused_in_one_line_with_nothing_written(
    tmp_path: Path, folders: dict[str, Path], changes: dict[str, object], said: str
) -> None:
    root = tmp_path / "repo"
    Repo.init(root)
    Repo(root).add(tensors(0), name="small")  # a model the adapter does not fit
    before = _objects(root)
    forged = _forge(folders["lora"], tmp_path / "forged", **changes)
    one_line_error(run_cli("add", str(forged), "--name", "forged", cwd=root), said)
    assert _objects(root) == before
    assert "forged" not in {m["name"] for m in mgit_json(root, "ls")}


@pytest.mark.parametrize("what", ["config-not-json", "config-list", "weights-truncated"])
def test_truncated_files_are_refused(tmp_path: Path, folders: dict[str, Path], what: str) -> None:
    root = tmp_path / "repo"
    Repo.init(root).add(tensors(0), name="x")
    before = _objects(root)
    forged = tmp_path / "forged"
    shutil.copytree(folders["lora"], forged)
    config, weights = forged / "adapter_config.json", forged / "adapter_model.safetensors"
    if what == "config-not-json":
        config.write_bytes(config.read_bytes()[:40])
    elif what == "config-list":
        config.write_text("[1, 2]")
    else:
        weights.write_bytes(weights.read_bytes()[:50])
    err = one_line_error(run_cli("add", str(forged), "--name", "forged", "--parent", "x", cwd=root))
    assert "adapter_config.json" in err or "adapter_model.safetensors" in err
    assert _objects(root) == before


def _checked_out(root: Path, ref: str, out: Path) -> Path:
    Repo(root).checkout(ref, out)
    return out


@pytest.mark.parametrize("kind", ["lora", "dora", "ia3"])
def test_loaded_adapters_equal_peft_on_the_checked_out_folders(
    family: Path, folders: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    import peft
    import torch
    from peft_family import merged_by_peft
    from transformers import AutoModel

    import mgit

    assert run_cli("add", str(folders[kind]), "--name", kind, cwd=family)[0] == 0
    base_dir = _checked_out(family, "tiny-base", tmp_path / "base")
    adapter_dir = _checked_out(family, kind, tmp_path / kind)
    ours = mgit.load_pretrained(kind, AutoModel, repo=family)
    theirs = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(base_dir), adapter_dir)
    assert isinstance(ours, peft.PeftModel)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(ours(input_ids=ids).last_hidden_state, theirs(input_ids=ids).last_hidden_state)
    merged, expected = mgit.load(kind, repo=family, merged=True), merged_by_peft(base_dir, adapter_dir)
    assert merged.keys() == expected.keys()
    assert all(torch.equal(merged[n], expected[n]) for n in expected)
    changed = [n for n in expected if not torch.equal(expected[n], mgit.load("tiny-base", repo=family)[n])]
    assert len(changed) >= 4  # the merge changed the adapted weights, and they are peft's bit for bit
    numpy_merged = mgit.load(kind, repo=family, merged=True, framework="numpy")
    assert (numpy_merged[changed[0]] == expected[changed[0]].numpy()).all()


def test_merged_load_of_a_model_that_is_no_adapter_is_refused(family: Path) -> None:
    import mgit
    from mgit.errors import InputError

    with pytest.raises(InputError, match="not a PEFT adapter"):
        mgit.load("tiny-base", repo=family, merged=True)


def test_commands_that_do_not_touch_adapters_do_not_import_peft(family: Path) -> None:
    code = (
        "import sys; from mgit.cli.main import main; "
        "[main([c, 'tiny-base']) for c in ('show', 'log')]; "
        "sys.exit(3 if 'peft' in sys.modules or 'torch' in sys.modules else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=family, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert subprocess.run([*MGIT, "ls"], cwd=family, capture_output=True, check=False).returncode == 0
