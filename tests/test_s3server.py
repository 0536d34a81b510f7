"""The S3 test server and the fault proxy do what tests of S3 remotes rely on.

Round trips are byte-exact (single put, multipart, ranges), moto honours the conditional writes
a remote uses as compare-and-swap, and the proxy forwards unchanged bytes or injects the faults
it was asked for, so that retrying code can be tested against them.
"""
# ruff: noqa: F811  (test arguments named after the imported fixtures are how pytest injects them)

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import os
import socket
import threading
import time
import zlib

import boto3
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionError, HTTPClientError
from s3server import FaultProxy, S3Server, s3_bucket, s3_client, s3_server  # noqa: F401

MiB = 1024 * 1024
NO_RETRIES = Config(retries={"total_max_attempts": 1})  # {"max_attempts": 1} still retries once
SEQUENTIAL_MULTIPART = TransferConfig(
    multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB, max_concurrency=1, use_threads=False
)


def payload(size: int, seed: int = 0) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (size // 32 + 1))[:size]


def random_payload(size: int) -> bytes:
    return os.urandom(size)


def error_of(exc: ClientError) -> tuple[int, str]:
    return exc.response["ResponseMetadata"]["HTTPStatusCode"], exc.response["Error"]["Code"]


def multipart_etag(data: bytes, part_size: int) -> str:
    digests = b"".join(hashlib.md5(data[i : i + part_size]).digest() for i in range(0, len(data), part_size))
    return f'"{hashlib.md5(digests).hexdigest()}-{-(-len(data) // part_size)}"'


# --- the server ---------------------------------------------------------------------------


def test_put_get_round_trip_is_byte_exact_with_md5_etag(s3_bucket):
    s3, data = s3_bucket.client(), random_payload(6 * MiB + 7)
    put = s3.put_object(Bucket=s3_bucket.name, Key="blobs/big", Body=data)
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    got = s3.get_object(Bucket=s3_bucket.name, Key="blobs/big")
    assert got["Body"].read() == data
    assert got["ETag"] == put["ETag"]


def test_multipart_upload_round_trip_is_byte_exact(s3_bucket):
    s3, data = s3_bucket.client(), random_payload(12 * MiB + 3)
    config = TransferConfig(multipart_threshold=5 * MiB, multipart_chunksize=5 * MiB)
    s3.upload_fileobj(io.BytesIO(data), s3_bucket.name, "blobs/multi", Config=config)
    assert s3.head_object(Bucket=s3_bucket.name, Key="blobs/multi")["ETag"] == multipart_etag(data, 5 * MiB)
    out = io.BytesIO()
    s3.download_fileobj(s3_bucket.name, "blobs/multi", out, Config=config)
    assert out.getvalue() == data


def test_range_get_returns_exact_slice(s3_bucket):
    s3, data = s3_bucket.client(), payload(100_000)
    s3.put_object(Bucket=s3_bucket.name, Key="r", Body=data)
    got = s3.get_object(Bucket=s3_bucket.name, Key="r", Range="bytes=1000-1999")
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    assert got["Body"].read() == data[1000:2000]


def test_buckets_are_fresh_per_test(s3_server):
    first, second = s3_server.new_bucket(), s3_server.new_bucket()
    assert first != second
    assert s3_server.client().list_objects_v2(Bucket=second)["KeyCount"] == 0


def test_default_credential_chain_finds_the_server(s3_bucket):
    assert os.environ["AWS_ENDPOINT_URL"] == s3_bucket.endpoint
    s3 = boto3.client("s3")  # nothing passed: environment only
    assert s3.meta.endpoint_url == s3_bucket.endpoint
    s3.put_object(Bucket=s3_bucket.name, Key="env", Body=b"found")
    assert s3_bucket.client().get_object(Bucket=s3_bucket.name, Key="env")["Body"].read() == b"found"


def test_stop_ends_exactly_the_server_process():
    server = S3Server()
    port = int(server.endpoint.rsplit(":", 1)[1])
    server.client().list_buckets()
    server.stop()
    assert server.process.returncode is not None
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    server.stop()  # twice is harmless


# --- conditional writes ---------------------------------------------------------------------


def test_if_none_match_star_creates_only_new_keys(s3_bucket):
    s3, bucket = s3_bucket.client(), s3_bucket.name
    s3.put_object(Bucket=bucket, Key="refs/main", Body=b"v1", IfNoneMatch="*")
    with pytest.raises(ClientError) as failed:
        s3.put_object(Bucket=bucket, Key="refs/main", Body=b"v2", IfNoneMatch="*")
    assert error_of(failed.value) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=bucket, Key="refs/main")["Body"].read() == b"v1"


