"""A block blob upload to Azure that survives the death of its process: a push killed (or cut
off) in the middle of a large object sends, when run again, only the blocks the container
lacks.

The blob goes up in blocks of the backend's part size, each staged (Put Block, with its
Content-MD5, which the service checks) under a block id of our own: the upload's nonce, the
block's index and the MD5 of its bytes. The nonce goes into the transfer journal
(mgit.remotes.journal) with the file's size and mtime before the first block goes. A re-run
with the same file asks the service which uncommitted blocks the blob has (Get Block List),
keeps those whose id and size are the ones the file's own bytes give, stages the rest, and
commits the list (Put Block List); an entry whose file changed is dropped (its blocks are
left for Azure, which discards uncommitted blocks after a week or at the blob's next commit),
and so are blocks the service no longer holds: they are sent again. The committed blob is
checked: its size, and its committed block list against the ids sent (each vouching for the
MD5 of its block). The journal entry goes last.

Why azure-storage-blob beside obstore: obstore keeps its block ids to itself and stages a
multipart upload only within one call; Microsoft's SDK exposes Put Block, Get Block List and
Put Block List. Credentials are those the az:// backend takes (objectstore.azure_credentials:
a connection string, an account key or a SAS); without a key or SAS, Azure's identity chain
(DefaultAzureCredential) if azure-identity is installed, else the upload goes whole through
obstore, unresumed.
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mgit.errors import MissingKeyError, RemoteAuthError, RemoteError, RemoteUnavailableError
from mgit.remotes.journal import UPLOADS
from mgit.util.faults import crash_point

CONNECT_TIMEOUT, READ_TIMEOUT = 10, 60  # seconds
MAX_BLOCKS = 50_000  # Azure's limit per blob


def block_id(nonce: str, index: int, data: bytes) -> str:
    """The id of block `index` of an upload: the same length for every block (Azure wants it)."""
    md5 = hashlib.md5(data, usedforsecurity=False).hexdigest()
    return base64.b64encode(f"{nonce}-{index:05d}-{md5}".encode()).decode()


class BlockUpload:
    """One file to one key of an az:// backend through journalled staged blocks. `container`
    is an azure-storage-blob ContainerClient; `blocks_sent` and `bytes_sent` count what this
    run sent (not what an earlier run did)."""

    def __init__(self, backend: Any, container: Any, blob_name: str, key: str) -> None:
        self.backend, self.key = backend, key
        self.url, self.journal = backend.url, backend.journal
        self.blob = container.get_blob_client(blob_name)
        self.blocks_sent = self.bytes_sent = 0

    def run(self, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        stat = path.stat()
        size = stat.st_size
        part_size = max(self.backend.part_size, -(-size // MAX_BLOCKS))
        count = max(1, -(-size // part_size))
        ident = {"size": size, "mtime_ns": stat.st_mtime_ns, "part_size": part_size, "file": str(path)}
        entry = self.journal.load(UPLOADS, self.url, self.key)
        held: dict[str, int] = {}
        if entry is not None and all(entry.get(k) == v for k, v in ident.items()) and _nonce(entry.get("nonce")):
            nonce = str(entry["nonce"])
            held = self._uncommitted()
        else:  # none, or of a file that changed: its blocks are of no use
            nonce = secrets.token_hex(4)
            self.journal.drop(UPLOADS, self.url, self.key)
            self.journal.save(UPLOADS, self.url, self.key, {**ident, "nonce": nonce, "blocks": "azure"})
        ids: list[str | None] = [None] * count
        with open(path, "rb") as fh:
            kept = 0
            for index in range(count):
                length = min(part_size, size - index * part_size)
                if held:  # (the file is read only when there are blocks to compare with)
                    bid = block_id(nonce, index, os.pread(fh.fileno(), length, index * part_size))
                    if held.get(bid) == length:
                        ids[index], kept = bid, kept + length
            if progress and kept:
                progress(kept)

            def stage(index: int) -> None:
                start = index * part_size
                data = os.pread(fh.fileno(), min(part_size, size - start), start)
                bid = block_id(nonce, index, data)
                with self._translated():
                    self.blob.stage_block(bid, data, length=len(data), validate_content=True, **_timeouts())
                ids[index] = bid
                self.blocks_sent += 1
                self.bytes_sent += len(data)
                if progress:
                    progress(len(data))
                crash_point("upload-part-sent")

            missing = [i for i in range(count) if ids[i] is None]
            workers = max(1, min(self.backend.max_workers, len(missing)))
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mgit-block") as pool:
                for done in [pool.submit(stage, i) for i in missing]:
                    done.result()
        committed = [str(i) for i in ids]
        with self._translated():
            self.blob.commit_block_list(committed, **_timeouts())
        self._check(size, committed)
        self.journal.drop(UPLOADS, self.url, self.key)

    def _uncommitted(self) -> dict[str, int]:
        """{block id: size} of the blob's uncommitted blocks (none if the service knows none)."""
        try:
            with self._translated():
                _, uncommitted = self.blob.get_block_list("uncommitted", **_timeouts())
        except MissingKeyError:  # no blob and no block: expired, or committed over meanwhile
            return {}
        return {str(b.id): int(b.size) for b in uncommitted if isinstance(b.size, int)}

    def _check(self, size: int, ids: list[str]) -> None:
        """The committed blob: of the file's size, made of the blocks sent, in their order."""
        with self._translated():
            said = self.blob.get_blob_properties(**_timeouts()).size
            committed, _ = self.blob.get_block_list("committed", **_timeouts())
        if said != size or [str(b.id) for b in committed] != ids:
            with self._translated():  # never left where a re-run would take it for whole
                self.blob.delete_blob(**_timeouts())
            raise RemoteError(
                f"{self.url}: {self.key} is not what was sent after its blocks were committed "
                f"({said} bytes in {len(committed)} blocks; sent {size} bytes in {len(ids)})",
                hint="Run the push again: the object is sent anew",
            )

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """What azure-storage-blob raises, as MGit's remote errors: one line each."""
        from azure.core import exceptions as azure_errors

        try:
            yield
        except azure_errors.ResourceNotFoundError as exc:
            if "ContainerNotFound" in str(exc):
                raise self.backend._no_container() from exc
            raise MissingKeyError(self.url, self.key) from exc
        except azure_errors.ClientAuthenticationError as exc:
            raise RemoteAuthError(self.url, f"access refused ({_line(exc)})", hint=self.backend.hint) from exc
        except (azure_errors.ServiceRequestError, azure_errors.ServiceResponseError) as exc:
            raise RemoteUnavailableError(self.url, _line(exc)) from exc
        except azure_errors.HttpResponseError as exc:
            if exc.status_code is not None and (exc.status_code >= 500 or exc.status_code == 429):
                raise RemoteUnavailableError(self.url, _line(exc)) from exc
            raise RemoteError(f"{self.url}: {_line(exc)}") from exc


