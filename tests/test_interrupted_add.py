"""An add killed after writing its objects: fsck names what it left (unreferenced objects and
their size), and the retry reports the bytes it found written already as reused, not new."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from conftest import make_model, run_mgit


def test_a_retried_add_reports_what_it_reused_and_fsck_what_was_left(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    assert run_mgit("init", cwd=root).returncode == 0
    src = make_model(tmp_path / "m", seed=4)
    killed = run_mgit("add", str(src), "--name", "m", cwd=root, env={"MGIT_CRASH_AT": "after-objects"})
    assert killed.returncode == -signal.SIGKILL
    fsck = run_mgit("fsck", "--json", cwd=root)
    report = json.loads(fsck.stdout)
    assert fsck.returncode == 0 and report["ok"] and report["unreferenced"] > 0 and report["unreferenced_bytes"] > 0
    human = run_mgit("fsck", cwd=root).stdout
    assert f"{report['unreferenced']} unreferenced objects (" in human and "mgit gc removes them" in human
    retry = run_mgit("add", str(src), "--name", "m", "--json", cwd=root)
    assert retry.returncode == 0, retry.stderr
    added = json.loads(retry.stdout)
    assert 0 < added["reused_bytes"] < added["new_bytes"]  # the records are new; the objects were there
    assert added["reused_bytes"] == report["unreferenced_bytes"]
    line = run_mgit("add", str(make_model(tmp_path / "n", seed=5)), "--name", "n", cwd=root).stdout
    assert "reused" not in line  # an add that wrote everything itself says nothing of it
    after = json.loads(run_mgit("fsck", "--json", cwd=root).stdout)
    assert after["unreferenced"] == 0
