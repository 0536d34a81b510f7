"""Every remote backend keeps the contract of remotes/base.py. `BackendContract` states it once
and runs against a folder, a real S3 server (moto), a real GCS emulator (gcp-storage-emulator)
and a real Azure emulator (Azurite), each a child process, each under a prefix. The
GCS emulator ignores generation preconditions: its compare-and-swap tests are expected
failures, and a test checks that the preconditions go out on the wire. The cloud-only tests
cover what a folder cannot have: a missing bucket or container, credentials (right, wrong,
absent), the endpoint chain, and (S3) a server that fails requests (FaultProxy), ridden out
by retries or reported in one line when it persists.
"""
# ruff: noqa: F811  (test arguments named after the imported fixtures are how pytest injects them)

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from azurite import AZURE_VARIABLES, AzureContainer, azure_container, azurite_server, requires_azurite  # noqa: F401
from gcsemulator import NO_PRECONDITIONS, GCSBucket, gcs_bucket, gcs_emulator  # noqa: F401
from s3server import UNSET_AWS_VARIABLES, FaultProxy, S3Server, aws_env, s3_bucket, s3_server  # noqa: F401

from mgit.errors import (
    InvalidOptionError,
    MissingDependencyError,
    MissingKeyError,
    RemoteAuthError,
    RemoteConflictError,
    RemoteError,
    RemoteNotFoundError,
    RemoteTooLargeError,
    RemoteUnavailableError,
)
from mgit.remotes import RemoteSpec, open_backend
from mgit.remotes.base import Backend
from mgit.remotes.folder import FolderBackend

MiB = 1 << 20
PART = 5 * MiB  # S3's smallest part: the S3 backend's multipart threshold in these tests
LARGE = 12 * MiB + 7  # three parts on S3; several MiB for a folder
CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
)


requires_s3 = pytest.mark.skipif(
    not (importlib.util.find_spec("boto3") and importlib.util.find_spec("moto")),
    reason="needs the S3 extra (boto3) and moto",
)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def s3_backend(url: str, **options: object) -> Backend:
    """An S3Backend whose large files go in 5 MiB parts (so multipart stays fast to test)."""
    from mgit.remotes.s3 import S3Backend, transfer_config

    backend = S3Backend(url, **options)  # type: ignore[arg-type]
    backend.transfer = transfer_config(max_workers=4, threshold=PART, part_size=PART)
    return backend


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and "Traceback" not in message, message
    return message


