"""gcp-storage-emulator (PyPI) as a real server process for tests of gs:// remotes: in
memory, on 127.0.0.1 and a free port.

    GCSEmulator()                   `python -m gcp_storage_emulator start` as a child process
    gcs_emulator                    session fixture: one emulator per pytest worker
    gcs_bucket                      function fixture: a fresh bucket, and STORAGE_EMULATOR_HOST
                                    (the variable every Google client library reads) naming it

What the emulator does with preconditions (checked by test_remote_backends.py): nothing. It
serves GCS's JSON API, but ignores `ifGenerationMatch` on uploads and downloads alike, so a
create over an existing object and a replace on a stale generation both succeed. The tests
of compare-and-swap on gs:// are therefore expected failures there (the requests MGit sends
carry the preconditions, which a test checks on the wire), and docs/format.md says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO

import pytest
from s3server import HOST, free_port

GOOGLE_VARIABLES = (
    "STORAGE_EMULATOR_HOST",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "GOOGLE_CLOUD_PROJECT",
    "MGIT_REMOTE_RETRY_SECONDS",
)

NO_PRECONDITIONS = (
    "gcp-storage-emulator ignores ifGenerationMatch: its conditional writes always succeed, "
    "so compare-and-swap cannot refuse there (on GCS it does)"
)


def gcs_env(endpoint: str) -> dict[str, str]:
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY", ""), HOST, "localhost") if p)
    return {"STORAGE_EMULATOR_HOST": endpoint, "NO_PROXY": no_proxy, "no_proxy": no_proxy}


class GCSEmulator:
    """The emulator in a child process on 127.0.0.1 and a free port, in memory."""

    def __init__(self, *, startup_timeout: float = 20.0, attempts: int = 3) -> None:
        deadline = time.monotonic() + startup_timeout
        self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        for _ in range(attempts):
            port = free_port()
            self.endpoint = f"http://{HOST}:{port}"
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gcp_storage_emulator", "start", "-H", HOST, "--port", str(port), "--in-memory"],
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            if self._wait_until_answering(deadline):
                return
            if self.process.poll() is None:
                break
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"gcp-storage-emulator did not start on {HOST} within {startup_timeout:.0f} s:\n{log}")

    def _wait_until_answering(self, deadline: float) -> bool:
        """True once this process says it started and answers its health check."""
        while time.monotonic() < deadline and self.process.poll() is None:
            if b"All services started" in os.pread(self._log.fileno(), 64 * 1024, 0):
                try:
                    _open(urllib.request.Request(self.endpoint + "/"))
                    return True
                except OSError:
                    pass
            time.sleep(0.05)
        return False

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

    def log_tail(self, size: int = 4000) -> str:
        if self._log.closed:
            return ""
        end = os.fstat(self._log.fileno()).st_size
        return os.pread(self._log.fileno(), size, max(0, end - size)).decode(errors="replace")

    def stop(self, timeout: float = 5.0) -> None:
        """End this server process (SIGTERM, then SIGKILL if it lingers); safe to call twice."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self._log.close()

    def __enter__(self) -> GCSEmulator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _open(request: urllib.request.Request) -> None:
    try:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).close()
    except urllib.error.HTTPError as exc:
        raise OSError(f"{request.get_method()} {request.full_url}: {exc.code}") from exc


@dataclass(frozen=True)
class GCSBucket:
    """A fresh bucket on the emulator and the variables that point Google's client at it."""

    endpoint: str
    name: str
    env: dict[str, str] = field(repr=False)

    @property
    def url(self) -> str:
        return f"gs://{self.name}"


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
