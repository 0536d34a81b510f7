"""`mgit serve` without a browser: the JSON twins against the library's own results, the
pages rendered with everything users wrote escaped, the model card sanitized, search,
filters and pages, the token rule, and no request parameter reaching the filesystem.
(tests/test_serve_browser.py drives the same pages in Chromium.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import CARD, MGIT, make_model, mgit_json, tensors

pytest.importorskip("starlette")
from starlette.testclient import TestClient  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.errors import TokenRequiredError  # noqa: E402
from mgit.web import access, graph_json  # noqa: E402
from mgit.web.app import create_app  # noqa: E402
from mgit.web.card import MAX_CARD_BYTES, TOO_LARGE, render_card, version_card  # noqa: E402

BASE = "http://127.0.0.1:8808"


@pytest.fixture(scope="module")
def client(web_family: Repo) -> Iterator[TestClient]:
    with TestClient(create_app(web_family), base_url=BASE) as c:
        yield c


def rounded(value: object) -> object:
    """Floats to 12 digits: mgit.diff sums over tensors in the order they finish (last bits vary)."""
    if isinstance(value, float):
        return float(f"{value:.12g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return [rounded(v) for v in value] if isinstance(value, list) else value


def finished_diff(client: TestClient, a: str, b: str) -> dict:
    for _ in range(200):  # bounded: 20 s at most
        r = client.get("/api/diff", params={"a": a, "b": b})
        assert r.status_code in (200, 202), r.text
        if r.json()["state"] == "done":
            return r.json()
        time.sleep(0.1)
    raise AssertionError("the diff did not finish")


# --- JSON twins: the library's own results ------------------------------------------------
def test_models_json_is_the_lineage_with_test_status(client: TestClient, web_family: Repo) -> None:
    data = client.get("/api/models").json()
    lineage = web_family.lineage
    assert [m["name"] for m in data["models"]] == ["base", "org/ft", "other", "q8"] and data["total"] == 4
    by = {m["name"]: m for m in data["models"]}
    for name, m in by.items():
        node = lineage.node(name)
        assert (m["head"], m["seq"], m["tags"], m["logical_bytes"], m["stored_bytes"]) == (
            node.head,
            node.seq,
            node.tags,
            node.logical_bytes,
            node.stored_bytes,
        )
        assert [(p["model"], p["relation"], p["stale"]) for p in m["parents"]] == [
            (e.parent, e.relation, e.stale) for e in lineage.parents(name)
        ]
    assert by["org/ft"]["parents"][0]["stale"] and not by["q8"]["parents"][0]["stale"]
    assert by["q8"]["tests"] == {"status": "fail", "pass": 0, "fail": 1, "error": 0, "not run": 0}
    assert by["base"]["tests"]["status"] == "pass"


def test_model_json_is_show_log_and_lineage(client: TestClient, web_family: Repo) -> None:
    data = client.get("/api/models/org/ft").json()
    assert data["version"] == json.loads(json.dumps(web_family.show("org/ft").to_json()))
    assert data["versions"] == json.loads(json.dumps([v.to_json() for v in web_family.log("org/ft")]))
    assert data["parents"] == [e.to_json() for e in web_family.lineage.parents("org/ft")]
    assert [e["child"] for e in data["children"]] == ["q8"]
    manifest = web_family.manifest("org/ft")
    assert [t["name"] for t in data["tensors"]["items"]] == [t.name for t in manifest.tensors()]
    assert {t["storage"] for t in data["tensors"]["items"]} <= {"delta", "derived", "standalone"}
    assert data["tensors"]["items"] == mgit_json(web_family.root, "show", "org/ft", "--tensors")["tensors"]
    assert data["card"]["front_matter"]["base_model"] == "base"
    old = client.get("/api/models/base", params={"version": 1}).json()
    assert old["version"]["version"]["seq"] == 1 and old["model"]["seq"] == 2
    assert old["tests"]["names"] == ["acc"]
    assert [v["seq"] for v in old["tests"]["versions"]] == [2, 1]


def test_diff_json_is_repo_diff_with_a_heatmap_row_per_layer(client: TestClient, web_family: Repo) -> None:
    data = finished_diff(client, "base@1", "org/ft")
    expected = json.loads(json.dumps(web_family.diff("base@1", "org/ft").to_json()))
    for result in (data["result"], expected):  # how many decodes a shared base saved depends on timing
        del result["summary"]["decoded"], result["summary"]["reused"]
    assert rounded(data["result"]) == rounded(expected)
    assert data["done"] == data["total"] > 0
    heat = data["heatmap"]
    assert [r["group"] for r in heat["rows"]] == [g["name"] for g in expected["groups"]]
    assert set(heat["kinds"]) == {"weight", "bias", "(whole)"}
    cell = heat["rows"][1]["cells"]["weight"]  # layer.0.weight
    assert cell["rel_change"] == pytest.approx(
        next(t["stats"]["rel_change"] for t in expected["tensors"] if t["name"] == "layer.0.weight")
    )
    page = client.get("/diff", params={"a": "base@1", "b": "org/ft"}).text
    assert page.count('class="heat-row"') == len(expected["groups"])


def test_storage_and_lineage_json(client: TestClient, web_family: Repo) -> None:
    data = client.get("/api/storage").json()
    du = web_family.du().to_json()
    assert data["summary"] == {k: v for k, v in du.items() if k != "models"}
    assert sorted(
        ({k: v for k, v in m.items() if k != "bars"} for m in data["models"]), key=lambda m: m["name"]
    ) == sorted(du["models"], key=lambda m: m["name"])
    assert [m["stored_bytes"] for m in data["models"]] == sorted(
        (m["stored_bytes"] for m in du["models"]), reverse=True
    )
    graph = web_family.lineage.subgraph()
    storage = web_family.storage([v.id for vs in graph.versions.values() for v in vs])
    assert client.get("/api/lineage").json() == json.loads(json.dumps(graph_json(graph, storage=storage)))
    around = client.get("/api/lineage", params={"around": "q8"}).json()
    assert sorted(n["name"] for n in around["nodes"]) == ["base", "org/ft", "q8"]


def test_tests_matrix_and_result(client: TestClient, web_family: Repo) -> None:
    data = client.get("/api/tests").json()
    assert data["names"] == ["acc"]
    cells = {r["model"]: r["cells"]["acc"] for r in data["rows"]}
    assert (
        cells["q8"]["status"] == "fail" and cells["q8"]["parent_status"] == "pass" and cells["q8"]["change"] == "broke"
    )
    assert cells["other"]["status"] == "pass" and cells["other"]["change"] is None
    assert data["totals"] == {"pass": 3, "fail": 1, "error": 0, "not run": 0}
    assert [r["model"] for r in client.get("/api/tests", params={"show": "failing"}).json()["rows"]] == ["q8"]
    q8 = web_family.resolve("q8")
    result = client.get("/api/tests/result", params={"version": q8, "test": "acc"}).json()["result"]
    assert result["status"] == "fail" and result["metrics"] == {"acc": 0.2} and "window.pwned = 7" in result["output"]
    assert result["parent"] == "org/ft@1" and result["parent_status"] == "pass"


def test_what_is_kept_is_dropped_when_a_head_moves(tmp_path: Path) -> None:
    # The graph, its storage, its page and its JSON are kept between requests, until a model moves.
    repo = Repo.init(tmp_path / "repo")
    repo.add(tensors(1), name="m")
    with TestClient(create_app(repo), base_url=BASE) as c:
        for _ in range(2):
            assert [n["name"] for n in c.get("/api/lineage").json()["nodes"]] == ["m"]
            assert "m2" not in c.get("/lineage").text
        repo.add(tensors(2), name="m2", parent="m")
        assert [n["name"] for n in c.get("/api/lineage").json()["nodes"]] == ["m", "m2"]
        assert "m2" in c.get("/lineage").text
        assert set(c.get("/api/lineage", params={"around": "m2"}).json()["storage"]) == {
            repo.resolve("m"),
            repo.resolve("m2"),
        }


# --- pages: escaping, sanitizing, headers ---------------------------------------------------
PAGES = [
    "/models",
    "/models/org/ft",
    "/models/base?version=1",
    "/models/q8",
    "/tests",
    "/storage",
    "/diff",
    "/lineage",
    "/lineage?around=org/ft",
]


def test_every_page_escapes_what_users_wrote(client: TestClient, web_family: Repo) -> None:
    finished_diff(client, "base@1", "org/ft")
    q8 = web_family.resolve("q8")
    for url in [*PAGES, "/diff?a=base@1&b=org/ft", f"/tests/result?version={q8}&test=acc"]:
        r = client.get(url)
        assert r.status_code == 200, url
        body = r.text
        tags = parsed(body)
        assert not [t for t, _ in tags if t in ("img", "iframe", "object", "embed")], url
        assert not [a for _, attrs in tags for a, v in attrs if a.startswith("on") or "javascript:" in (v or "")], url
        scripts = [dict(attrs) for t, attrs in tags if t == "script"]
        own = (
            [{"src": "/static/app.js", "defer": None}]
            if not url.startswith("/lineage")
            else [{"type": "application/json", "id": "mgit-data"}, {}]
        )
        assert scripts == own, url
        csp = r.headers["content-security-policy"]
        assert (
            "default-src 'none'" in csp
            and "unsafe-inline" not in csp
            and r.headers["x-content-type-options"] == "nosniff"
        )
        assert not [
            v
            for _, attrs in tags
            for a, v in attrs
            if a in ("src", "href") and "//" in (v or "") and not (v or "").startswith("https://example.com/doc")
        ], url  # nothing from elsewhere


def parsed(page: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Every start tag of a page with its attributes, as a browser's tokenizer sees them."""
    found = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            found.append((tag, attrs))

    Tags().feed(page)
    return found