class BackendContract:
    """What every backend does. A subclass supplies `backend` (an empty remote) and `absent`
    (a remote whose root is not there), and says whether its conditional writes are atomic."""

    atomic_conditional_writes = True

    @pytest.fixture
    def backend(self) -> Backend:
        raise NotImplementedError

    @pytest.fixture
    def absent(self) -> Backend:
        raise NotImplementedError

    def test_check_finds_the_remote_or_says_it_is_missing(self, backend, absent):
        backend.check()
        with pytest.raises(RemoteNotFoundError) as failed:
            absent.check()
        one_line(failed.value)

    def test_bytes_round_trip(self, backend):
        blobs = {"objects/ab/cdef01": os.urandom(1000), "index.json": b'{"models": []}', "empty": b""}
        for key, data in blobs.items():
            backend.write(key, data)
        assert {key: backend.read(key, limit=len(data)) for key, data in blobs.items()} == blobs
        backend.write("index.json", b"replaced")
        assert backend.read("index.json", limit=100) == b"replaced"

    @pytest.mark.parametrize("size", [0, 3 * MiB + 1, LARGE])
    def test_file_round_trip_is_byte_identical(self, backend, tmp_path, size):
        source = tmp_path / "source.bin"
        source.write_bytes(os.urandom(size))
        backend.write("objects/ab/file", source)
        out = tmp_path / "out.bin"
        assert backend.read_into("objects/ab/file", out, limit=size) == size
        assert sha256(out) == sha256(source)
        assert hashlib.sha256(backend.read("objects/ab/file", limit=size)).hexdigest() == sha256(source)

    def test_read_range_gives_exactly_the_bytes_asked_for(self, backend):
        data = os.urandom(3 * MiB + 11)
        backend.write("packs/p.objpack", data)
        for start, length in ((0, 1), (17, 4096), (MiB - 3, MiB + 9), (len(data) - 5, 5), (0, len(data))):
            assert backend.read_range("packs/p.objpack", start, length) == data[start : start + length]
        with pytest.raises(RemoteError) as past:  # a key that ends before the range: never a short answer
            backend.read_range("packs/p.objpack", len(data) - 2, 10)
        one_line(past.value)
        with pytest.raises(MissingKeyError):
            backend.read_range("packs/absent.objpack", 0, 10)

    def test_a_ranged_download_cut_off_resumes_with_the_ranges_that_had_not_arrived(self, backend, tmp_path):
        if backend.ranged_from is None:
            pytest.skip("this backend reads whole objects only (a local copy has nothing to resume)")
        from mgit.remotes import partial
        from mgit.remotes.journal import TransferJournal

        data = os.urandom(5 * 1000 + 17)
        backend.write("objects/ab/big", data)
        backend.journal, backend.ranged_from = TransferJournal(tmp_path / "transfers"), 2000  # 1,000-byte chunks
        asked: list[int] = []
        real = backend.read_range

        def cut_off_after_two(key: str, start: int, size: int) -> bytes:
            asked.append(start)
            if len(asked) > 2:
                raise RemoteUnavailableError(backend.url, "the connection dropped")
            return real(key, start, size)

        backend.read_range = cut_off_after_two
        with pytest.raises(RemoteUnavailableError):
            partial.download(backend, "objects/ab/big", tmp_path / "out", limit=len(data))
        assert not (tmp_path / "out").exists()
        arrived = {s for s in asked[:2]}
        backend.read_range = lambda key, start, size: asked.append(start) or real(key, start, size)
        del asked[:]
        assert partial.download(backend, "objects/ab/big", tmp_path / "out", limit=len(data)) == len(data)
        assert (tmp_path / "out").read_bytes() == data
        assert sorted(asked) == sorted(set(range(0, len(data), 1000)) - arrived)  # only what had not arrived
        assert [p.name for p in (tmp_path / "transfers" / "downloads").iterdir()] == []
        with pytest.raises(RemoteTooLargeError):
            partial.download(backend, "objects/ab/big", tmp_path / "again", limit=len(data) - 1)

    def test_a_missing_key_is_missing_key_error(self, backend, tmp_path):
        with pytest.raises(MissingKeyError) as failed:
            backend.read("objects/00/absent", limit=10)
        assert "objects/00/absent" in one_line(failed.value)
        with pytest.raises(MissingKeyError):
            backend.read_into("objects/00/absent", tmp_path / "out", limit=10)
        assert not (tmp_path / "out").exists()

    def test_read_refuses_more_than_the_limit(self, backend):
        backend.write("objects/ab/k", b"x" * 1000)
        with pytest.raises(RemoteTooLargeError) as failed:
            backend.read("objects/ab/k", limit=999)
        assert "1000 bytes" in one_line(failed.value)
        assert backend.read("objects/ab/k", limit=1000) == b"x" * 1000

    @pytest.mark.parametrize("size", [1000, LARGE])
    def test_read_into_refuses_more_than_the_limit_and_leaves_no_file(self, backend, tmp_path, size):
        source = tmp_path / "source.bin"
        source.write_bytes(os.urandom(size))
        backend.write("objects/ab/k", source)
        with pytest.raises(RemoteTooLargeError):
            backend.read_into("objects/ab/k", tmp_path / "out", limit=size - 1)
        assert not (tmp_path / "out").exists()

    def test_read_into_never_replaces_an_existing_file(self, backend, tmp_path):
        backend.write("objects/ab/k", b"remote")
        mine = tmp_path / "mine"
        mine.write_bytes(b"local")
        with pytest.raises(FileExistsError):
            backend.read_into("objects/ab/k", mine, limit=100)
        assert mine.read_bytes() == b"local"

    def test_exists(self, backend):
        assert not backend.exists("objects/ab/k")
        backend.write("objects/ab/k", b"1")
        assert backend.exists("objects/ab/k")
        assert not backend.exists("objects/ab")  # a folder of keys is not a key
        assert not backend.exists("objects/ab/k2")

    def test_list_gives_sorted_keys_under_a_prefix(self, backend):
        keys = [
            "index.json",
            "objects/ab/cd01",
            "objects/ab/cd00",
            "objects/ff/0011",
            "refs/models/bert",
            "refs/models/org/gpt2",
            "refs/models/bert-sst2",
        ]
        for key in keys:
            backend.write(key, b"v")
        assert list(backend.list("objects/")) == ["objects/ab/cd00", "objects/ab/cd01", "objects/ff/0011"]
        assert list(backend.list("objects/a")) == ["objects/ab/cd00", "objects/ab/cd01"]
        assert list(backend.list("refs/models/")) == [
            "refs/models/bert",
            "refs/models/bert-sst2",
            "refs/models/org/gpt2",
        ]
        assert list(backend.list("refs/models/org/")) == ["refs/models/org/gpt2"]
        assert list(backend.list("refs/models/bert")) == ["refs/models/bert", "refs/models/bert-sst2"]
        assert list(backend.list("nothing/")) == []

    def test_list_of_everything_shows_every_key_and_no_lock_or_temporary_file(self, backend):
        keys = ["index.json", "objects/ab/cd00", "refs/models/bert", "refs/models/org/gpt2"]
        for key in keys[:2]:
            backend.write(key, b"v")
        for key in keys[2:]:  # conditional writes take a lock where the backend has locks
            backend.write_if(key, b"v", token=None)
        assert list(backend.list("")) == sorted(keys)

    def test_list_info_gives_each_key_its_size_and_time_of_writing(self, backend):
        before = time.time()
        backend.write("objects/ab/cd00", b"x" * 10)
        backend.write("objects/ab/cd01", b"")
        backend.write("refs/models/bert", b"v")
        infos = list(backend.list_info("objects/"))
        assert [(i.key, i.size) for i in infos] == [("objects/ab/cd00", 10), ("objects/ab/cd01", 0)]
        for info in infos:  # the remote's clock: loopback servers share this machine's
            assert before - 5 <= info.modified <= time.time() + 5, (info, before)
        assert [i.key for i in backend.list_info("")] == list(backend.list(""))

    def test_delete_removes_a_key_and_a_missing_one_is_no_error(self, backend):
        backend.write("objects/ab/cd00", b"x")
        backend.write("objects/ab/cd01", b"y")
        backend.delete("objects/ab/cd00")
        assert not backend.exists("objects/ab/cd00")
        assert list(backend.list("objects/")) == ["objects/ab/cd01"]
        backend.delete("objects/ab/cd00")  # already gone: a gc killed midway runs again
        with pytest.raises(RemoteError, match="not a remote key"):
            backend.delete("../escape")
        assert backend.read("objects/ab/cd01", limit=10) == b"y"

    def test_write_if_without_token_creates_only_once(self, backend):
        key = "refs/models/bert"
        assert backend.read_versioned(key, limit=100) == (None, None)
        backend.write_if(key, b"v1", token=None)
        with pytest.raises(RemoteConflictError) as failed:
            backend.write_if(key, b"v2", token=None)
        assert key in one_line(failed.value)
        data, token = backend.read_versioned(key, limit=100)
        assert data == b"v1" and token

    def test_write_if_is_compare_and_swap_on_the_token(self, backend):
        key = "refs/models/bert"
        backend.write_if(key, b"v1", token=None)
        _, first = backend.read_versioned(key, limit=100)
        assert backend.read_versioned(key, limit=100) == (b"v1", first)  # a token names a version
        backend.write_if(key, b"v2", token=first)
        data, second = backend.read_versioned(key, limit=100)
        assert data == b"v2" and second != first
        with pytest.raises(RemoteConflictError):
            backend.write_if(key, b"v3", token=first)  # stale
        assert backend.read(key, limit=100) == b"v2"
        backend.write_if(key, b"v3", token=second)
        assert backend.read(key, limit=100) == b"v3"

    def test_write_if_returns_the_token_and_a_listing_gives_each_refs_token_and_md5(self, backend):
        """What the heads index (mgit.remotes.heads) is checked against: each key's token, as
        `read_versioned` gives it, and the MD5 of its bytes where the listing has it."""
        written = {"refs/models/a": b"v1\n", "refs/models/b/c": b"v2\n"}
        returned = {key: backend.write_if(key, data, token=None) for key, data in written.items()}
        backend.write("refs/other", b"not under the prefix")
        listed = backend.list_tokens("refs/models/")
        assert sorted(listed) == sorted(written)
        for key, data in written.items():
            token, md5 = listed[key]
            assert (data, token) == backend.read_versioned(key, limit=100)
            assert returned[key] in (None, token)  # (None: the backend's answer did not say)
            assert md5 is None or md5 == hashlib.md5(data).hexdigest()
        _, before = backend.read_versioned("refs/models/a", limit=100)
        after = backend.write_if("refs/models/a", b"v3\n", token=before)
        assert (
            backend.list_tokens("refs/models/")["refs/models/a"][0]
            == backend.read_versioned("refs/models/a", limit=100)[1]
        )
        assert after in (None, backend.read_versioned("refs/models/a", limit=100)[1]) and after != before
        assert backend.list_tokens("nothing/") == {}

    def test_write_if_with_a_token_on_a_missing_key_conflicts(self, backend):
        backend.write_if("refs/models/a", b"v", token=None)
        _, token = backend.read_versioned("refs/models/a", limit=100)
        with pytest.raises(RemoteConflictError):
            backend.write_if("refs/models/b", b"v", token=token)
        assert not backend.exists("refs/models/b")

    def test_one_of_concurrent_conditional_writers_wins(self, backend):
        key, writers = "refs/models/raced", 8
        backend.write_if(key, b"start", token=None)
        _, token = backend.read_versioned(key, limit=100)
        start, outcomes = threading.Barrier(writers), [""] * writers

        def write(i: int) -> None:
            start.wait()
            try:
                backend.write_if(key, f"writer {i}".encode(), token=token)
                outcomes[i] = "won"
            except RemoteConflictError:
                outcomes[i] = "refused"
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcomes[i] = repr(exc)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert set(outcomes) <= {"won", "refused"}, outcomes
        winners = [i for i, outcome in enumerate(outcomes) if outcome == "won"]
        if self.atomic_conditional_writes:
            assert len(winners) == 1, outcomes
        else:
            assert winners, outcomes
        assert backend.read(key, limit=100) in {f"writer {i}".encode() for i in winners}

    @pytest.mark.parametrize("key", ["../escape", "/absolute", "a//b", "a/./b", "a/../b", "", "has space"])
    def test_refuses_what_is_not_a_key(self, backend, key):
        with pytest.raises(RemoteError, match="not a remote key"):
            backend.write(key, b"x")
        with pytest.raises(RemoteError, match="not a remote key"):
            backend.read(key, limit=10)