def container_client(container: str, config: dict[str, str], *, retries: int) -> Any | None:
    """An azure-storage-blob ContainerClient for `container` with the credentials `config`
    names (objectstore.azure_credentials), or None where no resumable upload can go: the SDK is
    not installed, or only an identity chain would serve and azure-identity is not."""
    try:
        from azure.storage.blob import ContainerClient
    except ImportError:
        return None
    account = config.get("account_name")
    endpoint = config.get("endpoint") or (f"https://{account}.blob.core.windows.net" if account else None)
    if endpoint is None:
        return None
    credential: Any
    if config.get("account_key") and account:
        credential = {"account_name": account, "account_key": config["account_key"]}
    elif config.get("sas_key"):
        credential = config["sas_key"].lstrip("?")
    else:
        try:
            from azure.identity import DefaultAzureCredential
        except ImportError:
            return None
        credential = DefaultAzureCredential()
    return ContainerClient(
        endpoint,
        container,
        credential=credential,
        connection_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        retry_total=retries,
    )


def write_journalled(backend: Any, key: str, path: Path, progress: Callable[[int], None] | None) -> bool:
    """ObjectStoreBackend.write_file of a large file to Azure through the backend's journal,
    resuming a killed push's blocks; False when that cannot be (no SDK client, or another
    process of this repository sends that key): the caller then sends it whole."""
    name, prefix, config = backend.azure_config
    container = container_client(name, config, retries=backend.retries)
    if container is None:
        return False
    with container, backend.journal.claim(UPLOADS, backend.url, key) as mine:
        if not mine:
            return False
        BlockUpload(backend, container, f"{prefix}/{key}" if prefix else key, key).run(path, progress=progress)
    return True


def forget_unneeded(backend: Any, keys: set[str]) -> int:
    """ObjectStoreBackend.abort_unfinished on Azure: drop the journal's entries no push needs any
    more (stale, or of an object now whole). Their blocks need no abort: Azure discards
    uncommitted blocks after a week, and bills them until then."""
    if backend.journal is None:
        return 0
    return len(backend.journal.sort_uploads(backend.url, keys, backend.exists)[1])


def _nonce(value: object) -> bool:
    return isinstance(value, str) and len(value) == 8 and all(c in "0123456789abcdef" for c in value)


def _timeouts() -> dict[str, Any]:
    return {"timeout": READ_TIMEOUT}


def _line(what: object) -> str:
    """The first line of a message, short, with any URL's query (a SAS signature) cut."""
    import re

    line = (str(what).strip().splitlines() or [""])[0]
    return re.sub(r"(https?://[^\s?]+)\?\S*", r"\1?…", line)[:300]