def test_if_match_is_compare_and_swap_on_the_etag(s3_bucket):
    s3, bucket = s3_bucket.client(), s3_bucket.name
    seen = s3.put_object(Bucket=bucket, Key="refs/main", Body=b"v1")["ETag"]
    moved = s3.put_object(Bucket=bucket, Key="refs/main", Body=b"v2", IfMatch=seen)["ETag"]
    assert moved == f'"{hashlib.md5(b"v2").hexdigest()}"'
    with pytest.raises(ClientError) as failed:  # `seen` is stale now
        s3.put_object(Bucket=bucket, Key="refs/main", Body=b"v3", IfMatch=seen)
    assert error_of(failed.value) == (412, "PreconditionFailed")
    assert s3.get_object(Bucket=bucket, Key="refs/main")["Body"].read() == b"v2"
    s3.put_object(Bucket=bucket, Key="refs/main", Body=b"v3", IfMatch=moved.strip('"'))  # quotes optional


def test_if_match_on_a_missing_key_is_no_such_key(s3_bucket):
    with pytest.raises(ClientError) as failed:
        s3_bucket.client().put_object(Bucket=s3_bucket.name, Key="absent", Body=b"x", IfMatch='"0"')
    assert error_of(failed.value) == (404, "NoSuchKey")


def test_delete_if_match_refuses_a_stale_etag(s3_bucket):
    s3, bucket = s3_bucket.client(), s3_bucket.name
    stale = s3.put_object(Bucket=bucket, Key="k", Body=b"1")["ETag"]
    current = s3.put_object(Bucket=bucket, Key="k", Body=b"2")["ETag"]
    with pytest.raises(ClientError) as failed:
        s3.delete_object(Bucket=bucket, Key="k", IfMatch=stale)
    assert error_of(failed.value) == (412, "PreconditionFailed")
    s3.delete_object(Bucket=bucket, Key="k", IfMatch=current)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_complete_multipart_honours_if_none_match_but_ignores_if_match(s3_bucket):
    """moto 5.2.5 checks only If-None-Match on CompleteMultipartUpload; real S3 checks both."""
    s3, bucket, data = s3_bucket.client(), s3_bucket.name, payload(5 * MiB + 10)

    def complete(**condition):
        upload = s3.create_multipart_upload(Bucket=bucket, Key="m")["UploadId"]
        parts = [
            {
                "PartNumber": n,
                "ETag": s3.upload_part(Bucket=bucket, Key="m", UploadId=upload, PartNumber=n, Body=chunk)["ETag"],
            }
            for n, chunk in ((1, data[: 5 * MiB]), (2, data[5 * MiB :]))
        ]
        return s3.complete_multipart_upload(
            Bucket=bucket, Key="m", UploadId=upload, MultipartUpload={"Parts": parts}, **condition
        )

    assert complete(IfNoneMatch="*")["ETag"] == multipart_etag(data, 5 * MiB)
    with pytest.raises(ClientError) as failed:
        complete(IfNoneMatch="*")
    assert error_of(failed.value) == (412, "PreconditionFailed")
    complete(IfMatch='"not-the-etag"')  # would be 412 on AWS


# --- the fault proxy --------------------------------------------------------------------------