def test_model_card_is_rendered_and_sanitized() -> None:
    card = render_card(CARD.encode())
    assert card.front_matter == {"base_model": "base", "license": "<script>window.pwned = 3</script>"}
    assert "<table>" in card.html and "<h1>The card</h1>" in card.html
    assert '<a href="https://example.com/doc" rel="noopener noreferrer nofollow">safe</a>' in card.html
    tags = parsed(card.html)
    assert {t for t, _ in tags} <= {"h1", "p", "a", "table", "thead", "tbody", "tr", "th", "td"}
    assert [dict(attrs).get("href") for t, attrs in tags if t == "a"] == ["https://example.com/doc"]
    assert render_card(b"\xff\xfe").note and render_card(b"x" * (2 << 20)).note
    assert render_card(b"---\nnot: [closed\n---\nbody").html == "<p>body</p>\n"


def test_a_card_too_large_to_render_is_not_read(tmp_path: Path) -> None:
    folder = make_model(tmp_path / "m", seed=1)
    (folder / "README.md").write_bytes(b"x" * (MAX_CARD_BYTES + 1))
    repo = Repo.init(tmp_path / "repo")
    repo.add(folder, name="m")

    class Unread:
        def get(self, oid: str, **_: object) -> object:
            raise AssertionError(f"read {oid}")

    assert version_card(repo.manifest("m"), Unread()) == render_card(b"x" * (MAX_CARD_BYTES + 1))  # type: ignore[arg-type]
    with TestClient(create_app(repo), base_url=BASE) as c:
        assert c.get("/api/models/m").json()["card"] == {
            "path": "README.md",
            "front_matter": {},
            "html": "",
            "note": TOO_LARGE,
        }


