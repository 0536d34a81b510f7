"""A stored tensor against its manifest entry (mgit.store.objectformat.tensor_expected): a
read, a checkout and fsck apply the one check and give the same reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from conftest import tensors

from mgit import Repo
from mgit.errors import CorruptObjectError
from mgit.store.objects import Manifest, Version

WHY = "it is a F32[32, 16] tensor where its manifest names a F16[32, 32]"  # the same bytes, read otherwise


@pytest.fixture
def forged(repo: Repo) -> Repo:
    """`m`, whose manifest names its F32 (32, 16) embedding as an F16 (32, 32) tensor."""
    repo.add(tensors(1), name="m")
    manifest = repo.manifest("m")
    [f] = manifest.files
    lying = tuple(
        dataclasses.replace(t, dtype="F16", shape=(32, 32)) if t.name == "embed.weight" else t for t in f.tensors
    )
    mid = repo.store.put_record("manifest", Manifest((dataclasses.replace(f, tensors=lying),)).to_json()).oid
    head = repo.version("m")
    version = Version("m", mid, predecessor=repo.resolve("m"), author="forger", time=head.time)
    vid = repo.store.put_record("version", version.to_json()).oid
    repo.refs.update("m", vid, expected=repo.resolve("m"))
    return Repo(repo.root)


def test_a_read_and_a_checkout_refuse_a_tensor_that_is_not_what_its_entry_says(forged: Repo, tmp_path: Path) -> None:
    with pytest.raises(CorruptObjectError, match=WHY.replace("[", r"\[").replace("]", r"\]")):
        forged.open("m")["embed.weight"]
    with pytest.raises(CorruptObjectError) as raised:
        forged.checkout("m", tmp_path / "out")
    assert raised.value.why == WHY
    assert forged.open("m")["layer.0.weight"].shape == (16, 16)  # the other tensors read as they are


def test_fsck_names_the_same_reason(forged: Repo) -> None:
    report = forged.fsck()
    [problem] = report.problems
    assert problem.kind == "corrupt" and problem.message == f"is not what model.safetensors expects: {WHY}"
