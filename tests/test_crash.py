"""Crash safety with real kills: `mgit add`, `gc` and `checkout` SIGKILLed at named crash
points (MGIT_CRASH_AT=<point> or <point>:<n>, mgit.util.faults) leave a repository that fsck
accepts, that shows no half version, and that the next command simply continues from. Every
kill lands where it is named, so each test asserts what that kill leaves."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from conftest import fsck_ok, history, make_model, mgit_json, run_mgit, sha256_tree
from safetensors.numpy import save_file

from mgit import Repo
from mgit.store.local import LocalStore
from mgit.util.atomicfile import TMP_PREFIX

pytestmark = pytest.mark.slow

KILLED = -signal.SIGKILL


# --- helpers ---------------------------------------------------------------------------------
# Only the commands that are killed run in subprocesses (and one `mgit fsck` per test, for its
# exit code); the checks after them run the same CLI in-process, which starts much faster.


def heads(root: Path) -> dict[str, str]:
    return {m["name"]: m["head"] for m in mgit_json(root, "ls")}


def object_files(root: Path) -> list[Path]:
    """Complete object files (not the temporaries of interrupted writes)."""
    objects = root / ".mgit" / "objects"
    return [p for p in objects.glob("??/*") if not p.name.startswith(TMP_PREFIX)]


def checkout_tree(root: Path, ref: str, out: Path) -> dict[str, str]:
    """Check `ref` out in-process (faster than a subprocess) and hash what was written."""
    repo = Repo(root)
    try:
        repo.checkout(ref, out)
    finally:
        repo.catalog.close()
    return sha256_tree(out)


def raw_catalog(root: Path) -> tuple[dict[str, str], set[str]]:
    """The catalog's models and version ids as stored, without opening a Repo (which syncs)."""
    db = sqlite3.connect(root / ".mgit" / "catalog.sqlite")
    try:
        models = dict(db.execute("SELECT name, head FROM models"))
        versions = {r[0] for r in db.execute("SELECT id FROM versions")}
    finally:
        db.close()
    return models, versions


# --- fixed crash points -------------------------------------------------------------------------
CRASH_POINTS = ["after-scan", "after-objects", "before-ref", "after-ref"]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_add_killed_at_crash_point_leaves_no_half_version(tmp_path: Path, point: str) -> None:
    root = tmp_path / "work"
    root.mkdir()
    mgit_json(root, "init", ".")
    old_src = make_model(tmp_path / "old", seed=1)
    new_src = make_model(tmp_path / "new", seed=2)
    first = mgit_json(root, "add", str(old_src), "--name", "m")
    old = first["version"]
    objects_before = len(object_files(root))

    r = run_mgit("add", str(new_src), "--name", "m", "-m", "killed", cwd=root, env={"MGIT_CRASH_AT": point})
    assert r.returncode == KILLED, f"expected a SIGKILL at {point}, got {r.returncode}: {r.stderr}"

    # The kill happened where it says: nothing written before the lock, objects after it.
    objects_after = len(object_files(root))
    if point == "after-scan":
        assert objects_after == objects_before
    else:
        assert objects_after > objects_before
    if point == "after-ref":
        # The ref moved but the catalog was never told: the next Repo must catch up.
        models, versions = raw_catalog(root)
        assert models == {"m": old}
        assert len(versions) == 1

    fsck_ok(root, in_subprocess=True)
    log = history(root, "m")
    if point == "after-ref":
        assert [v["id"] for v in log][1:] == [old]
        new = log[0]["id"]
        assert [v["seq"] for v in log] == [2, 1]
        assert log[0]["message"] == "killed"
        assert heads(root) == {"m": new}
        ls = mgit_json(root, "ls")
        assert [(m["name"], m["seq"]) for m in ls] == [("m", 2)]
        models, versions = raw_catalog(root)
        assert models == {"m": new} and new in versions
    else:
        assert [v["id"] for v in log] == [old]
        assert heads(root) == {"m": old}

    again = mgit_json(root, "add", str(new_src), "--name", "m", "-m", "killed")
    assert again["seq"] == 2
    if point == "after-ref":
        assert again["created"] is False and again["version"] == new
    else:
        assert again["created"] is True and again["version"] != old
    log = history(root, "m")
    assert [v["id"] for v in log] == [again["version"], old]
    assert heads(root) == {"m": again["version"]}
    assert checkout_tree(root, "m", tmp_path / "out") == sha256_tree(new_src)
    assert checkout_tree(root, "m@1", tmp_path / "out-old") == sha256_tree(old_src)
    fsck_ok(root)


# --- a large model's add killed at each point of its writes -------------------------------------
TENSORS = 8
SHAPE = (1300, 1000)  # 8 x 5.2 MB of float32, each coded in two blocks: 42 MB