def test_search_filters_sorting_and_pages(client: TestClient) -> None:
    def names(**params: str) -> list[str]:
        return [m["name"] for m in client.get("/api/models", params=params).json()["models"]]

    assert names(q="FT") == ["org/ft"] and names(q="task=nli") == ["other"]
    assert names(tag="task") == ["org/ft", "other"] and names(tag="task=sst2") == ["org/ft"]
    assert names(relation="quantize") == ["q8"] and names(relation="merge") == []
    assert names(sort="name", order="desc") == ["q8", "other", "org/ft", "base"]
    assert names(sort="tests")[0] == "q8"
    first, last = (client.get("/api/models", params={"per_page": "3", "page": p}).json() for p in ("1", "9"))
    assert (first["pages"], len(first["models"]), last["page"], [m["name"] for m in last["models"]]) == (
        2,
        3,
        2,
        ["q8"],
    )
    page = client.get("/models", params={"per_page": "3"}).text
    assert 'rel="next"' in page and "page 1 of 2" in page
    tensors_page = client.get("/api/models/org/ft", params={"tper_page": "2", "tpage": "2"}).json()["tensors"]
    assert tensors_page["page"] == 2 and len(tensors_page["items"]) == 2
    for bad in ({"page": "x"}, {"sort": "evil"}, {"per_page": "100000"}, {"relation": "<x>"}, {"q": "x" * 400}):
        r = client.get("/api/models", params=bad)
        assert r.status_code == 400 and "query parameter" in r.json()["error"], bad


