"""Crash safety with real kills: `mgit add`, `gc` and `checkout` SIGKILLed at fixed points
(MGIT_CRASH_AT) and at random times leave a repository that fsck accepts, that shows no half
version, and that the next command simply continues from."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import MGIT, fsck_ok, history, make_model, mgit_json, run_mgit, sha256_tree
from safetensors.numpy import save_file

from mgit import Repo
from mgit.util.atomicfile import TMP_PREFIX

pytestmark = pytest.mark.slow

KILLED = -signal.SIGKILL


# --- helpers ---------------------------------------------------------------------------------
# Only the commands that are killed run in subprocesses (and one `mgit fsck` per test, for its
# exit code); the checks after them run the same CLI in-process, which starts much faster.

def kill_after(p: subprocess.Popen[str], delay: float) -> int:
    """SIGKILL `p` unless it finishes within `delay` seconds; its exit code (0 or KILLED)."""
    try:
        p.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    assert p.returncode in (0, KILLED), err
    return p.returncode

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


# --- random-time kills ----------------------------------------------------------------------------
TENSORS = 8
SHAPE = (1300, 1000)  # 8 x 5.2 MB of float32 (each coded in two blocks): 42 MB


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


def holds_lock(pid: int, lock: Path) -> bool:
    """Whether process `pid` holds an flock on `lock`, read from /proc/locks (probing the lock
    ourselves would get in the way of the process we watch)."""
    try:
        inode = lock.stat().st_ino
    except FileNotFoundError:
        return False
    with open("/proc/locks") as fh:
        for line in fh:  # "1: FLOCK  ADVISORY  READ 26987 fe:00:2541083 0 EOF"
            f = line.split()
            if len(f) >= 6 and f[1] == "FLOCK" and f[4] == str(pid) and int(f[5].rsplit(":", 1)[1]) == inode:
                return True
    return False


def test_add_killed_at_random_times(tmp_path: Path, big_base: list[np.ndarray]) -> None:
    root = tmp_path / "work"
    root.mkdir()
    mgit_json(root, "init", ".")
    src = tmp_path / "src"
    writer_lock = root / ".mgit" / "locks" / "repo.lock"
    expected: dict[str, dict[str, str]] = {}  # message -> tree of the source added with it

    def start_writing(message: str) -> tuple[subprocess.Popen[bytes], float]:
        """Start `mgit add`; return once it holds the writer lock, under which it writes its
        objects, manifest, version and ref (interpreter start-up and the scan come before)."""
        p = subprocess.Popen([*MGIT, "add", str(src), "--name", "big", "-m", message, "--json"], cwd=root,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
        while not holds_lock(p.pid, writer_lock) and p.poll() is None:
            time.sleep(0.001)
        return p, time.monotonic()

    # An uninterrupted add first, to time its writing phase.
    expected["v0"] = write_big_model(src, big_base, 0)
    p, started = start_writing("v0")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    writing = time.monotonic() - started

    # This seed kills five adds in the middle of their writes and one near the end (around
    # the ref move); an add that outruns its delay just completes.
    rng = random.Random(9)
    outcomes = []
    for attempt in range(1, 7):
        message = f"v{attempt}"
        expected[message] = write_big_model(src, big_base, attempt)
        p, started = start_writing(message)
        if kill_after(p, rng.uniform(0.0, 1.15) * writing) == 0:  # faster than measured (the machine's load changed): measure again
            writing = time.monotonic() - started
        outcomes.append(p.returncode)
    assert outcomes.count(KILLED) >= 4, f"too few adds were interrupted ({outcomes}, writing takes {writing:.2f}s)"

    report = fsck_ok(root, in_subprocess=True)
    log = history(root, "big")
    messages = [v["message"] for v in log]
    assert len(set(messages)) == len(messages)
    assert messages[-1] == "v0"
    # Every add that exited 0 is listed; a killed one may be listed only if its ref had moved.
    completed = {f"v{i + 1}" for i, rc in enumerate(outcomes) if rc == 0}
    assert completed <= set(messages)
    assert heads(root) == {"big": log[0]["id"]}
    for v in log:
        out = tmp_path / f"out-{v['message']}"
        assert checkout_tree(root, v["id"], out) == expected[v["message"]], f"version {v['message']} differs"

    expected["final"] = write_big_model(src, big_base, 99)
    final = mgit_json(root, "add", str(src), "--name", "big", "-m", "final")
    assert final["created"] is True and final["seq"] == len(log) + 1
    assert checkout_tree(root, "big", tmp_path / "out-final") == expected["final"]

    gc = mgit_json(root, "gc")
    assert gc["leftovers"] == report["leftovers"]
    assert gc["removed"] or gc["leftovers"], f"no kill interrupted a write ({outcomes})"
    leftovers = [p for p in (root / ".mgit" / "objects").rglob(f"{TMP_PREFIX}*")]
    assert leftovers == []
    after = fsck_ok(root)
    assert after["leftovers"] == 0
    assert after["objects_checked"] == gc["kept"] == len(object_files(root))
    assert [v["id"] for v in history(root, "big")] == [final["version"], *(v["id"] for v in log)]


# --- gc killed mid-way --------------------------------------------------------------------------
def kill_gc_midway(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    """A repository with a live model and ~1500 garbage objects known to the catalog, and a
    `mgit gc` SIGKILLed after it deleted some garbage but not all. Skips if the kill misses."""
    root = tmp_path / "work"
    src = make_model(tmp_path / "keep", seed=5)
    repo = Repo.init(root)
    try:
        keep = repo.add(src, name="keep").version
        live = set(repo.store.ids())
        repo.store.fsync = False  # only to build the garbage quickly
        repo.add({f"t{i}": np.full(8, i, np.float32) for i in range(1500)}, name="junk")
        repo.rm("junk")
    finally:
        repo.catalog.close()
    for _ in range(3):
        garbage = sorted({p.parent.name + p.name for p in object_files(root)} - live)
        paths = [root / ".mgit" / "objects" / o[:2] / o[2:] for o in garbage]
        p = subprocess.Popen([*MGIT, "gc"], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # gc deletes in id order: once the first garbage object is gone, it is mid-way.
        while paths[0].exists() and p.poll() is None:
            time.sleep(0.0005)
        p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=60)
        assert p.returncode in (0, KILLED), err
        left = sum(path.exists() for path in paths)
        if p.returncode == KILLED and 0 < left < len(paths):
            return root, keep, sha256_tree(src)
        if left == 0:
            break  # gc finished before the kill: nothing left to interrupt
    pytest.skip("could not SIGKILL gc while it was deleting objects (it finished too fast)")


def test_gc_killed_midway_leaves_repository_clean(tmp_path: Path) -> None:
    root, keep, tree = kill_gc_midway(tmp_path)
    fsck_ok(root, in_subprocess=True)
    assert heads(root) == {"keep": keep}
    assert checkout_tree(root, "keep", tmp_path / "out") == tree
    gc = mgit_json(root, "gc")
    assert gc["removed"], "the second gc had nothing left to remove"
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


# --- checkout killed at random times -------------------------------------------------------------
def temporaries(folder: Path) -> list[str]:
    try:
        return [n for n in os.listdir(folder) if n.startswith(TMP_PREFIX)]
    except FileNotFoundError:
        return []


def final_files(folder: Path) -> dict[str, str]:
    """`sha256_tree` of the files that have their final name (not a checkout's temporaries)."""
    return {k: v for k, v in sha256_tree(folder).items() if not Path(k).name.startswith(TMP_PREFIX)}


def run_checkout_until_writing(root: Path, out: Path) -> tuple[subprocess.Popen[bytes], float]:
    """Start `mgit checkout big -o OUT`; return once it has created its first temporary file."""
    p = subprocess.Popen([*MGIT, "checkout", "big", "-o", str(out), "--json"], cwd=root,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    while not temporaries(out) and p.poll() is None:
        time.sleep(0.001)
    return p, time.monotonic()


def test_checkout_killed_at_random_times_leaves_no_partial_file(tmp_path: Path,
                                                                big_base: list[np.ndarray]) -> None:  # fmt: skip
    root = tmp_path / "work"
    root.mkdir()
    mgit_json(root, "init", ".")
    src = tmp_path / "src"
    tree = write_big_model(src, big_base, 7)
    mgit_json(root, "add", str(src), "--name", "big")

    # How long the writing phase lasts, from the first temporary file to the end.
    p, started = run_checkout_until_writing(root, tmp_path / "measure")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    writing = time.monotonic() - started
    assert sha256_tree(tmp_path / "measure") == tree

    rng = random.Random(7)
    interrupted = []
    for attempt in range(6):
        out = tmp_path / f"out{attempt}"
        p, started = run_checkout_until_writing(root, out)
        if kill_after(p, rng.uniform(0.0, 0.9) * writing) == 0:  # faster than measured (the machine's load changed): measure again
            writing = time.monotonic() - started
        for name, digest in final_files(out).items():
            assert tree.get(name) == digest, f"{name} has its final name but not its final content"
        if p.returncode == KILLED and temporaries(out):
            interrupted.append(out)
    assert interrupted, "no checkout was killed while writing a file"

    # A checkout into an interrupted folder completes it.
    mgit_json(root, "checkout", "big", "-o", str(interrupted[0]), "--force")
    assert final_files(interrupted[0]) == tree
