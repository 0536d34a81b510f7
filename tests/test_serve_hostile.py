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
import sqlite3
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest
from conftest import MGIT, run_cli, tensors

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mgit import Repo, sync  # noqa: E402
from mgit.web import server  # noqa: E402
from mgit.web.app import create_app  # noqa: E402

BASE = "http://127.0.0.1:8808"
HOSTILE_NAME = "evil\x1b[31m<script>window.pwned=1</script>"


@pytest.fixture(scope="module")
def two_models(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """base (two versions) and ft, a fine-tune of it."""
    repo = Repo.init(tmp_path_factory.mktemp("hostile") / "repo")
    repo.add(tensors(1), name="base")
    repo.add(tensors(2), name="base")
    repo.add(tensors(3), name="ft", parent="base")
    return repo


def start(args: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], str]:
    """A real `mgit serve` on a free port of 127.0.0.1: the process and its address."""
    proc = subprocess.Popen(
        [*MGIT, *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
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
def served(two_models: Repo) -> Iterator[str]:
    proc, address = start(["-C", str(two_models.root), "serve"])
    try:
        yield address
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def served_with_token(two_models: Repo) -> Iterator[str]:
    proc, address = start(["-C", str(two_models.root), "serve", "--token", "tok"])
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
def test_numeric_parameters_are_bounded_ascii_digits(two_models: Repo, value: str) -> None:
    """`str.isdigit()` accepts `²` (int() refuses: a 500 and a traceback) and `١` (int() says
    1), and int() of 5000 digits raises: every number is ASCII digits, a few of them, or 400."""
    with TestClient(create_app(two_models), base_url=BASE, raise_server_exceptions=False) as c:
        for path, name in (
            ("/api/models", "page"),
            ("/api/models", "per_page"),
            ("/api/tests", "page"),
            ("/api/storage", "per_page"),
            ("/api/models/base", "version"),
            ("/api/models/base", "tpage"),
            ("/api/models/base", "tper_page"),
        ):
            r = c.get(path, params={name: value})
            assert r.status_code == 400, (path, name, r.text)
            assert r.json()["error"].startswith(f"query parameter {name!r}: a whole number from 1 to "), r.text
        r = c.get("/models", params={"page": value})
        assert r.status_code == 400 and "query parameter" in r.text
        assert c.get("/api/models", params={"page": "2", "per_page": "1"}).json()["page"] == 2  # still read


@pytest.mark.parametrize(("sel", "why"), [("²", ""), ("١", ""), ("9" * 290, "model 'base' has 2 versions; ")])
def test_a_version_number_in_a_ref_is_ascii_digits(two_models: Repo, sel: str, why: str) -> None:
    with TestClient(create_app(two_models), base_url=BASE, raise_server_exceptions=False) as c:
        r = c.get("/api/diff", params={"a": f"base@{sel}", "b": "ft"})
        assert r.status_code == 404 and r.json()["error"].startswith(f"{why}no version named 'base@{sel}'"), r.text
        r = c.get("/api/tests/result", params={"version": two_models.resolve("base") + "\n", "test": "acc"})
        assert r.status_code == 404, r.text


@pytest.mark.parametrize("sel", ["²", "١", "9" * 5000])
def test_the_cli_reads_a_version_number_as_the_app_does(two_models: Repo, sel: str) -> None:
    """The same parsing behind `mgit show`: `base@²` was a ValueError and a traceback."""
    code, out, err = run_cli("-C", str(two_models.root), "show", f"base@{sel}")
    assert code == 1 and out == "" and err.startswith("Error: ") and f"no version named 'base@{sel}'" in err, err


def test_numbers_on_the_real_server(served: str) -> None:
    status, _, body = get(served, "/api/models?page=%C2%B2")
    assert status == 400 and json.loads(body)["error"].startswith("query parameter 'page'")
    status, _, body = get(served, "/api/models/base?version=" + "9" * 5000)
    assert status == 400 and b"Traceback" not in body


# --- who may look: the Host header and the redirect after the token link ----------------------
@pytest.mark.parametrize(
    "host",
    [
        "localhost:80@evil.com",
        "127.0.0.1:8808@evil.com",
        "localhost:8x08",
        "localhost:",
        "localhost:123456",
        "localhost:\u00b2",
        "127.0.0.1.evil.com",
        "[::1]evil.com",
        "[::1",
        "[::1]:80:80",
        "localhost/evil",
        "local_host",
        "localhost:80,evil.com",
        "",
        "localhost\\@evil.com",
        "[localhost]:80",
    ],
)
def test_a_host_header_is_host_and_digits_port_exactly(served: str, host: str) -> None:
    status, _, body = get(served, "/api/models", host=host)
    assert status == 400, (host, body)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:8808", "LOCALHOST:1", "[::1]:8808", "127.1.2.3:80"])
def test_a_loopback_host_is_still_answered(served: str, host: str) -> None:
    status, _, body = get(served, "/api/models", host=host)
    assert status == 200 and json.loads(body)["total"] == 2, (host, body)


def test_two_host_headers_are_refused(two_models: Repo) -> None:
    """h11 refuses them itself; the app does too, whatever server runs it."""
    with TestClient(create_app(two_models), base_url=BASE) as c:
        for first, second in (("evil.example", "127.0.0.1"), ("127.0.0.1", "evil.example"), ("127.0.0.1", "127.0.0.1")):
            assert c.get("/api/models", headers=[("host", first), ("host", second)]).status_code == 400, first


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example/x",
        "///evil.example/x",
        "/\\evil.example/x",
        "/%2F%2Fevil.example/x",
        "/%2F/evil.example",
        "/%5Cevil.example",
        "/%5C%5Cevil.example",
        "/%09/evil.example",
        "/\\/evil.example",
        "//evil.example",
        "/%2F%5Cevil.example",
        "http://evil.example/x",
    ],
)
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
def test_half_open_connections_are_closed_and_a_request_still_answered(two_models: Repo) -> None:
    """Connections that send nothing, half a request line, or a header a byte at a time are
    closed within the header timeout; past the connection limit the oldest waiting one makes
    room, so that a real request is answered while they are held."""
    held_count = server.MAX_CONNECTIONS + 40
    proc, address = start(["-C", str(two_models.root), "serve"])
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
def test_ctrl_c_stops_the_server_quietly(two_models: Repo) -> None:
    proc, address = start(["-C", str(two_models.root), "serve"])
    with urllib.request.urlopen(address + "api/models", timeout=10) as r:
        assert r.status == 200
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and err == "", (proc.returncode, err)


