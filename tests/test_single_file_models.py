"""Models added as single files under their own names (`mgit add base.safetensors --name base`):
merge, diff and the cascade's re-merge pair their one weight file each whatever it is called;
folders of several weight files keep pairing by path (mgit.formats.pairing)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import mgit_json, one_line_error, run_cli
from safetensors.numpy import load_file, save_file

NAMES = ("base", "ft_full", "ft_frozen")


def single_files(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """base, a fine-tune of every tensor and one with its bias frozen, each a .safetensors file
    named after its model, in `folder`; their tensors."""
    rng = np.random.default_rng(23)
    base = {"w": rng.standard_normal((8, 8)).astype(np.float32), "b": rng.standard_normal(8).astype(np.float32)}
    models = {
        "base": base,
        "ft_full": {k: v + np.float32(0.1) * rng.standard_normal(v.shape).astype(np.float32) for k, v in base.items()},
        "ft_frozen": {
            "w": base["w"] + np.float32(0.05) * rng.standard_normal((8, 8)).astype(np.float32),
            "b": base["b"],
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    for name, state in models.items():
        save_file(state, str(folder / f"{name}.safetensors"))
    return models


@pytest.fixture
def family(tmp_path: Path) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    """A repository holding the three single-file models, added the usual way."""
    root = tmp_path / "work"
    models = single_files(root)
    assert run_cli("init", str(root))[0] == 0
    for name in NAMES:
        code, _, err = run_cli(
            "add", f"{name}.safetensors", "--name", name, *(["--parent", "base"] * (name != "base")), cwd=root
        )
        assert code == 0, err
    return root, models


def task_arithmetic(models: dict[str, dict[str, np.ndarray]], key: str) -> np.ndarray:
    base = models["base"][key]
    return base + ((models["ft_full"][key] - base) + (models["ft_frozen"][key] - base))


def merged(root: Path, ref: str, out: Path) -> dict[str, dict[str, np.ndarray]]:
    assert run_cli("checkout", ref, "-o", str(out), cwd=root)[0] == 0
    return {p.name: load_file(str(p)) for p in out.glob("*.safetensors")}


def test_a_merge_of_single_files_pairs_them_whatever_they_are_called(family, tmp_path: Path) -> None:
    root, models = family
    result = mgit_json(
        root, "merge", "ft_full", "ft_frozen", "--method", "task_arithmetic", "--base", "base", "--name", "m"
    )
    assert result["model"] == "m"
    files = merged(root, "m", tmp_path / "m")
    assert list(files) == ["base.safetensors"]  # the first input's name (the base, added first)
    for key in ("w", "b"):
        np.testing.assert_allclose(files["base.safetensors"][key], task_arithmetic(models, key), rtol=1e-6, atol=1e-6)
    # Stored as weighted sums of its inputs' tensors, as a merge of folders is (the bias,
    # frozen in one fine-tune, merges into the other's exactly: the same object).
    assert mgit_json(root, "show", "m")["tensor_storage"] == {"derived": 1, "deduplicated": 1}


def test_merge_file_names_the_output(family, tmp_path: Path) -> None:
    root, models = family
    args = ("merge", "ft_full", "ft_frozen", "--method", "linear", "--file", "merged.safetensors", "--name", "m")
    code, out, err = run_cli(*args, cwd=root)
    assert code == 0, err
    files = merged(root, "m", tmp_path / "m")
    assert list(files) == ["merged.safetensors"]
    mean = (models["ft_full"]["w"] + models["ft_frozen"]["w"]) / np.float32(2)
    np.testing.assert_allclose(files["merged.safetensors"]["w"], mean, rtol=1e-6, atol=1e-6)
    recipe = mgit_json(root, "show", "m")["version"]["recipe"]
    assert recipe["params"]["file"] == "merged.safetensors"  # a re-run names it alike


def test_a_mergekit_config_of_single_files_with_file(family, tmp_path: Path) -> None:
    root, models = family
    config = root / "merge.yml"
    config.write_text(
        "models:\n  - model: ft_full\n  - model: ft_frozen\nmerge_method: task_arithmetic\nbase_model: base\n"
    )
    code, _, err = run_cli("merge", "--config", "merge.yml", "--file", "out.safetensors", "--name", "m", cwd=root)
    assert code == 0, err
    files = merged(root, "m", tmp_path / "m")
    assert list(files) == ["out.safetensors"]
    np.testing.assert_allclose(files["out.safetensors"]["w"], task_arithmetic(models, "w"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["sub/m.safetensors", "m.bin", "../m.safetensors", ""])
def test_merge_file_refuses_what_is_not_a_safetensors_file_name(family, name: str) -> None:
    root, _ = family
    args = ("merge", "ft_full", "ft_frozen", "--method", "linear", "--file", name, "--name", "m")
    one_line_error(run_cli(*args, cwd=root), "--file")
    assert run_cli("show", "m", cwd=root)[0] == 1  # nothing added


def test_merge_file_is_refused_for_inputs_of_several_weight_files(family, tmp_path: Path) -> None:
    root, models = family
    shards = tmp_path / "work" / "sharded"
    shards.mkdir()
    save_file({"w": models["ft_full"]["w"]}, str(shards / "model-00001-of-00002.safetensors"))
    save_file({"b": models["ft_full"]["b"]}, str(shards / "model-00002-of-00002.safetensors"))
    assert run_cli("add", "sharded", "--name", "sharded", cwd=root)[0] == 0
    folder = tmp_path / "work" / "other"
    folder.mkdir()
    save_file({"w": models["ft_frozen"]["w"]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({"b": models["ft_frozen"]["b"]}, str(folder / "model-00002-of-00002.safetensors"))
    assert run_cli("add", "other", "--name", "other", cwd=root)[0] == 0
    args = ("merge", "sharded", "other", "--method", "linear", "--file", "m.safetensors", "--name", "m")
    one_line_error(run_cli(*args, cwd=root), "--file", "2 weight files")


def test_a_folder_of_shards_against_a_single_file_is_refused_in_one_line(family, tmp_path: Path) -> None:
    root, models = family
    shards = tmp_path / "work" / "sharded"
    shards.mkdir()
    save_file({"w": models["ft_full"]["w"]}, str(shards / "model-00001-of-00002.safetensors"))
    save_file({"b": models["ft_full"]["b"]}, str(shards / "model-00002-of-00002.safetensors"))
    assert run_cli("add", "sharded", "--name", "sharded", "--parent", "base", cwd=root)[0] == 0
    args = ("merge", "sharded", "ft_frozen", "--method", "task_arithmetic", "--base", "base", "--name", "m")
    one_line_error(
        run_cli(*args, cwd=root), "base.safetensors: is missing from input 2 (sharded)", "the same weight files"
    )
    assert run_cli("show", "m", cwd=root)[0] == 1


def test_single_files_of_different_tensors_are_refused_in_one_line(family, tmp_path: Path) -> None:
    root, models = family
    save_file({"w2": models["ft_full"]["w"], "b": models["ft_full"]["b"]}, str(root / "renamed.safetensors"))
    assert run_cli("add", "renamed.safetensors", "--name", "renamed", cwd=root)[0] == 0
    args = ("merge", "renamed", "ft_frozen", "--method", "linear", "--name", "m")
    one_line_error(run_cli(*args, cwd=root), "is only in some inputs")


def test_diff_of_single_files_compares_them_as_one_file(family) -> None:
    root, _ = family
    result = mgit_json(root, "diff", "base", "ft_full")
    assert [(f["path"], f["path_b"], f["status"]) for f in result["files"]] == [
        ("base.safetensors", "ft_full.safetensors", "changed")
    ]
    assert result["summary"]["files"] == {"changed": 1}
    assert result["summary"]["counts"] == {"changed": 2}
    code, out, _ = run_cli("diff", "base", "ft_full", cwd=root)
    assert code == 0 and "base.safetensors -> ft_full.safetensors changed" in out, out
    # Two files on disk pair alike, outside a repository.
    paths = mgit_json(root, "diff", str(root / "base.safetensors"), str(root / "ft_frozen.safetensors"))
    assert [(f["path"], f["path_b"]) for f in paths["files"]] == [("base.safetensors", "ft_frozen.safetensors")]
    assert paths["summary"]["counts"] == {"changed": 1, "identical": 1}


def test_diff_of_folders_keeps_pairing_by_path(tmp_path: Path) -> None:
    models = single_files(tmp_path / "files")
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, name in ((a, "base"), (b, "ft_full")):
        folder.mkdir()
        save_file({"w": models[name]["w"]}, str(folder / "one.safetensors"))
        save_file({"b": models[name]["b"]}, str(folder / f"{name}.safetensors"))
    result = mgit_json(tmp_path, "diff", str(a), str(b))
    assert {(f["path"], f["path_b"], f["status"]) for f in result["files"]} == {
        ("one.safetensors", None, "changed"),
        ("base.safetensors", None, "only_a"),
        ("ft_full.safetensors", None, "only_b"),
    }


def test_suggest_finds_the_parent_of_a_single_file_of_another_name(family) -> None:
    """(Parent inference matches tensors by name, never by file: this guards that it stays so.)"""
    root, models = family
    rng = np.random.default_rng(5)
    child = {
        k: v + np.float32(1e-3) * rng.standard_normal(v.shape).astype(np.float32) for k, v in models["ft_full"].items()
    }
    save_file(child, str(root / "child.safetensors"))
    found = mgit_json(root, "lineage", "suggest", "child.safetensors")
    assert found["candidates"][0]["model"] == "ft_full"
    code, out, err = run_cli("add", "child.safetensors", "--name", "child", "--auto-parent", cwd=root)
    assert code == 0 and "ft_full@1" in out, (out, err)


def test_a_cascade_merges_single_files_again(family) -> None:
    root, models = family
    args = ("merge", "ft_full", "ft_frozen", "--method", "task_arithmetic", "--base", "base", "--name", "m")
    assert run_cli(*args, cwd=root)[0] == 0
    newer = {k: v + np.float32(0.01) for k, v in models["ft_frozen"].items()}
    save_file(newer, str(root / "ft_frozen_v2.safetensors"))
    assert run_cli("add", "ft_frozen_v2.safetensors", "--name", "ft_frozen", cwd=root)[0] == 0
    code, out, err = run_cli("cascade", "ft_frozen", "--json", cwd=root)
    assert code == 0, err
    (result,) = [r for r in json.loads(out)["results"] if r["model"] == "m"]
    assert result["status"] == "updated", result
    again = merged(root, "m", root.parent / "again")
    expected = task_arithmetic({**models, "ft_frozen": newer}, "w")
    np.testing.assert_allclose(again["base.safetensors"]["w"], expected, rtol=1e-6, atol=1e-6)


def test_the_pairing_rule() -> None:
    from mgit.formats.pairing import paired_files

    single = paired_files([["a.safetensors", "config.json"], ["b.safetensors"]], [["a.safetensors"], ["b.safetensors"]])
    assert single == [("a.safetensors", "b.safetensors"), ("config.json", None)]
    shards = [["x-1.safetensors", "x-2.safetensors"], ["x-1.safetensors"]]
    assert paired_files(shards, shards) == [("x-1.safetensors", "x-1.safetensors"), ("x-2.safetensors", None)]
    # A blob named like the other side's single weight file is not taken for it.
    odd = paired_files([["a.safetensors"], ["b.safetensors", "a.safetensors"]], [["a.safetensors"], ["b.safetensors"]])
    assert odd == [("a.safetensors", "b.safetensors"), (None, "a.safetensors")]


def test_the_diff_page_shows_the_pair(family) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mgit import Repo
    from mgit.web.app import create_app

    root, _ = family
    with TestClient(create_app(Repo(root)), base_url="http://127.0.0.1:8808") as client:
        for _ in range(200):  # bounded: 20 s at most
            data = client.get("/api/diff", params={"a": "base", "b": "ft_full"}).json()
            if data["state"] == "done":
                break
            time.sleep(0.1)
        assert [(f["path"], f["path_b"]) for f in data["result"]["files"]] == [
            ("base.safetensors", "ft_full.safetensors")
        ]
        page = client.get("/diff", params={"a": "base", "b": "ft_full"}).text
    assert "base.safetensors → ft_full.safetensors" in page