def test_unknown_things_are_404_pages(client: TestClient, web_family: Repo) -> None:
    r = client.get("/models/<b>nope</b>")
    assert r.status_code == 404 and "no model named" in r.text and "<b>nope</b>" not in r.text
    r = client.get("/api/models/nope")
    assert r.status_code == 404 and r.json() == {"error": "no model named 'nope'", "hint": "See: mgit ls"}
    assert client.get("/models/base", params={"version": "7"}).status_code == 400
    assert client.get("/api/diff", params={"a": "base", "b": "nope@3"}).status_code == 404
    assert client.get("/api/diff", params={"a": "base"}).status_code == 400
    assert client.get("/api/tests/result", params={"version": "../../etc", "test": "acc"}).status_code == 404
    base = web_family.resolve("base")
    assert client.get("/api/tests/result", params={"version": base, "test": "x"}).status_code == 404
    assert client.get("/no/such/page").status_code == 404
    assert client.get("/api/lineage", params={"around": "nope"}).status_code == 404


def test_no_request_parameter_reaches_the_filesystem(
    client: TestClient, web_family: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `mgit diff` compares a folder that exists; the server only ever resolves refs.
    make_model(tmp_path / "mystery", seed=9)
    monkeypatch.chdir(tmp_path)
    for a in ("mystery", str(tmp_path / "mystery"), "/etc/passwd", "../mystery", "mystery/model.safetensors"):
        r = client.get("/api/diff", params={"a": a, "b": "base"})
        assert r.status_code == 404, a
    for path in (
        "/static/../../pyproject.toml",
        "/static/%2e%2e/app.py",
        "/static/..%2Fapp.py",
        "/models/..%2F..%2Fetc%2Fpasswd",
        "/static/app.css/../../../README.md",
    ):
        r = client.get(path)
        assert r.status_code == 404 and "MGit" not in r.text[:200].replace("MGit ", ""), path


# --- who may look -----------------------------------------------------------------------------
def test_a_token_is_required_off_the_loopback(web_family: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TokenRequiredError, match="serving on 0.0.0.0 needs a token"):
        create_app(web_family, host="0.0.0.0")
    compared = []
    real = access.hmac.compare_digest
    monkeypatch.setattr(access.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    with TestClient(
        create_app(web_family, host="0.0.0.0", token="s3cret"), base_url="http://10.1.2.3:8808", follow_redirects=False
    ) as c:
        for path in ("/models", "/api/models", "/static/app.css", "/api/diff?a=base&b=q8", "/lineage"):
            assert c.get(path).status_code == 401, path
            assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
            assert c.get(path, headers={"Authorization": "Bearer s3cret"}).status_code in (200, 202)
        assert compared  # every check goes through hmac.compare_digest
        assert c.get("/models?token=wrong").status_code == 401
        r = c.get("/models?q=ft&token=s3cret")
        assert r.status_code == 303 and r.headers["location"] == "/models?q=ft"
        assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
        assert c.get("/models?q=ft").status_code == 200  # the cookie now
        c.cookies.clear()
        assert c.get("/api/models").status_code == 401


def test_without_a_token_only_loopback_hosts_are_answered(web_family: Repo) -> None:
    with TestClient(create_app(web_family)) as c:
        for host, status in (
            ("127.0.0.1:8808", 200),
            ("localhost:8808", 200),
            ("[::1]:8808", 200),
            ("evil.example", 400),
            ("evil.example:8808", 400),
            ("10.0.0.1", 400),
        ):
            assert c.get("/api/models", headers={"host": host}).status_code == status, host


def test_serve_command_listens_and_enforces_its_token(web_family: Repo) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [*MGIT, "-C", str(web_family.root), "serve", "--port", "0", "--token", "tok"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        m = re.search(r"at (http://127\.0\.0\.1:\d+/) \(read-only", line)
        assert m, line + proc.stderr.read()  # type: ignore[union-attr]
        assert "?token=tok" in proc.stdout.readline()  # type: ignore[union-attr]
        import urllib.error
        import urllib.request

        with pytest.raises(urllib.error.HTTPError, match="401"):  # listening before the address is printed
            urllib.request.urlopen(m[1] + "api/models", timeout=10)
        req = urllib.request.Request(m[1] + "api/models", headers={"Authorization": "Bearer tok"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert json.loads(r.read())["total"] == 4
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_a_busy_port_is_named_with_the_way_out(web_family: Repo) -> None:
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        done = subprocess.run(
            [*MGIT, "-C", str(web_family.root), "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"Error: port {port} of 127.0.0.1 is in use (another mgit serve?): choose another "
        "with --port N, or --port 0 for any free port"
    )


def test_commands_other_than_serve_do_not_import_the_web_stack(web_family: Repo) -> None:
    probe = (
        "import io, json, sys, contextlib\n"
        "from mgit.cli.main import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    main(['-C', {str(web_family.root)!r}, 'ls']); main(['--help']); main(['serve', '--help'])\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('starlette', 'uvicorn', 'jinja2', 'markdown_it', 'nh3', 'anyio'))))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_diffs_waiting_are_bounded(web_family: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    from mgit.web import diffs

    monkeypatch.setattr(diffs, "RUNNING", 0)  # nothing runs: every job waits (daemon threads, left blocked)
    refs = [v.ref for n in web_family.lineage.nodes for v in web_family.lineage.versions(n)]
    pairs = [{"a": a, "b": b} for a in refs for b in refs if a != b][: diffs.WAITING + 1]
    with TestClient(create_app(web_family), base_url=BASE) as c:
        for pair in pairs[:-1]:
            r = c.get("/api/diff", params=pair)
            assert r.status_code == 202 and r.json()["state"] == "queued"
        assert c.get("/api/diff", params=pairs[0]).status_code == 202  # asked again: the same job, no new one
        r = c.get("/api/diff", params=pairs[-1])
        assert r.status_code == 503 and r.json()["error"] == "16 diffs are being computed already"


def test_a_remote_is_served_from_a_lazy_mirror_brought_up_to_date(
    web_family: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mgit serve URL`: a lazy clone under the mirror cache; pages of records fetch no
    object, a diff fetches what it reads; opened again, it has the remote's new versions."""
    from mgit import sync
    from mgit.sync.mirror import open_mirror

    remote = tmp_path / "team.mgit"
    sync.init_bare(str(remote))
    pusher = Repo.init(tmp_path / "pusher")
    pusher.add(tensors(1), name="m")
    pusher.add(tensors(2, scale=2), name="m")
    sync.add_remote(pusher, "origin", str(remote))
    sync.push(pusher, "origin")
    monkeypatch.setenv("MGIT_MIRROR_CACHE", str(tmp_path / "mirrors"))

    def objects(repo: Repo) -> int:
        return sum(1 for p in (repo.dir / "objects").rglob("*") if p.is_file() and len(p.name) > 20)

    mirror = open_mirror(str(remote))
    assert mirror.created and mirror.repo.lazy and str(tmp_path / "mirrors") in str(mirror.repo.root)
    before = objects(mirror.repo)
    with TestClient(create_app(mirror.repo), base_url=BASE) as c:
        assert c.get("/api/models").json()["total"] == 1
        assert c.get("/models/m").status_code == 200
        assert objects(mirror.repo) == before  # records only so far
        assert finished_diff(c, "m@1", "m@2")["result"]["tensors"]
    assert objects(mirror.repo) > before  # the diff read the tensors
    pusher.add(tensors(3, scale=3), name="m")
    sync.push(pusher, "origin")
    again = open_mirror(str(remote))
    assert not again.created and again.moved == ["m"] and again.repo.root == mirror.repo.root
    assert [v.ref for v in again.repo.log("m")][0] == "m@3"
    proc = subprocess.Popen(
        [*MGIT, "serve", f"file://{remote}", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "MGIT_MIRROR_CACHE": str(tmp_path / "mirrors"), "PYTHONUNBUFFERED": "1"},
    )
    try:
        first = proc.stdout.readline()  # type: ignore[union-attr]
        assert f"Mirror of {remote} in {mirror.repo.root}: up to date (0 models moved)" in first, first
        m = re.search(r"at (http://127\.0\.0\.1:\d+/)", proc.stdout.readline())  # type: ignore[union-attr]
        assert m
        import urllib.request

        with urllib.request.urlopen(m[1] + "api/models/m", timeout=10) as r:
            assert max(v["seq"] for v in json.loads(r.read())["versions"]) == 3
    finally:
        proc.terminate()
        proc.wait(timeout=20)
