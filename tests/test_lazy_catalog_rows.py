"""A lazy clone's catalog rows for objects it has not fetched: a metadata pack's rows are
hints, so a size that disagrees with the manifest naming the object is not kept (a lazy read
bounds what it decodes by the row when no record is at hand)."""

from __future__ import annotations

from pathlib import Path

from hostile_remote import pushed_remote, write_pack

from mgit import Repo, sync
from mgit.remotes.pack import MetadataPack

HUGE = 4 << 30


def test_a_pack_row_that_lies_about_a_size_is_not_kept(tmp_path: Path) -> None:
    remote, alice = pushed_remote(tmp_path)
    manifest = Repo(alice).manifest("base")
    config = next(f for f in manifest.files if f.path == "config.json")
    tensor = next(t for f in manifest.files for t in f.tensors)
    for honest in (remote / "packs").iterdir():  # the lying pack is the only one
        honest.unlink()
    write_pack(
        remote,
        MetadataPack(
            objects=[(config.object, "blob", HUGE, 100, "zstd", ()), (tensor.object, "tensor", HUGE, 100, "zstd", ())]
        ),
    )

    bob = Repo(sync.clone(str(remote), tmp_path / "bob", lazy=True).path)

    rows = bob.catalog.object_rows([config.object, tensor.object])
    assert rows[config.object].logical_size == config.size
    assert rows[tensor.object].logical_size == tensor.nbytes
    assert len(bob.checkout("base", tmp_path / "out").files) == len(manifest.files)
