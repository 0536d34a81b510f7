"""Decompression bombs planted in a folder remote: objects a few hundred KB on the wire that
declare gigabytes (a zstd frame of 4 GiB of zeros under its valid id, a blocked object that
declares 1 TiB, a small tensor coded against a 4 GiB base). `mgit clone`, a lazy clone's
checkout and `mgit serve` of the remote refuse each with a one-line error, measured in a
child process to stay within a small constant of what they use for a clean model."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import zstandard
from bombs import (
    file_entry,
    peak_rss,
    plant,
    remote_with_model,
    run,
    serve_peak,
    version_with,
    zero_bomb,
)
from conftest import make_model

from mgit.codecs import XorDeltaCodec, ZstdCodec, chain_to_list
from mgit.store.objectformat import ObjectHeader
from mgit.store.objects import object_hasher

GIB = 1 << 30
SLACK_RSS = 300 << 20  # what a bomb may add to a command's normal peak
README = b"# A toy model.\n\n"  # 16 bytes
BOMBS = ["blob-bomb", "blocked-bomb", "base-bomb"]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bombs")
    model = make_model(root / "model")
    (model / "README.md").write_bytes(README)
    remote = remote_with_model(root, model)
    assert file_entry(remote, "README.md").size == 16

    # A 16-byte README whose object is 4 GiB of zeros (its id is theirs: valid).
    oid, header, payload = zero_bomb("blob", {}, 4 * GIB)
    assert len(payload) < 200_000
    plant(remote, oid, header, payload)
    version_with(remote, "blob-bomb", {"README.md": {"object": oid}})

    # A README whose object is coded in 4 MiB blocks and declares 1 TiB in 16 KB.
    blocked = ObjectHeader("blob", {}, 1 << 40, chain_to_list([ZstdCodec(level=1)]), blocks=4 << 20)
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(4 << 20))
    frames = b"".join(struct.pack("<I", len(frame)) + frame for _ in range(16_000 // (len(frame) + 4)))
    fake = object_hasher("blob", {}).hexdigest()  # any name: the header is what is refused
    plant(remote, fake, blocked, frames)
    version_with(remote, "blocked-bomb", {"README.md": {"object": fake}})

    # A 64-byte tensor coded as an XOR against a 4 GiB tensor of zeros (both ids valid).
    base, base_header, base_payload = zero_bomb("tensor", {"dtype": "U8", "shape": [4 * GIB]}, 4 * GIB)
    plant(remote, base, base_header, base_payload)
    content = (np.arange(8, dtype="<i8") + 100).tobytes()
    meta = {"dtype": "I64", "shape": [8]}
    hasher = object_hasher("tensor", meta)
    hasher.update(content)
    child = hasher.hexdigest()
    chain = [XorDeltaCodec(base=base), ZstdCodec(level=1)]
    plant(
        remote,
        child,
        ObjectHeader("tensor", meta, 64, chain_to_list(chain), depth=1),
        zstandard.ZstdCompressor(write_content_size=True).compress(content),
    )  # (XOR with zeros: itself)
    weights = file_entry(remote, "model.safetensors")
    tensors = tuple(
        t if t.name != "position_ids" else type(t)(t.name, t.dtype, t.shape, child) for t in weights.tensors
    )
    version_with(remote, "base-bomb", {"model.safetensors": {"tensors": tensors}})
    return remote


def one_line_refusal(code: int, err: str) -> str:
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("Error: object "), err[-3000:]
    assert "is corrupt" in lines[0], lines[0]
    return lines[0]


def test_clone_refuses_every_bomb_in_bounded_memory(remote: Path, tmp_path: Path) -> None:
    code, err, normal = peak_rss("clone", str(remote), str(tmp_path / "clean"), "--models", "m")
    assert code == 0, err
    for name in BOMBS:
        target = tmp_path / name
        code, err, peak = peak_rss("clone", str(remote), str(target), "--models", name)
        line = one_line_refusal(code, err)
        assert peak < normal + SLACK_RSS, (name, peak >> 20, normal >> 20, line)
        if name != "base-bomb":
            assert "where its manifest gives 16" in line, line
        kept = [p.name for p in (target / ".mgit" / "objects").rglob("*") if p.is_file()] if target.exists() else []
        assert not kept  # nothing of the refused fetch was kept


def test_lazy_checkout_refuses_every_bomb_in_bounded_memory(remote: Path, tmp_path: Path) -> None:
    clone = tmp_path / "lazy"
    done = run("clone", str(remote), str(clone), "--lazy")
    assert done.returncode == 0, done.stderr
    code, err, normal = peak_rss("checkout", "m", "-o", str(tmp_path / "out-m"), cwd=clone)
    assert code == 0, err
    for name in BOMBS:
        code, err, peak = peak_rss("checkout", name, "-o", str(tmp_path / f"out-{name}"), cwd=clone)
        one_line_refusal(code, err)
        assert peak < normal + SLACK_RSS, (name, peak >> 20, normal >> 20)
    assert run("fsck", cwd=clone).returncode == 0  # nothing damaged was kept


def test_serve_reads_a_bomb_readme_in_bounded_memory(remote: Path, tmp_path: Path) -> None:
    pages = ["api/models/m", *(f"api/models/{n}" for n in ("blob-bomb", "blocked-bomb"))]
    statuses, peaks = serve_peak(remote, tmp_path / "mirrors", pages)
    assert statuses[0] == 200
    assert all(s >= 400 for s in statuses[1:]), statuses
    assert max(peaks) < peaks[0] + SLACK_RSS, [p >> 20 for p in peaks]


def test_a_blocked_object_declaring_a_tebibyte_is_refused_before_anything_is_allocated(tmp_path: Path) -> None:
    """On a hostile disk, read with no record to compare it with: its block table is
    checked before its content is allocated."""
    from mgit import Repo
    from mgit.errors import CorruptObjectError

    repo = Repo.init(tmp_path / "r")
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(4 << 20))
    header = ObjectHeader("blob", {}, 1 << 40, chain_to_list([ZstdCodec(level=1)]), blocks=4 << 20)
    fake = object_hasher("blob", {}).hexdigest()
    plant(repo.dir, fake, header, b"".join(struct.pack("<I", len(frame)) + frame for _ in range(100)))
    with pytest.raises(CorruptObjectError, match=f"object {fake[:16]} is corrupt: its payload ends inside"):
        repo.store.get(fake)


def test_diff_of_a_local_bomb_is_refused_in_bounded_memory(remote: Path) -> None:
    """A reader of a file's object with the manifest at hand (diff, merge, load) bounds it by
    the manifest's entry, as checkout does: here in the repository itself, not fetched. (Its
    digest differs from m's README's, so that diff reads the contents to compare them.)"""
    bomb = file_entry(remote, "README.md", model="blob-bomb")
    version_with(remote, "diff-bomb", {"README.md": {"object": bomb.object, "digest": "00" * 32}})
    code, err, normal = peak_rss("-C", str(remote), "diff", "m", "m")
    assert code == 0, err
    code, err, peak = peak_rss("-C", str(remote), "diff", "m", "diff-bomb")
    line = one_line_refusal(code, err)
    assert "where its manifest gives 16" in line, line
    assert peak < normal + SLACK_RSS, (peak >> 20, normal >> 20)