def test_a_latency_proxy_delays_each_request_and_is_bounded(s3_bucket):
    with pytest.raises(ValueError):
        FaultProxy(s3_bucket.endpoint, latency=5.0)  # beyond MAX_LATENCY: a hang, not a latency
    with FaultProxy(s3_bucket.endpoint, latency=0.2) as proxy:
        s3 = s3_client(proxy.endpoint)
        started = time.monotonic()
        for i in range(3):
            s3.put_object(Bucket=s3_bucket.name, Key=f"k{i}", Body=b"x")
        assert time.monotonic() - started >= 3 * 0.2  # each request waited (a lower bound only)
        assert s3.get_object(Bucket=s3_bucket.name, Key="k1")["Body"].read() == b"x"
        assert [r.method for r in proxy.seen] == ["PUT", "PUT", "PUT", "GET"]
        s3.list_objects_v2(Bucket=s3_bucket.name)
        assert proxy.kinds() == {"PUT": 3, "GET": 1, "LIST": 1} and proxy.kinds(3) == {"GET": 1, "LIST": 1}


def test_proxy_round_trip_is_byte_exact_and_counted(s3_bucket):
    with FaultProxy(s3_bucket.endpoint) as proxy:
        s3, data = s3_client(proxy.endpoint), random_payload(3 * MiB + 1)
        s3.put_object(Bucket=s3_bucket.name, Key="k", Body=data)
        s3.upload_fileobj(io.BytesIO(data * 3), s3_bucket.name, "multi", Config=SEQUENTIAL_MULTIPART)
        assert s3.get_object(Bucket=s3_bucket.name, Key="k")["Body"].read() == data
        assert s3.head_object(Bucket=s3_bucket.name, Key="k")["ContentLength"] == len(data)
        ranged = s3.get_object(Bucket=s3_bucket.name, Key="multi", Range=f"bytes={len(data) - 5}-{len(data) + 4}")
        assert ranged["Body"].read() == (data * 3)[len(data) - 5 : len(data) + 5]
        # put, create + 2 parts + complete, get, head, range get
        assert proxy.requests == 8 and proxy.faults == 0
        assert [r.method for r in proxy.seen] == ["PUT", "POST", "PUT", "PUT", "POST", "GET", "HEAD", "GET"]


def address(endpoint: str) -> tuple[str, int]:
    host, port = endpoint.removeprefix("http://").split(":")
    return host, int(port)


class RecordingUpstream:
    """A stand-in server that records every byte of one connection, then answers and closes."""

    def __init__(self, answer: bytes) -> None:
        self.received = b""
        self._answer = answer
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(5)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        conn, _ = self._listener.accept()
        conn.settimeout(5)
        with conn:
            for _ in range(10_000):
                data = conn.recv(65536)
                if not data:
                    break
                self.received += data
            conn.sendall(self._answer)
        self._listener.close()

    def join(self) -> None:
        self._thread.join(10)


def aws_chunked(data: bytes, chunk: int) -> bytes:
    """The aws-chunked encoding (unsigned, with a CRC32 trailer) that SDKs use over TLS."""
    body = b"".join(
        f"{len(data[i : i + chunk]):x}\r\n".encode() + data[i : i + chunk] + b"\r\n" for i in range(0, len(data), chunk)
    )
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big"))
    return body + b"0\r\nx-amz-checksum-crc32:" + crc + b"\r\n\r\n"


def test_proxy_forwards_request_bytes_unchanged():
    data = random_payload(200_000)
    chunked = b"".join(f"{len(part):X};ext=1\r\n".encode() + part + b"\r\n" for part in (data[:70_000], data[70_000:]))
    requests = (
        b"PUT /b/plain?x=%2F HTTP/1.1\r\nHost: h\r\nContent-Length: 200000\r\n\r\n"
        + data
        + b"PUT /b/chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n"
        + b"Content-Encoding: aws-chunked\r\nX-Custom:  spaced \r\n\r\n"
        + chunked
        + b"0\r\nx-amz-checksum-crc32: AAAAAA==\r\n\r\n"
        + b"HEAD /b/plain HTTP/1.1\r\nHost: h\r\n\r\n"
        + b"GET /b/plain HTTP/1.1\r\nHost: h\r\nRange: bytes=0-9\r\n\r\n"
    )
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    upstream = RecordingUpstream(answer)
    with FaultProxy(upstream.endpoint) as proxy, socket.create_connection(address(proxy.endpoint), timeout=5) as client:
        client.sendall(requests)
        client.shutdown(socket.SHUT_WR)  # the proxy relays the end, the upstream then answers
        reply = b"".join(iter(lambda: client.recv(65536), b""))
        upstream.join()
        assert upstream.received == requests
        assert reply == answer
        assert [(r.method, r.target) for r in proxy.seen] == [
            ("PUT", "/b/plain?x=%2F"),
            ("PUT", "/b/chunked"),
            ("HEAD", "/b/plain"),
            ("GET", "/b/plain"),
        ]


