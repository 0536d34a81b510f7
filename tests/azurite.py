"""Azurite, Microsoft's Azure Storage emulator (npm), as a real server process for tests of
az:// remotes: only its blob service, in memory, on 127.0.0.1 and a free port, telemetry off.

    AzuriteServer()                 `azurite-blob` as a child process (stopped by its pid)
    azurite_server                  session fixture: one server per pytest worker
    azure_container                 function fixture: a fresh container and the environment
                                    (AZURE_STORAGE_CONNECTION_STRING) that names it
    OnAzure                         mixin for a contract class: its `url` (a fresh remote,
                                    azure_container.remote()) and `env` fixtures on Azurite

`make venv` installs Azurite with `npm install --prefix .venv/node azurite`; it is looked for
there (beside this checkout's or the running interpreter's venv), then as MGIT_AZURITE, then
on PATH. Without node or Azurite the tests that need it are skipped, saying why.

Credentials are Azurite's well-known development account (`devstoreaccount1` and its
published key), and only here: MGit itself reads them from Azure's standard variables.

Conditional writes in Azurite 3.37 (checked by test_remote_backends.py): Put Blob honours
`If-None-Match: *` (409 BlobAlreadyExists) and `If-Match: <etag>` (412, also on a missing
blob); a GET If-Match a stale ETag is 412. Put Block List (the large blobs obstore sends in
blocks) commits atomically.
"""

from __future__ import annotations

import base64
import contextlib
import email.utils
import hashlib
import hmac
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from s3server import HOST, EmulatedBucket, OnRemote, ServerProcess

ACCOUNT = "devstoreaccount1"
# Azurite's published development key (the same in every install; not a secret).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
API_VERSION = "2021-08-06"
AZURE_VARIABLES = (
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_ACCESS_KEY",
    "AZURE_STORAGE_USE_EMULATOR",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
    "AZURE_FEDERATED_TOKEN_FILE",
    "AZURE_USE_AZURE_CLI",
)


def azurite_binary() -> str | None:
    """The `azurite-blob` script to run, or None when node or Azurite is not installed."""
    if not shutil.which("node"):
        return None
    here = Path(__file__).resolve().parent.parent
    for candidate in (
        os.environ.get("MGIT_AZURITE"),
        here / ".venv" / "node" / "node_modules" / ".bin" / "azurite-blob",
        Path(sys.prefix) / "node" / "node_modules" / ".bin" / "azurite-blob",
        shutil.which("azurite-blob"),
    ):
        if candidate and Path(candidate).is_file():
            return str(candidate)
    return None


requires_azurite = pytest.mark.skipif(
    azurite_binary() is None,
    reason="needs node and Azurite (make venv runs: npm install --prefix .venv/node azurite)",
)


def connection_string(endpoint: str) -> str:
    return f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={endpoint};"


def azure_env(endpoint: str) -> dict[str, str]:
    """The variables that point Azure's standard chain at the emulator's account."""
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY", ""), HOST, "localhost") if p)
    return {"AZURE_STORAGE_CONNECTION_STRING": connection_string(endpoint), "NO_PROXY": no_proxy, "no_proxy": no_proxy}


class AzuriteServer(ServerProcess):
    """`azurite-blob` in a child process on 127.0.0.1 and a free port, in memory."""

    label = "Azurite"
    cwd = tempfile.gettempdir()

    def __init__(self, *, startup_timeout: float = 30.0, attempts: int = 3, memory_mb: int = 2048) -> None:
        binary = azurite_binary()
        if binary is None:
            raise RuntimeError("Azurite is not installed (npm install --prefix .venv/node azurite)")
        self._binary, self._memory_mb = binary, memory_mb
        super().__init__(startup_timeout=startup_timeout, attempts=attempts)

    def command(self, port: int) -> list[str]:
        memory = ["--extentMemoryLimit", str(self._memory_mb)]
        flags = ["--inMemoryPersistence", "--disableTelemetry", "--skipApiVersionCheck", "--silent"]
        return [self._binary, "--blobHost", HOST, "--blobPort", str(port), *memory, *flags]

    def endpoint_of(self, port: int) -> str:
        return f"http://{HOST}:{port}/{ACCOUNT}"

    def ready(self, port: int) -> bytes:
        return f"listens on http://{HOST}:{port}".encode()

    def container(self, name: str, method: str = "PUT") -> None:
        """Create (PUT) or delete (DELETE) a container, signed with the account's key."""
        date = email.utils.formatdate(usegmt=True)
        headers = {"x-ms-date": date, "x-ms-version": API_VERSION}
        canonical = "".join(f"{k}:{v}\n" for k, v in sorted(headers.items()))
        to_sign = f"{method}\n" + "\n" * 11 + canonical + f"/{ACCOUNT}/{ACCOUNT}/{name}\nrestype:container"
        digest = hmac.new(base64.b64decode(KEY), to_sign.encode(), hashlib.sha256).digest()
        headers["Authorization"] = f"SharedKey {ACCOUNT}:{base64.b64encode(digest).decode()}"
        headers["Content-Length"] = "0"
        _open(urllib.request.Request(f"{self.endpoint}/{name}?restype=container", method=method, headers=headers))

    def new_container(self) -> str:
        name = f"mgit-test-{uuid.uuid4().hex[:16]}"
        self.container(name)
        return name


def _open(request: urllib.request.Request) -> None:
    urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=10).close()


@dataclass(frozen=True)
class AzureContainer(EmulatedBucket):
    """A fresh container on the emulator and the variables that point Azure's chain at it."""

    scheme = "az"


class OnAzure(OnRemote):
    """`url`: a fresh remote under az://<fresh container>/team/models; `env`: for child processes."""

    @pytest.fixture
    def url(self, azure_container: AzureContainer) -> str:
        return azure_container.remote(packs=self.packs)

    @pytest.fixture
    def env(self, azure_container: AzureContainer) -> dict[str, str]:
        return azure_container.child_env()


@pytest.fixture(scope="session")
def azurite_server() -> Iterator[AzuriteServer]:
    """One Azurite per pytest session (so one per xdist worker)."""
    with AzuriteServer() as server:
        yield server


@pytest.fixture
def azure_container(azurite_server: AzuriteServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[AzureContainer]:
    """A fresh container, with this test's Azure environment naming the emulator's account."""
    container = AzureContainer(
        azurite_server.endpoint, azurite_server.new_container(), azure_env(azurite_server.endpoint)
    )
    for name in AZURE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in container.env.items():
        monkeypatch.setenv(name, value)
    yield container
    with contextlib.suppress(Exception):  # cleanup only: keeps the in-memory server small
        azurite_server.container(container.name, "DELETE")
