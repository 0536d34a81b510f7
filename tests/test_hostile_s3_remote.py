"""An S3 endpoint that attacks a clone, for real: a loopback HTTP proxy in front of moto's
server that trickles object bodies (a byte at a time: a per-read socket timeout never fires),
or answers without Content-Length. And a push killed during a multipart upload, whose parts
the next push must not leave behind."""
# ruff: noqa: F811

from __future__ import annotations

import http.client
import importlib.util
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_mgit, sha256_tree, tensors
from s3server import HOST, S3Bucket, s3_bucket, s3_server  # noqa: F401

from mgit import Repo, sync

pytestmark = pytest.mark.skipif(
    not (importlib.util.find_spec("boto3") and importlib.util.find_spec("moto")),
    reason="needs the S3 extra (boto3) and moto",
)
WAIT = 60  # seconds a CLI run may take before it counts as hung
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection"}
MAX_TRICKLE = 10_000  # bytes a trickled body sends at most (then the proxy closes)


class HostileProxy:
    """Forwards every request to `upstream` (moto) and relays the answer, except that GETs
    whose path matches `path` get their body trickled (`trickle`: one byte every `delay`
    seconds) or sent without Content-Length, ended by closing the connection (`no-length`,
    which then applies to HEAD answers too). Counts the requests that matched."""

    def __init__(self, upstream: str, *, mode: str, path: str = r"/objects/|\.objpack", delay: float = 0.2) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream, self.mode, self.path, self.delay = (host, int(port)), mode, re.compile(path), delay
        self.matched: list[str] = []
        self.stopping = threading.Event()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                up = http.client.HTTPConnection(*proxy.upstream, timeout=30)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                up.request(self.command, self.path, body=body, headers=headers)
                answer = up.getresponse()
                data = answer.read()
                up.close()
                hostile = bool(proxy.path.search(self.path)) and (
                    self.command == "GET" or (self.command == "HEAD" and proxy.mode == "no-length")
                )
                if hostile:
                    proxy.matched.append(f"{self.command} {self.path}")
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in HOP:
                        self.send_header(name, value)
                if hostile and proxy.mode == "no-length":
                    self.send_header("Connection", "close")
                    self.close_connection = True
                else:
                    self.send_header("Content-Length", answer.getheader("Content-Length") or str(len(data)))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if hostile and proxy.mode == "trickle":
                    for i in range(min(len(data), MAX_TRICKLE)):
                        if proxy.stopping.wait(proxy.delay):
                            break
                        self.wfile.write(data[i : i + 1])
                        self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = relay

        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)


@pytest.fixture
def pushed(s3_bucket: S3Bucket, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A remote under the bucket holding one model pushed straight to moto; its source folder."""
    url = f"{s3_bucket.url}/team"
    sync.init_bare(url)
    alice = Repo.init(tmp_path / "alice")
    src = make_model(tmp_path / "src", seed=5)
    alice.add(src, name="m")
    sync.add_remote(alice, "origin", url)
    sync.push(alice)
    yield url, src


def through(proxy: HostileProxy, s3_bucket: S3Bucket, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **s3_bucket.env,
        "AWS_ENDPOINT_URL": proxy.endpoint,
        "AWS_ENDPOINT_URL_S3": proxy.endpoint,
        **extra,
    }


def test_a_trickling_endpoint_meets_a_deadline_and_one_line(pushed, s3_bucket: S3Bucket, tmp_path: Path) -> None:
    url, _ = pushed
    proxy = HostileProxy(s3_bucket.endpoint, mode="trickle")
    try:
        env = through(proxy, s3_bucket, MGIT_S3_ATTEMPTS="2", MGIT_TRANSFER_GRACE="1", MGIT_TRANSFER_MIN_RATE="1048576")
        try:
            done = run_mgit("clone", url, str(tmp_path / "bob"), cwd=tmp_path, env=env, timeout=WAIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"a clone from a trickling endpoint was still waiting after {WAIT} s")
    finally:
        proxy.stop()
    assert done.returncode == 1 and done.stdout == "", done
    err = done.stderr
    assert err.startswith(f"Error: {url} did not answer: ") and err.count("\n") == 1, err
    assert "too slow" in err and "2 attempts" in err, err
    # The first object asked for was tried MGIT_S3_ATTEMPTS times, then the clone stopped.
    first = proxy.matched[0]
    assert proxy.matched.count(first) == 2, proxy.matched
    assert not (tmp_path / "bob").exists() or Repo(tmp_path / "bob").refs.all() == {}


def test_answers_without_content_length_are_read_within_their_limit(
    pushed, s3_bucket: S3Bucket, tmp_path: Path
) -> None:
    url, src = pushed
    proxy = HostileProxy(s3_bucket.endpoint, mode="no-length", path=r"/team/")
    try:
        done = run_mgit("clone", url, str(tmp_path / "bob"), cwd=tmp_path, env=through(proxy, s3_bucket), timeout=WAIT)
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stderr
    # (small objects come in a data pack: its GETs were the ones without a length)
    assert any(m.startswith("GET /") and ("/objects/" in m or ".objpack" in m) for m in proxy.matched), proxy.matched
    Repo(tmp_path / "bob").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)


def test_the_next_push_aborts_a_multipart_upload_a_killed_push_left(s3_bucket: S3Bucket, tmp_path: Path) -> None:
    url = f"{s3_bucket.url}/team"
    sync.init_bare(url)
    alice = Repo.init(tmp_path / "alice")
    rng = np.random.default_rng(9)
    state = {**tensors(1), "big": rng.standard_normal(17 << 20 >> 2, dtype=np.float32)}  # one 17 MiB object
    src = make_model(tmp_path / "src", state=state)
    alice.add(src, name="m")
    sync.add_remote(alice, "origin", url)
    big = max(alice.store.ids(), key=alice.store.stored_size)
    key = f"team/objects/{big[:2]}/{big[2:]}"
    client = s3_bucket.client()
    # What a push killed halfway through that object's multipart upload leaves: an upload
    # started, a part sent, never completed (S3 keeps and bills its parts until aborted).
    upload = client.create_multipart_upload(Bucket=s3_bucket.name, Key=key)["UploadId"]
    client.upload_part(Bucket=s3_bucket.name, Key=key, UploadId=upload, PartNumber=1, Body=os.urandom(5 << 20))
    assert [u["Key"] for u in client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", [])] == [key]

    sync.push(alice)

    assert client.list_multipart_uploads(Bucket=s3_bucket.name).get("Uploads", []) == []
    assert client.head_object(Bucket=s3_bucket.name, Key=key)["ContentLength"] == alice.store.stored_size(big)
    sync.clone(url, tmp_path / "bob")
    Repo(tmp_path / "bob").checkout("m", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(src)
