"""The lineage graph: queries checked against networkx on random graphs, the tree command,
and lineage from Hugging Face model cards."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import networkx as nx
import pytest
from conftest import add_lineage, make_model, run_cli, tensors
from hypothesis import given, settings
from hypothesis import strategies as st

from mgit import Repo
from mgit.errors import InvalidOptionError, NoPathError
from mgit.formats.model_card import read_lineage, write_lineage
from mgit.lineage.graph import Lineage, VersionNode


# --- a pure graph, built without a repository, against a reference implementation ------------
def _version(vid: str, model: str, seq: int, predecessor: str | None) -> VersionNode:
    return VersionNode(vid, model, seq, predecessor, "2026-01-01T00:00:00Z", "", {}, 1, 4, 4)


@st.composite
def histories(draw: st.DrawFn) -> tuple[dict[str, VersionNode], dict[str, str], list[tuple[str, int, str, str]]]:
    """Random models, each with 1-3 versions; every version records 0-2 parent versions among
    those that exist when it is made (so new versions of a parent make old edges stale, and
    models can even form cycles through their history)."""
    n = draw(st.integers(1, 9))
    versions: dict[str, VersionNode] = {}
    heads: dict[str, str] = {}
    edges: list[tuple[str, int, str, str]] = []
    steps = draw(st.lists(st.integers(0, n - 1), min_size=n, max_size=3 * n))
    for k, m in enumerate(list(range(n)) + steps):
        name = f"m{m}"
        vid = f"{k:064x}"
        prev = heads.get(name)
        versions[vid] = _version(vid, name, versions[prev].seq + 1 if prev else 1, prev)
        existing = [v for v in versions if versions[v].model != name]
        chosen = draw(st.lists(st.sampled_from(existing), max_size=2, unique=True)) if existing else []
        for pos, p in enumerate(chosen):
            edges.append((vid, pos, p, draw(st.sampled_from(["finetune", "quantize", "merge"]))))
        heads[name] = vid
    return versions, heads, edges


def reference(versions: dict[str, VersionNode], heads: dict[str, str], edges: list) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(heads)
    for child, _, parent, _ in edges:
        if heads.get(versions[child].model) == child:
            g.add_edge(versions[parent].model, versions[child].model)
    return g


def version_reference(edges: list) -> nx.DiGraph:
    """Ancestry is version by version: each version's recorded parents, never a model's latest."""
    g = nx.DiGraph()
    for child, _, parent, _ in edges:
        g.add_edge(parent, child)
    return g


@settings(max_examples=150, deadline=None)
@given(histories())
def test_queries_match_networkx(graph: tuple) -> None:
    versions, heads, edges = graph
    lin = Lineage(versions, heads, edges)
    ref = reference(versions, heads, edges)
    vref = version_reference(edges)
    assert set(lin.nodes) == set(ref.nodes)
    for n in ref.nodes:
        head = heads[n]

        def up(cutoff: int | None, n: str = n, head: str = head) -> set[str]:
            if head not in vref:
                return set()
            near = nx.single_source_shortest_path_length(vref.reverse(), head, cutoff=cutoff)
            return {versions[v].model for v in near if v != head} - {n}

        assert set(lin.ancestors(n)) == up(None)
        assert set(lin.descendants(n)) == nx.descendants(ref, n)
        assert {e.parent for e in lin.parents(n)} == set(ref.predecessors(n))
        assert {e.child for e in lin.children(n)} == set(ref.successors(n))
        assert set(lin.ancestors(n, depth=1)) == set(ref.predecessors(n)) - {n} == up(1)
        assert set(lin.ancestors(n, depth=2)) == up(2)
    assert lin.roots() == sorted(n for n in ref.nodes if ref.in_degree(n) == 0)
    assert lin.leaves() == sorted(n for n in ref.nodes if ref.out_degree(n) == 0)
    order = lin.topological_order()
    assert sorted(order) == sorted(ref.nodes)
    if nx.is_directed_acyclic_graph(ref):
        pos = {n: i for i, n in enumerate(order)}
        assert all(pos[a] < pos[b] for a, b in ref.edges)
    undirected = ref.to_undirected()
    names = sorted(ref.nodes)
    for a in names[:3]:
        for b in names[-3:]:
            if nx.has_path(undirected, a, b):
                path = lin.path(a, b)
                assert len(path) == nx.shortest_path_length(undirected, a, b)
                walk = [a]  # the edges chain from a to b, each step along or against an edge
                for e in path:
                    assert walk[-1] in (e.parent, e.child)
                    walk.append(e.child if walk[-1] == e.parent else e.parent)
                assert walk[-1] == b
            else:
                with pytest.raises(NoPathError):
                    lin.path(a, b)
    for e in lin.stale():
        assert e.parent_version != heads[e.parent] and e.stale
    stale = {(c, p) for c, _, p, _ in edges if heads.get(versions[c].model) == c and heads[versions[p].model] != p}
    assert {(e.child_version, e.parent_version) for e in lin.stale()} == stale


# --- end to end on a repository -----------------------------------------------------------
def test_parents_children_and_exact_versions(repo: Repo) -> None:
    add_lineage(repo, "base", "ft <- base", "q <- ft : quantize", "m <- ft base : merge", "base")
    lin = repo.lineage
    [edge] = lin.parents("ft")
    assert (edge.parent, edge.parent_seq, edge.latest_seq, edge.relation, edge.stale) == (
        "base",
        1,
        2,
        "finetune",
        True,
    )
    assert edge.parent_version == repo.resolve("base@1") and edge.child_version == repo.resolve("ft")
    assert [(e.parent, e.relation) for e in lin.parents("m")] == [("ft", "merge"), ("base", "merge")]
    assert [e.child for e in lin.children("ft")] == ["m", "q"]
    assert lin.descendants("base") == ["ft", "m", "q"]
    assert lin.ancestors("q") == ["ft", "base"]
    assert lin.roots() == ["base"] and lin.leaves() == ["m", "q"]
    assert lin.topological_order() == ["base", "ft", "m", "q"]
    assert [(e.child, e.parent) for e in lin.path("q", "m")] == [("q", "ft"), ("m", "ft")]
    assert {(e.child, e.parent_ref) for e in lin.stale()} == {("ft", "base@1"), ("m", "base@1")}
    assert [v.seq for v in lin.versions("base")] == [2, 1]
    with pytest.raises(Exception, match="no model named 'nope'"):
        lin.parents("nope")


def test_the_graph_reads_each_version_as_the_catalog_indexes_it(repo: Repo) -> None:
    from dataclasses import fields

    from mgit.index.rows import GRAPH_COLUMNS

    assert tuple(f.name for f in fields(VersionNode)) == GRAPH_COLUMNS  # (the graph's rows are read in order)
    repo.add(tensors(1), name="base", tags={"stage": "dev"}, message="first")
    repo.add(tensors(2), name="base", message="second")
    repo.add(tensors(3), name="ft", parent="base", relation="finetune", lossy=1e-3)
    repo.rm("base", force=True)  # (kept as ft's parent: its versions removed)
    nodes = {v.id: v for name in ("base", "ft") for v in repo.lineage.versions(name)}
    assert len(nodes) == 3 and [v.removed for v in nodes.values()] == [True, True, False]
    assert all(type(v.removed) is bool and isinstance(v.tags, dict) for v in nodes.values())  # (decoded)
    for vid, node in nodes.items():
        row = repo.catalog.version(vid)
        assert row is not None and node == VersionNode(
            *(getattr(row, c) for c in ("id", "model", "seq", "predecessor", "time", "message", "tags")),
            *(getattr(row, c) for c in ("params", "logical_bytes", "new_bytes", "lossy", "removed")),
        )


def test_select_by_glob_tag_and_relation(repo: Repo) -> None:
    add_lineage(repo, "bert", "bert-sst2 <- bert", "bert-int8 <- bert-sst2 : quantize", "gpt")
    repo.add(tensors(7, layers=1, width=4), name="bert-mnli", parent="bert", tags={"task": "nli"})
    lin = repo.lineage
    assert lin.select("bert-*") == ["bert-int8", "bert-mnli", "bert-sst2"]
    assert lin.select(tag="task") == ["bert-mnli"] and lin.select(tag="task=nli") == ["bert-mnli"]
    assert lin.select(tag="task=sst2") == []
    assert lin.select(relation="quantize") == ["bert-int8"]
    assert lin.select("bert*", relation="finetune") == ["bert-mnli", "bert-sst2"]
    sub = lin.subgraph(lin.select("bert*"))
    assert [n.name for n in sub.nodes] == ["bert", "bert-mnli", "bert-sst2", "bert-int8"]
    assert sorted((e.child, e.parent) for e in sub.edges) == [
        ("bert-int8", "bert-sst2"),
        ("bert-mnli", "bert"),
        ("bert-sst2", "bert"),
    ]
    json.dumps(sub.to_json())


def test_removed_parent_stays_as_a_node(repo: Repo) -> None:
    add_lineage(repo, "base", "ft <- base")
    repo.rm("base", force=True)
    repo.gc()
    lin = repo.lineage
    assert lin.nodes["base"].removed and not lin.nodes["ft"].removed
    assert lin.roots() == ["base"] and lin.parents("ft")[0].parent == "base"
    code, out, _ = run_cli("lineage", cwd=repo.root)
    assert code == 0 and "base@1" in out and "[removed]" in out


def _families(n: int) -> Lineage:
    """n models in families of ten, each a chain: m0 <- m1 <- ... <- m9, m10 <- m11 ..."""
    versions, heads, edges = {}, {}, []
    for i in range(n):
        vid = f"{i:064x}"
        versions[vid] = _version(vid, f"m{i}", 1, None)
        heads[f"m{i}"] = vid
        if i % 10:
            edges.append((vid, 0, f"{i - 1:064x}", "finetune"))
    return Lineage(versions, heads, edges)


def _steps_for_every_query(n: int) -> int:
    """The lines of Python run (counted by a trace function: the same on any machine, under
    any load) to load a graph of n models and ask every whole-graph question of it."""
    steps = 0

    def count(frame: FrameType, event: str, arg: object) -> Callable[..., object]:
        nonlocal steps
        steps += event == "line"
        return count

    sys.settrace(count)
    try:
        lin = _families(n)
        for root in lin.roots():
            lin.descendants(root)
        for leaf in lin.leaves():
            lin.ancestors(leaf)
        for name in lin.nodes:
            lin.parents(name)
            lin.children(name)
        lin.topological_order()
        lin.stale()
        lin.tree()
    finally:
        sys.settrace(None)
    return steps


def test_lineage_queries_grow_linearly_with_the_number_of_models() -> None:
    lin = _families(1000)
    assert len(lin.roots()) == 100 and lin.descendants("m0") == [f"m{i}" for i in range(1, 10)]
    assert len(lin.topological_order()) == 1000

    small, large = _steps_for_every_query(500), _steps_for_every_query(5000)

    # Ten times the models: about ten times the steps when every query is linear, a hundred
    # times when one loops over the models for each model. (A count of Python lines: a loop
    # inside one builtin call, `x in a_list`, counts once; the benchmark lineage_scale.py
    # times the queries at 1,000 models.)
    assert 5 * small < large < 20 * small, (small, large)


# --- the CLI --------------------------------------------------------------------------------
def test_lineage_tree_cli(repo: Repo) -> None:
    add_lineage(repo, "base", "ft <- base", "q <- ft : quantize", "m <- ft base : merge", "base")
    code, out, err = run_cli("lineage", cwd=repo.root)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("base@2")
    assert any(
        line.startswith("├── ft@1  finetune") and "(stale: ft built on base@1, latest @2)" in line for line in lines
    )
    assert any("q@1  quantize" in line for line in lines)
    assert any("m@1  merge  (shown above)" in line for line in lines)

    code, out, _ = run_cli("lineage", "q", "--up", cwd=repo.root)  # up, each parent as the version built on
    assert code == 0 and [line.lstrip("│├└─ ").split()[0] for line in out.splitlines()] == ["q@1", "ft@1", "base@1"]
    assert "(stale: ft built on base@1, latest @2)" in out.splitlines()[2]

    code, out, _ = run_cli("lineage", "base", "--depth", "1", cwd=repo.root)
    assert "ft@1" in out and "q@1" not in out

    code, out, _ = run_cli("lineage", "ft", "--json", cwd=repo.root)
    [tree] = json.loads(out)
    assert tree["model"]["name"] == "ft" and [c["model"]["name"] for c in tree["children"]] == ["m", "q"]
    assert tree["children"][1]["edge"]["relation"] == "quantize"


def test_lineage_cli_errors(repo: Repo) -> None:
    code, out, err = run_cli("lineage", cwd=repo.root)
    assert code == 0 and "No models yet" in out
    add_lineage(repo, "base")
    code, _, err = run_cli("lineage", "bsae", cwd=repo.root)
    assert code == 1 and err.strip() == "Error: no model named 'bsae'. Did you mean 'base'? See: mgit ls"
    code, _, err = run_cli("lineage", "base", "--depth", "0", cwd=repo.root)
    assert code == 2 and "--depth" in err


# --- Hugging Face model cards ---------------------------------------------------------------
CARD = """---
license: apache-2.0
base_model:
- org/base
- other
base_model_relation: merge
tags:
- text
---
# My model