class TestFolderBackend(BackendContract):
    @pytest.fixture
    def backend(self, tmp_path):
        root = tmp_path / "remote"
        root.mkdir()
        return FolderBackend(root)

    @pytest.fixture
    def absent(self, tmp_path):
        return FolderBackend(tmp_path / "nowhere")


@requires_s3
class TestS3Backend(BackendContract):
    """moto's server checks a conditional PUT's precondition and then writes, in two steps
    that other requests can come between: racing conditional writers can all pass the check.
    So here the race test asks only that someone wins and nobody fails otherwise (on AWS,
    one writer wins and the others get 412 or 409)."""

    atomic_conditional_writes = False

    @pytest.fixture
    def backend(self, s3_bucket):
        return s3_backend(f"{s3_bucket.url}/team/models")  # endpoint and credentials: the environment

    @pytest.fixture
    def absent(self, s3_bucket):
        return s3_backend("s3://mgit-test-no-such-bucket/team")

    def test_keys_live_under_the_prefix_and_nothing_else_is_listed(self, backend, s3_bucket):
        raw = s3_bucket.client()
        for key in ("team/models-old/objects/x", "team/other", "elsewhere/objects/y", "team/models/.hidden"):
            raw.put_object(Bucket=s3_bucket.name, Key=key, Body=b"not ours")
        backend.write("objects/ab/k", b"ours")
        assert raw.get_object(Bucket=s3_bucket.name, Key="team/models/objects/ab/k")["Body"].read() == b"ours"
        assert list(backend.list("")) == ["objects/ab/k"]

    def test_large_files_go_in_parallel_parts(self, backend, s3_bucket, tmp_path):
        source = tmp_path / "source.bin"
        source.write_bytes(os.urandom(LARGE))
        backend.write("objects/ab/big", source)
        head = s3_bucket.client().head_object(Bucket=s3_bucket.name, Key="team/models/objects/ab/big")
        assert head["ETag"].endswith('-3"') and head["ContentLength"] == LARGE  # three parts

    @pytest.mark.parametrize("size", [1000, LARGE])
    def test_an_object_that_changes_while_downloaded_leaves_no_file(self, backend, tmp_path, size):
        backend.write("objects/ab/k", os.urandom(size))
        gets, replace_at = [], 1 if size < PART else 2  # before the only GET, or between ranges

        def another_writer(**kwargs: object) -> None:
            gets.append(1)
            if len(gets) == replace_at:
                backend.client.put_object(Bucket=backend.bucket, Key="team/models/objects/ab/k", Body=b"new")

        backend.client.meta.events.register("before-call.s3.GetObject", another_writer)
        with pytest.raises(RemoteConflictError):
            backend.read_into("objects/ab/k", tmp_path / "out", limit=size)
        assert not (tmp_path / "out").exists()

    @pytest.mark.parametrize("breaks", [1, 2])
    def test_a_body_that_breaks_off_is_fetched_again_or_leaves_no_file(self, s3_bucket, tmp_path, monkeypatch, breaks):
        from botocore.response import StreamingBody

        monkeypatch.setenv("MGIT_S3_ATTEMPTS", "2")
        backend = s3_backend(f"{s3_bucket.url}/team/models")
        data = os.urandom(100_000)
        backend.write("objects/ab/k", data)
        broken = []

        def break_off(parsed: dict, **kwargs: object) -> None:  # the connection drops halfway
            if len(broken) < breaks:
                broken.append(1)
                parsed["Body"].close()
                parsed["Body"] = StreamingBody(io.BytesIO(data[:50_000]), len(data))

        backend.client.meta.events.register("after-call.s3.GetObject", break_off)
        if breaks < backend.attempts:
            assert backend.read("objects/ab/k", limit=len(data)) == data
            broken.clear()
            assert backend.read_into("objects/ab/k", tmp_path / "out", limit=len(data)) == len(data)
            assert (tmp_path / "out").read_bytes() == data
        else:
            with pytest.raises(RemoteUnavailableError, match="objects/ab/k"):
                backend.read("objects/ab/k", limit=len(data))
            broken.clear()
            with pytest.raises(RemoteUnavailableError):
                backend.read_into("objects/ab/k", tmp_path / "out", limit=len(data))
            assert not (tmp_path / "out").exists()