@pytest.fixture(scope="module")
def big_base() -> list[np.ndarray]:
    rng = np.random.default_rng(1234)
    return [rng.standard_normal(SHAPE, dtype=np.float32) for _ in range(TENSORS)]


def write_big_model(path: Path, base: list[np.ndarray], variant: int) -> dict[str, str]:
    """A 40 MiB model folder; every `variant` has different bytes in every tensor."""
    path.mkdir(parents=True, exist_ok=True)
    state = {f"layer.{i}.weight": t + np.float32(variant) for i, t in enumerate(base)}
    save_file(state, str(path / "model.safetensors"), metadata={"variant": str(variant)})
    (path / "config.json").write_text(json.dumps({"model_type": "big", "variant": variant}))
    return sha256_tree(path)


def object_temporaries(root: Path) -> list[Path]:
    return list((root / ".mgit" / "objects").glob(f"??/{TMP_PREFIX}*"))


def tensors_among(root: Path, files: set[Path]) -> int:
    """How many of these complete object files hold tensors."""
    store = LocalStore(root / ".mgit" / "objects")
    return sum(store.header(p.parent.name + p.name).kind == "tensor" for p in files)


def killed_add(root: Path, src: Path, message: str, point: str) -> set[Path]:
    """`mgit add SRC --name big` SIGKILLed at `point`: the complete object files it left."""
    before = set(object_files(root))
    r = run_mgit("add", str(src), "--name", "big", "-m", message, cwd=root, env={"MGIT_CRASH_AT": point})
    assert r.returncode == KILLED, f"expected a SIGKILL at {point}, got {r.returncode}: {r.stderr}"
    return set(object_files(root)) - before


# The model's first add (its tensors coded whole, each in two blocks) is killed in the first
# block of the first tensor and among the blocks, then done; its next versions (deltas
# against the last) are killed after three objects and with the ref moved but the catalog not
# told. (test_add_killed_at_crash_point_leaves_no_half_version kills at every point of a small
# model's add.)
FIRST_ADD_KILLS = ["block-written:1", "block-written:9"]
NEXT_ADD_KILLS = ["object-written:3", "after-ref"]


def test_add_of_a_large_model_killed_at_each_point_of_its_writes(tmp_path: Path, big_base: list[np.ndarray]) -> None:
    root = tmp_path / "work"
    root.mkdir()
    mgit_json(root, "init", ".")
    src = tmp_path / "src"
    expected = {"v0": write_big_model(src, big_base, 0)}  # message -> tree of the source added with it
    finished = 0  # tensors the killed adds wrote whole
    for point in FIRST_ADD_KILLS:
        temporaries_before = len(object_temporaries(root))
        new_files = killed_add(root, src, "v0", point)
        assert len(object_temporaries(root)) > temporaries_before, point  # the tensors being written
        done = tensors_among(root, new_files)
        # Nine blocks of two-block tensors: one tensor at least was whole (more, the fewer
        # tensors the add was writing at once).
        assert done == 0 if point == "block-written:1" else done >= 1, point
        finished += done
        assert heads(root) == {}, point
    first = mgit_json(root, "add", str(src), "--name", "big", "-m", "v0")
    assert first["tensors_new"] == TENSORS - finished  # what the killed adds finished is kept

    for variant, point in enumerate(NEXT_ADD_KILLS, start=1):
        message = f"v{variant}"
        expected[message] = write_big_model(src, big_base, variant)
        new_files = killed_add(root, src, message, point)
        name, _, nth = point.partition(":")
        if name == "object-written":
            assert len(new_files) >= int(nth), point
        else:  # every tensor written, and the version record
            assert tensors_among(root, new_files) == TENSORS, point
        if point == "after-ref":
            log = history(root, "big")
            assert [v["message"] for v in log] == [message, "v0"]
            assert heads(root) == {"big": log[0]["id"]}
        else:
            assert heads(root) == {"big": first["version"]}, point

    report = fsck_ok(root, in_subprocess=True)
    assert report["leftovers"] >= len(FIRST_ADD_KILLS)  # the tensors killed mid-write
    log = history(root, "big")
    assert [v["message"] for v in log] == [f"v{len(NEXT_ADD_KILLS)}", "v0"]
    for v in log:
        out = tmp_path / f"out-{v['message']}"
        assert checkout_tree(root, v["id"], out) == expected[v["message"]], f"version {v['message']} differs"

    expected["final"] = write_big_model(src, big_base, 99)
    final = mgit_json(root, "add", str(src), "--name", "big", "-m", "final")
    assert final["created"] is True and final["seq"] == 3
    assert checkout_tree(root, "big", tmp_path / "out-final") == expected["final"]

    gc = mgit_json(root, "gc")
    assert gc["leftovers"] == report["leftovers"]
    assert gc["removed"]  # what the killed adds wrote, which no version uses
    assert object_temporaries(root) == []
    after = fsck_ok(root)
    assert after["leftovers"] == 0
    assert after["objects_checked"] == gc["kept"] == len(object_files(root))
    assert [v["id"] for v in history(root, "big")] == [final["version"], *(v["id"] for v in log)]


