"""`mgit serve` attacked: query parameters no int() accepts, connections that send nothing
or half a request, open redirects after the token link, Host headers that only start with
a loopback name, Ctrl-C, and a folder remote whose catalog.sqlite was forged.

Everything that concerns the server itself runs against a real `mgit serve` process on
127.0.0.1 over real sockets; every wait is bounded in count and time."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from urllib.parse import urljoin, urlsplit

import pytest
from conftest import MGIT, tensors

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.web import server  # noqa: E402
from mgit.web.app import create_app  # noqa: E402

BASE = "http://127.0.0.1:8808"
HOSTILE_NAME = "evil\x1b[31m<script>window.pwned=1</script>"


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    repo = Repo.init(tmp_path_factory.mktemp("hostile") / "repo")
    repo.add(tensors(1), name="base")
    repo.add(tensors(2), name="base")
    repo.add(tensors(3), name="ft", parent="base")
    return repo


def start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A real `mgit serve` on a free port of 127.0.0.1: the process and its address."""
    proc = subprocess.Popen([*MGIT, *args, "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})  # fmt: skip
    lines = []
    for _ in range(5):  # bounded: the address comes within the first lines
        line = proc.stdout.readline()  # type: ignore[union-attr]
        lines.append(line)
        m = re.search(r"at (http://127\.0\.0\.1:\d+/) \(read-only", line)
        if m:
            return proc, m[1]
        if not line:
            break
    proc.kill()
    raise AssertionError("".join(lines) + proc.stderr.read())  # type: ignore[union-attr]


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=20)


@pytest.fixture(scope="module")
def served(family: Repo) -> Iterator[str]:
    proc, address = start(["-C", str(family.root), "serve"])
    try:
        yield address
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def served_with_token(family: Repo) -> Iterator[str]:
    proc, address = start(["-C", str(family.root), "serve", "--token", "tok"])
    try:
        yield address
    finally:
        stop(proc)


def raw(address: str, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One request sent byte for byte (no client library normalizes it): status, headers, body."""
    parts = urlsplit(address)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(request)
        data = b""
        for _ in range(1000):  # bounded: the server closes after answering (Connection: close)
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def get(address: str, target: str, *, host: str | None = None, extra: str = "") -> tuple[int, dict[str, str], bytes]:
    host = host if host is not None else urlsplit(address).netloc
    return raw(address, f"GET {target} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n".encode("latin-1"))


# --- numbers in queries ---------------------------------------------------------------------
@pytest.mark.parametrize("value", ["²", "١", "9" * 5000, "1" + "0" * 30, "+1", " 1", "1 ", "1_0", "0x1", "-1", "1.0"])
def test_numeric_parameters_are_bounded_ascii_digits(family: Repo, value: str) -> None:
    """`str.isdigit()` accepts `²` (int() refuses: a 500 and a traceback) and `١` (int() says
    1), and int() of 5000 digits raises: every number is ASCII digits, a few of them, or 400."""
    with TestClient(create_app(family), base_url=BASE, raise_server_exceptions=False) as c:
        for path, name in (("/api/models", "page"), ("/api/models", "per_page"), ("/api/tests", "page"),
                           ("/api/storage", "per_page"), ("/api/models/base", "version"),
                           ("/api/models/base", "tpage"), ("/api/models/base", "tper_page")):  # fmt: skip
            r = c.get(path, params={name: value})
            assert r.status_code == 400, (path, name, r.text)
            assert r.json()["error"].startswith(f"query parameter {name!r}: a whole number from 1 to "), r.text
        r = c.get("/models", params={"page": value})
        assert r.status_code == 400 and "query parameter" in r.text
        assert c.get("/api/models", params={"page": "2", "per_page": "1"}).json()["page"] == 2  # still read


@pytest.mark.parametrize(("sel", "why"), [("²", ""), ("١", ""), ("9" * 290, "model 'base' has 2 versions; ")])
def test_a_version_number_in_a_ref_is_ascii_digits(family: Repo, sel: str, why: str) -> None:
    with TestClient(create_app(family), base_url=BASE, raise_server_exceptions=False) as c:
        r = c.get("/api/diff", params={"a": f"base@{sel}", "b": "ft"})
        assert r.status_code == 404 and r.json()["error"].startswith(f"{why}no version named 'base@{sel}'"), r.text
        r = c.get("/api/tests/result", params={"version": family.resolve("base") + "\n", "test": "acc"})
        assert r.status_code == 404, r.text


def test_numbers_on_the_real_server(served: str) -> None:
    status, _, body = get(served, "/api/models?page=%C2%B2")
    assert status == 400 and json.loads(body)["error"].startswith("query parameter 'page'")
    status, _, body = get(served, "/api/models/base?version=" + "9" * 5000)
    assert status == 400 and b"Traceback" not in body


# --- who may look: the Host header and the redirect after the token link ----------------------
@pytest.mark.parametrize("host", ["localhost:80@evil.com", "127.0.0.1:8808@evil.com", "localhost:8x08",
                                  "localhost:", "localhost:123456", "localhost:\u00b2", "127.0.0.1.evil.com",
                                  "[::1]evil.com", "[::1", "[::1]:80:80", "localhost/evil", "local_host",
                                  "localhost:80,evil.com", "", "localhost\\@evil.com", "[localhost]:80"])  # fmt: skip
def test_a_host_header_is_host_and_digits_port_exactly(served: str, host: str) -> None:
    status, _, body = get(served, "/api/models", host=host)
    assert status == 400, (host, body)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:8808", "LOCALHOST:1", "[::1]:8808", "127.1.2.3:80"])
def test_a_loopback_host_is_still_answered(served: str, host: str) -> None:
    status, _, body = get(served, "/api/models", host=host)
    assert status == 200 and json.loads(body)["total"] == 2, (host, body)


def test_two_host_headers_are_refused(family: Repo) -> None:
    """h11 refuses them itself; the app does too, whatever server runs it."""
    with TestClient(create_app(family), base_url=BASE) as c:
        for first, second in (("evil.example", "127.0.0.1"), ("127.0.0.1", "evil.example"), ("127.0.0.1", "127.0.0.1")):
            assert c.get("/api/models", headers=[("host", first), ("host", second)]).status_code == 400, first


@pytest.mark.parametrize("target", ["//evil.example/x", "///evil.example/x", "/\\evil.example/x",
                                    "/%2F%2Fevil.example/x", "/%2F/evil.example", "/%5Cevil.example",
                                    "/%5C%5Cevil.example", "/%09/evil.example", "/\\/evil.example",
                                    "//evil.example", "/%2F%5Cevil.example"])  # fmt: skip
def test_the_token_link_redirects_to_this_server_only(served_with_token: str, target: str) -> None:
    sep = "&" if "?" in target else "?"
    status, headers, _ = get(served_with_token, f"{target}{sep}token=tok")
    assert status == 303, target
    location = headers["location"]
    assert location.startswith("/") and location[1:2] not in ("/", "\\"), (target, location)
    assert not re.search(r"[\x00-\x20\\]", location), (target, location)
    assert urlsplit(urljoin(served_with_token, location)).netloc == urlsplit(served_with_token).netloc


def test_the_token_link_keeps_the_page_and_its_query(served_with_token: str) -> None:
    status, headers, _ = get(served_with_token, "/models/base?version=1&token=tok")
    assert status == 303 and headers["location"] == "/models/base?version=1"
    status, _, _ = get(served_with_token, "/api/models", extra="Cookie: mgit_token=tok\r\n")
    assert status == 200


# --- connections that say nothing -------------------------------------------------------------
def test_half_open_connections_are_closed_and_a_request_still_answered(family: Repo) -> None:
    """Connections that send nothing, half a request line, or a header a byte at a time are
    closed within the header timeout; past the connection limit the oldest waiting one makes
    room, so that a real request is answered while they are held."""
    held_count = server.MAX_CONNECTIONS + 40
    proc, address = start(["-C", str(family.root), "serve"])
    parts = urlsplit(address)
    held: list[socket.socket] = []
    trickle = None
    try:
        for i in range(held_count):
            s = socket.create_connection((parts.hostname, parts.port), timeout=10)
            if i % 2:
                s.sendall(b"GET /api/mod")
            held.append(s)
        trickle = socket.create_connection((parts.hostname, parts.port), timeout=10)
        trickle.sendall(b"GET /api/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        with urllib.request.urlopen(address + "api/models", timeout=10) as r:
            assert json.loads(r.read())["total"] == 2
        deadline = time.monotonic() + server.HEADER_TIMEOUT + 20  # bounded
        closed_trickle = False
        for _ in range(int(server.HEADER_TIMEOUT + 20) * 2):
            try:
                trickle.sendall(b"a")
            except OSError:
                closed_trickle = True
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert closed_trickle, "a header sent a byte at a time kept its connection"
        closed = 0
        for s in held:
            s.settimeout(max(0.1, deadline - time.monotonic()))
            try:
                closed += s.recv(1024) == b""
            except ConnectionResetError:
                closed += 1
            except TimeoutError:
                pass
        assert closed == held_count
        with urllib.request.urlopen(address + "api/models", timeout=10) as r:
            assert json.loads(r.read())["total"] == 2
    finally:
        for s in [*held, *([trickle] if trickle else [])]:
            s.close()
        stop(proc)


# --- Ctrl-C ------------------------------------------------------------------------------------
def test_ctrl_c_stops_the_server_quietly(family: Repo) -> None:
    proc, address = start(["-C", str(family.root), "serve"])
    with urllib.request.urlopen(address + "api/models", timeout=10) as r:
        assert r.status == 200
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == "", (proc.returncode, err)
