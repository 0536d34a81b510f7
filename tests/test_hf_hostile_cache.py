"""A hostile Hugging Face cache: folders of the layout that are links out of the cache, refs
that are links or FIFOs, blobs that lead elsewhere. An import never reads a file outside the
cache root: a structural link refuses the import (one line, exit 1, nothing kept), a
snapshot file that leads out of its repository's blobs skips its revision.

Caches are laid out as huggingface_hub writes them (tests/test_hf.py's put_revision); the
"secret" is a file outside the cache, as ~/.ssh/id_ed25519 would be.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
from conftest import run_mgit
from safetensors.numpy import save

from mgit import Repo
from mgit.errors import InputError
from mgit.hf import import_cache

hub = pytest.importorskip("huggingface_hub")

SECRET = b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----\n"
REV = hashlib.sha1(b"evil").hexdigest()
GOOD = hashlib.sha1(b"good").hexdigest()
T0 = 1_700_000_000.0


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def weights(seed: int) -> bytes:
    return save({"w": np.random.default_rng(seed).standard_normal(8).astype(np.float32)}, metadata={"format": "pt"})


def put_revision(
    repo_root: Path, rev: str, files: dict[str, bytes], *, blob_names: dict[str, str] | None = None
) -> None:
    """One revision as hf_hub_download leaves it, in the repository folder `repo_root`."""
    (repo_root / "blobs").mkdir(parents=True, exist_ok=True)
    (repo_root / "snapshots" / rev).mkdir(parents=True, exist_ok=True)
    for rel, data in files.items():
        name = (blob_names or {}).get(rel) or (
            hashlib.sha256(data).hexdigest() if rel.endswith(".safetensors") else git_sha1(data)
        )
        blob = repo_root / "blobs" / name
        if not blob.exists():
            blob.write_bytes(data)
        link = repo_root / "snapshots" / rev / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo_root / "refs").mkdir(exist_ok=True)
    (repo_root / "refs" / "main").write_text(rev)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A user's key folder outside the cache."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_bytes(SECRET)
    return ssh


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """A cache with one sound model (so that a refused import has something it did not keep)."""
    root = tmp_path / "hub"
    put_revision(root / "models--acme--good", GOOD, {"config.json": b"{}", "model.safetensors": weights(1)})
    return root


def refused(root: Path, repo_dir: Path, start: str) -> None:
    """The import stops with one line naming the entry, exit 1; nothing is kept; the secret
    is in no output."""
    done = run_mgit("import-hf", str(root), cwd=repo_dir, timeout=60)  # first: a FIFO would block in-process
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert done.stderr.startswith("Error: " + start) and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert b"PRIVATE KEY" not in (done.stdout + done.stderr).encode()
    listing = run_mgit("ls", "--json", cwd=repo_dir)
    assert listing.returncode == 0 and json.loads(listing.stdout) == [], listing.stdout
    with pytest.raises(InputError) as caught:
        import_cache(Repo(repo_dir), root)
    assert str(caught.value).startswith(start), str(caught.value)


def test_a_linked_blobs_folder_is_refused_and_the_key_never_read(cache: Path, secret: Path, tmp_path: Path) -> None:
    """blobs/ -> ~/.ssh: every snapshot link "resolves inside blobs"; the import must not
    take it (before: exit 0, and a checkout printed the key)."""
    evil = cache / "models--acme--evil"
    (evil / "snapshots" / REV).mkdir(parents=True)
    (evil / "blobs").symlink_to(secret)
    (evil / "snapshots" / REV / "id_ed25519").symlink_to("../../blobs/id_ed25519")
    (evil / "refs").mkdir()
    (evil / "refs" / "main").write_text(REV)
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{evil / 'blobs'}: a link")


def test_a_linked_repository_folder_is_refused(cache: Path, secret: Path, tmp_path: Path) -> None:
    """models--acme--evil -> a folder elsewhere laid out as a repository whose blob is the key."""
    elsewhere = tmp_path / "elsewhere"
    put_revision(elsewhere, REV, {"id_ed25519": SECRET})
    (cache / "models--acme--evil").symlink_to(elsewhere)
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{cache / 'models--acme--evil'}: a link")


def test_a_linked_snapshots_folder_is_refused(cache: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    put_revision(elsewhere, REV, {"config.json": b"{}"})
    evil = cache / "models--acme--evil"
    evil.mkdir()
    (evil / "blobs").mkdir()
    (evil / "snapshots").symlink_to(elsewhere / "snapshots")
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{evil / 'snapshots'}: a link")


def test_a_linked_snapshot_and_subfolder_are_refused(cache: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    good = cache / "models--acme--good"
    (good / "snapshots" / GOOD / "1_Pooling").symlink_to(elsewhere)
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{good / 'snapshots' / GOOD / '1_Pooling'}: a link")
    (good / "snapshots" / GOOD / "1_Pooling").unlink()
    (good / "snapshots" / REV).symlink_to(elsewhere)
    refused(cache, tmp_path / "repo", f"{good / 'snapshots' / REV}: a link")


def test_a_ref_that_links_to_a_secret_is_never_read(cache: Path, secret: Path, tmp_path: Path) -> None:
    """refs/main -> ~/.ssh/id_ed25519: huggingface_hub's scan reads a ref's whole text and
    names it in its warning (before: the key was printed among the skipped)."""
    good = cache / "models--acme--good"
    (good / "refs" / "main").unlink()
    (good / "refs" / "main").symlink_to(secret / "id_ed25519")
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{good / 'refs' / 'main'}: a link")


def test_a_ref_that_is_a_fifo_does_not_block(cache: Path, tmp_path: Path) -> None:
    good = cache / "models--acme--good"
    (good / "refs" / "pr").mkdir()
    os.mkfifo(good / "refs" / "pr" / "1")
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{good / 'refs' / 'pr' / '1'}: not a regular file")


def test_a_huge_ref_is_not_read(cache: Path, tmp_path: Path) -> None:
    good = cache / "models--acme--good"
    (good / "refs" / "big").write_bytes(b"0" * (1 << 20))
    Repo.init(tmp_path / "repo")
    refused(cache, tmp_path / "repo", f"{good / 'refs' / 'big'}: 1048576 bytes")


@pytest.mark.parametrize("plant", ["blob links out", "blob links into another repository", "snapshot links out"])
def test_a_revision_whose_file_leads_out_of_its_blobs_is_skipped(
    plant: str, cache: Path, secret: Path, tmp_path: Path
) -> None:
    """A file of a snapshot that reaches anything but a regular file of its repository's
    blobs (or of the cache's shared blob store) skips its revision; the rest is imported."""
    evil = cache / "models--acme--evil"
    put_revision(evil, REV, {"config.json": b"{}"})
    blob = evil / "blobs" / ("0" * 40)
    link = evil / "snapshots" / REV / "notes.txt"
    if plant == "blob links out":
        blob.symlink_to(secret / "id_ed25519")
        link.symlink_to(f"../../blobs/{blob.name}")
    elif plant == "blob links into another repository":
        target = next((cache / "models--acme--good" / "blobs").iterdir())
        blob.symlink_to(os.path.relpath(target, blob.parent))
        link.symlink_to(f"../../blobs/{blob.name}")
    else:
        link.symlink_to(os.path.relpath(secret / "id_ed25519", link.parent))
    repo = Repo.init(tmp_path / "repo")
    result = import_cache(repo, cache)
    assert result.models == ["acme/good"]
    assert any(
        s.startswith(f"acme/evil revision {REV[:12]}: notes.txt links outside the repository's blobs")
        for s in result.skipped
    ), result.skipped
    assert not any("PRIVATE KEY" in s for s in result.skipped)


def test_a_blob_in_the_shared_blob_store_is_imported(cache: Path, tmp_path: Path) -> None:
    """huggingface_hub keeps a Xet file once for the whole cache in <cache>/blobs/<2 hex>/<hash>
    (marked by .huggingface-shared-blobs) and links a repository's blobs/<etag> to it: that
    is the cache's own file, imported as any other."""
    data = weights(7)
    xet = hashlib.sha256(b"xet" + data).hexdigest()
    store = cache / "blobs"
    (store / xet[:2]).mkdir(parents=True)
    (store / ".huggingface-shared-blobs").write_text("1\n")
    (store / xet[:2] / xet).write_bytes(data)
    shared = cache / "models--acme--shared"
    put_revision(shared, REV, {"config.json": b"{}"})
    etag = hashlib.sha256(data).hexdigest()
    (shared / "blobs" / etag).symlink_to(f"../../blobs/{xet[:2]}/{xet}")
    (shared / "snapshots" / REV / "model.safetensors").symlink_to(f"../../blobs/{etag}")
    info = hub.scan_cache_dir(cache)
    assert not info.warnings and {r.repo_id for r in info.repos} == {"acme/good", "acme/shared"}
    repo = Repo.init(tmp_path / "repo")
    result = import_cache(repo, cache)
    assert result.models == ["acme/good", "acme/shared"], result.skipped
    repo.checkout("acme/shared", tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == data


def test_a_link_planted_after_the_cache_was_listed_is_not_read(
    cache: Path, secret: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache changes between its listing and the read of a revision: the revision is
    checked again right before it is added."""
    import mgit.hf.importing as importing

    listed = importing.read_cache

    def read_then_plant(cache_dir: Path) -> object:
        listing = listed(cache_dir)
        snapshot = cache / "models--acme--good" / "snapshots" / GOOD
        (snapshot / "notes.txt").symlink_to(secret / "id_ed25519")
        return listing

    monkeypatch.setattr(importing, "read_cache", read_then_plant)
    repo = Repo.init(tmp_path / "repo")
    result = import_cache(repo, cache)
    assert result.models == [] and repo.ls() == [], result
    assert any(s.startswith(f"acme/good revision {GOOD[:12]}: notes.txt links outside") for s in result.skipped)
