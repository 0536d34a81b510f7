"""A remote in an S3 bucket (`s3://bucket/prefix`, on AWS or any S3-compatible server): the
keys of `Backend` are objects under `prefix/`; compare-and-swap is S3's conditional PutObject
(`If-None-Match: *` to create, `If-Match: <ETag>` to replace; 412 or 409 refuse).

Why boto3: AWS's maintained SDK, so credentials come from the standard chain (environment,
shared files and profiles, SSO, credential_process, container and instance roles) with no code
of ours; s3transfer's parallel multipart uploads and ranged downloads; botocore's "standard"
retries with backoff on dropped connections, 5xx and SlowDown. obstore (Rust object_store) has
the same conditional puts, but its own credentials stop at environment variables, web identity,
container and instance roles: profiles and SSO would need boto3 anyway, as a Python callback.

Nothing a bucket says is trusted: a size is checked against the caller's limit before a body
is read, at most limit + 1 bytes are read, and a download that comes short or changes on the
way leaves no file behind. An answer without a size (no Content-Length) is read up to the
limit. Every body has a deadline, `MGIT_TRANSFER_GRACE` seconds plus its size at
`MGIT_TRANSFER_MIN_RATE` bytes a second (botocore's timeout bounds each socket read, so a
server sending a byte a second would otherwise hold a clone forever); one that misses it is
fetched again, then reported. A push first aborts the multipart uploads a killed push left
for the keys it sends (billed until then) but those its transfer journal resumes
(mgit.remotes.multipart). MGIT_S3_PART_SIZE: the part size (5 MiB or more; parts from twice it).
"""

from __future__ import annotations

import io
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
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
from mgit.remotes import multipart
from mgit.remotes.base import Backend, KeyInfo, check_key, listed
from mgit.util.atomicfile import disk_full_as_error

try:
    import boto3
    import botocore.exceptions as boto_errors
    import s3transfer.exceptions as transfer_errors
    import urllib3.exceptions as urllib3_errors
    from boto3.s3.transfer import TransferConfig, create_transfer_manager
    from botocore.config import Config
    from s3transfer.subscribers import BaseSubscriber
except ImportError as exc:  # boto3 is the optional extra mgit-models[s3]
    raise MissingDependencyError("boto3", "An S3 remote", "s3") from exc

MiB = 1 << 20
MIN_PART = 5 * MiB  # S3's least part (but the last)
MULTIPART_THRESHOLD = 64 * MiB  # from here on, files go up and come down in parallel parts
PART_SIZE = 16 * MiB  # s3transfer enlarges it to stay under S3's 10,000 parts
ATTEMPTS = 8  # per request, with botocore's jittered exponential backoff; MGIT_S3_ATTEMPTS overrides
CONNECT_TIMEOUT, READ_TIMEOUT = 10, 60  # seconds
GRACE, MIN_RATE = 60.0, 32 * 1024  # a body has GRACE s plus its size at MIN_RATE B/s (MGIT_TRANSFER_*)
CHUNK = 8 * MiB
T = TypeVar("T")
_LOADERS: dict[str, Any] = {}  # one botocore data loader (~0.1 s of JSON a client otherwise)
MAX_LIST_PAGES = 100_000  # 10^8 keys: a listing that never ends comes from a broken server
MD5_ETAG = re.compile(r'^"[0-9a-f]{32}"\Z')
AWS_HOST = re.compile(r"(^|\.)amazonaws\.com(\.cn)?$")
AUTH_CODES = {
    "AccessDenied",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "TokenRefreshRequired",
    "RequestTimeTooSkewed",
    "AllAccessDisabled",
}
BUSY_CODES = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestTimeout",
    "ServiceUnavailable",
    "InternalError",
    "RequestLimitExceeded",
}
CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
CREDENTIAL_ERRORS = (
    boto_errors.PartialCredentialsError,
    boto_errors.CredentialRetrievalError,
    boto_errors.TokenRetrievalError,
    boto_errors.SSOError,
)


def attempts_from_env() -> int:
    """Attempts per request: MGIT_S3_ATTEMPTS (1 fails at once, as tests of failure want)."""
    raw = os.environ.get("MGIT_S3_ATTEMPTS", str(ATTEMPTS))
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 3) or not 1 <= int(raw) <= 100:  # "²".isdigit()
        raise InvalidOptionError(f"MGIT_S3_ATTEMPTS={raw!r} is not a number of attempts", hint="Use 1 to 100")
    return int(raw)