# --- a folder remote's catalog is not trusted ---------------------------------------------------
@pytest.fixture
def remote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder remote holding `m` (two versions), pushed to by a repository."""
    folder = tmp_path / "team.mgit"
    sync.init_bare(str(folder))
    pusher = Repo.init(tmp_path / "pusher")
    pusher.add(tensors(1), name="m", message="first")
    pusher.add(tensors(2, scale=2), name="m", message="second")
    sync.add_remote(pusher, "origin", str(folder))
    sync.push(pusher, "origin")
    monkeypatch.setenv("MGIT_MIRROR_CACHE", str(tmp_path / "mirrors"))
    return folder


def forge_catalog(folder: Path, head: str) -> None:
    """The catalog a folder remote's writer left, then edited: the head's message and tags
    changed, a lineage parent that does not exist, from a model with control characters and
    a script in its name, and a third version of `m` that does not exist either."""
    Repo(folder).catalog.close()  # made as mgit makes it
    fake, evil = "ab" * 32, "cd" * 32
    row = "(?, ?, ?, ?, NULL, ?, 'mallory', '2030-01-01T00:00:00Z', '{}', 0, 0, 0, 0, 0, 0, NULL, NULL, 0, NULL)"
    with sqlite3.connect(folder / "catalog.sqlite") as db:
        db.execute("UPDATE versions SET message = 'forged', tags = '{\"stage\": \"prod\"}' WHERE id = ?", (head,))
        db.execute(f"INSERT INTO versions VALUES {row}", (evil, HOSTILE_NAME, 1, evil, "forged"))
        db.execute("INSERT INTO edges VALUES (?, 0, ?, 'finetune')", (head, evil))
        db.execute(f"INSERT INTO versions VALUES {row}", (fake, "m", 3, fake, "forged <script>x</script>"))
    db.close()


def served_versions(address: str) -> dict[str, list[tuple]]:
    """Every model the server lists, and what it says of each of its versions."""
    with urllib.request.urlopen(address + "api/models", timeout=10) as r:
        names = [m["name"] for m in json.loads(r.read())["models"]]
    out = {}
    for name in names:
        with urllib.request.urlopen(address + "api/models/" + urllib.request.quote(name), timeout=10) as r:
            out[name] = [
                (v["seq"], v["id"], v["message"], v["tags"], v["parents"]) for v in json.loads(r.read())["versions"]
            ]
    return out


def test_a_forged_catalog_of_a_folder_remote_is_not_served(remote: Path, tmp_path: Path) -> None:
    pusher = Repo(tmp_path / "pusher")
    truth = {"m": [(v.seq, v.id, v.message, v.tags, []) for v in pusher.log("m")]}
    forge_catalog(remote, pusher.resolve("m"))
    before = (remote / "catalog.sqlite").read_bytes()
    for args in (["serve", str(remote)], ["-C", str(remote), "serve"]):
        proc, address = start(args)
        try:
            assert served_versions(address) == truth
            status, _, body = get(address, "/api/lineage")
            assert status == 200 and [n["name"] for n in json.loads(body)["nodes"]] == ["m"]
            status, _, _ = get(address, "/api/models/m?version=3")
            assert status == 400
            for page in ("/models", "/models/m", "/lineage", "/storage"):
                status, _, body = get(address, page)
                assert status == 200 and b"forged" not in body and b"evil" not in body, page
        finally:
            stop(proc)
    assert (remote / "catalog.sqlite").read_bytes() == before  # the remote is not written to


def test_a_folder_remote_served_shows_what_is_pushed_to_it(remote: Path, tmp_path: Path) -> None:
    """Served from a mirror, the remote is fetched again every few seconds while pages are
    read: a version pushed meanwhile appears, as it did when the folder was read in place."""
    refresh_every = 0.5  # (5 s unless told: the wait is what this test would spend)
    proc, address = start(["serve", str(remote)], env={"MGIT_SERVE_REFRESH_EVERY": str(refresh_every)})
    try:
        assert [v[0] for v in served_versions(address)["m"]] == [2, 1]
        pusher = Repo(tmp_path / "pusher")
        pusher.add(tensors(3, scale=3), name="m", message="third")
        sync.push(pusher, "origin")
        seen = []
        for _ in range(int((refresh_every + 20) * 10)):  # bounded: a refresh is due within refresh_every
            seen = [v[2] for v in served_versions(address)["m"]]
            if seen[0] == "third":
                break
            time.sleep(0.1)
        assert seen == ["third", "second", "first"]
    finally:
        stop(proc)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "3601"])
def test_a_refresh_interval_that_is_not_seconds_is_refused(
    two_models: Repo, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    from mgit.errors import InvalidOptionError
    from mgit.web.repoview import RepoView

    monkeypatch.setenv("MGIT_SERVE_REFRESH_EVERY", value)
    with pytest.raises(InvalidOptionError, match=f"MGIT_SERVE_REFRESH_EVERY={value!r} is not a number of seconds"):
        RepoView(two_models, refresh=lambda: None)


@pytest.mark.parametrize("kind", ["garbage", "fifo", "huge"])
def test_a_folder_remote_whose_catalog_is_not_sqlite_is_served(remote: Path, tmp_path: Path, kind: str) -> None:
    catalog = remote / "catalog.sqlite"
    catalog.unlink(missing_ok=True)
    if kind == "garbage":
        catalog.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    elif kind == "fifo":
        os.mkfifo(catalog)  # opening it would block forever
    else:
        with open(catalog, "wb") as f:  # sparse: a header, then 64 GiB of nothing
            f.write(b"SQLite format 3\x00\x10\x00\x01\x01")
            f.truncate(64 << 30)
    proc, address = start(["serve", str(remote)])
    try:
        assert [v[0] for v in served_versions(address)["m"]] == [2, 1]
    finally:
        stop(proc)
