"""`mgit show REF --tensors`: every tensor of a version with how its object is stored and
which other versions share it, the same rows as `mgit serve`'s version page; in a lazy
clone, the tensors not fetched are said so and nothing is fetched to say it."""

from __future__ import annotations

from pathlib import Path

from conftest import make_model, mgit_json, run_cli, tensors

from mgit import Repo


def family(tmp_path: Path) -> Repo:
    """base and ft (one tensor changed from base's), pushed to a folder remote `team.mgit`."""
    repo = Repo.init(tmp_path / "alice")
    repo.add(make_model(tmp_path / "base", 0), name="base")
    state = tensors(0)
    state["layer.0.weight"] = state["layer.0.weight"] * 1.5
    repo.add(make_model(tmp_path / "ft", state=state), name="ft", parent=["base"])
    assert run_cli("init", "--bare", str(tmp_path / "team.mgit"))[0] == 0
    assert run_cli("remote", "add", "origin", str(tmp_path / "team.mgit"), cwd=repo.root)[0] == 0
    assert run_cli("push", cwd=repo.root)[0] == 0
    return repo


def test_show_tensors_lists_every_tensor_with_its_codec_and_the_versions_sharing_it(tmp_path: Path) -> None:
    repo = family(tmp_path)
    shown = mgit_json(repo.root, "show", "ft", "--tensors")
    rows = {t["name"]: t for t in shown["tensors"]}
    manifest = repo.manifest("ft")
    assert [(t["file"], t["name"]) for t in shown["tensors"]] == [
        (f.path, t.name) for f in manifest.files for t in f.tensors
    ]
    base_objects = repo.manifest("base").object_ids()
    for entry in manifest.tensors():
        row = rows[entry.name]
        assert (row["object"], row["dtype"], row["shape"]) == (entry.object, entry.dtype, list(entry.shape))
        assert row["codec"] == repo.store.header(entry.object).codec_names
        assert row["stored_bytes"] == repo.store.stored_size(entry.object) and row["fetched"] is True
        assert row["shared_with"] == (["base@1"] if entry.object in base_objects else [])
    assert rows["layer.0.weight"]["shared_with"] == [] and rows["embed.weight"]["shared_with"] == ["base@1"]
    assert "tensors" not in mgit_json(repo.root, "show", "ft")  # only when asked

    code, out, err = run_cli("show", "ft", "--tensors", cwd=repo.root)
    assert code == 0, err
    line = next(x for x in out.splitlines() if " layer.0.weight " in x)
    assert rows["layer.0.weight"]["codec"] in line and line.rstrip().endswith("-")
    assert next(x for x in out.splitlines() if " embed.weight " in x).rstrip().endswith("base@1")


def test_show_tensors_in_a_lazy_clone_says_what_is_not_fetched_and_fetches_nothing(tmp_path: Path) -> None:
    family(tmp_path)
    lazy = tmp_path / "lazy"
    assert run_cli("clone", str(tmp_path / "team.mgit"), str(lazy), "--lazy")[0] == 0
    before = set(Repo(lazy).store.ids())
    shown = mgit_json(lazy, "show", "ft", "--tensors")
    assert shown["tensors"] and not any(t["fetched"] for t in shown["tensors"])
    code, out, err = run_cli("show", "ft", "--tensors", cwd=lazy)
    assert code == 0 and out.count("(not fetched)") == len(shown["tensors"]), out
    assert set(Repo(lazy).store.ids()) == before
    assert run_cli("checkout", "ft", "-o", str(tmp_path / "out"), cwd=lazy)[0] == 0
    assert all(t["fetched"] for t in mgit_json(lazy, "show", "ft", "--tensors")["tensors"])