Body text, with --- inside.
"""


def test_read_card_lineage() -> None:
    found = read_lineage(CARD)
    assert found and found.base_models == ["org/base", "other"] and found.relation == "merge"
    one = read_lineage("---\nbase_model: org/base\nbase_model_relation: quantized\n---\n")
    assert one and one.base_models == ["org/base"] and one.relation == "quantize"
    assert read_lineage("# no front matter\nbase_model: x\n") is None
    assert read_lineage("---\nbase_model: [unclosed\n---\n") is None  # broken YAML: ignored
    assert read_lineage("---\n- a list\n---\n") is None
    assert read_lineage("---\nbase_model_relation: adapter\n---\n") is None


def test_write_card_keeps_everything_else() -> None:
    text = write_lineage(CARD, ["bert-base"], "quantize")
    assert text.endswith("# My model\n\nBody text, with --- inside.\n")
    assert "license: apache-2.0\n" in text and "tags:\n- text\n" in text
    found = read_lineage(text)
    assert found and found.base_models == ["bert-base"] and found.hub_relation == "quantized"
    assert "org/base" not in text and "merge" not in text
    assert write_lineage(text, ["bert-base"], "quantize") == text  # idempotent
    fresh = write_lineage(None, ["a", "b"], "prune")  # the hub has no word for prune
    assert read_lineage(fresh).base_models == ["a", "b"] and "base_model_relation" not in fresh


def test_add_takes_parents_from_the_model_card(repo: Repo, tmp_path) -> None:
    repo.add(tensors(1), name="org/base")
    repo.add(tensors(2), name="other")
    model = make_model(tmp_path / "merged", seed=3)
    (model / "README.md").write_text(CARD)
    result = repo.add(model, name="merged")
    assert [(p.model, p.relation) for p in result.parents] == [("org/base", "merge"), ("other", "merge")]
    assert any("from the base_model of README.md" in n for n in result.notes)

    # The command line wins; --no-model-card ignores the card.
    code, out, err = run_cli(
        "add", str(model), "--name", "cli", "--parent", "other", "--relation", "finetune", cwd=repo.root
    )
    assert code == 0, err
    assert [(e.parent, e.relation) for e in repo.lineage.parents("cli")] == [("other", "finetune")]
    code, _, err = run_cli("add", str(model), "--name", "none", "--no-model-card", cwd=repo.root)
    assert code == 0 and repo.lineage.parents("none") == []

    # A relation on the command line applies to the card's parents.
    model2 = make_model(tmp_path / "q", seed=4)
    (model2 / "README.md").write_text("---\nbase_model: org/base\n---\n")
    assert [p.relation for p in repo.add(model2, name="q", relation="quantize").parents] == ["quantize"]


def test_add_notes_base_models_it_does_not_have(repo: Repo, tmp_path) -> None:
    model = make_model(tmp_path / "m", seed=3)
    (model / "README.md").write_text("---\nbase_model: sentence-transformers/all-MiniLM-L6-v2\n---\n")
    code, out, err = run_cli("add", str(model), "--name", "m", cwd=repo.root)
    assert code == 0
    assert (
        "note: README.md names base_model 'sentence-transformers/all-MiniLM-L6-v2', not in this repository: "
        "not recorded as a parent"
    ) in err
    assert repo.lineage.parents("m") == []


def test_checkout_model_card_round_trip(repo: Repo, tmp_path) -> None:
    base = make_model(tmp_path / "base", seed=1)
    repo.add(base, name="base")
    child = make_model(tmp_path / "child", seed=2)
    (child / "README.md").write_text("# Child\n")
    repo.add(child, name="child", parent="base", relation="adapter")
    code, out, err = run_cli("checkout", "child", "-o", str(tmp_path / "pub"), "--model-card", cwd=repo.root)
    assert code == 0, err
    text = (tmp_path / "pub" / "README.md").read_text()
    assert text == "---\nbase_model: base\nbase_model_relation: adapter\n---\n\n# Child\n"
    assert (tmp_path / "pub" / "model.safetensors").read_bytes() == (child / "model.safetensors").read_bytes()
    # Re-adding the published folder finds the same parent from the card alone.
    result = repo.add(tmp_path / "pub", name="child2")
    assert [(p.model, p.relation) for p in result.parents] == [("base", "adapter")]
    # A model without parents keeps its card as it was and says so.
    code, _, err = run_cli("checkout", "base", "-o", str(tmp_path / "b"), "--model-card", cwd=repo.root)
    assert code == 0 and "left as it was" in err and not (tmp_path / "b" / "README.md").exists()
    # Without the flag the bytes are exactly what was added.
    code, _, _ = run_cli("checkout", "child", "-o", str(tmp_path / "plain"), cwd=repo.root)
    assert (tmp_path / "plain" / "README.md").read_text() == "# Child\n"


def test_a_model_is_never_a_lineage_parent_of_itself(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path)
    repo.add(tensors(1), name="p1")
    before = repo.refs.all()
    code, out, err = run_cli(
        "add", str(make_model(tmp_path / "p", seed=2)), "--name", "p1", "--parent", "p1", cwd=tmp_path
    )
    assert code == 1 and out == ""
    assert (
        err.startswith("Error: p1@1 cannot be a lineage parent of p1: it is p1's own history") and err.count("\n") == 1
    )
    assert repo.refs.all() == before
    with pytest.raises(InvalidOptionError, match="cannot be a lineage parent of p1"):
        repo.add(tensors(3), name="p1", parent="p1@1")


def test_ancestors_go_version_by_version_through_a_cycle_of_models(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path)
    repo.add(tensors(1), name="cyc-a")
    repo.add(tensors(2), name="cyc-b", parent="cyc-a")  # cyc-b@1 on cyc-a@1
    repo.add(tensors(3), name="cyc-a", parent="cyc-b")  # cyc-a@2 on cyc-b@1: a cycle of models, not of versions
    code, out, _ = run_cli("lineage", "cyc-b", "--up", cwd=tmp_path)
    assert code == 0 and [line.lstrip("│├└─ ").split()[0] for line in out.splitlines()] == ["cyc-b@1", "cyc-a@1"]
    code, out, _ = run_cli("lineage", "cyc-a", "--up", cwd=tmp_path)
    assert code == 0 and [line.lstrip("│├└─ ").split()[0] for line in out.splitlines()] == [
        "cyc-a@2",
        "cyc-b@1",
        "cyc-a@1",
    ]
    assert repo.lineage.ancestors("cyc-b") == ["cyc-a"] and repo.lineage.ancestors("cyc-a") == ["cyc-b"]