def azure_backend(url: str, **options: object) -> Backend:
    """An Azure backend whose large files go in 5 MiB blocks and ranges (multipart stays fast)."""
    from mgit.remotes.objectstore import ObjectStoreBackend

    backend = ObjectStoreBackend.azure(url, **options)  # type: ignore[arg-type]
    backend.part_size = PART
    return backend


@requires_azurite
class TestAzureBackend(BackendContract):
    """Azurite checks a conditional Put Blob and writes in one step: of racing writers, one
    wins (as on Azure)."""

    @pytest.fixture
    def backend(self, azure_container):
        return azure_backend(f"{azure_container.url}/team/models")  # account and endpoint: the environment

    @pytest.fixture
    def absent(self, azure_container):
        return azure_backend("az://mgit-test-no-such-container/team")

    def test_keys_live_under_the_prefix_and_nothing_else_is_listed(self, backend, azure_container):
        import obstore

        from mgit.remotes.objectstore import ObjectStoreBackend

        raw = ObjectStoreBackend.azure(azure_container.url)  # the container's root
        for key in ("team/models-old/objects/x", "team/other", "elsewhere/objects/y", "team/models/.hidden"):
            obstore.put(raw.store, key, b"not ours")
        backend.write("objects/ab/k", b"ours")
        assert raw.read("team/models/objects/ab/k", limit=10) == b"ours"
        assert list(backend.list("")) == ["objects/ab/k"]
        assert list(backend.list("obj")) == ["objects/ab/k"]  # a prefix need not end at a "/"

    def test_large_files_go_in_blocks_and_come_back_in_ranges(self, backend, tmp_path):
        import obstore

        source = tmp_path / "source.bin"
        source.write_bytes(os.urandom(LARGE))
        gets = []
        original = obstore.get
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(obstore, "get", lambda *a, **k: gets.append(k.get("options")) or original(*a, **k))
            backend.write("objects/ab/big", source)
            backend.read_into("objects/ab/big", tmp_path / "out", limit=LARGE)
        assert sha256(tmp_path / "out") == sha256(source)
        assert sorted(o["range"] for o in gets) == [(0, PART), (PART, 2 * PART), (2 * PART, LARGE)]
        assert {o["if_match"] for o in gets} == {obstore.head(backend.store, "objects/ab/big")["e_tag"]}

    @pytest.mark.parametrize("size", [1000, LARGE])
    def test_an_object_that_changes_while_downloaded_leaves_no_file(self, backend, tmp_path, size):
        import obstore

        backend.write("objects/ab/k", os.urandom(size))
        original, gets = obstore.get, []

        def another_writer(*args, **kwargs):  # replaces the blob before the first (or only) GET
            gets.append(1)
            if len(gets) == 1:
                obstore.put(backend.store, "objects/ab/k", b"new")
            return original(*args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(obstore, "get", another_writer)
            with pytest.raises(RemoteConflictError):
                backend.read_into("objects/ab/k", tmp_path / "out", limit=size)
        assert not (tmp_path / "out").exists()


@requires_azurite
def test_azure_credentials_come_from_the_standard_variables(azure_container, monkeypatch):
    url = f"{azure_container.url}/team"
    azure_backend(url).write("objects/ab/k", b"v")
    from azurite import ACCOUNT, KEY

    for name in AZURE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT", ACCOUNT)
    monkeypatch.setenv("AZURE_STORAGE_KEY", KEY)
    assert azure_backend(url, endpoint_url=azure_container.endpoint).read("objects/ab/k", limit=10) == b"v"
    monkeypatch.setenv("AZURE_STORAGE_KEY", base64_of(b"not the key" * 6))
    bad = azure_backend(url, endpoint_url=azure_container.endpoint)
    for call in (bad.check, partial(bad.read, "objects/ab/k", limit=10), partial(bad.write, "objects/ab/x", b"x")):
        with pytest.raises(RemoteAuthError) as failed:
            call()
        message = one_line(failed.value)
        assert url in message and "AZURE_STORAGE_CONNECTION_STRING" in message and KEY not in message


@requires_azurite
def test_a_missing_container_is_named_in_one_line_and_never_created(azure_container):
    backend = azure_backend("az://mgit-test-no-such-container/team")
    for call in (
        backend.check,
        lambda: backend.read("objects/ab/k", limit=10),
        lambda: backend.write("k", b"x"),
        lambda: list(backend.list("")),
        lambda: backend.write_if("refs/models/m", b"x", token=None),
    ):
        with pytest.raises(RemoteNotFoundError) as failed:
            call()
        assert "container 'mgit-test-no-such-container' of az://mgit-test-no-such-container/team" in one_line(
            failed.value
        )
        assert "never creates" in str(failed.value)
    with pytest.raises(RemoteNotFoundError):
        azure_backend("az://mgit-test-no-such-container/team").check()


@requires_azurite
def test_an_unreachable_azure_endpoint_is_unavailable_in_one_line_and_soon(azure_container, monkeypatch):
    monkeypatch.setenv("MGIT_REMOTE_RETRIES", "1")
    backend = azure_backend(f"{azure_container.url}/team", endpoint_url="http://127.0.0.1:9/devstoreaccount1")
    with pytest.raises(RemoteUnavailableError) as failed:
        backend.read("objects/ab/k", limit=10)
    assert one_line(failed.value).startswith(f"{azure_container.url}/team did not answer")


def test_without_obstore_an_azure_remote_asks_for_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "obstore", None)
    monkeypatch.delitem(sys.modules, "mgit.remotes.objectstore", raising=False)
    with pytest.raises(MissingDependencyError, match=r"pip install 'mgit-models\[azure\]'"):
        open_backend(RemoteSpec("az://some-container/team"))


