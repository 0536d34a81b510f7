"""gcp-storage-emulator (PyPI) as a real server process for tests of gs:// remotes: in
memory, on 127.0.0.1 and a free port.

    GCSEmulator()                   `python -m gcp_storage_emulator start` as a child process
    gcs_emulator                    session fixture: one emulator per pytest worker
    gcs_bucket                      function fixture: a fresh bucket, and STORAGE_EMULATOR_HOST
                                    (the variable every Google client library reads) naming it
    OnGCS                           mixin for a contract class: its `url` (a fresh remote,
                                    gcs_bucket.remote()) and `env` fixtures on the emulator

What the emulator does with preconditions (checked by test_remote_backends.py): nothing. It
serves GCS's JSON API, but ignores `ifGenerationMatch` on uploads and downloads alike, so a
create over an existing object and a replace on a stale generation both succeed. The tests
of compare-and-swap on gs:// are therefore expected failures there (the requests MGit sends
carry the preconditions, which a test checks on the wire), and docs/format.md says so.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from s3server import HOST, EmulatedBucket, OnRemote, ServerProcess

GOOGLE_VARIABLES = (
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "MGIT_REMOTE_RETRY_SECONDS",
    "MGIT_REMOTE_RETRY_DELAY",
)
# Google's first retry waits about a second, then two...: on loopback a tenth of that rides out
# the same faults (the tests that fail requests count them, never time them).
RETRY_DELAY = "0.05"

NO_PRECONDITIONS = (
    "gcp-storage-emulator ignores ifGenerationMatch: its conditional writes always succeed, "
    "so compare-and-swap cannot refuse there (on GCS it does)"
)


def gcs_env(endpoint: str) -> dict[str, str]:
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY", ""), HOST, "localhost") if p)
    return {
        "STORAGE_EMULATOR_HOST": endpoint,
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
        "MGIT_REMOTE_RETRY_DELAY": RETRY_DELAY,
    }


class GCSEmulator(ServerProcess):
    """The emulator in a child process on 127.0.0.1 and a free port, in memory."""

    label = "gcp-storage-emulator"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "gcp_storage_emulator", "start", "-H", HOST, "--port", str(port), "--in-memory"]

    def ready(self, port: int) -> bytes:
        return b"All services started"

    def new_bucket(self) -> str:
        name = f"mgit-test-{uuid.uuid4().hex[:16]}"
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/storage/v1/b?project=mgit",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        _open(request)
        return name


def _open(request: urllib.request.Request) -> None:
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).close()
    except urllib.error.HTTPError as exc:
        raise OSError(f"{request.get_method()} {request.full_url}: {exc.code}") from exc


@dataclass(frozen=True)
class GCSBucket(EmulatedBucket):
    """A fresh bucket on the emulator and the variables that point Google's client at it."""

    scheme = "gs"


class OnGCS(OnRemote):
    """`url`: a fresh remote under gs://<fresh bucket>/team/models; `env`: for child processes."""

    @pytest.fixture
    def url(self, gcs_bucket: GCSBucket) -> str:
        return gcs_bucket.remote(packs=self.packs)

    @pytest.fixture
    def env(self, gcs_bucket: GCSBucket) -> dict[str, str]:
        return gcs_bucket.child_env()


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    with GCSEmulator() as server:
        yield server


@pytest.fixture
def gcs_bucket(gcs_emulator: GCSEmulator, monkeypatch: pytest.MonkeyPatch) -> Iterator[GCSBucket]:
    """A fresh bucket, with this test's environment pointing Google's client at the emulator."""
    bucket = GCSBucket(gcs_emulator.endpoint, gcs_emulator.new_bucket(), gcs_env(gcs_emulator.endpoint))
    for name in GOOGLE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    yield bucket
