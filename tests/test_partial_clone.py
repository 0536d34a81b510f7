"""`clone --models GLOB`: the models asked for come whole; the versions they derive from, of
other models, come as records and are shown as remote-only (not removed), and `show` and
`checkout` of them fetch what they read, as a lazy clone does. Through the CLI, a folder remote."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, mgit_json, run_cli, sha256_tree, tensors

from mgit import Repo


def team(tmp_path: Path) -> tuple[Path, Path]:
    """A folder remote holding base, ft@1..3 (fine-tunes of base) and ft-fp16 (ft@3
    quantized to float16); the work folder that pushed them."""
    alice = tmp_path / "alice"
    Repo.init(alice)
    run = [("base", make_model(tmp_path / "m" / "base", 0), [])]
    for i in range(3):
        state = tensors(0)
        state["layer.0.weight"] = state["layer.0.weight"] + i + 1
        run.append(("ft", make_model(tmp_path / "m" / f"ft{i}", state=state), ["--parent", "base"]))
    state = tensors(0)
    state["layer.0.weight"] = (state["layer.0.weight"] + 3).astype(np.float16)
    fp16 = make_model(tmp_path / "m" / "fp16", state=state)
    run.append(("ft-fp16", fp16, ["--parent", "ft", "--relation", "quantize"]))
    for name, folder, parents in run:
        assert run_cli("add", str(folder), "--name", name, *parents, cwd=alice)[0] == 0
    remote = tmp_path / "team.mgit"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("remote", "add", "origin", str(remote), cwd=alice)[0] == 0
    assert run_cli("push", cwd=alice)[0] == 0
    return alice, remote


def test_a_clone_of_some_models_shows_and_checks_out_their_ancestors_fetching_what_it_reads(tmp_path: Path) -> None:
    alice, remote = team(tmp_path)
    code, out, err = run_cli("clone", str(remote), str(tmp_path / "dave"), "--models", "ft-fp16")
    assert code == 0, err
    dave = tmp_path / "dave"
    assert [m["name"] for m in mgit_json(dave, "ls")] == ["ft-fp16"]
    own = Repo(alice).manifest("ft@1").object_ids() - Repo(alice).manifest("ft@3").object_ids()
    assert own and not any(Repo(dave).store.has(o) for o in own)  # ft@1's own tensors: records only

    code, out, err = run_cli("lineage", cwd=dave)
    assert code == 0 and "ft@3" in out and "[remote-only]" in out and "[removed]" not in out, out
    [root] = mgit_json(dave, "lineage")
    assert root["model"]["name"] == "ft" and root["model"]["remote_only"] is True and not root["model"]["removed"]

    shown = mgit_json(dave, "show", "ft")
    assert shown["version"]["id"] == mgit_json(alice, "show", "ft@3")["version"]["id"]
    assert mgit_json(dave, "show", "ft@2")["version"]["id"] == mgit_json(alice, "show", "ft@2")["version"]["id"]
    for ref in ("ft", "ft@1", "ft-fp16"):
        out_dir = f"out-{ref.replace('@', '-')}"
        assert run_cli("checkout", ref, "-o", str(tmp_path / "a" / out_dir), cwd=alice)[0] == 0
        code, _, err = run_cli("checkout", ref, "-o", str(tmp_path / "d" / out_dir), cwd=dave)
        assert code == 0, err
        assert sha256_tree(tmp_path / "d" / out_dir) == sha256_tree(tmp_path / "a" / out_dir)
    assert mgit_json(dave, "fsck")["ok"] is True


def test_a_removed_model_without_a_remote_is_still_said_removed(tmp_path: Path) -> None:
    alice, _ = team(tmp_path)
    solo = tmp_path / "solo"
    Repo.init(solo)
    base = make_model(tmp_path / "m" / "base", 0)
    assert run_cli("add", str(base), "--name", "base", cwd=solo)[0] == 0
    assert run_cli("add", str(tmp_path / "m" / "ft0"), "--name", "ft", "--parent", "base", cwd=solo)[0] == 0
    assert run_cli("rm", "base", "--force", cwd=solo)[0] == 0
    [root] = mgit_json(solo, "lineage")
    assert root["model"]["name"] == "base" and root["model"]["removed"] is True and not root["model"]["remote_only"]
    code, out, err = run_cli("show", "base", cwd=solo)
    assert code == 1 and "no model named 'base'" in err


def test_the_pages_of_a_clone_of_some_models_show_its_remote_only_ancestors(tmp_path: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mgit.web.app import create_app

    _, remote = team(tmp_path)
    assert run_cli("clone", str(remote), str(tmp_path / "dave"), "--models", "ft-fp16")[0] == 0
    (tmp_path / "dave" / "evals.py").write_text("def score(path):\n    return {'acc': 1.0}\n")
    code, _, err = run_cli("test", "add", "ft*", "--fn", "evals.py:score", "--inherit", cwd=tmp_path / "dave")
    assert code == 0, err
    with TestClient(create_app(Repo(tmp_path / "dave")), base_url="http://127.0.0.1:8808") as client:
        for name in ("ft", "ft-fp16"):
            page = client.get(f"/api/models/{name}")
            assert page.status_code == 200, page.text
        ft = client.get("/api/models/ft").json()
        assert ft["model"]["remote_only"] and ft["version"]["version"]["seq"] == 3
        assert ft["tests"]["names"] == ["score"]
        assert client.get("/models/ft").status_code == 200
