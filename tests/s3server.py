"""A real S3-compatible server and a fault-injecting proxy, for tests of S3 remotes.

The tests talk HTTP to a real server process rather than patching botocore in-process, so
retries, streaming bodies, ETags and conditional writes behave as they do against a bucket.

    S3Server()                      moto's server (`python -m moto.server`) as a child process
    s3_server                       session fixture: one server per pytest worker
    s3_bucket                       function fixture: a fresh bucket and AWS_* variables naming it
    s3_bucket.remote(packs=False)   a fresh remote under s3://<bucket>/team/models, its URL
    OnS3                            mixin for a contract class: its `url` and `env` fixtures on S3
    FaultProxy(endpoint, every=3, mode="503")
                                    forwards byte for byte, but drops or fails every 3rd request
    FaultProxy(endpoint, latency=0.02)
                                    forwards every request 20 ms late (a bucket's latency, on
                                    loopback; benchmarks/remote.py) and counts them
    FaultProxy(endpoint, every=1, after=2, mode="stall", path="partNumber=")
                                    lets two parts through, then holds every other one unanswered
                                    (until the proxy stops): a process to kill mid-upload

Use the fixtures by importing them into a test module or a conftest (ruff then also wants
`# ruff: noqa: F811` in a test module, whose arguments shadow the imported names):

    from s3server import s3_bucket, s3_server  # noqa: F401

Code that builds its client from the standard AWS chain (`boto3.client("s3")`) reaches the
server when these are set; `s3_bucket` sets them with monkeypatch (`S3Bucket.env` holds them):

    AWS_ACCESS_KEY_ID=testing  AWS_SECRET_ACCESS_KEY=testing  AWS_DEFAULT_REGION=us-east-1
    AWS_ENDPOINT_URL=http://127.0.0.1:PORT  AWS_ENDPOINT_URL_S3=http://127.0.0.1:PORT
    AWS_CONFIG_FILE=/dev/null  AWS_SHARED_CREDENTIALS_FILE=/dev/null  AWS_EC2_METADATA_DISABLED=true
    AWS_PROFILE, AWS_DEFAULT_PROFILE, AWS_SESSION_TOKEN, AWS_SECURITY_TOKEN unset;
    127.0.0.1 added to NO_PROXY / no_proxy

Conditional writes in moto 5.2.5's server (checked by test_s3server.py): PutObject honours
`If-None-Match: *` and `If-Match: <etag>` (quotes optional) with 412 PreconditionFailed;
If-Match on a missing key is 404 NoSuchKey. ETags are the quoted MD5 of the body, or for a
multipart object the quoted MD5 of the parts' MD5s followed by "-<parts>". The check and the
write are not one atomic step in moto, so concurrent conditional writers can both succeed.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, ClassVar

import pytest

REGION = "us-east-1"
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
HOST = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (it may be taken later)."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def s3_client(endpoint: str, config: Any = None) -> Any:
    """A boto3 S3 client for `endpoint` with fake credentials, path-style addressing and short
    timeouts. `config`, a botocore Config, is merged on top: no retries at all is
    `Config(retries={"total_max_attempts": 1})`, since {"max_attempts": 1} still retries once."""
    import boto3
    from botocore.config import Config

    base = Config(s3={"addressing_style": "path"}, connect_timeout=5, read_timeout=15)
    return boto3.client(
        "s3", endpoint_url=endpoint, region_name=REGION, config=base.merge(config) if config else base, **CREDENTIALS
    )


def aws_env(endpoint: str) -> dict[str, str]:
    """The variables that point the standard AWS credential and endpoint chain at `endpoint`."""
    no_proxy = ",".join(p for p in (os.environ.get("NO_PROXY", ""), HOST, "localhost") if p)
    return {
        "AWS_ACCESS_KEY_ID": CREDENTIALS["aws_access_key_id"],
        "AWS_SECRET_ACCESS_KEY": CREDENTIALS["aws_secret_access_key"],
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ENDPOINT_URL_S3": endpoint,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        "NO_PROXY": no_proxy,
        "no_proxy": no_proxy,
    }


UNSET_AWS_VARIABLES = ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


class ServerProcess:
    """A storage server or emulator in a child process on 127.0.0.1 and a free port, stopped by
    its pid. Subclasses say what to run (`command`), where it answers (`endpoint`, `probe`) and
    the line it logs once it listens (`ready`). The constructor returns once the server logged
    that line and answers HTTP (or raises after `startup_timeout`); a port taken between choosing
    and binding it is retried on another port, a few times, each with a fresh log."""

    label = "server"
    cwd: str | None = None

    def command(self, port: int) -> list[str]:  # pragma: no cover - abstract
        raise NotImplementedError

    def endpoint_of(self, port: int) -> str:
        return f"http://{HOST}:{port}"

    def ready(self, port: int) -> bytes:  # pragma: no cover - abstract
        raise NotImplementedError

    def __init__(self, *, startup_timeout: float = 20.0, attempts: int = 3) -> None:
        deadline = time.monotonic() + startup_timeout
        for attempt in range(attempts):
            port = free_port()
            self.endpoint = self.endpoint_of(port)
            if attempt:
                self._log.close()
            # The child shares this file's offset, so the parent only ever reads with pread.
            self._log: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
            self.process = subprocess.Popen(
                self.command(port), stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.cwd
            )
            if self._wait_until_answering(port, deadline):
                return
            if self.process.poll() is None:  # still running but silent: out of time
                break
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"{self.label} did not start on {HOST} within {startup_timeout:.0f} s:\n{log}")

    def _wait_until_answering(self, port: int, deadline: float) -> bool:
        """True once this process logged that it listens on its port and answers HTTP (any
        status); False if it exits (port taken) or time runs out. Waiting for the line keeps
        another worker's server that took the same port from passing for this one."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        ready = self.ready(port)
        while time.monotonic() < deadline and self.process.poll() is None:
            if ready in os.pread(self._log.fileno(), _MAX_HEAD_BYTES, 0):
                try:
                    opener.open(f"http://{HOST}:{port}/", timeout=1).close()
                    return True
                except urllib.error.HTTPError:
                    return True
                except OSError:
                    pass
            time.sleep(0.05)
        return False

    def log_tail(self, size: int = 4000) -> str:
        """The end of the server's combined stdout and stderr, for failure messages."""
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

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class S3Server(ServerProcess):
    """moto's S3-compatible server (Werkzeug logs "Running on <url>" only after binding)."""

    label = "moto server"

    def __init__(self, *, startup_timeout: float = 20.0, attempts: int = 3) -> None:
        self._admin: Any = None
        super().__init__(startup_timeout=startup_timeout, attempts=attempts)

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(port)]

    def ready(self, port: int) -> bytes:
        return f"Running on http://{HOST}:{port}".encode()

    def client(self, config: Any = None) -> Any:
        """A boto3 S3 client for this server (see `s3_client`)."""
        return s3_client(self.endpoint, config)

    def new_bucket(self, name: str | None = None) -> str:
        """Create a bucket (a fresh unique name unless given) and return its name."""
        name = name or f"mgit-test-{uuid.uuid4().hex[:16]}"
        if self._admin is None:
            self._admin = self.client()
        self._admin.create_bucket(Bucket=name)
        return name

    def delete_bucket(self, name: str, *, max_pages: int = 100) -> None:
        """Delete a bucket with its objects and unfinished uploads (to keep the server small)."""
        admin = self._admin or self.client()
        for _ in range(max_pages):
            page = admin.list_objects_v2(Bucket=name)
            keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
            if keys:
                admin.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
            if not page.get("IsTruncated"):
                break
        for upload in admin.list_multipart_uploads(Bucket=name).get("Uploads", []):
            admin.abort_multipart_upload(Bucket=name, Key=upload["Key"], UploadId=upload["UploadId"])
        admin.delete_bucket(Bucket=name)