def test_proxy_forwards_chunked_and_aws_chunked_uploads_to_s3(s3_bucket):
    data = random_payload(300_000)
    with FaultProxy(s3_bucket.endpoint) as proxy:
        conn = http.client.HTTPConnection(*address(proxy.endpoint), timeout=10)
        pieces = [data[i : i + 50_000] for i in range(0, len(data), 50_000)]
        conn.request("PUT", f"/{s3_bucket.name}/plain", body=iter(pieces), encode_chunked=True)
        assert conn.getresponse().read() is not None
        encoded = aws_chunked(data, 64 * 1024)
        headers = {
            "Content-Encoding": "aws-chunked",
            "X-Amz-Decoded-Content-Length": str(len(data)),
            "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
            "X-Amz-Trailer": "x-amz-checksum-crc32",
        }
        body = iter([encoded[i : i + 40_000] for i in range(0, len(encoded), 40_000)])
        conn.request("PUT", f"/{s3_bucket.name}/aws", body=body, headers=headers, encode_chunked=True)
        response = conn.getresponse()
        response.read()
        conn.close()
        assert response.status == 200 and proxy.requests == 2
    s3 = s3_bucket.client()
    assert s3.get_object(Bucket=s3_bucket.name, Key="plain")["Body"].read() == data
    assert s3.get_object(Bucket=s3_bucket.name, Key="aws")["Body"].read() == data


@pytest.mark.parametrize("mode", ["drop", "500", "503"])
def test_default_retries_ride_out_every_third_request_failing(s3_bucket, mode):
    data = random_payload(11 * MiB)
    with FaultProxy(s3_bucket.endpoint, every=3, mode=mode) as proxy:
        s3 = s3_client(proxy.endpoint)
        s3.put_object(Bucket=s3_bucket.name, Key="small", Body=data[:1000])
        s3.upload_fileobj(io.BytesIO(data), s3_bucket.name, "multi", Config=SEQUENTIAL_MULTIPART)
        assert s3.head_object(Bucket=s3_bucket.name, Key="multi")["ContentLength"] == len(data)
        assert s3.get_object(Bucket=s3_bucket.name, Key="small")["Body"].read() == data[:1000]
        out = io.BytesIO()
        s3.download_fileobj(s3_bucket.name, "multi", out, Config=SEQUENTIAL_MULTIPART)
        assert out.getvalue() == data
        assert proxy.faults >= 3
        assert proxy.faults == sum(1 for r in proxy.seen if r.fault == mode) == proxy.requests // 3


@pytest.mark.parametrize(("mode", "status", "code"), [("500", 500, "InternalError"), ("503", 503, "SlowDown")])
@pytest.mark.parametrize("body", [b"bytes", io.BytesIO(b"file-like, sent after 100-continue")], ids=["bytes", "stream"])
def test_without_retries_an_injected_error_surfaces(s3_bucket, mode, status, code, body):
    with FaultProxy(s3_bucket.endpoint, every=1, mode=mode) as proxy:
        with pytest.raises(ClientError) as failed:
            s3_client(proxy.endpoint, NO_RETRIES).put_object(Bucket=s3_bucket.name, Key="k", Body=body)
        assert error_of(failed.value) == (status, code)
        with pytest.raises(ClientError) as failed:
            s3_client(proxy.endpoint, NO_RETRIES).head_object(Bucket=s3_bucket.name, Key="k")
        assert error_of(failed.value) == (status, "503" if mode == "503" else "500")  # HEAD has no body
        assert proxy.requests == proxy.faults == 2


def test_without_retries_a_dropped_connection_surfaces(s3_bucket):
    with FaultProxy(s3_bucket.endpoint, every=1, mode="drop") as proxy:
        s3 = s3_client(proxy.endpoint, NO_RETRIES)
        with pytest.raises((ConnectionError, HTTPClientError)):
            s3.put_object(Bucket=s3_bucket.name, Key="k", Body=random_payload(2 * MiB))
        with pytest.raises((ConnectionError, HTTPClientError)):
            s3.get_object(Bucket=s3_bucket.name, Key="k")
        assert proxy.requests == proxy.faults == 2
    assert s3_bucket.client().list_objects_v2(Bucket=s3_bucket.name)["KeyCount"] == 0