def pace_from_env() -> tuple[float, float]:
    """(grace in seconds, least rate in bytes a second) of a download: MGIT_TRANSFER_GRACE and
    MGIT_TRANSFER_MIN_RATE, or the defaults."""
    pace = []
    for name, default in (("MGIT_TRANSFER_GRACE", GRACE), ("MGIT_TRANSFER_MIN_RATE", MIN_RATE)):
        raw = os.environ.get(name, str(default))
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value < 1e12:
            raise InvalidOptionError(f"{name}={raw!r} is not a positive number", hint="Unset it for the default")
        pace.append(value)
    return pace[0], pace[1]


def part_size_from_env() -> int | None:
    """MGIT_S3_PART_SIZE in bytes (at least 5 MiB, S3's least part), or None: the defaults."""
    raw = os.environ.get("MGIT_S3_PART_SIZE")
    if raw is None:
        return None
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12) or not MIN_PART <= int(raw) <= 5 << 30:
        raise InvalidOptionError(f"MGIT_S3_PART_SIZE={raw!r} is not a part size", hint="Use 5242880 (5 MiB) to 5 GiB")
    return int(raw)


def transfer_config(
    *, max_workers: int = 16, threshold: int = MULTIPART_THRESHOLD, part_size: int = PART_SIZE
) -> TransferConfig:
    """How files move: one request below `threshold`, else `part_size` parts on `max_workers`
    threads. A benchmark passes the same object to a plain boto3 `upload_file` to compare."""
    return TransferConfig(
        multipart_threshold=threshold,
        multipart_chunksize=part_size,
        max_concurrency=max_workers,
        preferred_transfer_client="classic",
    )