@dataclass(frozen=True)
class EmulatedBucket:
    """A fresh bucket (or container) on an emulator and the variables that point a client
    library's standard chain at it: what S3Bucket, azurite.AzureContainer and
    gcsemulator.GCSBucket share."""

    scheme: ClassVar[str]
    endpoint: str
    name: str
    env: dict[str, str] = field(repr=False)

    @property
    def url(self) -> str:
        """The bucket as a remote URL, <scheme>://<name>."""
        return f"{self.scheme}://{self.name}"

    def remote(self, prefix: str = "team/models", *, packs: bool | None = None) -> str:
        """A fresh empty remote (`mgit init --bare`) under `prefix`, and its URL. `packs`: as
        `sync.init_bare` takes it (None: the default for a bucket, data packs)."""
        from mgit import sync

        url = f"{self.url}/{prefix}"
        sync.init_bare(url, packs=packs)
        return url

    def child_env(self) -> dict[str, str]:
        """The environment for an mgit child process that is to reach this bucket."""
        return {**os.environ, **self.env}


@dataclass(frozen=True)
class S3Bucket(EmulatedBucket):
    """A fresh bucket on the test server and the AWS_* variables that point at it."""

    scheme = "s3"

    def client(self, config: Any = None) -> Any:
        """A boto3 S3 client for the bucket's server (see `s3_client`)."""
        return s3_client(self.endpoint, config)