def test_fault_filter_and_cap_pick_which_requests_fail(s3_bucket):
    with FaultProxy(s3_bucket.endpoint, every=1, mode="503", methods={"PUT"}, path=r"/refs/", max_faults=1) as proxy:
        s3 = s3_client(proxy.endpoint, NO_RETRIES)
        s3.put_object(Bucket=s3_bucket.name, Key="objects/a", Body=b"a")
        with pytest.raises(ClientError):
            s3.put_object(Bucket=s3_bucket.name, Key="refs/main", Body=b"1")
        s3.put_object(Bucket=s3_bucket.name, Key="refs/main", Body=b"2")  # the cap is reached
        assert s3.get_object(Bucket=s3_bucket.name, Key="refs/main")["Body"].read() == b"2"
        assert [r.fault for r in proxy.seen] == [None, "503", None, None]
        proxy.set_faults(every=2, mode="500", methods={"GET"})
        s3.get_object(Bucket=s3_bucket.name, Key="refs/main")
        with pytest.raises(ClientError):
            s3.get_object(Bucket=s3_bucket.name, Key="refs/main")
        assert proxy.faults == 2


def test_stall_holds_requests_after_the_first_ones_and_bytes_are_counted(s3_bucket):
    with FaultProxy(s3_bucket.endpoint, every=1, after=1, mode="stall", methods={"PUT"}) as proxy:
        s3 = s3_client(proxy.endpoint, Config(retries={"total_max_attempts": 1}, read_timeout=1, connect_timeout=1))
        s3.put_object(Bucket=s3_bucket.name, Key="first", Body=b"x" * 1000)
        with pytest.raises(HTTPClientError):  # held unanswered: the client's read times out
            s3.put_object(Bucket=s3_bucket.name, Key="second", Body=b"y" * 1000)
        assert [(r.method, r.fault) for r in proxy.seen] == [("PUT", None), ("PUT", "stall")]
        assert proxy.bytes_up > 1000 and proxy.bytes_down > 0
        up = proxy.bytes_up
        got = s3.get_object(Bucket=s3_bucket.name, Key="first", Range="bytes=10-19")
        assert got["Body"].read() == b"x" * 10
        assert proxy.seen[-1].range == "bytes=10-19" and proxy.bytes_up > up
    assert [o["Key"] for o in s3_bucket.client().list_objects_v2(Bucket=s3_bucket.name)["Contents"]] == ["first"]


def test_proxy_stop_closes_open_connections_promptly(s3_bucket):
    import contextlib
    import socket
    import time
    from urllib.parse import urlsplit

    proxy = FaultProxy(s3_bucket.endpoint)
    s3 = s3_client(proxy.endpoint, NO_RETRIES)
    s3.put_object(Bucket=s3_bucket.name, Key="k", Body=b"x")
    where = urlsplit(proxy.endpoint)
    # A connection that stays open whatever the server does with keep-alive: connected, silent.
    with socket.create_connection((where.hostname, where.port), timeout=10) as held:
        for _ in range(200):  # bounded wait for the proxy to take it (its relay thread starts)
            if proxy.open_connections >= 1:
                break
            time.sleep(0.05)
        assert proxy.open_connections >= 1
        proxy.stop()  # cuts it: its relay would otherwise wait out the proxy's 30 s timeout, past stop's wait
        assert proxy.open_connections == 0
        with contextlib.suppress(ConnectionResetError):  # closed from the proxy's side: end of stream, or a reset
            assert held.recv(1) == b""
    with pytest.raises((ConnectionError, HTTPClientError)):
        s3.get_object(Bucket=s3_bucket.name, Key="k")
    proxy.stop()  # twice is harmless


def test_proxy_rejects_unknown_fault_modes():
    with pytest.raises(ValueError, match="fault mode"):
        FaultProxy("http://127.0.0.1:9", mode="teapot")