class S3Backend(Backend):
    """Keys under `prefix/` in one bucket. `client` (one boto3 client, shared by every thread)
    and `transfer` (how large files move) are public, so a benchmark can run plain boto3 alike."""

    def __init__(
        self,
        url: str,
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        max_workers: int = 16,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.netloc:
            raise InvalidOptionError(f"{url!r} does not name an S3 bucket", hint="Use s3://BUCKET/PREFIX")
        if endpoint_url and (urlsplit(endpoint_url).scheme not in ("http", "https") or "@" in endpoint_url):
            raise InvalidOptionError("an S3 endpoint is http(s)://HOST[:PORT], without credentials")
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/") + "/" if parts.path.strip("/") else ""
        self.attempts = attempts_from_env()
        self.grace, self.min_rate = pace_from_env()
        part = part_size_from_env()
        self.transfer = transfer_config(
            max_workers=max_workers, **({"threshold": 2 * part, "part_size": part} if part else {})
        )
        self.ranged_from = self.transfer.multipart_threshold
        self.client = self._connect(endpoint_url, region, profile, max_workers)
        # Every body (ours, and s3transfer's ranged parts) is read against its deadline.
        self.client.meta.events.register("after-call.s3.GetObject", self._pace)

    def _pace(self, parsed: dict[str, Any], **kwargs: Any) -> None:
        if "Body" in parsed:
            parsed["Body"] = _PacedBody(parsed["Body"], parsed.get("ContentLength"), self.grace, self.min_rate)

    def _connect(self, endpoint_url: str | None, region: str | None, profile: str | None, workers: int) -> Any:
        limits = {"connect_timeout": CONNECT_TIMEOUT, "read_timeout": READ_TIMEOUT, "max_pool_connections": workers + 4}
        config = Config(retries={"mode": "standard", "total_max_attempts": self.attempts}, **limits)
        try:
            session = boto3.session.Session(profile_name=profile, region_name=region)
            core = session._session  # botocore's: its own credentials, but S3's model parsed once a process
            core.register_component("data_loader", _LOADERS.setdefault("data", core.get_component("data_loader")))
            client = session.client("s3", endpoint_url=endpoint_url, config=config)
            if endpoint_url or not AWS_HOST.search(urlsplit(client.meta.endpoint_url).hostname or ""):
                # An S3-compatible server, named here or by AWS_ENDPOINT_URL(_S3) or the AWS
                # config: its buckets are paths, since BUCKET.HOST rarely resolves.
                path_style = config.merge(Config(s3={"addressing_style": "path"}))
                client = session.client("s3", endpoint_url=endpoint_url, config=path_style)
        except boto_errors.ProfileNotFound:
            raise RemoteAuthError(self.url, f"no AWS profile named {profile!r}") from None
        return client

    def _key(self, key: str) -> str:
        return self.prefix + check_key(key)

    @contextmanager
    def _translated(self, key: str | None = None, *, conditional: bool = False) -> Iterator[None]:
        """What botocore raises, as MGit's remote errors: one line each, never a secret."""
        try:
            yield
        except boto_errors.ClientError as exc:
            raise self._error(exc, key, conditional) from exc
        except boto_errors.NoCredentialsError as exc:
            raise RemoteAuthError(self.url, "no AWS credentials found") from exc
        except CREDENTIAL_ERRORS as exc:  # partial, expired SSO, a failing credential_process
            raise RemoteAuthError(self.url, _line(exc)) from exc
        except (boto_errors.ConnectionError, boto_errors.HTTPClientError) as exc:
            raise RemoteUnavailableError(self.url, f"{_line(exc)} ({self.attempts} attempts)") from exc
        except boto_errors.BotoCoreError as exc:
            raise RemoteError(f"{self.url}: {_line(exc)}") from exc

    def _error(self, exc: boto_errors.ClientError, key: str | None, conditional: bool) -> RemoteError:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        said = _line(exc.response.get("Error", {}).get("Message") or code)
        if code == "NoSuchBucket" or (status == 404 and key is None):
            return RemoteNotFoundError(
                f"bucket {self.bucket!r} of {self.url} does not exist",
                hint="MGit never creates buckets: create it with your S3 tools, or check the URL and the endpoint",
            )
        if conditional and (code in CONFLICT_CODES or status == 404):  # 404: If-Match on a missing key
            return RemoteConflictError(self.url, str(key))
        if status == 404:
            return MissingKeyError(self.url, str(key))
        if status in (401, 403) or code in AUTH_CODES:
            return RemoteAuthError(self.url, f"access refused ({code}: {said})")
        if status >= 500 or code in BUSY_CODES:
            return RemoteUnavailableError(self.url, f"{code}: {said} ({self.attempts} attempts)")
        return RemoteError(f"{self.url}: S3 error {code or status}: {said}")

    def check(self) -> None:
        with self._translated():
            self.client.head_bucket(Bucket=self.bucket)

    def _get(self, key: str, take: Callable[[Any], T], *, conditional: bool = False, **params: str) -> T:
        """GET `key` (`params`: a Range, an If-Match) and give the answer to `take`; again, at
        botocore's pace, while its body breaks off (`take` raises EOFError, or botocore a read error)."""
        reason = ""
        for attempt in range(1, self.attempts + 1):
            with self._translated(key, conditional=conditional):
                try:
                    got = self.client.get_object(Bucket=self.bucket, Key=self._key(key), **params)
                except boto_errors.ClientError as exc:
                    if "Range" in params and exc.response.get("Error", {}).get("Code") == "InvalidRange":
                        raise RemoteError(f"{key} on {self.url} ends before the range {params['Range']}") from None
                    raise
            try:
                return take(got)
            except EOFError as exc:
                reason = str(exc)
            except (boto_errors.HTTPClientError, boto_errors.IncompleteReadError) as exc:
                reason = _line(exc)
            finally:
                got["Body"].close()
            if attempt < self.attempts:
                time.sleep(random.random() * min(0.1 * 2**attempt, 20))
        raise RemoteUnavailableError(self.url, f"reading {key}: {reason} ({self.attempts} attempts)")

    def _fetch(self, key: str, sink: BinaryIO, limit: int, **condition: str) -> str:
        """GET `key` into `sink` (from its start) and return its ETag. The announced length is
        checked before the body is read; a body that breaks off is fetched again."""

        def take(got: Any) -> str:
            size = got.get("ContentLength")  # (no size said: read up to the limit)
            if size is not None and size > limit:
                raise RemoteTooLargeError(self.url, key, size, limit)
            sink.seek(0)
            sink.truncate()
            copied = _copy(got["Body"], sink, limit + 1)
            if copied > limit:  # it said less than it sent
                raise RemoteTooLargeError(self.url, key, copied, limit)
            if size is not None and copied != size:
                raise EOFError(f"{copied} of {size} bytes arrived")
            return str(got.get("ETag", ""))

        return self._get(key, take, conditional="IfMatch" in condition, **condition)

    def read(self, key: str, *, limit: int) -> bytes:
        sink = io.BytesIO()
        self._fetch(key, sink, limit)
        return sink.getvalue()

    def read_into(self, key: str, path: Path, *, limit: int) -> int:
        with self._translated(key):
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        size, etag = head.get("ContentLength"), head.get("ETag")
        if size is not None and size > limit:
            raise RemoteTooLargeError(self.url, key, size, limit)
        with disk_full_as_error(path), open(path, "xb") as fh:  # an existing file is refused, and kept
            try:
                if size is None or etag is None or size < self.transfer.multipart_threshold:
                    self._fetch(key, fh, limit, **({"IfMatch": etag} if etag else {}))
                else:
                    self._download(key, _BoundedFile(fh, size, self.url, key), size, etag)
                fh.flush()
                written = os.fstat(fh.fileno()).st_size
                if size is not None and written != size:
                    raise RemoteUnavailableError(self.url, f"reading {key}: {written} of {size} bytes arrived")
            except BaseException:
                path.unlink(missing_ok=True)
                raise
        return written

    def _download(self, key: str, sink: _BoundedFile, size: int, etag: str) -> None:
        """Parallel ranged GETs, each If-Match the ETag: parts of two versions never mix."""
        with create_transfer_manager(self.client, self.transfer) as manager, self._translated(key):
            try:
                manager.download(self.bucket, self._key(key), sink, subscribers=[_KnownObject(size, etag)]).result()
            except transfer_errors.S3DownloadFailedError as exc:  # s3transfer's word for a 412 on If-Match
                raise RemoteConflictError(self.url, key) from exc
            except transfer_errors.RetriesExceededError as exc:  # a body that kept breaking off
                raise RemoteUnavailableError(self.url, f"reading {key}: {_line(exc.last_exception)}") from exc

    def read_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length <= 0:
            raise RemoteError(f"{self.url}: no range {start}+{length} of {key}")

        def take(got: Any) -> bytes:
            size = got.get("ContentLength")
            if size is not None and size != length:  # a server that ignored the range, or a short key
                raise RemoteError(f"{key} on {self.url} answered {size} bytes for a range of {length}")
            sink = io.BytesIO()
            if _copy(got["Body"], sink, length + 1) != length:
                raise EOFError(f"{sink.tell()} of {length} bytes arrived")
            return sink.getvalue()

        return self._get(key, take, Range=f"bytes={start}-{start + length - 1}")

    def write_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        large = self.journal is not None and path.stat().st_size >= self.transfer.multipart_threshold
        if not (large and multipart.write_journalled(self, key, path, progress)):
            super().write_file(key, path, progress=progress)

    def write(self, key: str, data: bytes | Path) -> None:
        with self._translated(key):
            if isinstance(data, bytes):
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
            elif data.stat().st_size < self.transfer.multipart_threshold:
                with open(data, "rb") as fh:
                    self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=fh)
            else:  # parallel parts; the object appears only when the upload completes
                for attempt in range(2):
                    try:
                        with create_transfer_manager(self.client, self.transfer) as manager:
                            manager.upload(str(data), self.bucket, self._key(key)).result()
                        return
                    except boto_errors.ClientError as exc:
                        # Another push took this upload for a killed one's and aborted it: again.
                        if attempt or exc.response.get("Error", {}).get("Code") != "NoSuchUpload":
                            raise

    def abort_unfinished(self, keys: Iterable[str]) -> int:
        return multipart.abort_unfinished(self, set(keys))

    def size(self, key: str) -> int | None:
        try:
            with self._translated(key):
                head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except MissingKeyError:
            return None
        size = head.get("ContentLength")
        return size if isinstance(size, int) and size >= 0 else None  # (a server that says no size: sent again)

    def _listing(self, prefix: str) -> list[tuple[str, dict[str, Any]]]:
        """(key, ListObjectsV2's entry) of every key under `prefix`, sorted."""
        if top := prefix.rpartition("/")[0]:
            check_key(top)
        start, keys = self.prefix + prefix, []
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=start)
        with self._translated():
            for number, page in enumerate(pages):
                if number >= MAX_LIST_PAGES:
                    raise RemoteError(f"{self.url}: listing {prefix!r} did not end after {number} pages")
                keys += [
                    (o["Key"][len(self.prefix) :], o) for o in page.get("Contents", ()) if o["Key"].startswith(start)
                ]
        return sorted(((k, o) for k, o in keys if listed(k)), key=lambda ko: ko[0])

    def list_info(self, prefix: str) -> Iterator[KeyInfo]:
        return (KeyInfo(k, int(o.get("Size", 0)), o["LastModified"].timestamp()) for k, o in self._listing(prefix))

    def list_tokens(self, prefix: str) -> dict[str, tuple[str, str | None]]:
        etags = {k: str(o["ETag"]) for k, o in self._listing(prefix) if o.get("ETag")}
        return {k: (e, e.strip('"') if MD5_ETAG.match(e) else None) for k, e in etags.items()}  # (SSE-KMS: no MD5)

    def delete(self, key: str) -> None:
        with self._translated(key):
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))  # (absent: no error)

    def read_versioned(self, key: str, *, limit: int) -> tuple[bytes | None, str | None]:
        sink = io.BytesIO()
        try:
            etag = self._fetch(key, sink, limit)
        except MissingKeyError:
            return None, None
        return sink.getvalue(), etag

    def write_if(self, key: str, data: bytes, *, token: str | None) -> str | None:
        condition = {"IfNoneMatch": "*"} if token is None else {"IfMatch": token}
        with self._translated(key, conditional=True):
            try:
                put = self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, **condition)
                return str(put["ETag"]) if put.get("ETag") else None
            except boto_errors.ClientError as exc:
                # A retried put refused as a conflict: its first try may have landed, the answer lost.
                if not (exc.response.get("ResponseMetadata", {}).get("RetryAttempts") and self._holds(key, data)):
                    raise  # (else the key holds exactly our bytes; the ETag went with the lost answer)
        return None

    def _holds(self, key: str, data: bytes) -> bool:
        try:
            return self.read_versioned(key, limit=len(data))[0] == data
        except RemoteError:
            return False


