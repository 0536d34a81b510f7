"""A remote in a Google Cloud Storage bucket (`gs://bucket/prefix`): the keys of `Backend` are
objects under `prefix/`; compare-and-swap is GCS's generation precondition
(`ifGenerationMatch=0` to create, `ifGenerationMatch=<generation>` to replace; 412 refuses),
and a key's token is its generation.

Why google-cloud-storage and not obstore (which serves az://): obstore's GCS client speaks
GCS's XML API, and the GCS emulator the tests run (gcp-storage-emulator) serves the JSON API
only (its XML side has no HEAD, no listing, no ETag or Last-Modified headers, no multipart):
with obstore, nothing of a gs:// remote could be tested against a real server process. Google's
own client speaks the JSON API, takes credentials from Application Default Credentials
(GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`, the metadata
server, workload identity federation) and goes to an emulator named by STORAGE_EMULATOR_HOST,
the variable of every Google client library. A remote's `endpoint_url` (a private endpoint)
is the JSON API's root.

Nothing a bucket says is trusted: a size is checked against the caller's limit before a body
is read, files come down in ranges of at most `part_size` bytes each checked for its length,
every GET is conditional on the generation first seen (a key that changes on the way is a
conflict, and leaves no file behind). Every request has a connect and a read timeout, and
retries (Google's policy: 408, 429, 5xx and dropped connections, jittered backoff from
MGIT_REMOTE_RETRY_DELAY seconds) stop after MGIT_REMOTE_RETRY_SECONDS; listings are bounded in pages.

A large file pushed with the repository's transfer journal goes through a resumable upload
session that a killed push's re-run takes up where the bucket's bytes end
(mgit.remotes.gcsresumable); MGIT_REMOTE_PART_SIZE sets the part size.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
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
from mgit.remotes import gcsresumable
from mgit.remotes.base import Backend, KeyInfo, check_key, listed
from mgit.remotes.journal import part_size_from_env
from mgit.util.atomicfile import disk_full_as_error

try:
    import google.auth
    import google.auth.exceptions as auth_errors
    import google.auth.transport.requests
    import requests
    import requests.adapters
    import requests.exceptions as http_errors
    from google.api_core import exceptions as api_errors
    from google.cloud import storage
    from google.cloud.storage.retry import DEFAULT_RETRY
except ImportError as exc:  # google-cloud-storage is the optional extra mgit-models[gcs]
    raise MissingDependencyError("google-cloud-storage", "A Google Cloud Storage remote", "gcs") from exc

MiB = 1 << 20
PART = 16 * MiB  # files come down in ranges of this size, in parallel; uploads are resumable in parts
WORKERS = 16
TIMEOUT = (10, 60)  # seconds: connect, and each read of a response
RETRY_SECONDS = 120.0  # a request is retried until this many seconds have passed (MGIT_REMOTE_RETRY_SECONDS)
RETRY_DELAY = 1.0  # seconds before the first retry, then twice as long each time up to 60 (MGIT_REMOTE_RETRY_DELAY)
MAX_LIST_PAGES = 100_000
LIST_PAGE = 1000
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
GCS_HINT = (
    "Credentials come from Google's Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, "
    "gcloud auth application-default login, or the metadata server"
)


def retry_seconds_from_env(name: str = "MGIT_REMOTE_RETRY_SECONDS", default: float = RETRY_SECONDS) -> float:
    """Seconds from the variable `name` (0 to 3600), or `default`."""
    raw = os.environ.get(name, str(default))
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise InvalidOptionError(f"{name}={raw!r} is not a number of seconds", hint="Use 0 to 3600")
    return value


class GCSBackend(Backend):
    """Keys under `prefix/` in one bucket, through one google-cloud-storage client that every
    thread shares."""

    def __init__(self, url: str, *, endpoint_url: str | None = None, max_workers: int = WORKERS) -> None:
        parts = urlsplit(url)
        if parts.scheme != "gs" or not parts.netloc:
            raise InvalidOptionError(f"{url!r} does not name a GCS bucket", hint="Use gs://BUCKET/PREFIX")
        if endpoint_url and (urlsplit(endpoint_url).scheme not in ("http", "https") or "@" in endpoint_url):
            raise InvalidOptionError("a GCS endpoint is http(s)://HOST[:PORT], without credentials")
        self.url = url
        self.bucket_name = parts.netloc
        self.prefix = parts.path.strip("/") + "/" if parts.path.strip("/") else ""
        self.max_workers = max_workers
        self.part_size = part_size_from_env(PART)  # MGIT_REMOTE_PART_SIZE
        # From there, a fetch resumes by ranges (mgit.remotes.partial) and a push inside its
        # resumable upload session (mgit.remotes.gcsresumable).
        self.ranged_from = 2 * self.part_size
        self.timeout = TIMEOUT
        seconds = retry_seconds_from_env()
        delay = retry_seconds_from_env("MGIT_REMOTE_RETRY_DELAY", RETRY_DELAY)
        self.retry = DEFAULT_RETRY.with_deadline(seconds).with_delay(initial=delay) if seconds else None
        self.client = self._connect(endpoint_url)
        self.bucket = self.client.bucket(self.bucket_name)

    def _connect(self, endpoint_url: str | None) -> Any:
        """A client whose connection pool holds a connection for every worker thread."""
        options = {"api_endpoint": endpoint_url} if endpoint_url else None
        pool = requests.adapters.HTTPAdapter(pool_connections=4, pool_maxsize=self.max_workers + 4)
        if os.environ.get("STORAGE_EMULATOR_HOST"):  # Google's variable: anonymous, to an emulator
            session = requests.Session()
            session.mount("http://", pool)
            session.mount("https://", pool)
            self.http = session  # (a resumable upload's parts go on it: mgit.remotes.gcsresumable)
            return storage.Client(project="mgit", client_options=options, _http=session)
        try:
            credentials, project = google.auth.default(scopes=SCOPES)
        except auth_errors.DefaultCredentialsError:
            raise RemoteAuthError(self.url, "no Google credentials found", hint=GCS_HINT) from None
        session = google.auth.transport.requests.AuthorizedSession(credentials)
        session.mount("https://", pool)
        self.http = session
        return storage.Client(project=project or "_", credentials=credentials, client_options=options, _http=session)

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(self.prefix + check_key(key), chunk_size=self.part_size)

    @contextmanager
    def _translated(self, key: str | None = None, *, conditional: bool = False, bucket: bool = False) -> Iterator[None]:
        """What the client raises, as MGit's remote errors: one line each, never a secret.
        `bucket`: a 404 here can only mean the bucket (a listing, an upload)."""
        try:
            yield
        except api_errors.PreconditionFailed as exc:
            if conditional:
                raise RemoteConflictError(self.url, str(key)) from exc
            raise RemoteError(f"{self.url}: {_line(exc)}") from exc
        except api_errors.NotFound as exc:
            if bucket or key is None:
                raise self._no_bucket() from exc
            raise MissingKeyError(self.url, str(key)) from exc
        except (api_errors.Forbidden, api_errors.Unauthorized) as exc:
            raise RemoteAuthError(self.url, f"access refused ({_line(exc)})", hint=GCS_HINT) from exc
        except auth_errors.GoogleAuthError as exc:
            raise RemoteAuthError(self.url, _line(exc), hint=GCS_HINT) from exc
        except (api_errors.ServerError, api_errors.TooManyRequests, api_errors.RetryError) as exc:
            raise RemoteUnavailableError(self.url, _line(exc)) from exc
        except (http_errors.ConnectionError, http_errors.Timeout, http_errors.ChunkedEncodingError) as exc:
            raise RemoteUnavailableError(self.url, _line(exc)) from exc
        except api_errors.GoogleAPIError as exc:
            raise RemoteError(f"{self.url}: {_line(exc)}") from exc

    def _no_bucket(self) -> RemoteNotFoundError:
        return RemoteNotFoundError(
            f"bucket {self.bucket_name!r} of {self.url} does not exist",
            hint="MGit never creates buckets: create it with your cloud's tools, or check the URL and the endpoint",
        )

    def _pages(self, prefix: str) -> Iterator[Any]:
        return self.client.list_blobs(
            self.bucket_name, prefix=prefix, page_size=LIST_PAGE, timeout=TIMEOUT, retry=self.retry
        ).pages

    def check(self) -> None:
        with self._translated(bucket=True):
            next(iter(self._pages(self.prefix)), None)

    def _meta(self, key: str) -> tuple[int, int] | None:
        """(size, generation) of `key`, or None if there is none."""
        with self._translated(key):
            blob = self.bucket.get_blob(self.prefix + check_key(key), timeout=TIMEOUT, retry=self.retry)
        if blob is None or not isinstance(blob.size, int) or blob.size < 0:
            return None
        return blob.size, int(blob.generation)

    def _range(self, key: str, start: int, end: int, generation: int) -> bytes:
        """Bytes [start, end) of the generation `generation` of `key`, exactly that many."""
        with self._translated(key, conditional=True):
            data = self._blob(key).download_as_bytes(
                start=start, end=end - 1, if_generation_match=generation, timeout=TIMEOUT, retry=self.retry
            )
        if len(data) != end - start:
            raise RemoteUnavailableError(self.url, f"reading {key}: {len(data)} of {end - start} bytes arrived")
        return data

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length <= 0:
            raise RemoteError(f"{self.url}: no range {start}+{length} of {key}")
        with self._translated(key):
            data = self._blob(key).download_as_bytes(
                start=start, end=start + length - 1, timeout=TIMEOUT, retry=self.retry
            )
        if len(data) != length:
            raise RemoteError(f"{key} on {self.url} answered {len(data)} bytes for a range of {length}")
        return data

    def read(self, key: str, *, limit: int) -> bytes:
        data, _ = self.read_versioned(key, limit=limit)
        if data is None:
            raise MissingKeyError(self.url, key)
        return data

    def read_versioned(self, key: str, *, limit: int) -> tuple[bytes | None, str | None]:
        for _ in range(3):  # a key replaced between the look and the read is looked at again
            meta = self._meta(key)
            if meta is None:
                return None, None
            size, generation = meta
            if size > limit:
                raise RemoteTooLargeError(self.url, key, size, limit)
            try:
                parts = [
                    self._range(key, s, min(s + self.part_size, size), generation)
                    for s in range(0, size, self.part_size)
                ]
            except RemoteConflictError:
                continue
            return b"".join(parts), str(generation)
        raise RemoteUnavailableError(self.url, f"reading {key}: it changed at every read")

    def read_into(self, key: str, path: Path, *, limit: int) -> int:
        meta = self._meta(key)
        if meta is None:
            raise MissingKeyError(self.url, key)
        size, generation = meta
        if size > limit:
            raise RemoteTooLargeError(self.url, key, size, limit)
        with disk_full_as_error(path), open(path, "xb") as fh:  # an existing file is refused, and kept
            try:
                fd = fh.fileno()

                def part(start: int) -> None:
                    os.pwrite(fd, self._range(key, start, min(start + self.part_size, size), generation), start)

                starts = range(0, size, self.part_size)
                with ThreadPoolExecutor(max(1, min(self.max_workers, len(starts)))) as pool:
                    for done in [pool.submit(part, s) for s in starts]:
                        done.result()
                if os.fstat(fd).st_size != size:
                    raise RemoteUnavailableError(self.url, f"reading {key}: {os.fstat(fd).st_size} of {size} bytes")
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        return size

    def write(self, key: str, data: bytes | Path) -> None:
        # Objects are named by their content, so a retried upload is harmless: retried always.
        with self._translated(key, bucket=True):
            if isinstance(data, bytes):
                self._blob(key).upload_from_string(data, timeout=TIMEOUT, retry=self.retry)
            else:  # resumable in parts above part_size; the object appears when the last one lands
                self._blob(key).upload_from_filename(str(data), timeout=TIMEOUT, retry=self.retry)

    def write_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        large = self.journal is not None and path.stat().st_size >= self.ranged_from
        if not (large and gcsresumable.write_journalled(self, key, path, progress)):
            super().write_file(key, path, progress=progress)

    def abort_unfinished(self, keys: Iterable[str]) -> int:
        return gcsresumable.forget_unneeded(self, set(keys))

    def size(self, key: str) -> int | None:
        meta = self._meta(key)
        return None if meta is None else meta[0]

    def _listing(self, prefix: str) -> list[Any]:
        """The blobs under `prefix` (a key `list` would not show left out), sorted by key."""
        if top := prefix.rpartition("/")[0]:
            check_key(top)
        blobs: list[Any] = []
        with self._translated(bucket=True):
            for number, page in enumerate(self._pages(self.prefix + prefix)):
                if number >= MAX_LIST_PAGES:
                    raise RemoteError(f"{self.url}: listing {prefix!r} did not end after {number} pages")
                blobs += [b for b in page if b.name.startswith(self.prefix + prefix)]
        return sorted((b for b in blobs if listed(b.name[len(self.prefix) :])), key=lambda b: b.name)

    def list_info(self, prefix: str) -> Iterator[KeyInfo]:
        for b in self._listing(prefix):
            yield KeyInfo(b.name[len(self.prefix) :], int(b.size or 0), b.updated.timestamp() if b.updated else 0.0)

    def list_tokens(self, prefix: str) -> dict[str, tuple[str, str | None]]:
        return {
            b.name[len(self.prefix) :]: (str(b.generation), base64.b64decode(b.md5_hash).hex() if b.md5_hash else None)
            for b in self._listing(prefix)
            if b.generation
        }

    def delete(self, key: str) -> None:
        try:
            with self._translated(key):
                self._blob(key).delete(timeout=TIMEOUT, retry=self.retry)
        except MissingKeyError:
            pass

    def write_if(self, key: str, data: bytes, *, token: str | None) -> str | None:
        if token is not None and not (token.isascii() and token.isdigit()):
            raise RemoteConflictError(self.url, key)  # not a generation of ours: never a match
        blob = self._blob(key)
        with self._translated(key, conditional=True, bucket=True):
            blob.upload_from_string(
                data, if_generation_match=0 if token is None else int(token), timeout=TIMEOUT, retry=self.retry
            )
        return str(blob.generation) if blob.generation else None


def _line(what: object) -> str:
    """The first line of a message, short."""
    return (str(what).strip().splitlines() or [""])[0][:300]
