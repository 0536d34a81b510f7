"""A full disk, for real: a repository on a small tmpfs. The add that runs out of space fails
with one line, commits nothing, and leaves a repository that fsck finds clean and gc tidies;
a checkout that runs out of space leaves no half-written file under its final name."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_cli, sha256_tree

from mgit import Repo


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def big_model(path: Path, megabytes: int, *, one_tensor: bool = False) -> Path:
    """Random float32 weights: incompressible, so they take their full size on disk. In 256 KiB
    tensors, or in one tensor (over a block: coded and written block by block)."""
    rng = np.random.default_rng(megabytes)
    if one_tensor:
        return make_model(path, state={"w": rng.standard_normal(megabytes << 18, dtype=np.float32)})
    quarter = 256 * 1024 // 4  # float32 values in 256 KiB
    state = {f"w{i}": rng.standard_normal(quarter, dtype=np.float32) for i in range(megabytes * 4)}
    return make_model(path, state=state)


@pytest.mark.parametrize("one_tensor", [False, True], ids=["small-tensors", "blocked-tensor"])
def test_add_on_a_full_disk_commits_nothing(tiny_disk: Path, tmp_path: Path, one_tensor: bool) -> None:
    Repo.init(tiny_disk)
    small = make_model(tmp_path / "small", seed=1)
    assert run_cli("add", str(small), "--name", "small", cwd=tiny_disk)[0] == 0
    before = run_cli("ls", "--json", cwd=tiny_disk)[1]

    code, out, err = run_cli("add", str(big_model(tmp_path / "big", 5, one_tensor=one_tensor)), "--name", "big",
                             cwd=tiny_disk)  # fmt: skip

    assert code == 1 and out == ""
    assert err.startswith("Error: no space left on the device") and "nothing was committed" in err
    assert err.count("\n") == 1
    assert run_cli("ls", "--json", cwd=tiny_disk)[1] == before
    repo = Repo(tiny_disk)
    assert repo.fsck().ok
    partial = len(list(repo.store.ids()))
    gc = repo.gc()
    assert len(gc.removed) > 0 and len(list(repo.store.ids())) == partial - len(gc.removed)
    assert not repo.store.temporary_files()
    repo.checkout("small", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(small)
    # With the space back, the same kind of add succeeds.
    repo.rm("small")
    repo.gc()
    assert repo.add(big_model(tmp_path / "fits", 1), name="fits").created


@pytest.mark.parametrize("one_tensor", [False, True], ids=["small-tensors", "blocked-tensor"])
def test_checkout_onto_a_full_disk_leaves_no_half_file(tiny_disk: Path, tmp_path: Path, one_tensor: bool) -> None:
    repo = Repo.init(tmp_path / "repo")
    src = big_model(tmp_path / "big", 5 if one_tensor else 4, one_tensor=one_tensor)
    repo.add(src, name="big")
    out = tiny_disk / "out"

    code, _, err = run_cli("-C", str(tmp_path / "repo"), "checkout", "big", "-o", str(out))

    assert code == 1 and err.startswith("Error: no space left on the device"), err
    for path in out.rglob("*"):
        if path.is_file():
            assert not path.name.startswith(".tmp-"), f"temporary file left: {path}"
            assert sha256_tree(out)[path.relative_to(out).as_posix()] == sha256_tree(src)[path.relative_to(out).as_posix()]
