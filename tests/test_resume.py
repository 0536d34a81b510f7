"""Interrupted transfers resume inside a large object, with real kills and dropped connections:
a `mgit push` SIGKILLed in the middle of a multipart upload sends, when run again, only the
parts the bucket lacks (the proxy's log says which went); a clone whose connection drops in
the middle of a large object fetches, when run again, only the byte ranges that had not
arrived; a partial file damaged meanwhile makes an object refused by its id check, fetched
again whole by the next run.

Sizes are kept small with MGIT_S3_PART_SIZE at S3's least part (5 MiB; moto enforces it too):
one ~20 MB object goes in four parts, and comes back in four ranges.
"""

# ruff: noqa: F811
from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import MGIT, make_model, run_mgit, sha256_tree, tensors
from s3server import FaultProxy, S3Bucket, s3_bucket, s3_server  # noqa: F401

from mgit import sync
from mgit.repo.repository import Repo

PART = 5 << 20
WAIT = 120


def big_model(tmp_path: Path, seed: int = 3) -> Path:
    rng = np.random.default_rng(seed)
    state = {**tensors(seed), "big": rng.standard_normal(20 << 20 >> 2, dtype=np.float32)}  # ~19 MB stored
    return make_model(tmp_path / "src", state=state)


def alice_with_big_model(s3_bucket: S3Bucket, tmp_path: Path) -> tuple[str, Path, Repo, str]:
    """A bare remote in the bucket, and a repository whose origin it is holding one model with
    a large object, nothing pushed: (the remote's URL, the model's folder, the repository, the
    large object's id)."""
    url = f"{s3_bucket.url}/team"
    sync.init_bare(url)
    src = big_model(tmp_path)
    alice = Repo.init(tmp_path / "alice")
    alice.add(src, name="m")
    sync.add_remote(alice, "origin", url)
    return url, src, alice, max(alice.store.ids(), key=alice.store.stored_size)


def env_through(proxy: FaultProxy, s3_bucket: S3Bucket, **extra: str) -> dict[str, str]:
    return {
        **s3_bucket.env,
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "AWS_ENDPOINT_URL_S3": proxy.endpoint,
        "MGIT_S3_PART_SIZE": str(PART),
        **extra,
    }


