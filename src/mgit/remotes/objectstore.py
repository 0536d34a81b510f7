"""A remote in a cloud object store through obstore (the Python binding of Rust's
`object_store`): `az://container/prefix` on Azure Blob Storage, and, for the benchmark that
weighs it against boto3, `s3://bucket/prefix`. The keys of `Backend` are blobs under
`prefix/`; compare-and-swap is the store's conditional put (Azure: `If-None-Match: *` to
create, `If-Match: <ETag>` to replace; 409 or 412 refuse).

Credentials come from each cloud's standard chain only, never from a URL or the repository:
for Azure, `AZURE_STORAGE_CONNECTION_STRING`, or `AZURE_STORAGE_ACCOUNT` with
`AZURE_STORAGE_KEY` or `AZURE_STORAGE_SAS_TOKEN`, or what obstore itself reads
(`AZURE_STORAGE_ACCOUNT_NAME`, `AZURE_CLIENT_ID`/`AZURE_CLIENT_SECRET`/`AZURE_TENANT_ID`,
workload and managed identity, `AZURE_USE_AZURE_CLI`). A remote's `endpoint_url` (an
emulator, a sovereign cloud) is the blob endpoint, `http(s)://HOST[:PORT]/ACCOUNT` or
`https://ACCOUNT.blob.core.windows.net`.

Nothing a store says is trusted: a size is checked against the caller's limit before a body
is read, at most limit + 1 bytes are read, and a download that comes short or whose object
changes on the way (every ranged GET is If-Match the ETag first seen) leaves no file behind.
Every client has a connect timeout, a stall timeout on each read and a bound on the whole
request; retries (obstore's, with jittered backoff on 5xx and dropped connections) are
bounded in count and time, as listings are in pages.

A large file pushed to Azure with the repository's transfer journal goes up in staged blocks
that a killed push's re-run takes up (mgit.remotes.azureblocks, through azure-storage-blob);
MGIT_REMOTE_PART_SIZE sets the part size.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import urlsplit

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
from mgit.remotes import AZURE_CONTAINER_RE, azureblocks
from mgit.remotes.base import Backend, KeyInfo, check_key, listed
from mgit.remotes.journal import part_size_from_env
from mgit.util.atomicfile import disk_full_as_error

try:
    import obstore
    from obstore import exceptions as obstore_errors
except ImportError as exc:  # obstore is the optional extra mgit-models[azure]
    raise MissingDependencyError("obstore", "An Azure remote", "azure") from exc

MiB = 1 << 20
PART = 16 * MiB  # from here on, files go up in blocks and come down in parallel ranges
WORKERS = 16
CHUNK = 1 * MiB  # a body is read (and its limit checked) a chunk at a time
RETRIES = 4  # per request, with obstore's jittered exponential backoff (MGIT_REMOTE_RETRIES overrides)
CONNECT_TIMEOUT, STALL_TIMEOUT = timedelta(seconds=10), timedelta(seconds=60)
REQUEST_TIMEOUT = timedelta(minutes=30)  # a whole request, body included: one part, one small key
RETRY_TIMEOUT = timedelta(minutes=2)
MAX_LIST_PAGES = 100_000
LIST_PAGE = 1000
AZURE_HINT = (
    "Credentials come from the standard Azure chain: AZURE_STORAGE_CONNECTION_STRING, "
    "AZURE_STORAGE_ACCOUNT with AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, a service principal "
    "(AZURE_CLIENT_ID, AZURE_CLIENT_SECRET, AZURE_TENANT_ID) or a managed identity"
)
AWS_HINT = "Credentials come from the standard AWS chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"


def retries_from_env() -> int:
    """Retries per request: MGIT_REMOTE_RETRIES (0 fails at once, as tests of failure want)."""
    raw = os.environ.get("MGIT_REMOTE_RETRIES", str(RETRIES))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3) or int(raw) > 100:
        raise InvalidOptionError(f"MGIT_REMOTE_RETRIES={raw!r} is not a number of retries", hint="Use 0 to 100")
    return int(raw)


def client_options(endpoint_url: str | None) -> dict[str, Any]:
    """Timeouts on every request; plain http only towards an endpoint named so (an emulator)."""
    return {
        "connect_timeout": CONNECT_TIMEOUT,
        "read_timeout": STALL_TIMEOUT,
        "timeout": REQUEST_TIMEOUT,
        "allow_http": bool(endpoint_url and endpoint_url.startswith("http://")),
    }


def azure_credentials(endpoint_url: str | None) -> dict[str, str]:
    """The account, key or SAS and endpoint that Azure's own variables name (those obstore
    reads by itself, AZURE_STORAGE_ACCOUNT_NAME and the identity flows, it reads itself)."""
    found: dict[str, str] = {}
    if connection := os.environ.get("AZURE_STORAGE_CONNECTION_STRING"):
        fields = dict(p.split("=", 1) for p in connection.split(";") if "=" in p)
        for field, name in (
            ("AccountName", "account_name"),
            ("AccountKey", "account_key"),
            ("BlobEndpoint", "endpoint"),
        ):
            if fields.get(field):
                found[name] = fields[field].rstrip("/")
        if fields.get("SharedAccessSignature"):
            found["sas_key"] = fields["SharedAccessSignature"]
    for variable, name in (
        ("AZURE_STORAGE_ACCOUNT", "account_name"),
        ("AZURE_STORAGE_KEY", "account_key"),
        ("AZURE_STORAGE_SAS_TOKEN", "sas_key"),
    ):
        if os.environ.get(variable) and name not in found:
            found[name] = os.environ[variable]
    if endpoint_url:
        found["endpoint"] = endpoint_url.rstrip("/")
        host = urlsplit(endpoint_url).hostname or ""
        if "account_name" not in found and host.endswith(".blob.core.windows.net"):
            found["account_name"] = host.split(".", 1)[0]
        elif "account_name" not in found and (path := urlsplit(endpoint_url).path.strip("/")):
            found["account_name"] = path.split("/")[0]  # an emulator's http://HOST:PORT/ACCOUNT
    return found


def check_endpoint(endpoint_url: str | None) -> None:
    if endpoint_url and (urlsplit(endpoint_url).scheme not in ("http", "https") or "@" in endpoint_url):
        raise InvalidOptionError("an endpoint is http(s)://HOST[:PORT][/PATH], without credentials")


class ObjectStoreBackend(Backend):
    """Keys under a prefix of one container (or bucket), through one obstore store that every
    thread shares. `azure(url, ...)` and `s3(url, ...)` build one from a remote's URL."""

    def __init__(self, url: str, store: Any, *, container: str, hint: str, max_workers: int = WORKERS) -> None:
        self.url = url
        self.store = store
        self.container = container
        self.hint = hint
        self.max_workers = max_workers
        self.part_size = part_size_from_env(PART)  # MGIT_REMOTE_PART_SIZE
        # From there, a fetch resumes by ranges (mgit.remotes.partial), and a push to Azure
        # inside the blob's staged blocks (mgit.remotes.azureblocks).
        self.ranged_from = 2 * self.part_size
        self.retries = retries_from_env()
        # Azure's (container, prefix, credentials) for azure-storage-blob; None elsewhere.
        self.azure_config: tuple[str, str, dict[str, str]] | None = None

    @classmethod
    def azure(cls, url: str, *, endpoint_url: str | None = None, max_workers: int = WORKERS) -> ObjectStoreBackend:
        from obstore.store import AzureStore

        parts = urlsplit(url)
        if parts.scheme != "az" or not AZURE_CONTAINER_RE.match(parts.netloc or ""):
            raise InvalidOptionError(f"{url!r} does not name an Azure container", hint="Use az://CONTAINER/PREFIX")
        check_endpoint(endpoint_url)
        config = azure_credentials(endpoint_url)
        store = AzureStore(
            parts.netloc,
            prefix=parts.path.strip("/") or None,
            client_options=client_options(config.get("endpoint")),
            retry_config=_retries(),
            **config,  # type: ignore[arg-type]
        )
        backend = cls(url, store, container=parts.netloc, hint=AZURE_HINT, max_workers=max_workers)
        backend.azure_config = (parts.netloc, parts.path.strip("/"), config)
        return backend

    @classmethod
    def s3(
        cls, url: str, *, endpoint_url: str | None = None, region: str | None = None, max_workers: int = WORKERS
    ) -> ObjectStoreBackend:
        """An S3 remote through obstore (the benchmark's alternative to the boto3 backend);
        the endpoint and region default to AWS_ENDPOINT_URL and AWS_DEFAULT_REGION."""
        from obstore.store import S3Store

        parts = urlsplit(url)
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        check_endpoint(endpoint)
        config: dict[str, Any] = {"conditional_put": "etag"}
        if endpoint:
            config |= {"endpoint": endpoint, "virtual_hosted_style_request": False}
        if region or os.environ.get("AWS_DEFAULT_REGION"):
            config["region"] = region or os.environ["AWS_DEFAULT_REGION"]
        store = S3Store(
            parts.netloc,
            prefix=parts.path.strip("/") or None,
            client_options=client_options(endpoint),
            retry_config=_retries(),
            **config,
        )
        return cls(url, store, container=parts.netloc, hint=AWS_HINT, max_workers=max_workers)

    # --- errors ---------------------------------------------------------------------------------

    @contextmanager
    def _translated(self, key: str | None = None, *, conditional: bool = False) -> Iterator[None]:
        """What obstore raises, as MGit's remote errors: one line each, never a secret."""
        try:
            yield
        except (obstore_errors.AlreadyExistsError, obstore_errors.PreconditionError) as exc:
            if conditional:
                raise RemoteConflictError(self.url, str(key)) from exc
            raise RemoteError(f"{self.url}: {_line(exc)}") from exc
        except FileNotFoundError as exc:  # obstore's NotFoundError is one
            if _container_missing(exc):
                raise self._no_container() from exc
            if conditional:  # (a replace of a key that is gone)
                raise RemoteConflictError(self.url, str(key)) from exc
            raise MissingKeyError(self.url, str(key)) from exc
        except (obstore_errors.PermissionDeniedError, obstore_errors.UnauthenticatedError) as exc:
            raise RemoteAuthError(self.url, f"access refused ({_line(exc)})", hint=self.hint) from exc
        except obstore_errors.BaseError as exc:
            raise self._error(exc) from exc

    def _error(self, exc: Exception) -> RemoteError:
        said = _line(exc)
        if _container_missing(exc):
            return self._no_container()
        if "credential" in said.lower() or "token request" in said.lower():
            return RemoteAuthError(self.url, said, hint=self.hint)
        if re.search(r"status code: (401|403)\b", str(exc)):
            return RemoteAuthError(self.url, f"access refused ({said})", hint=self.hint)
        if "retries" in said or re.search(r"status code: 5\d\d|connect|timed out|timeout", str(exc), re.I):
            return RemoteUnavailableError(self.url, said)
        return RemoteError(f"{self.url}: {said}")

    def _no_container(self) -> RemoteNotFoundError:
        return RemoteNotFoundError(
            f"container {self.container!r} of {self.url} does not exist",
            hint="MGit never creates containers or buckets: create it with your cloud's tools, or check "
            "the URL and the endpoint",
        )

    # --- the contract ---------------------------------------------------------------------------

    def check(self) -> None:
        with self._translated():
            next(iter(obstore.list(self.store, chunk_size=1)), None)

    def _get(self, key: str, limit: int, **options: Any) -> Any:
        """A GET whose announced size is checked before any of its body is read."""
        with self._translated(key, conditional="if_match" in options):
            got = obstore.get(self.store, check_key(key), options=options or None)
        size = got.meta["size"]
        if size > limit:
            raise RemoteTooLargeError(self.url, key, size, limit)
        return got

    def _copy(self, got: Any, key: str, sink: BinaryIO, limit: int) -> int:
        copied = 0
        with self._translated(key):
            for chunk in got.stream(min_chunk_size=CHUNK):
                copied += len(chunk)
                if copied > limit:  # it said less than it sent
                    raise RemoteTooLargeError(self.url, key, copied, limit)
                sink.write(memoryview(chunk))
        return copied

    def read(self, key: str, *, limit: int) -> bytes:
        return self._read(key, limit)[0]

    def _read(self, key: str, limit: int) -> tuple[bytes, str | None]:
        got = self._get(key, limit)
        sink = io.BytesIO()
        copied = self._copy(got, key, sink, limit)
        if copied != got.meta["size"]:
            raise RemoteUnavailableError(self.url, f"reading {key}: {copied} of {got.meta['size']} bytes arrived")
        return sink.getvalue(), got.meta.get("e_tag")

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length <= 0:
            raise RemoteError(f"{self.url}: no range {start}+{length} of {key}")
        with self._translated(key):
            data = obstore.get(self.store, check_key(key), options={"range": (start, start + length)}).bytes()
        if len(data) != length:
            raise RemoteError(f"{key} on {self.url} answered {len(data)} bytes for a range of {length}")
        return bytes(data)

    def read_into(self, key: str, path: Path, *, limit: int) -> int:
        with self._translated(key):
            head = obstore.head(self.store, check_key(key))
        size, etag = head["size"], head.get("e_tag")
        if size > limit:
            raise RemoteTooLargeError(self.url, key, size, limit)
        with disk_full_as_error(path), open(path, "xb") as fh:  # an existing file is refused, and kept
            try:
                condition = {"if_match": etag} if etag else {}
                if size < self.part_size or not etag:
                    written = self._copy(self._get(key, limit, **condition), key, fh, limit)
                else:
                    self._download(key, fh, size, etag)
                    written = size
                fh.flush()
                if os.fstat(fh.fileno()).st_size != size or written != size:
                    raise RemoteUnavailableError(self.url, f"reading {key}: {written} of {size} bytes arrived")
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        return size

    def _download(self, key: str, fh: BinaryIO, size: int, etag: str) -> None:
        """Parallel ranged GETs, each If-Match the ETag: parts of two versions never mix."""
        fd = fh.fileno()

        def part(start: int) -> None:
            end = min(start + self.part_size, size)
            with self._translated(key, conditional=True):
                got = obstore.get(self.store, key, options={"range": (start, end), "if_match": etag})
                data = got.bytes()
            if len(data) != end - start:
                raise RemoteUnavailableError(self.url, f"reading {key}: a part of {len(data)} of {end - start} bytes")
            os.pwrite(fd, memoryview(data), start)

        with ThreadPoolExecutor(min(self.max_workers, -(-size // self.part_size))) as pool:
            for done in [pool.submit(part, start) for start in range(0, size, self.part_size)]:
                done.result()

    def write(self, key: str, data: bytes | Path) -> None:
        with self._translated(key):
            obstore.put(
                self.store,
                check_key(key),
                data,
                chunk_size=self.part_size,
                max_concurrency=self.max_workers,
                use_multipart=isinstance(data, Path) and data.stat().st_size >= self.part_size,
            )

    def write_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        large = self.journal is not None and self.azure_config and path.stat().st_size >= self.ranged_from
        if not (large and azureblocks.write_journalled(self, key, path, progress)):
            super().write_file(key, path, progress=progress)

    def abort_unfinished(self, keys: Iterable[str]) -> int:
        return azureblocks.forget_unneeded(self, set(keys)) if self.azure_config else 0

    def size(self, key: str) -> int | None:
        try:
            with self._translated(key):
                return int(obstore.head(self.store, check_key(key))["size"])
        except MissingKeyError:
            return None

    def _listing(self, prefix: str) -> list[dict[str, Any]]:
        """obstore's entries of the keys under `prefix` (a key `list` would not show left out),
        sorted. It lists whole path segments: the folder is asked for, what starts with `prefix` kept."""
        folder = prefix.rpartition("/")[0]
        if folder:
            check_key(folder)
        keys: list[dict[str, Any]] = []
        with self._translated():
            for number, page in enumerate(obstore.list(self.store, folder or None, chunk_size=LIST_PAGE)):
                if number >= MAX_LIST_PAGES:
                    raise RemoteError(f"{self.url}: listing {prefix!r} did not end after {number} pages")
                keys += [m for m in page if m["path"].startswith(prefix) and listed(m["path"])]
        return sorted(keys, key=lambda m: m["path"])

    def list_info(self, prefix: str) -> Iterator[KeyInfo]:
        for m in self._listing(prefix):
            yield KeyInfo(m["path"], int(m["size"]), m["last_modified"].timestamp())

    def list_tokens(self, prefix: str) -> dict[str, tuple[str, str | None]]:
        # (Azure's listing, through obstore, carries no MD5 of a blob's bytes: tokens only.)
        return {m["path"]: (_quoted(m["e_tag"]), None) for m in self._listing(prefix) if m.get("e_tag")}

    def delete(self, key: str) -> None:
        try:
            with self._translated(key):
                obstore.delete(self.store, check_key(key))
        except MissingKeyError:
            pass

    def read_versioned(self, key: str, *, limit: int) -> tuple[bytes | None, str | None]:
        try:
            return self._read(key, limit)
        except MissingKeyError:
            return None, None

    def write_if(self, key: str, data: bytes, *, token: str | None) -> str | None:
        mode: Any = "create" if token is None else {"e_tag": token}
        with self._translated(key, conditional=True):
            done = obstore.put(self.store, check_key(key), data, mode=mode, use_multipart=False)
        return _quoted(done["e_tag"]) if done.get("e_tag") else None


def _quoted(etag: str) -> str:
    """An ETag as a GET's answer gives it, quoted (a listing gives Azure's bare)."""
    return etag if etag.startswith(('"', 'W/"')) else f'"{etag}"'


def _retries() -> dict[str, Any]:
    return {"max_retries": retries_from_env(), "retry_timeout": RETRY_TIMEOUT}


def _line(what: object) -> str:
    """The first line of a message, short, with any URL's query (a SAS signature) cut."""
    line = (str(what).strip().splitlines() or [""])[0]
    return re.sub(r"(https?://[^\s?]+)\?\S*", r"\1?…", line)[:300]


def _container_missing(exc: Exception) -> bool:
    return any(code in str(exc) for code in ("ContainerNotFound", "NoSuchBucket"))
