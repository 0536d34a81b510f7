"""A safetensors tensor of shape [2**70, 0] holds no byte, yet no array can have that shape:
it is refused on add (one-line error) and, stored anyway, on read (a corrupt object), never
a raw ValueError from numpy."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import MGIT

from mgit import Repo
from mgit.errors import CorruptObjectError
from mgit.store.objects import TensorEntry
from mgit.store.reader import as_array

HUGE = [2**70, 0]


def crafted(path: Path, shape: list[int]) -> Path:
    header = {
        "w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "x": {"dtype": "F32", "shape": shape, "data_offsets": [8, 8]},
    }
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body)) + body + np.ones(2, "<f4").tobytes())
    return path


def test_add_refuses_a_shape_no_array_can_have(tmp_path: Path) -> None:
    import subprocess

    repo = Repo.init(tmp_path / "r")
    done = subprocess.run(
        [*MGIT, "-C", str(repo.root), "add", str(crafted(tmp_path / "m.safetensors", HUGE)), "--name", "m"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(
        f"Error: {tmp_path / 'm.safetensors'}: tensor 'x' has a shape {HUGE} that no array can have"
    )
    assert repo.refs.all() == {}


def test_the_largest_shape_an_array_can_have_is_added_and_loaded(tmp_path: Path) -> None:
    shape = [2**61 - 1, 0]  # x 4 bytes: just within numpy's bound
    repo = Repo.init(tmp_path / "r")
    repo.add(crafted(tmp_path / "m.safetensors", shape), name="m")
    assert repo.open("m")["x"].shape == tuple(shape)


def test_a_stored_tensor_of_such_a_shape_is_a_corrupt_object_on_read(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path / "r")
    oid = repo.store.put_tensor("F32", tuple(HUGE), np.empty(0, np.uint8)).oid
    with pytest.raises(CorruptObjectError, match=f"object {oid[:16]} is corrupt: tensor header does not match"):
        as_array(repo.store, TensorEntry("x", "F32", tuple(HUGE), oid))
