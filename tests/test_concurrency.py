"""Real races: several `mgit` processes (released together by a pipe barrier) and several
threads writing one repository at once. No version may be lost or half-written, history
stays one chain per model, `gc` never deletes what an add in flight uses, and the catalog
agrees with refs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from conftest import fsck_ok, history, make_model, mgit_json, run_mgit, sha256_tree

from mgit import Repo
from mgit.reports import AddResult

pytestmark = pytest.mark.slow

# A child imports mgit, reports "ready" on one pipe, then blocks reading another until the
# test closes it: the commands start together instead of one interpreter start-up apart.
LAUNCHER = """
import os, sys
from mgit.cli.main import main
ready, go = int(sys.argv[1]), int(sys.argv[2])
os.write(ready, b".")
os.close(ready)
os.read(go, 1)
sys.exit(main(sys.argv[3:]))
"""


def run_together(root: Path, commands: list[list[str]]) -> list[subprocess.CompletedProcess[str]]:
    """Run `mgit` commands in separate processes released at the same moment."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    procs = []
    try:
        for args in commands:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", LAUNCHER, str(ready_w), str(go_r), *args],
                    cwd=root,
                    pass_fds=(ready_w, go_r),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        os.close(ready_w)
        ready = b""
        while len(ready) < len(commands):
            chunk = os.read(ready_r, 64)
            assert chunk, "a child exited before reaching the barrier"
            ready += chunk
    finally:
        os.close(go_w)  # releases every child at once (EOF on its end of the pipe)
        os.close(go_r)
        os.close(ready_r)
    results = []
    for p, args in zip(procs, commands, strict=True):
        out, err = p.communicate(timeout=180)
        results.append(subprocess.CompletedProcess(args, p.returncode, out, err))
    return results