# --- gc killed mid-way --------------------------------------------------------------------------
GARBAGE = 1500
GC_KILLED_AFTER = 500  # deletions


def kill_gc_midway(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """A repository with a live model and GARBAGE garbage objects known to the catalog, and a
    `mgit gc` SIGKILLed right after its GC_KILLED_AFTER-th deletion."""
    root = tmp_path / "work"
    src = make_model(tmp_path / "keep", seed=5)
    repo = Repo.init(root)
    try:
        keep = repo.add(src, name="keep").version
        live = set(repo.store.ids())
        repo.store.fsync = False  # only to build the garbage quickly
        repo.add({f"t{i}": np.full(8, i, np.float32) for i in range(GARBAGE)}, name="junk")
        repo.rm("junk")
    finally:
        repo.catalog.close()
    garbage = sorted({p.parent.name + p.name for p in object_files(root)} - live)
    assert len(garbage) > GARBAGE  # the tensors, the manifest and the version
    r = run_mgit("gc", cwd=root, env={"MGIT_CRASH_AT": f"gc-deleted:{GC_KILLED_AFTER}"})
    assert r.returncode == KILLED, r.stderr
    left = {p.parent.name + p.name for p in object_files(root)}
    assert len(set(garbage) - left) == GC_KILLED_AFTER and live <= left
    return root, keep, sha256_tree(src)


def test_gc_killed_midway_leaves_repository_clean(tmp_path: Path) -> None:
    root, keep, tree = kill_gc_midway(tmp_path)
    fsck_ok(root, in_subprocess=True)
    assert heads(root) == {"keep": keep}
    assert checkout_tree(root, "keep", tmp_path / "out") == tree
    gc = mgit_json(root, "gc")
    assert len(gc["removed"]) > GARBAGE - GC_KILLED_AFTER  # what the killed gc had not deleted yet
    after = fsck_ok(root)
    assert after["objects_checked"] == gc["kept"] == len(object_files(root))
    assert checkout_tree(root, "keep", tmp_path / "out2") == tree


def test_gc_killed_midway_then_gc_leaves_du_exact(tmp_path: Path) -> None:
    """The catalog's object rows follow a killed gc: a gc that deleted files before removing
    their rows and died in between left rows that no later gc removed, so `du` counted bytes
    that were not on disk."""
    root, _, _ = kill_gc_midway(tmp_path)
    mgit_json(root, "gc")
    du = mgit_json(root, "du")
    on_disk = sum(p.stat().st_size for p in object_files(root))
    assert (du["on_disk_bytes"], du["unreachable_bytes"]) == (on_disk, 0)


# --- checkout killed while it writes a file ------------------------------------------------------
def temporaries(folder: Path) -> list[str]:
    try:
        return [n for n in os.listdir(folder) if n.startswith(TMP_PREFIX)]
    except FileNotFoundError:
        return []


def final_files(folder: Path) -> dict[str, str]:
    """`sha256_tree` of the files that have their final name (not a checkout's temporaries)."""
    return {k: v for k, v in sha256_tree(folder).items() if not Path(k).name.startswith(TMP_PREFIX)}


# A checkout rebuilds config.json (one piece), then model.safetensors (its header, then its
# tensors' blocks), each in a temporary file renamed when its digest checks out: killed after
# config.json's piece (not renamed yet), the weights' header, their eighth piece, their last.
CHECKOUT_KILLS = [1, 2, 9, 2 + 2 * TENSORS]


def test_checkout_killed_while_writing_a_file_leaves_no_partial_file(
    tmp_path: Path, big_base: list[np.ndarray]
) -> None:
    root = tmp_path / "work"
    root.mkdir()
    mgit_json(root, "init", ".")
    src = tmp_path / "src"
    tree = write_big_model(src, big_base, 7)
    mgit_json(root, "add", str(src), "--name", "big")

    for n in CHECKOUT_KILLS:
        out = tmp_path / f"out{n}"
        r = run_mgit("checkout", "big", "-o", str(out), cwd=root, env={"MGIT_CRASH_AT": f"checkout-piece-written:{n}"})
        assert r.returncode == KILLED, f"expected a SIGKILL after piece {n}, got {r.returncode}: {r.stderr}"
        # The file being written is a temporary; only a file written before has its final name.
        assert final_files(out) == ({} if n == 1 else {"config.json": tree["config.json"]}), n
        assert len(temporaries(out)) == 1, n

    # A checkout into an interrupted folder completes it.
    interrupted = tmp_path / f"out{CHECKOUT_KILLS[-1]}"
    mgit_json(root, "checkout", "big", "-o", str(interrupted), "--force")
    assert final_files(interrupted) == tree