def base64_of(data: bytes) -> str:
    import base64

    return base64.b64encode(data).decode()


requires_gcs = pytest.mark.skipif(
    not (importlib.util.find_spec("google.cloud.storage") and importlib.util.find_spec("gcp_storage_emulator")),
    reason="needs the gcs extra (google-cloud-storage) and gcp-storage-emulator",
)


def gcs_backend(url: str, **options: object) -> Backend:
    """A GCS backend whose large files come down in 5 MiB ranges (so parts stay fast to test)."""
    from mgit.remotes.gcs import GCSBackend

    backend = GCSBackend(url, **options)  # type: ignore[arg-type]
    backend.part_size = PART
    return backend


@requires_gcs
class TestGCSBackend(BackendContract):
    """The emulator ignores ifGenerationMatch, so the compare-and-swap tests cannot pass on it,
    and its racing writers all "win" (the race test here asks only that nobody fails)."""

    atomic_conditional_writes = False

    @pytest.fixture
    def backend(self, gcs_bucket):
        return gcs_backend(f"{gcs_bucket.url}/team/models")  # the emulator: STORAGE_EMULATOR_HOST

    @pytest.fixture
    def absent(self, gcs_bucket):
        return gcs_backend("gs://mgit-test-no-such-bucket/team")

    @pytest.mark.xfail(reason=NO_PRECONDITIONS, strict=True)
    def test_write_if_without_token_creates_only_once(self, backend):
        super().test_write_if_without_token_creates_only_once(backend)

    @pytest.mark.xfail(reason=NO_PRECONDITIONS, strict=True)
    def test_write_if_is_compare_and_swap_on_the_token(self, backend):
        super().test_write_if_is_compare_and_swap_on_the_token(backend)

    @pytest.mark.xfail(reason=NO_PRECONDITIONS, strict=True)
    def test_write_if_with_a_token_on_a_missing_key_conflicts(self, backend):
        super().test_write_if_with_a_token_on_a_missing_key_conflicts(backend)

    def test_a_token_is_the_generation_and_every_write_if_sends_its_precondition(self, gcs_bucket, monkeypatch):
        with FaultProxy(gcs_bucket.endpoint) as proxy:  # forwards every request, and records it
            monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
            backend = gcs_backend(f"{gcs_bucket.url}/team")
            backend.write_if("refs/models/m", b"v1", token=None)
            data, token = backend.read_versioned("refs/models/m", limit=10)
            backend.write_if("refs/models/m", b"v2", token=token)
            with pytest.raises(RemoteConflictError):
                backend.write_if("refs/models/m", b"v3", token="not-a-generation")
            uploads = [r.target for r in proxy.seen if r.method == "POST" and "/upload/" in r.target]
            reads = [r.target for r in proxy.seen if r.method == "GET" and "alt=media" in r.target]
        assert data == b"v1" and token and token.isdigit()
        assert len(uploads) == 2 and "ifGenerationMatch=0" in uploads[0] and f"ifGenerationMatch={token}" in uploads[1]
        assert reads and all(f"ifGenerationMatch={token}" in r for r in reads)  # a read names its generation

    def test_the_emulator_really_ignores_preconditions(self, gcs_bucket):
        """What the expected failures above rest on: if this fails, the emulator has learnt
        preconditions, and the xfail marks (strict) fail too, to be removed."""
        from google.cloud import storage

        blob = storage.Client(project="mgit").bucket(gcs_bucket.name).blob("k")
        blob.upload_from_string(b"v1", if_generation_match=0)
        blob.upload_from_string(b"v2", if_generation_match=0)  # on GCS: 412
        blob.upload_from_string(b"v3", if_generation_match=1)  # on GCS: 412
        assert blob.download_as_bytes() == b"v3"

    def test_large_files_come_back_in_ranges_of_one_generation(self, backend, tmp_path):
        source = tmp_path / "source.bin"
        source.write_bytes(os.urandom(LARGE))
        backend.write("objects/ab/big", source)
        assert backend.read_into("objects/ab/big", tmp_path / "out", limit=LARGE) == LARGE
        assert sha256(tmp_path / "out") == sha256(source)
        assert backend.size("objects/ab/big") == LARGE

    def test_keys_live_under_the_prefix_and_nothing_else_is_listed(self, backend, gcs_bucket):
        from google.cloud import storage

        raw = storage.Client(project="mgit").bucket(gcs_bucket.name)
        for key in ("team/models-old/objects/x", "team/other", "elsewhere/objects/y", "team/models/.hidden"):
            raw.blob(key).upload_from_string(b"not ours")
        backend.write("objects/ab/k", b"ours")
        assert raw.blob("team/models/objects/ab/k").download_as_bytes() == b"ours"
        assert list(backend.list("")) == ["objects/ab/k"]


