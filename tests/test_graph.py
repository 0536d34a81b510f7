"""`mgit graph`: the page (in a real headless Chromium), DOT, JSON, the selection options,
the layout, and escaping of what users write (names, messages, tags).

The browser tests need Debian's chromium at /usr/bin/chromium (the Makefile's `test` target
installs it) and the `playwright` package (the `dev` extra), which drives it and never
downloads a browser of its own. They are skipped only when MGIT_NO_BROWSER=1 is set; a
missing browser otherwise fails them.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import HOSTILE, run_cli, tensors

from mgit import Repo
from mgit.lineage.graph import LineageEdge, LineageGraph, ModelNode, VersionNode
from mgit.web import graph_json, page_data, render_dot, render_html
from mgit.web.layout import Box, layered_layout


@pytest.fixture
def lineage_repo(tmp_path: Path) -> Repo:
    """base@1 -> ft-a (2 versions), ft-b (adapter); ft-a + ft-b -> merged; base@2 -> q8 (so the
    edges from base@1 are stale); old -> kid, then old removed. Messages and tags carry HTML."""
    repo = Repo.init(tmp_path)
    repo.add(tensors(1), name="base", message=HOSTILE, tags={"stage": "<b>pre</b>"})
    repo.add(tensors(2), name="ft-a", parent="base", relation="finetune", tags={"task": 'a&"b"'})
    repo.add(tensors(3), name="ft-a", message="second epoch", tags={"task": 'a&"b"'})
    repo.add(tensors(4), name="ft-b", parent="base", relation="adapter", tags={"task": "nli"})
    repo.add(tensors(5), name="merged", parent=["ft-a", "ft-b"], relation="merge")
    repo.add(tensors(6), name="base", message="v2")
    repo.add(tensors(7), name="q8", parent="base", relation="quantize")
    repo.add(tensors(8), name="old")
    repo.add(tensors(9), name="kid", parent="old", relation="distill")
    repo.rm("old", force=True)
    return repo


def cli_graph(repo: Repo, *args: str) -> dict:
    code, out, err = run_cli("-C", str(repo.root), "graph", *args, "--format", "json")
    assert code == 0, err
    return json.loads(out)


def hand_graph(names: list[str], edges: list[tuple[str, str]], message: str = "m") -> LineageGraph:
    """A graph built by hand, for names that a repository would refuse."""
    nodes, versions = [], {}
    for i, n in enumerate(names):
        vid = hashlib.sha256(n.encode()).hexdigest()
        nodes.append(ModelNode(n, vid, 1, 10 * i, 1000 + i, 900, {"t": n}))
        versions[n] = [VersionNode(vid, n, 1, None, "2026-01-01T00:00:00Z", message, {}, 10 * i, 1000 + i, 900)]
    heads = {n.name: n.head for n in nodes}
    return LineageGraph(
        nodes, [LineageEdge(c, heads[c], 1, p, heads[p], 1, "finetune", 1, False) for p, c in edges], versions
    )


# --- DOT ----------------------------------------------------------------------------------
DOT_STRING = r'"((?:[^"\\]|\\.)*)"'
DOT_NODE = re.compile(rf"^  {DOT_STRING} \[(.*)\];$")
DOT_EDGE = re.compile(rf"^  {DOT_STRING} -> {DOT_STRING} \[(.*)\];$")


def dot_unquote(s: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m[1] == "n" else m[1], s)


def parse_dot(text: str) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
    lines = text.splitlines()
    assert lines[0] == "digraph mgit {" and lines[-1] == "}"
    nodes, edges = {}, []
    for line in lines[1:-1]:
        if m := DOT_EDGE.match(line):
            edges.append((dot_unquote(m[1]), dot_unquote(m[2]), m[3]))
        elif m := DOT_NODE.match(line):
            nodes[dot_unquote(m[1])] = m[2]
        else:
            assert re.match(r"^  (rankdir|node|edge)\b", line), line
    return nodes, edges


def test_dot_has_every_node_and_edge(lineage_repo: Repo) -> None:
    code, text, err = run_cli("-C", str(lineage_repo.root), "graph", "--format", "dot")
    assert code == 0, err
    nodes, edges = parse_dot(text)
    lineage = lineage_repo.lineage
    assert set(nodes) == set(lineage.nodes) == {"base", "ft-a", "ft-b", "merged", "q8", "old", "kid"}
    assert {(p, c) for p, c, _ in edges} == {(e.parent, e.child) for e in lineage.subgraph().edges}
    attrs = {(p, c): a for p, c, a in edges}
    assert 'style="dashed"' in attrs[("base", "ft-a")] and 'label="finetune @1 (now @2)"' in attrs[("base", "ft-a")]
    assert "dashed" not in attrs[("base", "q8")] and 'label="quantize @2"' in attrs[("base", "q8")]
    assert 'label="merge @2"' in attrs[("ft-a", "merged")]
    assert "dashed" in nodes["old"] and "removed" in nodes["old"] and "removed" not in nodes["kid"]


def test_dot_quotes_names() -> None:
    names = ['a"b', "back\\slash", "<x>&y", "line\nbreak", "plain"]
    nodes, edges = parse_dot(render_dot(hand_graph(names, [(names[0], names[1]), (names[2], names[3])])))
    assert set(nodes) == set(names)
    assert [(p, c) for p, c, _ in edges] == [(names[0], names[1]), (names[2], names[3])]


# --- JSON ---------------------------------------------------------------------------------
def test_json_is_the_subgraph_and_round_trips(lineage_repo: Repo) -> None:
    data = cli_graph(lineage_repo)
    expected = json.loads(json.dumps(lineage_repo.lineage.subgraph().to_json()))
    assert {k: data[k] for k in ("nodes", "edges", "versions")} == expected
    rebuilt = LineageGraph(
        [ModelNode(**n) for n in data["nodes"]],
        [LineageEdge(**e) for e in data["edges"]],
        {m: [VersionNode(**v) for v in vs] for m, vs in data["versions"].items()},
    )
    assert rebuilt == lineage_repo.lineage.subgraph()
    # storage: every version, matching what `show` says of it
    assert set(data["storage"]) == {v["id"] for vs in data["versions"].values() for v in vs}
    for ref in ("base@1", "merged", "q8"):
        shown = lineage_repo.show(ref)
        assert data["storage"][shown.version.id] == {
            "stored_bytes": shown.version.stored_bytes,
            "tensors": shown.tensor_storage,
        }


def test_graph_json_is_to_json_plus_storage() -> None:
    graph = random_graph(50, seed=2)
    assert json.loads(json.dumps(graph_json(graph))) == {**json.loads(json.dumps(graph.to_json())), "storage": {}}


def test_json_to_a_file(lineage_repo: Repo, tmp_path: Path) -> None:
    code, out, _ = run_cli("-C", str(lineage_repo.root), "graph", "--json", "-o", str(tmp_path / "g.json"))
    assert code == 0 and "g.json: 7 models, 6 edges" in out
    assert [n["name"] for n in json.loads((tmp_path / "g.json").read_text())["nodes"]][0] == "base"


# --- selection ----------------------------------------------------------------------------
def names(data: dict) -> set[str]:
    return {n["name"] for n in data["nodes"]}


def test_selection_options(lineage_repo: Repo) -> None:
    assert names(cli_graph(lineage_repo, "ft-*")) == {"ft-a", "ft-b"}
    assert cli_graph(lineage_repo, "ft-*")["edges"] == []  # edges to models outside are left out
    assert names(cli_graph(lineage_repo, "--tag", "task")) == {"ft-a", "ft-b"}
    assert names(cli_graph(lineage_repo, "--tag", "task=nli")) == {"ft-b"}
    assert names(cli_graph(lineage_repo, "--relation", "merge")) == {"merged"}
    assert names(cli_graph(lineage_repo, "--around", "ft-a", "--depth", "1")) == {"base", "ft-a", "merged"}
    assert names(cli_graph(lineage_repo, "--around", "ft-a@1")) == {"base", "ft-a", "merged"}
    assert names(cli_graph(lineage_repo, "--around", lineage_repo.resolve("ft-a")[:12])) == {"base", "ft-a", "merged"}
    assert names(cli_graph(lineage_repo, "--around", "base")) == {"base", "ft-a", "ft-b", "merged", "q8"}
    assert names(cli_graph(lineage_repo, "--around", "kid")) == {"kid", "old"}
    assert names(cli_graph(lineage_repo, "m*", "--around", "base")) == {"merged"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nothing*"], "no model matches name nothing*"),
        (["--tag", "task=none"], "no model matches --tag task=none"),
        (["--around", "nope"], "no model named 'nope'"),
    ],
)
def test_selection_errors_are_one_line(lineage_repo: Repo, args: list[str], message: str) -> None:
    code, out, err = run_cli("-C", str(lineage_repo.root), "graph", *args)
    assert code == 1 and out == ""
    assert err.startswith(f"Error: {message}") and err.count("\n") == 1


def test_empty_repository_and_usage_errors(tmp_path: Path) -> None:
    Repo.init(tmp_path)
    code, _, err = run_cli("-C", str(tmp_path), "graph")
    assert code == 1 and err.startswith("Error: no models yet") and err.count("\n") == 1
    code, _, err = run_cli("-C", str(tmp_path), "graph", "--depth", "2")
    assert code == 2 and "--depth needs --around" in err


def test_html_default_file_and_stdout(lineage_repo: Repo, tmp_path: Path) -> None:
    work = tmp_path / "elsewhere"
    work.mkdir()
    code, out, err = run_cli("-C", str(lineage_repo.root), "graph", cwd=work)  # -C is git's: written in DIR
    assert code == 0, err
    assert out.strip() == f"{lineage_repo.root / 'mgit-graph.html'}: 7 models, 6 edges" and list(work.iterdir()) == []
    page = (lineage_repo.root / "mgit-graph.html").read_text()
    code, out, _ = run_cli("-C", str(lineage_repo.root), "graph", "-o", "-")
    assert code == 0 and out.startswith("<!DOCTYPE html>") and out == page


# --- the page, without a browser ----------------------------------------------------------
def embedded(page: str) -> dict:
    m = re.search(r'<script type="application/json" id="mgit-data">(.*?)</script>', page, re.S)
    assert m
    return json.loads(m[1])


def test_page_escapes_user_text_and_allows_only_its_own_script() -> None:
    graph = hand_graph([HOSTILE, "b<!--", "c\u2028d"], [(HOSTILE, "b<!--")], message=HOSTILE)
    page = render_html(graph, title=HOSTILE)
    assert page.count("</script>") == 2  # the data element and the script, nothing from users
    assert "<img" not in page and "<!--" not in page and "\u2028" not in page
    assert f"<title>{HOSTILE}" not in page and "<title>&lt;/script&gt;" in page
    data = embedded(page)
    assert data == json.loads(json.dumps({**page_data(graph, storage={}, outside=[]), "title": HOSTILE}))
    assert [n["name"] for n in data["nodes"]][0] == HOSTILE
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page)[1]
    script = re.search(r"<script>(.*?)</script>", page, re.S)[1]
    style = re.search(r"<style>(.*?)</style>", page, re.S)[1]
    for body in (script, style):
        assert "sha256-" + base64.b64encode(hashlib.sha256(body.encode()).digest()).decode() in csp
    assert "default-src 'none'" in csp  # nothing can be fetched, and nothing is asked for:
    assert set(re.findall(r"\w+://[^\"' ]*", page)) == {"http://www.w3.org/2000/svg"}


def test_page_of_a_thousand_models_holds_them_all() -> None:
    # How fast it is made is measured by benchmarks/lineage_scale.py, not asserted here.
    graph = random_graph(1000, seed=3)
    page = render_html(graph)
    assert len(embedded(page)["nodes"]) == 1000


# --- layout -------------------------------------------------------------------------------
def random_graph(n: int, seed: int) -> LineageGraph:
    rng = random.Random(seed)
    names_ = [f"model-{i:04d}" + "x" * rng.randrange(0, 20) for i in range(n)]
    edges = []
    for i in range(1, n):
        if rng.random() < 0.95:
            edges.append((names_[max(0, i - 1 - int(rng.expovariate(1 / 6)))], names_[i]))
        if rng.random() < 0.05:
            edges.append((names_[rng.randrange(i)], names_[i]))
    return hand_graph(names_, list(dict.fromkeys(edges)))


def test_layout_places_parents_left_without_overlaps() -> None:
    graph = random_graph(300, seed=5)
    boxes = [Box(n.name, 60 + len(n.name) * 3, 38) for n in graph.nodes]
    layout = layered_layout(boxes, [(e.parent, e.child) for e in graph.edges])
    pos = layout.positions
    size = {b.name: (b.width, b.height) for b in boxes}
    for e in graph.edges:
        assert pos[e.parent][0] + size[e.parent][0] < pos[e.child][0]
    by_column: dict[float, list[tuple[float, float]]] = {}
    for b in boxes:
        x, y = pos[b.name]
        by_column.setdefault(round(x + b.width / 2), []).append((y, y + b.height))
        assert x >= 0 and x + b.width <= layout.width + 0.01 and y >= -0.01 and y + b.height <= layout.height + 0.01
    for spans in by_column.values():
        spans.sort()
        assert all(a[1] < b[0] for a, b in zip(spans, spans[1:], strict=False))
    assert len(layout.routes) == len(graph.edges) and all(len(r) >= 2 for r in layout.routes)


def test_layout_survives_a_cycle() -> None:
    # Models can form a cycle through their histories; the back edge is drawn, not layered.
    layout = layered_layout([Box("a", 50, 30), Box("b", 50, 30)], [("a", "b"), ("b", "a")])
    assert layout.positions["a"][0] < layout.positions["b"][0] and len(layout.routes) == 2


# --- in a real browser --------------------------------------------------------------------
@pytest.fixture
def open_page(browser: object) -> Iterator[object]:
    """`open_page(path)` -> a page of the file, loaded; console errors fail the test."""
    problems: list[str] = []
    pages = []

    def opener(path: Path) -> object:
        page = browser.new_page(viewport={"width": 1280, "height": 800})  # type: ignore[attr-defined]
        page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
        page.on("pageerror", lambda e: problems.append(str(e)))
        page.on("request", lambda r: problems.append(f"request: {r.url}") if not r.url.startswith("file:") else None)
        page.goto(path.as_uri())
        pages.append(page)
        return page

    yield opener
    for page in pages:
        assert page.evaluate("window.pwned") is None
        page.close()
    assert problems == []


def transform(page: object) -> str:
    return page.get_attribute("#viewport", "transform")  # type: ignore[attr-defined]


def test_page_in_chromium(lineage_repo: Repo, tmp_path: Path, open_page: object) -> None:
    code, _, err = run_cli("-C", str(lineage_repo.root), "graph", "-o", str(tmp_path / "g.html"))
    assert code == 0, err
    page = open_page(tmp_path / "g.html")  # type: ignore[operator]
    drawn = page.eval_on_selector_all(".node", "els => els.map(e => e.getAttribute('data-model'))")
    assert sorted(drawn) == sorted(lineage_repo.lineage.nodes)
    assert page.locator(".edge").count() == 6 and page.locator(".edge[data-stale]").count() == 2
    assert page.locator('.node[data-model="old"][data-removed]').count() == 1
    assert page.locator("#panel").is_hidden()

    page.locator('.node[data-model="merged"]').click()
    panel = page.locator("#panel")
    assert panel.is_visible()
    assert panel.locator("h2").inner_text() == "merged"
    merged = lineage_repo.lineage.versions("merged")
    assert panel.locator("tr[data-version]").count() == len(merged)
    assert panel.locator(f'tr[data-version="{merged[0].id}"]').is_visible()
    parents = panel.locator('[data-list="parents"] li')
    assert sorted(parents.evaluate_all("els => els.map(e => e.getAttribute('data-parent'))")) == ["ft-a", "ft-b"]
    assert "merge" in parents.first.inner_text() and "ft-a@2" in parents.first.inner_text()
    assert "stored" in panel.inner_text() and "deduplicated" in panel.inner_text()

    # base: two versions (one message is hostile HTML, shown as text), stale children
    page.click("#fit")  # the panel may cover the rest: fit the graph beside it
    page.locator('.node[data-model="base"]').click()
    assert panel.locator("h2").inner_text() == "base"
    assert panel.locator("tr[data-version]").count() == 2
    assert HOSTILE in panel.inner_text()
    children = panel.locator('[data-list="children"] li')
    assert children.count() == 3
    assert "stale: base is now at @2" in panel.locator('[data-list="children"] li[data-child="ft-a"]').inner_text()
    assert "stale" not in panel.locator('[data-list="children"] li[data-child="q8"]').inner_text()
    panel.locator('[data-list="children"] li[data-child="q8"] button').click()  # follow a link
    assert panel.locator("h2").inner_text() == "q8"

    # zoom with the wheel and the buttons, pan by dragging the background
    before = transform(page)
    page.mouse.move(300, 600)
    page.mouse.wheel(0, -400)
    zoomed = transform(page)
    assert zoomed != before and float(re.search(r"scale\(([\d.]+)\)", zoomed)[1]) > float(
        re.search(r"scale\(([\d.]+)\)", before)[1]
    )
    page.click("#zoom-out")
    assert transform(page) != zoomed
    moved = transform(page)
    page.mouse.move(120, 700)
    page.mouse.down()
    page.mouse.move(220, 650, steps=5)
    page.mouse.up()
    assert transform(page) != moved
    assert panel.locator("h2").inner_text() == "q8"  # a drag is not a click

    # search, then Escape closes the panel
    page.fill("#search", "kid")
    assert page.locator(".node.match").count() == 1
    page.press("#search", "Enter")
    assert panel.locator("h2").inner_text() == "kid"
    assert "old" in panel.locator('[data-list="parents"]').inner_text()
    page.locator("#graph").click(position={"x": 5, "y": 5})
    assert panel.is_hidden()


def test_hostile_names_in_chromium(tmp_path: Path, open_page: object) -> None:
    names_ = [HOSTILE, "b<!--", 'c"&amp;']
    (tmp_path / "h.html").write_text(
        render_html(hand_graph(names_, [(HOSTILE, "b<!--")], message=HOSTILE), title=HOSTILE)
    )
    page = open_page(tmp_path / "h.html")  # type: ignore[operator]
    drawn = page.eval_on_selector_all(".node", "els => els.map(e => e.getAttribute('data-model'))")
    assert sorted(drawn) == sorted(names_)
    assert page.title() == HOSTILE
    page.locator(".node").first.click()
    assert page.locator("#panel h2").inner_text() == HOSTILE


def test_a_thousand_models_in_chromium(tmp_path: Path, open_page: object) -> None:
    graph = random_graph(1000, seed=7)
    (tmp_path / "big.html").write_text(render_html(graph))
    page = open_page(tmp_path / "big.html")  # type: ignore[operator]
    assert page.locator(".node").count() == 1000  # how fast: benchmarks/lineage_scale.py
    name = graph.nodes[500].name
    page.fill("#search", name)
    page.press("#search", "Enter")
    assert page.locator("#panel h2").inner_text() == name
    page.locator(f'.node[data-model="{graph.nodes[501].name}"]').click()
    assert page.locator("#panel h2").inner_text() == graph.nodes[501].name