def _line(what: object) -> str:
    """The first line of a message, short (botocore's can quote a whole request)."""
    return (str(what).strip().splitlines() or [""])[0][:200]


def _copy(body: Any, sink: BinaryIO, most: int) -> int:
    """Copy at most `most` bytes of a response body into `sink`; return how many."""
    copied = 0
    while copied < most and (chunk := body.read(min(CHUNK, most - copied))):
        copied += sink.write(chunk)
    return copied


class _TooSlow(boto_errors.ReadTimeoutError):
    """A body that missed its deadline (a ReadTimeoutError, so that s3transfer's ranged parts
    are retried like any read that timed out)."""

    fmt = "too slow: {received} of {size} bytes in {seconds:.0f} s (the least rate is {rate:.0f} bytes a second)"


class _PacedBody:
    """A response body read against a deadline: `grace` seconds plus its size (or, where the
    answer said none, what has arrived) at `rate` bytes a second. Each read returns what one
    socket read brings (urllib3's read1), so the deadline is looked at between bytes that
    trickle in, not only when a whole chunk has come."""

    def __init__(self, body: Any, size: Any, grace: float, rate: float) -> None:  # (size: None if not said)
        self._body, self._grace, self._rate = body, grace, rate
        self._size: int | None = size if isinstance(size, int) else None
        self._start, self._received = time.monotonic(), 0
        raw = getattr(body, "_raw_stream", None)
        self._read1 = getattr(raw, "read1", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)

    def _check(self) -> None:
        spent = time.monotonic() - self._start
        allowed = self._grace + (self._size if self._size is not None else self._received) / self._rate
        if spent > allowed and (self._size is None or self._received < self._size):
            raise _TooSlow(
                received=self._received,
                size=self._size if self._size is not None else "?",
                seconds=spent,
                rate=self._rate,
                endpoint_url="",
            )

    def read(self, amt: int | None = None) -> bytes:
        if amt is None or amt < 0:
            return b"".join(iter(lambda: self.read(CHUNK), b""))
        self._check()
        try:
            chunk = self._read1(min(amt, CHUNK)) if self._read1 is not None else self._body.read(min(amt, 64 * 1024))
        except urllib3_errors.ReadTimeoutError as exc:
            raise boto_errors.ReadTimeoutError(endpoint_url=str(exc)) from exc
        except (urllib3_errors.ProtocolError, urllib3_errors.HTTPError) as exc:
            raise boto_errors.ResponseStreamingError(error=exc) from exc
        self._received += len(chunk)
        if chunk:
            self._check()
        return chunk

    def close(self) -> None:
        self._body.close()


class _BoundedFile:
    """A file s3transfer writes parts into at their offsets, refusing any byte past `size`."""

    def __init__(self, fh: BinaryIO, size: int, url: str, key: str) -> None:
        self._fh, self._size, self._url, self._key = fh, size, url, key

    def __getattr__(self, name: str) -> Any:  # seekable, seek, tell: the file's own
        return getattr(self._fh, name)

    def write(self, data: bytes) -> int:
        if (end := self._fh.tell() + len(data)) > self._size:
            raise RemoteTooLargeError(self._url, self._key, end, self._size)
        return self._fh.write(data)


class _KnownObject(BaseSubscriber):
    """Hands s3transfer the size and ETag from our HEAD: no second HEAD, and every ranged GET
    carries If-Match, so parts of two versions of an object are never mixed."""

    def __init__(self, size: int, etag: str) -> None:
        self._size, self._etag = size, etag

    def on_queued(self, future: Any, **kwargs: Any) -> None:
        future.meta.provide_transfer_size(self._size)
        future.meta.provide_object_etag(self._etag)