@requires_gcs
def test_a_missing_gcs_bucket_is_named_in_one_line_and_never_created(gcs_bucket):
    backend = gcs_backend("gs://mgit-test-no-such-bucket/team")
    for call in (
        backend.check,
        lambda: backend.write("k", b"x"),
        lambda: list(backend.list("")),
        lambda: backend.write_if("refs/models/m", b"x", token=None),
    ):
        with pytest.raises(RemoteNotFoundError) as failed:
            call()
        assert "bucket 'mgit-test-no-such-bucket' of gs://mgit-test-no-such-bucket/team" in one_line(failed.value)
        assert "never creates buckets" in str(failed.value)


@requires_gcs
def test_without_emulator_or_google_credentials_a_gcs_remote_is_an_auth_error(gcs_bucket, monkeypatch, tmp_path):
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud application-default credentials
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")
    with pytest.raises(RemoteAuthError, match="no Google credentials found") as failed:
        gcs_backend(gcs_bucket.url)
    assert "GOOGLE_APPLICATION_CREDENTIALS" in one_line(failed.value)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(RemoteAuthError):
        gcs_backend(gcs_bucket.url)


@requires_gcs
def test_an_unreachable_gcs_endpoint_is_unavailable_in_one_line_and_soon(gcs_bucket, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9")
    monkeypatch.setenv("MGIT_REMOTE_RETRY_SECONDS", "0")
    backend = gcs_backend(f"{gcs_bucket.url}/team")
    with pytest.raises(RemoteUnavailableError) as failed:
        backend.read("objects/ab/k", limit=10)
    assert one_line(failed.value).startswith(f"{gcs_bucket.url}/team did not answer")


@requires_gcs
@pytest.mark.parametrize("variable", ["MGIT_REMOTE_RETRY_SECONDS", "MGIT_REMOTE_RETRY_DELAY"])
@pytest.mark.parametrize("value", ["soon", "-1", "3601", "nan"])
def test_retry_seconds_and_delay_must_be_a_number_of_seconds(gcs_bucket, monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(InvalidOptionError) as refused:
        gcs_backend(f"{gcs_bucket.url}/team")
    assert one_line(refused.value).startswith(f"{variable}={value!r} is not a number of seconds")


def test_without_its_client_a_gcs_remote_asks_for_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "google.auth", None)  # (the first of its imports)
    monkeypatch.delitem(sys.modules, "mgit.remotes.gcs", raising=False)
    with pytest.raises(MissingDependencyError, match=r"pip install 'mgit-models\[gcs\]'"):
        open_backend(RemoteSpec("gs://some-bucket/team"))


@requires_s3
class TestS3ThroughObstore(BackendContract):
    """The obstore backend on s3:// (what benchmarks/s3_clients.py weighs against boto3) keeps
    the same contract against the same moto server (whose conditional writes are not atomic:
    see TestS3Backend)."""

    atomic_conditional_writes = False

    @pytest.fixture
    def backend(self, s3_bucket):
        from mgit.remotes.objectstore import ObjectStoreBackend

        backend = ObjectStoreBackend.s3(f"{s3_bucket.url}/team/models")  # endpoint and credentials: the environment
        backend.part_size = PART
        return backend

    @pytest.fixture
    def absent(self, s3_bucket):
        from mgit.remotes.objectstore import ObjectStoreBackend

        return ObjectStoreBackend.s3("s3://mgit-test-no-such-bucket/team")


# --- S3 only: buckets, credentials, endpoints ---------------------------------------------------


@requires_s3
def test_a_missing_bucket_is_named_in_one_line_and_never_created(s3_bucket, tmp_path):
    backend = s3_backend("s3://mgit-test-no-such-bucket/team")
    calls = [
        backend.check,
        lambda: backend.read("objects/ab/k", limit=10),
        lambda: backend.write("k", b"x"),
        lambda: list(backend.list("")),
        lambda: backend.write_if("refs/models/m", b"x", token=None),
    ]
    for call in calls:
        with pytest.raises(RemoteNotFoundError) as failed:
            call()
        assert "'mgit-test-no-such-bucket' of s3://mgit-test-no-such-bucket/team does not exist" in one_line(
            failed.value
        )
        assert "never creates buckets" in str(failed.value)
    buckets = [b["Name"] for b in s3_bucket.client().list_buckets()["Buckets"]]
    assert "mgit-test-no-such-bucket" not in buckets


@dataclass(frozen=True)
class StrictServer:
    endpoint: str
    bucket: str
    key_id: str
    secret: str


@pytest.fixture(scope="module")
def strict_server():
    """A moto server that checks signatures and keys. By default moto accepts any credentials;
    POST /moto-api/reset-auth with a count N makes it serve N requests unchecked (here: an IAM
    user, its key, its policy, a bucket) and authenticate every one after them."""
    import boto3

    with S3Server() as server:
        switch = urllib.request.Request(
            server.endpoint + "/moto-api/reset-auth",
            data=b"4",
            method="POST",
            headers={"Content-Type": "application/octet-stream"},
        )
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(switch, timeout=10).close()
        iam = boto3.client(
            "iam",
            endpoint_url=server.endpoint,
            region_name="us-east-1",
            aws_access_key_id="setup",
            aws_secret_access_key="setup",
        )
        iam.create_user(UserName="mgit")
        key = iam.create_access_key(UserName="mgit")["AccessKey"]
        allow_s3 = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}
        iam.put_user_policy(UserName="mgit", PolicyName="s3", PolicyDocument=json.dumps(allow_s3))
        server.client().create_bucket(Bucket="mgit-strict")
        yield StrictServer(server.endpoint, "mgit-strict", key["AccessKeyId"], key["SecretAccessKey"])


