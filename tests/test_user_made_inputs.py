"""Inputs made the way users (or a hostile remote) make them, found in a pass over the
round's features with real tools: each test here failed before the fix it names."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import pytest
import zstandard

from mgit import sync
from mgit.errors import RemoteError
from mgit.remotes import RemoteSpec, normalize_url, open_backend
from mgit.remotes.leases import LEASES, read_lease, write_lease
from mgit.remotes.repository import RemoteRepository


def test_a_lease_that_decompresses_far_past_its_size_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    """A lease of 8 KiB on the wire that inflates to 128 MiB of blanks (then `{}`) was read
    whole into memory before being judged; it is refused at the ratio a pack is held to."""
    url = str(tmp_path / "remote.mgit")
    sync.init_bare(url)
    remote = RemoteRepository(open_backend(RemoteSpec(normalize_url(url))))
    bomb = zstandard.ZstdCompressor(level=3).compress(b" " * (128 << 20) + b"{}")
    assert len(bomb) < 64 << 10
    key = f"{LEASES}{'b' * 32}"
    remote.backend.write(key, bomb)
    tracemalloc.start()
    try:
        with pytest.raises(RemoteError, match="larger than a lease can be"):
            read_lease(remote, key)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        remote.close()
    assert peak < 16 << 20, peak


def test_a_lease_a_push_writes_is_read_back(tmp_path: Path) -> None:
    """The bound leaves a real lease readable: ids are random hex, far below the ratio."""

    url = str(tmp_path / "remote.mgit")
    sync.init_bare(url)
    remote = RemoteRepository(open_backend(RemoteSpec(normalize_url(url))))
    try:
        ids = {os.urandom(32).hex() for _ in range(200_000)}
        versions = {os.urandom(32).hex()}
        lid = write_lease(remote, ids, versions)
        assert read_lease(remote, f"{LEASES}{lid}") == (ids, versions)
    finally:
        remote.close()