def wait_for(what, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def part_numbers(requests) -> list[int]:
    return sorted(int(m[1]) for r in requests if r.method == "PUT" and (m := re.search(r"partNumber=(\d+)", r.target)))


def test_a_push_killed_mid_upload_sends_only_the_missing_parts(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    url, src, alice, big = alice_with_big_model(s3_bucket, tmp_path)
    size = alice.store.stored_size(big)
    parts = -(-size // PART)
    assert parts == 4
    key = f"team/objects/{big[:2]}/{big[2:]}"
    client = s3_bucket.client()

    # Two parts go through; the others are held unanswered, and the push is killed.
    with FaultProxy(s3_bucket.endpoint, every=1, after=2, mode="stall", methods=["PUT"], path="partNumber=") as proxy:
        env = {**os.environ, **env_through(proxy, s3_bucket)}
        proc = subprocess.Popen(
            [*MGIT, "push"], cwd=alice.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:

            def two_parts_held() -> bool:
                uploads = client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])
                if not uploads or len(part_numbers(proxy.seen)) < parts:
                    return False
                held = client.list_parts(Bucket=s3_bucket.name, Key=key, UploadId=uploads[0]["UploadId"])
                return len(held.get("Parts", [])) == 2

            wait_for(two_parts_held)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=WAIT)
        assert proc.returncode == -signal.SIGKILL
        uploads = client.list_multipart_uploads(Bucket=s3_bucket.name)["Uploads"]
        assert [u["Key"] for u in uploads] == [key]
        held = {
            p["PartNumber"]
            for p in client.list_parts(Bucket=s3_bucket.name, Key=key, UploadId=uploads[0]["UploadId"])["Parts"]
        }
        journal = [json.loads(p.read_text()) for p in (alice.dir / "transfers" / "uploads").glob("*.json")]
        assert [(e["key"], e["upload_id"]) for e in journal] == [
            (f"objects/{big[:2]}/{big[2:]}", uploads[0]["UploadId"])
        ]

        proxy.set_faults(every=0)
        before = len(proxy.seen)
        done = run_mgit("push", cwd=alice.root, env=env_through(proxy, s3_bucket), timeout=WAIT)
        assert done.returncode == 0, done.stderr
        rerun = proxy.seen[before:]

    # Only the parts the bucket lacked went again, into the same upload (no new one began).
    assert part_numbers(rerun) == sorted(set(range(1, parts + 1)) - held)
    assert not [r for r in rerun if r.method == "POST" and r.target.endswith("?uploads")]
    assert any(r.method == "GET" and "uploadId=" in r.target for r in rerun)  # ListParts
    assert client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", []) == []
    assert client.head_object(Bucket=s3_bucket.name, Key=key)["ContentLength"] == size
    assert list((alice.dir / "transfers" / "uploads").glob("*.json")) == []

    sync.clone(url, tmp_path / "bob")
    Repo(tmp_path / "bob").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


@pytest.fixture
def pushed(s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path, str, int]:
    """A remote holding a model with one large object: (url, its source, the object's key, its size)."""
    monkeypatch.setenv("MGIT_S3_PART_SIZE", str(PART))
    url, src, alice, big = alice_with_big_model(s3_bucket, tmp_path)
    sync.push(alice)
    return url, src, f"{big[:2]}/{big[2:]}", alice.store.stored_size(big)


def ranges_of(requests, key: str) -> list[str]:
    return sorted(r.range or "whole" for r in requests if r.method == "GET" and r.target.split("?")[0].endswith(key))


def test_a_clone_cut_off_mid_object_fetches_only_the_missing_ranges(
    pushed, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    url, src, key, size = pushed
    count = -(-size // PART)
    every_range = sorted(f"bytes={i * PART}-{min(size, (i + 1) * PART) - 1}" for i in range(count))
    bob = tmp_path / "bob"
    # Two ranges of the large object arrive; the next connection for it drops, and with one
    # attempt a request the clone stops there, with a one-line error.
    with FaultProxy(s3_bucket.endpoint, every=1, after=2, mode="drop", methods=["GET"], path=key) as proxy:
        cut = run_mgit("clone", url, str(bob), cwd=tmp_path, env=env_through(proxy, s3_bucket, MGIT_S3_ATTEMPTS="1"))
        assert cut.returncode == 1, cut.stderr
        assert cut.stderr.startswith("Error: ") and len(cut.stderr.strip().splitlines()) <= 2, cut.stderr
        first = [r for r in proxy.seen if r.fault is None]
        arrived = set(ranges_of(first, key))
        assert len(arrived) == 2
        entries = [json.loads(p.read_text()) for p in (bob / ".mgit" / "transfers" / "downloads").glob("*.json")]
        assert [len(e["chunks"]) for e in entries] == [2]
        left = json.loads(run_mgit("status", "--json", cwd=bob).stdout)["leftovers"]
        (transfer,) = [x for x in left if x["kind"] == "interrupted transfer"]
        assert transfer["count"] == 1 and 2 * PART <= transfer["bytes"] < 3 * PART  # what arrived, not the file's size

        proxy.set_faults(every=0)
        before = len(proxy.seen)
        again = run_mgit("clone", url, str(bob), cwd=tmp_path, env=env_through(proxy, s3_bucket))
        assert again.returncode == 0, again.stderr
        resumed = ranges_of(proxy.seen[before:], key)

    assert resumed == sorted(set(every_range) - arrived)
    assert list((bob / ".mgit" / "transfers" / "downloads").iterdir()) == []
    Repo(bob).checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def test_a_partial_file_damaged_since_is_refused_and_fetched_again(pushed, s3_bucket: S3Bucket, tmp_path: Path) -> None:
    url, src, key, size = pushed
    count = -(-size // PART)
    bob = tmp_path / "bob"
    with FaultProxy(s3_bucket.endpoint, every=1, after=2, mode="drop", methods=["GET"], path=key) as proxy:
        cut = run_mgit("clone", url, str(bob), cwd=tmp_path, env=env_through(proxy, s3_bucket, MGIT_S3_ATTEMPTS="1"))
        assert cut.returncode == 1, cut.stderr
        downloads = bob / ".mgit" / "transfers" / "downloads"
        (part,) = downloads.glob("*.part")
        (entry,) = [json.loads(p.read_text()) for p in part.parent.glob("*.json")]
        first = min(entry["chunks"])
        with open(part, "r+b") as fh:  # one byte of a chunk the journal says arrived
            fh.seek(first * PART + 1000)
            byte = fh.read(1)
            fh.seek(first * PART + 1000)
            fh.write(bytes([byte[0] ^ 0xFF]))

        proxy.set_faults(every=0)
        before = len(proxy.seen)
        # The missing ranges arrive; the object they make fails its check against its id: a
        # one-line error naming it, nothing kept, and nothing left in the journal.
        refused = run_mgit("clone", url, str(bob), cwd=tmp_path, env=env_through(proxy, s3_bucket))
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith("Error: ") and len(refused.stderr.strip().splitlines()) <= 2
        assert f"object {key.replace('/', '')[:16]} from {url} is corrupt" in refused.stderr, refused.stderr
        assert len(ranges_of(proxy.seen[before:], key)) == count - 2
        assert list(downloads.iterdir()) == []
        assert not (bob / ".mgit" / "objects" / key).exists()

        before = len(proxy.seen)
        again = run_mgit("clone", url, str(bob), cwd=tmp_path, env=env_through(proxy, s3_bucket))
        assert again.returncode == 0, again.stderr
        resumed = ranges_of(proxy.seen[before:], key)

    assert len(resumed) == len(set(resumed)) == count  # every range again, from the first byte
    Repo(bob).checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def test_the_transfer_bar_shows_bytes_and_objects_each_with_a_rate() -> None:
    from rich.console import Console

    from mgit.cli.output import transfer_bar

    with transfer_bar("Pushing") as start:  # stderr is no terminal here: no bar
        assert start is None
    sink = io.StringIO()
    with transfer_bar("Pushing to origin", console=Console(file=sink, force_terminal=True, width=200)) as start:
        assert start is not None
        advance = start(12 << 20, 3)
        advance(4 << 20)  # a part of a large object
        advance(4 << 20, 1)
        time.sleep(0.3)
        advance(4 << 20, 1)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", sink.getvalue())
    assert "Pushing to origin" in text
    assert "12.0/12.0 MiB" in text
    assert re.search(r"2/3 objects, \d+\.\d/s", text), text
    assert re.search(r"MiB/s|MB/s|kB/s", text), text


def journalled_upload(alice: Repo, client, bucket: str, url: str, oid: str, **changes) -> tuple[str, str]:
    """An upload of `oid` begun as a killed push begins one, its journal entry written: (key, id)."""
    from mgit.remotes.journal import UPLOADS, TransferJournal

    key = f"objects/{oid[:2]}/{oid[2:]}"
    upload = client.create_multipart_upload(Bucket=bucket, Key=f"team/{key}")["UploadId"]
    path = alice.store.path_of(oid)
    entry = {"size": path.stat().st_size, "mtime_ns": path.stat().st_mtime_ns, "part_size": PART, "file": str(path)}
    TransferJournal(alice.dir / "transfers").save(UPLOADS, url, key, {**entry, "upload_id": upload, **changes})
    return f"team/{key}", upload


def test_a_resumed_upload_sends_again_a_part_that_is_not_the_files_bytes(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MGIT_S3_PART_SIZE", str(PART))
    url, src, alice, big = alice_with_big_model(s3_bucket, tmp_path)
    client = s3_bucket.client()
    key, upload = journalled_upload(alice, client, s3_bucket.name, url, big)
    data = alice.store.path_of(big).read_bytes()
    client.upload_part(Bucket=s3_bucket.name, Key=key, UploadId=upload, PartNumber=1, Body=os.urandom(PART))
    client.upload_part(Bucket=s3_bucket.name, Key=key, UploadId=upload, PartNumber=2, Body=data[PART : 2 * PART])

    sync.push(alice)

    got = client.get_object(Bucket=s3_bucket.name, Key=key)["Body"].read()
    assert got == data  # part 1 (not the file's bytes) went again; part 2 was kept
    assert client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", []) == []
    sync.clone(url, tmp_path / "bob")
    Repo(tmp_path / "bob").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


@pytest.mark.parametrize("change", ["file", "stale"])
def test_an_upload_the_journal_no_longer_needs_is_aborted(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    monkeypatch.setenv("MGIT_S3_PART_SIZE", str(PART))
    url, _, alice, big = alice_with_big_model(s3_bucket, tmp_path)
    client = s3_bucket.client()
    # "file": the entry names a file of another size (its parts are of no use); "stale": an
    # entry for an object the push does not send, not resumed for weeks.
    other = "ab" + "c" * 62
    oid = big if change == "file" else other
    key, upload = journalled_upload(alice, client, s3_bucket.name, url, oid if change == "file" else big)
    if change == "stale":
        from mgit.remotes.journal import UPLOADS, TransferJournal

        journal = TransferJournal(alice.dir / "transfers")
        entry = journal.load(UPLOADS, url, key.removeprefix("team/"))
        journal.drop(UPLOADS, url, key.removeprefix("team/"))
        stale_key = f"objects/{other[:2]}/{other[2:]}"
        upload = client.create_multipart_upload(Bucket=s3_bucket.name, Key=f"team/{stale_key}")["UploadId"]
        journal.save(UPLOADS, url, stale_key, {**entry, "upload_id": upload})
        path = journal.path(UPLOADS, url, stale_key, ".json")
        path.write_text(json.dumps({**json.loads(path.read_text()), "updated": time.time() - 30 * 86400}))
    else:
        journal_path = next((alice.dir / "transfers" / "uploads").glob("*.json"))
        journal_path.write_text(json.dumps({**json.loads(journal_path.read_text()), "size": 1}))

    sync.push(alice)

    assert client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", []) == []
    assert list((alice.dir / "transfers" / "uploads").glob("*.json")) == []
    size = alice.store.stored_size(big)
    assert client.head_object(Bucket=s3_bucket.name, Key=f"team/objects/{big[:2]}/{big[2:]}")["ContentLength"] == size


def key_of(target: str) -> str:
    """The object id a request's target names (or what follows /objects/)."""
    return target.split("?")[0].rpartition("/objects/")[2].replace("/", "")


def test_a_clone_killed_takes_up_the_objects_that_had_arrived_whole(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{s3_bucket.url}/team"
    sync.init_bare(url, packs=False)  # loose objects, each its own GET (in packs they would be ranges of one)
    rng = np.random.default_rng(4)
    state = {f"w{i}": rng.standard_normal(1 << 18, dtype=np.float32) for i in range(8)}  # eight 1 MiB objects
    src = make_model(tmp_path / "src", state=state)
    alice = Repo.init(tmp_path / "alice")
    alice.add(src, name="m")
    sync.add_remote(alice, "origin", url)
    sync.push(alice)
    bob = tmp_path / "bob"
    client = s3_bucket.client()
    with FaultProxy(s3_bucket.endpoint, every=1, after=3, mode="stall", methods=["GET"], path="/objects/") as proxy:
        env = {**os.environ, **env_through(proxy, s3_bucket)}
        proc = subprocess.Popen([*MGIT, "clone", url, str(bob)], cwd=tmp_path, env=env, stderr=subprocess.PIPE)

        def whole_in_quarantine() -> list[Path]:
            return [p for p in bob.glob(".mgit/incoming/*/??/*") if not p.name.startswith(".")]

        def downloaded_whole() -> set[str]:
            whole = {p.parent.name + p.name for p in whole_in_quarantine()}
            return {key_of(r.target) for r in proxy.seen if r.method == "GET" and r.fault is None} & whole

        try:  # the three objects let through have arrived whole, the next is held
            wait_for(lambda: len(downloaded_whole()) == 3 and any(r.fault for r in proxy.seen))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=WAIT)
        arrived = {p.parent.name + p.name for p in whole_in_quarantine()}
        downloaded = downloaded_whole()
        assert len(downloaded) == 3  # (the others in the quarantine are records a metadata pack held)
        proxy.set_faults(every=0)
        before = len(proxy.seen)
        again = run_mgit("clone", url, str(bob), "--json", cwd=tmp_path, env=env_through(proxy, s3_bucket))
        assert again.returncode == 0, again.stderr
        fetched = {key_of(r.target) for r in proxy.seen[before:]}

    assert not arrived & fetched  # what had arrived whole did not travel again
    assert json.loads(again.stdout)["fetch"]["received"]["skipped"] >= len(downloaded)
    assert client.list_objects_v2(Bucket=s3_bucket.name)["KeyCount"] > 0
    Repo(bob).checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


@pytest.mark.parametrize("large", [False, True])
def test_a_download_cut_off_leaves_nothing_under_the_objects_name(tmp_path: Path, large: bool) -> None:
    """What a killed fetch leaves in its quarantine is taken up by the next one: so a download
    (whole, or of an object that may be large but is not) is renamed into place only once
    complete. Here the backend's read is cut off after half the bytes."""
    from mgit.errors import RemoteUnavailableError
    from mgit.remotes import partial
    from mgit.remotes.folder import FolderBackend
    from mgit.remotes.journal import TransferJournal

    class CutOff(FolderBackend):
        def read_into(self, key: str, path: Path, *, limit: int) -> int:
            path.write_bytes(b"\0" * 500)  # half of it, then the connection drops
            raise RemoteUnavailableError(self.url, "the connection dropped")

    backend = CutOff(tmp_path / "remote")
    backend.write("objects/ab/cd", os.urandom(1000))
    if large:  # may be large (its limit), is not (its size): fetched whole, as a small one is
        backend.journal, backend.ranged_from = TransferJournal(tmp_path / "transfers"), 2000
    (tmp_path / "q").mkdir()
    with pytest.raises(RemoteUnavailableError):
        partial.download(backend, "objects/ab/cd", tmp_path / "q" / "cd", limit=4000)
    assert list((tmp_path / "q").iterdir()) == []


def test_progress_counts_every_object_whether_packed_or_loose(
    s3_bucket: S3Bucket, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A push and a clone to a bucket with data packs (small objects many to a pack, the large
    one on its own, in parts): the progress reports each object once, and the bytes of each."""
    monkeypatch.setenv("MGIT_S3_PART_SIZE", str(PART))
    url, src, alice, _ = alice_with_big_model(s3_bucket, tmp_path)  # packs: a bucket's default
    calls: list[tuple[str, int, int]] = []

    def start(label: str):
        def factory(total: int, objects: int):
            calls.append((label + " total", total, objects))
            return lambda nbytes, objects=0: calls.append((label, nbytes, objects))

        return factory

    sync.push(alice, progress=start("push"))
    ids = list(alice.store.ids())
    sizes = sorted(alice.store.stored_size(o) for o in ids)
    assert sizes[0] < 4 << 20 < sizes[-1]  # some objects in packs, one loose
    for label in ("push", "clone"):
        if label == "clone":
            sync.clone(url, tmp_path / "bob", progress=start("clone"))
        _, total_bytes, total_objects = next(c for c in calls if c[0] == label + " total")
        moved = [c for c in calls if c[0] == label]
        # A clone's version record and manifest came before, in the metadata pack: not counted.
        expected = len(ids) - (2 if label == "clone" else 0)
        assert (total_objects, sum(c[2] for c in moved)) == (expected, expected), label
        assert 0.9 * total_bytes <= sum(c[1] for c in moved) <= 1.1 * total_bytes  # (packs: their framing)
    Repo(tmp_path / "bob").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)