def settle(root: Path, result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The JSON of a successful command; a retryable failure ("try again") is retried once."""
    if result.returncode == 1 and "try again" in result.stderr:
        result = run_mgit(*result.args, cwd=root)
    assert result.returncode == 0, f"mgit {' '.join(result.args)} exited {result.returncode}: {result.stderr}"
    return json.loads(result.stdout)


def check_out_all(root: Path, out: Path, expected: dict[str, dict[str, str]]) -> None:
    """Every version id in `expected` checks out to exactly that tree."""
    repo = Repo(root)
    try:
        for vid, tree in expected.items():
            target = out / vid[:16]
            repo.checkout(vid, target)
            assert sha256_tree(target) == tree, f"version {vid[:12]} does not check out as added"
    finally:
        repo.catalog.close()


def refs_on_disk(root: Path) -> dict[str, str]:
    base = root / ".mgit" / "refs" / "models"
    return {
        p.relative_to(base).as_posix(): p.read_text().strip()
        for p in base.rglob("*")
        if p.is_file() and not p.name.startswith(".tmp-")
    }


@pytest.fixture
def root(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    Repo.init(work).catalog.close()
    return work


# --- processes --------------------------------------------------------------------------------
def test_many_models_and_one_shared_model_at_once(root: Path, tmp_path: Path) -> None:
    base_src = make_model(tmp_path / "shared0", seed=100)
    base = mgit_json(root, "add", str(base_src), "--name", "shared")["version"]
    sources = {f"m{i}": make_model(tmp_path / f"m{i}", seed=i) for i in range(4)}
    shared = [make_model(tmp_path / f"shared{i}", seed=100 + i) for i in (1, 2)]
    commands = [["add", str(src), "--name", name, "--json"] for name, src in sources.items()]
    commands += [["add", str(src), "--name", "shared", "-m", src.name, "--json"] for src in shared]

    results = [settle(root, r) for r in run_together(root, commands)]

    assert all(r["created"] for r in results)
    added = {r["version"]: sha256_tree(Path(c[1])) for r, c in zip(results, commands, strict=True)}
    assert len(added) == 6
    log = history(root, "shared")
    assert len(log) == 3 and log[-1]["id"] == base
    assert [v["seq"] for v in log] == [3, 2, 1]
    assert {v["id"] for v in log[:2]} == {r["version"] for r in results[4:]}, "a shared version was lost"
    check_out_all(root, tmp_path / "out", {**added, base: sha256_tree(base_src)})
    fsck_ok(root, in_subprocess=True)

    expected_heads = {f"m{i}": results[i]["version"] for i in range(4)} | {"shared": log[0]["id"]}
    assert refs_on_disk(root) == expected_heads
    assert {m["name"]: m["head"] for m in mgit_json(root, "ls")} == expected_heads


def test_rounds_of_same_model_races_keep_one_chain(root: Path, tmp_path: Path) -> None:
    expected: dict[str, dict[str, str]] = {}
    rounds: list[set[str]] = []
    for r in range(5):
        sources = [make_model(tmp_path / f"r{r}s{i}", seed=10 * r + i) for i in range(3)]
        results = [
            settle(root, res)
            for res in run_together(root, [["add", str(s), "--name", "m", "-m", s.name, "--json"] for s in sources])
        ]
        assert all(res["created"] for res in results)
        rounds.append({res["version"] for res in results})
        expected.update((res["version"], sha256_tree(s)) for res, s in zip(results, sources, strict=True))

    log = history(root, "m")
    ids = [v["id"] for v in log]
    assert [v["seq"] for v in log] == list(range(15, 0, -1))
    assert len(ids) == len(set(ids)) == 15
    assert set(ids) == set(expected)
    # Rounds ran one after the other, so the chain holds them in round order.
    oldest_first = ids[::-1]
    assert [set(oldest_first[3 * r : 3 * r + 3]) for r in range(5)] == rounds
    assert refs_on_disk(root) == {"m": ids[0]}
    check_out_all(root, tmp_path / "out", expected)
    fsck_ok(root, in_subprocess=True)


def test_gc_during_adds_never_deletes_their_objects(root: Path, tmp_path: Path) -> None:
    keep_src = make_model(tmp_path / "keep0", seed=1)
    kept = {mgit_json(root, "add", str(keep_src), "--name", "keep")["version"]: sha256_tree(keep_src)}
    # Content that is garbage when the race starts: an add that finds its objects already
    # stored must not lose them to the gc running beside it.
    recycled = make_model(tmp_path / "recycled", seed=2)
    mgit_json(root, "add", str(recycled), "--name", "recycled")
    for r in range(3):
        mgit_json(root, "rm", "recycled")
        fresh = make_model(tmp_path / f"fresh{r}", seed=30 + r)
        keep = make_model(tmp_path / f"keep{r + 1}", seed=40 + r)
        commands = [
            ["add", str(recycled), "--name", "recycled", "--json"],
            ["gc", "--json"],
            ["add", str(fresh), "--name", f"fresh{r}", "--json"],
            ["add", str(keep), "--name", "keep", "--json"],
        ]
        results = [settle(root, res) for res in run_together(root, commands)]
        created = {}
        for res, cmd in zip(results, commands, strict=True):
            if cmd[0] == "add":
                assert res["created"], f"{cmd} did not create a version"
                created[res["version"]] = sha256_tree(Path(cmd[1]))
        kept[results[3]["version"]] = created[results[3]["version"]]
        check_out_all(root, tmp_path / f"out{r}", {**created, **kept})
        fsck_ok(root, in_subprocess=True)
    assert {v["id"] for v in history(root, "keep")} == set(kept)
    assert set(refs_on_disk(root)) == {"keep", "recycled", "fresh0", "fresh1", "fresh2"}


# --- threads -----------------------------------------------------------------------------------
@pytest.mark.parametrize("sharing", ["one Repo", "a Repo per thread"])
def test_threads_adding_to_one_repository(root: Path, tmp_path: Path, sharing: str) -> None:
    shared_repo = Repo(root)
    threads, per_thread = 4, 3
    sources = {
        (t, k): make_model(tmp_path / f"t{t}k{k}", seed=100 * t + k) for t in range(threads) for k in range(per_thread)
    }
    barrier = threading.Barrier(threads)
    results: dict[tuple[int, int], AddResult] = {}
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            repo = shared_repo if sharing == "one Repo" else Repo(root)
            barrier.wait(timeout=30)
            for k in range(per_thread):
                # Every thread adds to the shared model, and thread 0 to its own as well.
                results[t, k] = repo.add(sources[t, k], name="shared", message=f"t{t}k{k}")
                if t == 0:
                    repo.add(sources[t, k], name="solo", message=f"k{k}")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in pool)
    assert errors == []

    assert all(r.created for r in results.values())
    expected = {r.version: sha256_tree(sources[key]) for key, r in results.items()}
    assert len(expected) == threads * per_thread
    log = history(root, "shared")
    assert {v["id"] for v in log} == set(expected) and len(log) == len(expected)
    assert [v["seq"] for v in log] == list(range(len(log), 0, -1))
    # Each thread's own versions keep their order in the shared history.
    oldest_first = [v["message"] for v in reversed(log)]
    for t in range(threads):
        mine = [m for m in oldest_first if m.startswith(f"t{t}k")]
        assert mine == [f"t{t}k{k}" for k in range(per_thread)]
    assert [v["message"] for v in history(root, "solo")] == ["k2", "k1", "k0"]
    check_out_all(root, tmp_path / "out", expected)
    fsck_ok(root, in_subprocess=True)
    shared_repo.catalog.close()


def test_version_numbers_when_the_previous_writer_indexes_late(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Writer A moves the ref and is descheduled before it updates the catalog; writer B adds
    the next version meanwhile. Both versions must get their true numbers (before commit
    74206f5 writer B numbered its version 1: it read its predecessor's row, not yet written)."""
    first, late, next_ = (make_model(tmp_path / f"s{i}", seed=i) for i in range(3))
    writer_a, writer_b = Repo(root), Repo(root)
    writer_a.add(first, name="m")
    indexing, resume = threading.Event(), threading.Event()
    add_objects = writer_a.catalog.add_objects

    def paused_add_objects(rows: Any) -> None:  # the first catalog write after the ref moved
        indexing.set()
        assert resume.wait(timeout=60)
        add_objects(rows)

    monkeypatch.setattr(writer_a.catalog, "add_objects", paused_add_objects)
    result_a: list[AddResult] = []
    thread = threading.Thread(target=lambda: result_a.append(writer_a.add(late, name="m")))
    thread.start()
    try:
        assert indexing.wait(timeout=60), "writer A never reached the catalog update"
        result_b = writer_b.add(next_, name="m")
    finally:
        resume.set()
        thread.join(timeout=60)
    assert result_a and result_a[0].seq == 2
    log = history(root, "m")
    assert [v["id"] for v in log] == [result_b.version, result_a[0].version, log[-1]["id"]]
    assert [v["seq"] for v in log] == [3, 2, 1]
    assert result_b.seq == 3


def test_a_stale_catalog_sync_does_not_undo_a_newer_head(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process C syncs the catalog (it saw a head the catalog lacked) and is descheduled between
    reading refs/ and writing the catalog; writer A adds a version meanwhile. The catalog must
    end up with A's head, as refs/ has it (a sync that read refs/ before taking the catalog's
    write lock put the old head back, and a long-lived Repo listed it)."""
    writer_a, syncer = Repo(root), Repo(root)
    writer_a.add(make_model(tmp_path / "m1", seed=1), name="m")
    # A head the catalog does not know yet: an add killed right after its ref moved.
    killed = run_mgit(
        "add", str(make_model(tmp_path / "x", seed=2)), "--name", "x", cwd=root, env={"MGIT_CRASH_AT": "after-ref"}
    )
    assert killed.returncode == -9, killed.stderr
    writing, resume = threading.Event(), threading.Event()
    set_heads = syncer.catalog.set_heads

    def paused_set_heads(*args: Any) -> None:  # the sync has read refs/; its write comes next
        writing.set()
        assert resume.wait(timeout=60)
        set_heads(*args)

    monkeypatch.setattr(syncer.catalog, "set_heads", paused_set_heads)
    thread = threading.Thread(target=syncer.sync_catalog)
    thread.start()
    try:
        assert writing.wait(timeout=60), "the sync never reached its catalog write"
        newer = writer_a.add(make_model(tmp_path / "m2", seed=3), name="m").version
    finally:
        resume.set()
        thread.join(timeout=60)
    assert refs_on_disk(root)["m"] == newer
    assert {m.name: m.head for m in writer_a.ls()} == refs_on_disk(root)
    assert writer_a.fsck().ok
