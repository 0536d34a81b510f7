"""`mgit serve` attacked: query parameters no int() accepts, connections that send nothing
or half a request, open redirects after the token link, Host headers that only start with
a loopback name, Ctrl-C, and a folder remote whose catalog.sqlite was forged.

Everything that concerns the server itself runs against a real `mgit serve` process on
127.0.0.1 over real sockets; every wait is bounded in count and time."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from conftest import MGIT, tensors

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mgit import Repo  # noqa: E402
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