class OnRemote:
    """Base of the fixture mixins OnS3, azurite.OnAzure, gcsemulator.OnGCS: a contract class
    that takes `url` (a fresh remote) and `env` (for its child processes) gets both from a
    mixin, `class TestS3Thing(OnS3, ThingContract)`. `packs` is passed to `remote()`."""

    packs: bool | None = None


class OnS3(OnRemote):
    """`url`: a fresh remote under s3://<fresh bucket>/team/models; `env`: for child processes."""

    @pytest.fixture
    def url(self, s3_bucket: S3Bucket) -> str:
        return s3_bucket.remote(packs=self.packs)

    @pytest.fixture
    def env(self, s3_bucket: S3Bucket) -> dict[str, str]:
        return s3_bucket.child_env()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto server per pytest session (so one per xdist worker)."""
    with S3Server() as server:
        yield server


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    """A fresh bucket, with the AWS environment of this test pointing at it."""
    bucket = S3Bucket(s3_server.endpoint, s3_server.new_bucket(), aws_env(s3_server.endpoint))
    for name in UNSET_AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    for name, value in bucket.env.items():
        monkeypatch.setenv(name, value)
    yield bucket
    with contextlib.suppress(Exception):  # cleanup only; a test may break its bucket on purpose
        s3_server.delete_bucket(bucket.name)


# ---------------------------------------------------------------------------------------------
# Fault injection

FAULT_MODES = ("drop", "500", "503", "stall")
_S3_ERRORS = {  # mode -> (status, reason, S3 error code, message), as S3 itself words them
    "500": (500, "Internal Server Error", "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "Slow Down", "SlowDown", "Please reduce your request rate."),
}
_MAX_HEAD_BYTES = 64 * 1024
MAX_LATENCY = 1.0  # seconds a proxied request may be delayed: a bound, not a hang
_MAX_CHUNKS = 1 << 20
_MAX_TRAILER_LINES = 100
_MAX_REQUESTS_PER_CONNECTION = 100_000
_BLOCK = 64 * 1024


@dataclass(frozen=True)
class ProxiedRequest:
    """One request the proxy saw: `fault` is the injected mode, or None if it was forwarded."""

    method: str
    target: str
    fault: str | None
    range: str | None = None  # the Range header of a ranged GET


@dataclass(frozen=True)
class _RequestHead:
    raw: bytes
    method: str
    target: str
    headers: dict[str, str]  # lower-case names; repeated headers joined with ","


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of `upstream` that injects faults by count.

    Requests are forwarded unchanged, byte for byte (heads, Content-Length and chunked bodies,
    Expect: 100-continue); responses are relayed as raw bytes. Of the requests that match
    `methods` and the regex `path` (searched in the request target, query included), every
    `every`-th one is not forwarded: "drop" closes the connection, "500" and "503" answer with
    S3's InternalError or SlowDown XML and close, "stall" holds it unanswered until the proxy
    stops. `every=0` never faults; the first `after` matching requests are never faulted;
    `max_faults` caps the number of faults. `set_faults` changes the plan while running and
    restarts the count. `latency`: seconds each forwarded request waits before it goes on (at
    most MAX_LATENCY): what a request to a real bucket costs beyond loopback's. Requests on
    separate connections wait in parallel, as they would on a network. `seen` logs every
    request (with its Range header); `bytes_up` and `bytes_down` count the bytes relayed each
    way."""

    def __init__(
        self,
        upstream: str,
        *,
        every: int = 0,
        mode: str = "503",
        methods: Iterable[str] | None = None,
        path: str | None = None,
        max_faults: int | None = None,
        after: int = 0,
        timeout: float = 30.0,
        latency: float = 0.0,
    ) -> None:
        if not 0.0 <= latency <= MAX_LATENCY:
            raise ValueError(f"latency must be between 0 and {MAX_LATENCY} s, not {latency}")
        self.latency = latency
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self._upstream = (host, int(port or 80))
        self._timeout = timeout
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self.seen: list[ProxiedRequest] = []
        self.faults = 0
        self.bytes_up = 0  # request bytes forwarded (heads and bodies), and response bytes relayed
        self.bytes_down = 0
        self.set_faults(every=every, mode=mode, methods=methods, path=path, max_faults=max_faults, after=after)
        self._listener = socket.create_server((HOST, 0))
        self._listener.settimeout(0.1)  # how quickly the accept loop notices stop()
        self.endpoint = f"http://{HOST}:{self._listener.getsockname()[1]}"
        self._acceptor = threading.Thread(target=self._accept_loop, name="fault-proxy", daemon=True)
        self._acceptor.start()

    def set_faults(
        self,
        *,
        every: int,
        mode: str = "503",
        methods: Iterable[str] | None = None,
        path: str | None = None,
        max_faults: int | None = None,
        after: int = 0,
    ) -> None:
        """Replace the fault plan; the every-N count starts again from zero."""
        if mode not in FAULT_MODES:
            raise ValueError(f"fault mode {mode!r} is not one of {FAULT_MODES}")
        if every < 0:
            raise ValueError(f"every must be 0 (never) or positive, not {every}")
        with self._lock:
            self._every, self._mode, self._max_faults, self._after = every, mode, max_faults, after
            self._methods = {m.upper() for m in methods} if methods is not None else None
            self._path = re.compile(path) if path is not None else None
            self._matched = 0
            self._faults_in_plan = 0

    @property
    def requests(self) -> int:
        """How many requests arrived, forwarded or faulted."""
        with self._lock:
            return len(self.seen)

    def kinds(self, since: int = 0) -> dict[str, int]:
        """The requests from the `since`-th on, by kind: PUT, GET, HEAD, POST (multipart) and
        LIST (a GET of a listing)."""
        with self._lock:
            seen = self.seen[since:]
        out: dict[str, int] = {}
        for r in seen:
            kind = "LIST" if r.method == "GET" and ("list-type=" in r.target or "?uploads" in r.target) else r.method
            out[kind] = out.get(kind, 0) + 1
        return out

    @property
    def open_connections(self) -> int:
        """Client connections still being relayed (their threads have not ended)."""
        with self._lock:
            return sum(t.is_alive() for t in self._threads)

    def _admit(self, head: _RequestHead) -> str | None:
        """Record the request; return the fault to inject, or None to forward it."""
        with self._lock:
            fault = None
            wanted = (self._methods is None or head.method in self._methods) and (
                self._path is None or self._path.search(head.target) is not None
            )
            if self._every and wanted:
                self._matched += 1
                capped = self._max_faults is not None and self._faults_in_plan >= self._max_faults
                if self._matched > self._after and (self._matched - self._after) % self._every == 0 and not capped:
                    fault = self._mode
                    self._faults_in_plan += 1
                    self.faults += 1
            self.seen.append(ProxiedRequest(head.method, head.target, fault, head.headers.get("range")))
            return fault

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # listener closed by stop()
                return
            thread = threading.Thread(target=self._serve, args=(client,), daemon=True)
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, client: socket.socket) -> None:
        """Relay one client connection: requests parsed and forwarded, responses copied raw."""
        client.settimeout(self._timeout)
        try:
            upstream = socket.create_connection(self._upstream, timeout=self._timeout)
        except OSError:
            _close(client)
            return
        with self._lock:
            if self._stopping.is_set():
                _close(client, upstream)
                return
            self._sockets |= {client, upstream}
        send_lock = threading.Lock()
        pump = threading.Thread(target=_pump, args=(upstream, client, send_lock, self._count_down), daemon=True)
        pump.start()
        rfile = client.makefile("rb")
        try:
            for _ in range(_MAX_REQUESTS_PER_CONNECTION):
                head = _read_head(rfile)
                if head is None:  # the client is done: let the last response finish
                    upstream.shutdown(socket.SHUT_WR)
                    pump.join(self._timeout)
                    break
                fault = self._admit(head)
                if fault is None:
                    if self.latency:
                        time.sleep(self.latency)
                    upstream.sendall(head.raw)
                    _copy_body(rfile, head, lambda data: self._count_up(upstream, data))
                    self._count_up(None, head.raw)
                    continue
                if fault == "stall":
                    self._stopping.wait()
                elif fault != "drop":
                    _answer_with_error(fault, head, rfile, client, send_lock)
                break
        except (OSError, ValueError):
            pass  # either side went away or sent garbage: the connection ends
        finally:
            rfile.close()
            _close(client, upstream)
            pump.join(self._timeout)
            with self._lock:
                self._sockets -= {client, upstream}

    def _count_up(self, upstream: socket.socket | None, data: bytes) -> None:
        if upstream is not None:
            upstream.sendall(data)
        with self._lock:
            self.bytes_up += len(data)

    def _count_down(self, data: bytes) -> None:
        with self._lock:
            self.bytes_down += len(data)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, cut every open connection, and wait for the relay threads."""
        self._stopping.set()
        self._listener.close()
        self._acceptor.join(timeout)
        with self._lock:
            sockets, threads = list(self._sockets), list(self._threads)
        _close(*sockets)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_head(rfile: IO[bytes]) -> _RequestHead | None:
    """The next request line and headers, or None if the connection ended between requests."""
    lines: list[bytes] = []
    size = 0
    while True:
        line = rfile.readline(_MAX_HEAD_BYTES + 1)
        size += len(line)
        if size > _MAX_HEAD_BYTES:
            raise ValueError("request head too large")
        if not line:
            if lines:
                raise ValueError("connection closed inside a request head")
            return None
        if not lines and line in (b"\r\n", b"\n"):
            continue  # empty lines before a request line are allowed (RFC 9112, 2.2)
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            break
    method, target, _version = lines[0].decode("latin-1").split()
    headers: dict[str, str] = {}
    for line in lines[1:-1]:
        name, _, value = line.decode("latin-1").partition(":")
        name, value = name.strip().lower(), value.strip()
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    return _RequestHead(b"".join(lines), method.upper(), target, headers)


def _copy_body(rfile: IO[bytes], head: _RequestHead, sink: Callable[[bytes], Any]) -> None:
    """Pass the request body to `sink` exactly as framed on the wire (chunk lines included)."""
    if "chunked" in head.headers.get("transfer-encoding", "").lower():
        _copy_chunked(rfile, sink)
    else:
        _copy_exact(rfile, int(head.headers.get("content-length", "0")), sink)


def _copy_chunked(rfile: IO[bytes], sink: Callable[[bytes], Any]) -> None:
    for _ in range(_MAX_CHUNKS):
        line = rfile.readline(1024)
        if not line.endswith(b"\n"):
            raise ValueError("bad chunk size line")
        sink(line)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size:
            _copy_exact(rfile, size + 2, sink)  # the data and its CRLF
            continue
        for _ in range(_MAX_TRAILER_LINES):
            trailer = rfile.readline(_MAX_HEAD_BYTES)
            if not trailer.endswith(b"\n"):
                raise ValueError("bad chunked trailer")
            sink(trailer)
            if trailer in (b"\r\n", b"\n"):
                return
        raise ValueError("too many trailer lines")
    raise ValueError("too many chunks")


def _copy_exact(rfile: IO[bytes], size: int, sink: Callable[[bytes], Any]) -> None:
    while size > 0:
        data = rfile.read(min(size, _BLOCK))
        if not data:
            raise ValueError("connection closed inside a request body")
        sink(data)
        size -= len(data)


def _answer_with_error(
    mode: str, head: _RequestHead, rfile: IO[bytes], client: socket.socket, send_lock: threading.Lock
) -> None:
    """Answer like S3 under strain. The body is read first, so that closing the connection
    afterwards does not reset it; unless the client waits for 100-continue before sending it."""
    if "100-continue" not in head.headers.get("expect", "").lower():
        _copy_body(rfile, head, lambda _data: None)
    status, reason, code, message = _S3_ERRORS[mode]
    request_id = uuid.uuid4().hex[:16].upper()
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
        f"<Message>{message}</Message><RequestId>{request_id}</RequestId></Error>"
    ).encode()
    response = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\n"
        f"Content-Length: {len(body)}\r\nx-amz-request-id: {request_id}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    with send_lock:
        client.sendall(response if head.method == "HEAD" else response + body)


def _pump(
    source: socket.socket, dest: socket.socket, send_lock: threading.Lock, count: Callable[[bytes], None]
) -> None:
    """Copy raw bytes from `source` to `dest` until either ends or stays idle past its timeout."""
    try:
        while data := source.recv(_BLOCK):
            with send_lock:
                dest.sendall(data)
            count(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dest.shutdown(socket.SHUT_RDWR)  # the client sees the end; the reader loop wakes up


def _close(*sockets: socket.socket) -> None:
    for sock in sockets:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
