"""`mgit status` on real repositories: behind after the origin adds a version and the clone
fetches, ahead after a local add, diverged, a lazy clone's objects here and not, and what an
interrupted add or checkout left (killed at their crash points), each with the command to
run next; the text and `--json` say the same."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import make_model, mgit_json, one_line_error, run_cli, run_mgit, tensors

from mgit import Repo
from mgit.status import status
from mgit.util.locks import FileLock


def shared(tmp_path: Path) -> tuple[Path, Path, Path]:
    """alice's work folder with base and ft pushed to a folder remote; bob's clone of it."""
    alice = tmp_path / "alice"
    Repo.init(alice)
    assert run_cli("add", str(make_model(tmp_path / "m" / "base", 0)), "--name", "base", cwd=alice)[0] == 0
    ft = make_model(tmp_path / "m" / "ft", 1)
    assert run_cli("add", str(ft), "--name", "ft", "--parent", "base", cwd=alice)[0] == 0
    remote = tmp_path / "team.mgit"
    assert run_cli("init", "--bare", str(remote))[0] == 0
    assert run_cli("remote", "add", "origin", str(remote), cwd=alice)[0] == 0
    assert run_cli("push", cwd=alice)[0] == 0
    bob = tmp_path / "bob"
    assert run_cli("clone", str(remote), str(bob))[0] == 0
    return alice, remote, bob


def states(root: Path, *args: str) -> dict[str, dict[str, Any]]:
    return {m["model"]: m for m in mgit_json(root, "status", *args)["models"]}


def new_version(tmp_path: Path, root: Path, name: str, seed: int) -> None:
    folder = make_model(tmp_path / "m" / f"{name}-{seed}", state=tensors(seed))
    code, _, err = run_cli("add", str(folder), "--name", name, cwd=root)
    assert code == 0, err


def test_a_clone_is_behind_after_a_fetch_ahead_after_an_add_and_up_to_date_after_push(tmp_path: Path) -> None:
    alice, _, bob = shared(tmp_path)
    report = mgit_json(bob, "status")
    assert report["clean"] is True and report["leftovers"] == [] and report["lazy"] is None
    assert {m["state"] for m in report["models"]} == {"up to date"}

    new_version(tmp_path, alice, "ft", 7)
    assert run_cli("push", cwd=alice)[0] == 0
    assert states(bob)["ft"]["state"] == "up to date"  # the last fetch is what status knows: no network
    assert run_cli("fetch", cwd=bob)[0] == 0
    ft = states(bob)["ft"]
    assert (ft["state"], ft["behind"], ft["ahead"], ft["next"]) == ("behind", 1, 0, "mgit pull origin")
    assert ft["tracking"] == Repo(alice).resolve("ft") and ft["head"] == Repo(bob).resolve("ft")
    code, out, _ = run_cli("status", cwd=bob)
    line = next(x for x in out.splitlines() if x.startswith("ft "))
    assert "behind 1" in line and line.rstrip().endswith("mgit pull origin")

    assert run_cli("pull", cwd=bob)[0] == 0
    new_version(tmp_path, bob, "base", 8)
    base = states(bob)["base"]
    assert (base["state"], base["ahead"], base["next"]) == ("ahead", 1, "mgit push origin")
    assert states(bob)["ft"]["state"] == "up to date"
    assert run_cli("push", cwd=bob)[0] == 0
    assert mgit_json(bob, "status")["clean"] is True


def test_diverged_models_and_models_on_one_side_say_what_to_run(tmp_path: Path) -> None:
    alice, _, bob = shared(tmp_path)
    new_version(tmp_path, alice, "ft", 11)
    new_version(tmp_path, alice, "other", 12)
    assert run_cli("push", cwd=alice)[0] == 0
    new_version(tmp_path, bob, "ft", 13)
    new_version(tmp_path, bob, "mine", 14)
    found = states(bob, "--fetch")
    assert (found["ft"]["state"], found["ft"]["ahead"], found["ft"]["behind"]) == ("diverged", 1, 1)
    assert found["ft"]["next"].startswith("mgit pull origin")
    assert (found["other"]["state"], found["other"]["next"]) == ("remote only", "mgit pull origin")
    assert (found["mine"]["state"], found["mine"]["next"]) == ("local only", "mgit push origin")
    one_line_error(run_cli("status", "--remote", "nowhere", cwd=bob), "nowhere")
    solo = tmp_path / "solo"
    Repo.init(solo)
    new_version(tmp_path, solo, "m", 15)
    assert [(m["model"], m["state"], m["next"]) for m in mgit_json(solo, "status")["models"]] == [
        ("m", "no remote", None)
    ]


def test_a_lazy_clone_says_which_versions_read_offline_and_reading_one_changes_it(tmp_path: Path) -> None:
    _, remote, _ = shared(tmp_path)
    lazy = tmp_path / "lazy"
    assert run_cli("clone", str(remote), str(lazy), "--lazy")[0] == 0
    before = mgit_json(lazy, "status")["lazy"]
    assert before["remote"] == "origin" and before["versions"] == 2 and before["versions_here"] == 0
    assert before["objects_here"] < before["objects"] and before["bytes_remote_only"] > 0
    assert before["next"].startswith("mgit fetch --objects")
    assert run_cli("checkout", "base", "-o", str(tmp_path / "out"), cwd=lazy)[0] == 0
    after = mgit_json(lazy, "status")["lazy"]
    assert after["versions_here"] == 1 and after["objects_here"] > before["objects_here"]
    assert after["bytes_remote_only"] < before["bytes_remote_only"]
    code, out, _ = run_cli("status", cwd=lazy)
    assert "lazy clone of origin: 1 of 2 versions readable offline" in out


def test_an_interrupted_add_and_checkout_are_named_with_what_to_run_next(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    assert run_mgit("init", cwd=root).returncode == 0
    src = make_model(tmp_path / "m", seed=4)
    killed = run_mgit("add", str(src), "--name", "m", cwd=root, env={"MGIT_CRASH_AT": "after-objects"})
    assert killed.returncode == -signal.SIGKILL
    report = mgit_json(root, "status")
    fsck = mgit_json(root, "fsck")
    [left] = report["leftovers"]
    assert left["kind"] == "unreferenced objects" and not report["clean"]
    assert (left["count"], left["bytes"]) == (fsck["unreferenced"], fsck["unreferenced_bytes"])
    assert "run the add again" in left["next"] and "mgit gc" in left["next"]
    with FileLock(root / ".mgit" / "locks" / "repo.lock", what="an add under way", shared=True):
        # While an mgit runs, objects no ref names may be those of its add: not called leftovers.
        assert [x.kind for x in status(Repo(root)).leftovers] == ["lock held"]
    assert run_mgit("add", str(src), "--name", "m", cwd=root).returncode == 0  # the add, resumed
    assert mgit_json(root, "status")["leftovers"] == []

    killed = run_mgit("checkout", "m", cwd=root, env={"MGIT_CRASH_AT": "checkout-piece-written"})
    assert killed.returncode == -signal.SIGKILL
    report = status(Repo(root))
    [left] = report.leftovers
    assert left.kind == "killed checkout" and left.count >= 1
    assert all(w.startswith("m/.tmp-") for w in left.where)
    assert left.next.startswith("mgit checkout m -o m --force")
    code, out, _ = run_cli("status", cwd=root)
    assert f"{left.count} killed checkout" in out and "next: mgit checkout m -o m --force" in out


def test_a_write_under_way_is_not_a_leftover_and_a_held_lock_is_said_held(tmp_path: Path) -> None:
    root = tmp_path / "work"
    Repo.init(root)
    (root / "m").mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = root / "m" / f".tmp-{writer.pid}-{'ab' * 6}-model.safetensors"
        live.write_bytes(b"half")
        (root / "m" / ".tmp-notes").write_text("another tool's")
        assert status(Repo(root)).leftovers == []  # its writer runs: a checkout under way
        with FileLock(root / ".mgit" / "locks" / "repo.lock", what="the test", shared=True):
            [held] = status(Repo(root)).leftovers
            assert (held.kind, held.where) == ("lock held", [".mgit/locks/repo.lock"])
            assert held.next.startswith("wait for it to finish")
    finally:
        writer.kill()
        writer.wait()
    [left] = status(Repo(root)).leftovers
    assert (left.kind, left.where, left.bytes) == ("killed checkout", [f"m/{live.name}"], 4)