def use_aws_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, **overrides: str) -> None:
    for name in UNSET_AWS_VARIABLES + CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**aws_env(endpoint), **overrides}.items():
        monkeypatch.setenv(name, value)


@requires_s3
def test_right_credentials_pass_and_wrong_ones_are_refused_in_one_line(strict_server, monkeypatch):
    url = f"s3://{strict_server.bucket}/team"
    use_aws_env(
        monkeypatch,
        strict_server.endpoint,
        AWS_ACCESS_KEY_ID=strict_server.key_id,
        AWS_SECRET_ACCESS_KEY=strict_server.secret,
    )
    good = s3_backend(url)
    good.write("objects/ab/k", b"v")
    assert good.read("objects/ab/k", limit=10) == b"v"
    for key_id, secret, code in [
        (strict_server.key_id, "not-the-secret", "SignatureDoesNotMatch"),
        ("AKIAUNKNOWNKEY000000", "not-the-secret", "InvalidAccessKeyId"),
    ]:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        bad = s3_backend(url)
        for call in (
            bad.check,
            partial(bad.exists, "objects/ab/k"),
            partial(bad.read, "objects/ab/k", limit=10),
            partial(bad.write, "objects/ab/k", b"x"),
        ):
            with pytest.raises(RemoteAuthError) as failed:
                call()
            message = one_line(failed.value)
            assert url in message and "AWS_ACCESS_KEY_ID" in message  # the hint names the chain
            assert "not-the-secret" not in message and strict_server.secret not in message
        with pytest.raises(RemoteAuthError, match=code):
            bad.read("objects/ab/k", limit=10)
    assert good.read("objects/ab/k", limit=10) == b"v"


@requires_s3
def test_no_credentials_at_all_is_an_auth_error_with_a_hint(s3_bucket, monkeypatch):
    for name in CREDENTIAL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    backend = s3_backend(s3_bucket.url)
    with pytest.raises(RemoteAuthError, match="no AWS credentials found") as failed:
        backend.check()
    assert "AWS_ACCESS_KEY_ID" in one_line(failed.value)


@requires_s3
def test_an_unknown_profile_is_an_auth_error(s3_bucket):
    with pytest.raises(RemoteAuthError, match="no AWS profile named 'nobody'"):
        s3_backend(s3_bucket.url, profile="nobody")


@requires_s3
def test_an_endpoint_from_the_environment_or_given_is_addressed_by_path(s3_bucket, monkeypatch):
    localhost = s3_bucket.endpoint.replace("127.0.0.1", "localhost")  # BUCKET.localhost would not resolve
    monkeypatch.setenv("AWS_ENDPOINT_URL", localhost)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", localhost)
    for backend in (s3_backend(s3_bucket.url), s3_backend(s3_bucket.url, endpoint_url=s3_bucket.endpoint)):
        assert backend.client.meta.config.s3["addressing_style"] == "path"
        backend.write("k", backend.client.meta.endpoint_url.encode())
        assert backend.read("k", limit=100) == backend.client.meta.endpoint_url.encode()
    assert s3_backend(s3_bucket.url).client.meta.endpoint_url == localhost
    assert s3_backend(s3_bucket.url, endpoint_url=s3_bucket.endpoint).client.meta.endpoint_url == s3_bucket.endpoint


def test_without_boto3_an_s3_remote_asks_for_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import boto3` meets when it is not installed
    monkeypatch.delitem(sys.modules, "mgit.remotes.s3", raising=False)
    with pytest.raises(MissingDependencyError, match=r"pip install 'mgit-models\[s3\]'"):
        open_backend(RemoteSpec("s3://some-bucket/team"))


@requires_s3
@pytest.mark.parametrize("attempts", ["lots", "²", "0", "101", "9" * 5000])
def test_attempts_must_be_a_small_whole_number(s3_bucket, monkeypatch, attempts):
    monkeypatch.setenv("MGIT_S3_ATTEMPTS", attempts)
    with pytest.raises(InvalidOptionError, match="MGIT_S3_ATTEMPTS"):
        s3_backend(s3_bucket.url)


# --- S3 only: a server that fails requests -------------------------------------------------------


@requires_s3
@pytest.mark.parametrize("mode", ["503", "500", "drop"])
def test_retries_ride_out_a_server_failing_every_third_request(s3_bucket, tmp_path, mode):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 * PART + 1))
    blobs = {f"objects/0{i}/blob": os.urandom(1000 + i) for i in range(3)}
    with FaultProxy(s3_bucket.endpoint, every=3, mode=mode) as proxy:
        backend = s3_backend(f"{s3_bucket.url}/team", endpoint_url=proxy.endpoint)  # given wins over the env
        for key, data in blobs.items():
            backend.write(key, data)
        backend.write("objects/big", big)
        backend.write_if("refs/models/m", b"v1", token=None)
        _, token = backend.read_versioned("refs/models/m", limit=10)
        backend.write_if("refs/models/m", b"v2", token=token)
        assert {key: backend.read(key, limit=2000) for key in blobs} == blobs
        backend.read_into("objects/big", tmp_path / "out.bin", limit=2 * PART + 1)
        assert list(backend.list("objects/0")) == sorted(blobs)
        assert backend.exists("refs/models/m") and backend.read("refs/models/m", limit=10) == b"v2"
        assert proxy.faults >= 5 and all(r.fault in (None, mode) for r in proxy.seen)
    assert sha256(tmp_path / "out.bin") == sha256(big)


@requires_s3
@pytest.mark.parametrize("mode", ["503", "500", "drop"])
def test_a_server_that_keeps_failing_is_unavailable_in_one_line_and_soon(s3_bucket, monkeypatch, mode):
    s3_bucket.client().put_object(Bucket=s3_bucket.name, Key="team/objects/ab/k", Body=b"v")
    monkeypatch.setenv("MGIT_S3_ATTEMPTS", "2")
    with FaultProxy(s3_bucket.endpoint, every=1, mode=mode) as proxy:
        backend = s3_backend(f"{s3_bucket.url}/team", endpoint_url=proxy.endpoint)
        with pytest.raises(RemoteUnavailableError) as failed:
            backend.read("objects/ab/k", limit=10)
        # Soon: MGIT_S3_ATTEMPTS bounds the attempts, and each was a fault answered at once.
        assert [r.fault for r in proxy.seen] == [mode, mode]
    message = one_line(failed.value)
    assert message.startswith(f"{s3_bucket.url}/team did not answer: ") and "2 attempts" in message


# --- URLs of every cloud ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "normal", "kind"),
    [
        ("s3://team-models/bert/", "s3://team-models/bert", "s3"),
        ("gs://team_models//bert/v1/", "gs://team_models/bert/v1", "gcs"),
        ("az://models/", "az://models", "azure"),
    ],
)
def test_cloud_urls_are_normalized_and_name_their_kind(url, normal, kind):
    from mgit.remotes import normalize_url

    assert normalize_url(url) == normal
    assert RemoteSpec(normal).kind == kind


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("gs://Upper/x", "does not name a GCS bucket"),
        ("az://under_score/x", "does not name an Azure container"),
        ("az://double--dash/x", "does not name an Azure container"),
        ("gs://bucket/a/../b", "'.' or '..'"),
        ("az://key:secret@models/x", "holds credentials"),
        ("gs://token@bucket/x", "holds credentials"),
        ("abfs://models/x", "scheme 'abfs' is not supported"),
    ],
)
def test_cloud_urls_that_are_wrong_or_hold_credentials_are_refused(url, said):
    from mgit.remotes import normalize_url

    with pytest.raises(InvalidOptionError, match=re.escape(said)) as failed:
        normalize_url(url)
    assert "secret" not in str(failed.value) and "token@" not in str(failed.value)


# --- GCS and Azure: a server that fails requests --------------------------------------------------


def ride_out_faults(backend: Backend, tmp_path: Path) -> None:
    """Writes, a compare-and-swap, reads, a ranged download and a listing, each ending right
    however many of their requests the proxy fails."""
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 * PART + 1))
    blobs = {f"objects/0{i}/blob": os.urandom(1000 + i) for i in range(3)}
    for key, data in blobs.items():
        backend.write(key, data)
    backend.write("objects/big", big)
    backend.write_if("refs/models/m", b"v1", token=None)
    _, token = backend.read_versioned("refs/models/m", limit=10)
    backend.write_if("refs/models/m", b"v2", token=token)
    assert {key: backend.read(key, limit=2000) for key in blobs} == blobs
    backend.read_into("objects/big", tmp_path / "out.bin", limit=2 * PART + 1)
    assert list(backend.list("objects/0")) == sorted(blobs)
    assert backend.read("refs/models/m", limit=10) == b"v2"
    assert sha256(tmp_path / "out.bin") == sha256(big)


@requires_azurite
@pytest.mark.parametrize("mode", ["503", "drop"])
def test_azure_retries_ride_out_a_server_failing_every_third_request(azure_container, tmp_path, mode):
    with FaultProxy(azure_container.endpoint.rsplit("/", 1)[0], every=3, mode=mode) as proxy:
        endpoint = f"{proxy.endpoint}/{azure_container.endpoint.rsplit('/', 1)[1]}"
        ride_out_faults(azure_backend(f"{azure_container.url}/team", endpoint_url=endpoint), tmp_path)
        assert proxy.faults >= 5 and all(r.fault in (None, mode) for r in proxy.seen)


@requires_azurite
def test_an_azure_server_that_keeps_failing_is_unavailable_in_one_line(azure_container, monkeypatch):
    monkeypatch.setenv("MGIT_REMOTE_RETRIES", "1")
    with FaultProxy(azure_container.endpoint.rsplit("/", 1)[0], every=1, mode="503") as proxy:
        endpoint = f"{proxy.endpoint}/{azure_container.endpoint.rsplit('/', 1)[1]}"
        backend = azure_backend(f"{azure_container.url}/team", endpoint_url=endpoint)
        with pytest.raises(RemoteUnavailableError) as failed:
            backend.read("objects/ab/k", limit=10)
        assert len(proxy.seen) == 2  # the request and its one retry
    assert one_line(failed.value).startswith(f"{azure_container.url}/team did not answer")


@requires_gcs
@pytest.mark.parametrize("mode", ["503", "drop"])
def test_gcs_retries_ride_out_a_server_failing_every_third_request(gcs_bucket, tmp_path, monkeypatch, mode):
    with FaultProxy(gcs_bucket.endpoint, every=3, mode=mode) as proxy:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.endpoint)
        ride_out_faults(gcs_backend(f"{gcs_bucket.url}/team"), tmp_path)
        assert proxy.faults >= 5 and all(r.fault in (None, mode) for r in proxy.seen)
