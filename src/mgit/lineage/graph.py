"""The lineage graph: which model was derived from which, by what relation, from which exact
version, and the queries over it (parents, children, ancestors, descendants, roots, leaves,
the path between two models, topological order, selections).

A node is a model; its edges are the lineage parents recorded in its latest version, each
naming the exact parent version it was derived from. An edge is *stale* when that parent
version is no longer the parent model's latest: the child was built on an old base (a
cascade brings it up to date). A parent version whose model was removed stays in the graph
as a `removed` node, since the child still records it and the store still keeps it (or as
`remote_only`, when a remote holds it: a clone of some models brings its ancestors as records).

`Lineage.load(catalog)` reads the whole graph in two queries and answers every query in
memory, so thousands of models cost milliseconds. The graph is a snapshot: load it again
after a change.
"""

from __future__ import annotations

import fnmatch
import heapq
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from itertools import takewhile
from typing import Any

from mgit.errors import NoMatchError, NoPathError, UnknownRefError
from mgit.index.catalog import Catalog
from mgit.reports import Report, json_safe
from mgit.store.objects import tag_matches, walk_history


class FlatReport(Report):
    """A report of plain fields: `to_json` without `dataclasses.asdict`'s deep copies, which
    cost most of `mgit lineage --json` on a thousand models."""

    def to_json(self) -> dict[str, Any]:
        values = {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]
        return {k: json_safe(v) if isinstance(v, (dict, float)) else v for k, v in values.items()}


@dataclass(frozen=True)
class VersionNode(FlatReport):
    """One version in the graph: model, number, predecessor, time, message, tags, figures."""

    id: str
    model: str
    seq: int
    predecessor: str | None
    time: str
    message: str
    tags: dict[str, str]
    params: int
    logical_bytes: int
    new_bytes: int  # what this version added to the store when it was written
    lossy: dict[str, Any] | None = None
    removed: bool = False  # on no model's history any more (`mgit rm`), kept as a live version's parent

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


@dataclass(frozen=True)
class ModelNode(FlatReport):
    """One model in the graph: its head, its latest version's figures, whether it is removed or remote only."""

    name: str
    head: str
    seq: int  # the latest version's number
    params: int
    logical_bytes: int  # of the latest version
    stored_bytes: int  # what the model's versions added to the store, together
    tags: dict[str, str]
    lossy: dict[str, Any] | None = None
    removed: bool = False  # no ref: kept because a live model was derived from one of its versions
    remote_only: bool = False  # no ref here, but a remote holds it (a clone of some models brought its records)


@dataclass(frozen=True)
class LineageEdge(FlatReport):
    """A lineage edge between two models' versions, with its relation."""

    child: str
    child_version: str
    child_seq: int
    parent: str
    parent_version: str
    parent_seq: int
    relation: str
    latest_seq: int  # the parent model's latest version number
    stale: bool  # derived from a version that is no longer the parent's latest
    parent_removed: bool = False  # that version was removed (`mgit rm`)

    @property
    def parent_ref(self) -> str:
        """`ft@3`, or `ft@3 [removed]`."""
        return f"{self.parent}@{self.parent_seq}" + (" [removed]" if self.parent_removed else "")


@dataclass(frozen=True)
class LineageGraph(Report):
    """A selection of the graph: its models and the edges between them."""

    nodes: list[ModelNode]
    edges: list[LineageEdge]
    versions: dict[str, list[VersionNode]] = field(default_factory=dict)  # model -> newest first


@dataclass(frozen=True)
class TreeNode(Report):
    """One line of a lineage tree: a model, the edge that led to it (None at the top), and
    what hangs below. `repeated` marks a model already printed elsewhere in the tree (a
    merge has several parents), whose subtree is not printed twice."""

    model: ModelNode
    edge: LineageEdge | None
    children: list[TreeNode]
    repeated: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model.to_json(),
            "edge": self.edge.to_json() if self.edge else None,
            "children": [c.to_json() for c in self.children],
            "repeated": self.repeated,
        }


class Lineage:
    def __init__(
        self,
        versions: dict[str, VersionNode],
        heads: dict[str, str],
        edges: list[tuple[str, int, str, str]],
        *,
        remote: Callable[[str], bool] | None = None,
    ) -> None:
        self._remote = remote = remote or (lambda _name: False)
        self._versions = versions
        self._heads = heads
        self.nodes: dict[str, ModelNode] = {}
        model_versions: dict[str, list[VersionNode]] = {}
        for name, head in heads.items():
            chain = self._chain(head)
            model_versions[name] = chain
            top = chain[0]
            self.nodes[name] = ModelNode(
                name, head, top.seq, top.params, top.logical_bytes, sum(v.new_bytes for v in chain), top.tags, top.lossy
            )
        by_child: dict[str, list[tuple[int, str, str]]] = {}
        for child, position, parent, relation in edges:
            by_child.setdefault(child, []).append((position, parent, relation))
        self._by_child = {v: sorted(e) for v, e in by_child.items()}  # each version's own parents
        self._parents: dict[str, list[LineageEdge]] = {}
        self._children: dict[str, list[LineageEdge]] = {}
        live = list(self.nodes.values())
        for node in live:
            for _, pvid, relation in sorted(by_child.get(node.head, [])):
                pv = versions.get(pvid)
                if pv is None:  # not indexed (a catalog being rebuilt): nothing to show yet
                    continue
                pnode = self.nodes.get(pv.model)
                if pnode is None:
                    chain = self._chain(pvid)
                    pnode = ModelNode(
                        pv.model,
                        pvid,
                        pv.seq,
                        pv.params,
                        pv.logical_bytes,
                        sum(v.new_bytes for v in chain),
                        pv.tags,
                        pv.lossy,
                        removed=not remote(pv.model),
                        remote_only=remote(pv.model),
                    )
                    self.nodes[pv.model] = pnode
                    model_versions[pv.model] = chain
                edge = LineageEdge(
                    node.name,
                    node.head,
                    node.seq,
                    pnode.name,
                    pvid,
                    pv.seq,
                    relation,
                    pnode.seq,
                    stale=pvid != pnode.head,
                    parent_removed=pv.removed,
                )
                self._parents.setdefault(node.name, []).append(edge)
                self._children.setdefault(pnode.name, []).append(edge)
        for kids in self._children.values():
            kids.sort(key=lambda e: e.child)
        self._model_versions = model_versions

    @classmethod
    def load(cls, catalog: Catalog, *, remote: Callable[[str], bool] | None = None) -> Lineage:
        """The graph the catalog indexes; `remote` says whether a model without a ref here is
        held by a remote (shown remote-only rather than removed)."""
        rows, edges = catalog.graph_rows()
        versions = {r[0]: VersionNode(*r) for r in rows}  # (GRAPH_COLUMNS are VersionNode's fields, in order)
        return cls(versions, catalog.heads(), edges, remote=remote)

    def _chain(self, vid: str) -> list[VersionNode]:
        """A version and its predecessors, newest first, as far as the catalog indexes them."""
        known = takewhile(self._versions.__contains__, walk_history(vid, lambda v: self._versions[v].predecessor))
        return [self._versions[v] for v in known]

    # --- one model ----------------------------------------------------------------------
    def node(self, name: str) -> ModelNode:
        node = self.nodes.get(name)
        if node is None:
            raise UnknownRefError(name, "no model", hint="See: mgit ls")
        return node

    def versions(self, name: str) -> list[VersionNode]:
        """The versions of a model, newest first."""
        self.node(name)
        return list(self._model_versions[name])

    def parents(self, name: str) -> list[LineageEdge]:
        """The edges to a model's lineage parents, in the order they were recorded."""
        self.node(name)
        return list(self._parents.get(name, []))

    def children(self, name: str) -> list[LineageEdge]:
        """The edges from models derived from this one, by child name."""
        self.node(name)
        return list(self._children.get(name, []))

    # --- the graph ----------------------------------------------------------------------
    def ancestors(self, name: str, *, depth: int | None = None) -> list[str]:
        """Models this one derives from, nearest first (breadth-first, then by name), version
        by version: a parent's own parents are those of the version it was built on, never of
        that model's latest (A@2 built on B@1, itself built on A@1: B's ancestor is A@1, and B is
        no ancestor of itself)."""
        head = self.node(name).head
        seen, out, frontier, level = {head}, [], [head], 0
        while frontier and (depth is None or level < depth):
            nxt = sorted({p for v in frontier for p in self._parent_versions(v)} - seen)
            seen.update(nxt)
            out.extend(sorted({self._versions[v].model for v in nxt} - {name, *out}))
            frontier, level = nxt, level + 1
        return out

    def _parent_versions(self, vid: str) -> list[str]:
        return [p for _, p, _ in self._by_child.get(vid, []) if p in self._versions]

    def _edge_up(self, vid: str, pvid: str, relation: str) -> LineageEdge:
        """The edge from a version to one of its parents (either may be any version)."""
        v, pv = self._versions[vid], self._versions[pvid]
        latest = self.nodes.get(pv.model)
        return LineageEdge(
            v.model,
            vid,
            v.seq,
            pv.model,
            pvid,
            pv.seq,
            relation,
            latest.seq if latest else pv.seq,
            stale=latest is not None and pvid != latest.head,
            parent_removed=pv.removed,
        )

    def _version_node(self, vid: str) -> ModelNode:
        """A model as it was at one of its versions (its latest: the model's own node)."""
        v = self._versions[vid]
        live = self.nodes.get(v.model)
        if live is not None and live.head == vid:
            return live
        chain = self._chain(vid)
        return ModelNode(
            v.model,
            vid,
            v.seq,
            v.params,
            v.logical_bytes,
            sum(c.new_bytes for c in chain),
            v.tags,
            v.lossy,
            removed=live.removed if live is not None else not self._remote(v.model),
            remote_only=live.remote_only if live is not None else self._remote(v.model),
        )

    def descendants(self, name: str, *, depth: int | None = None) -> list[str]:
        """Models derived from this one, directly or not, nearest first."""
        return self._reach(name, lambda n: [e.child for e in self._children.get(n, [])], depth)

    def _reach(self, name: str, step: Any, depth: int | None) -> list[str]:
        self.node(name)
        seen, out, frontier, level = {name}, [], [name], 0
        while frontier and (depth is None or level < depth):
            nxt = sorted({m for n in frontier for m in step(n)} - seen)
            seen.update(nxt)
            out.extend(nxt)
            frontier, level = nxt, level + 1
        return out

    def roots(self) -> list[str]:
        return sorted(n for n in self.nodes if not self._parents.get(n))

    def leaves(self) -> list[str]:
        return sorted(n for n in self.nodes if not self._children.get(n))

    def stale(self) -> list[LineageEdge]:
        """Edges whose child was built on a version that is no longer its parent's latest."""
        return [e for edges in self._parents.values() for e in edges if e.stale]

    def path(self, a: str, b: str) -> list[LineageEdge]:
        """The shortest chain of lineage edges between two models, in either direction (up
        to a common ancestor and down again if need be), in order from `a` to `b`."""
        self.node(a), self.node(b)
        back: dict[str, tuple[str, LineageEdge] | None] = {a: None}
        queue = deque([a])
        while queue and b not in back:
            n = queue.popleft()
            steps = [(e.parent, e) for e in self._parents.get(n, [])] + [
                (e.child, e) for e in self._children.get(n, [])
            ]
            for m, e in sorted(steps, key=lambda s: s[0]):
                if m not in back:
                    back[m] = (n, e)
                    queue.append(m)
        if b not in back:
            raise NoPathError(a, b)
        out: list[LineageEdge] = []
        cur = b
        while (prev := back[cur]) is not None:
            out.append(prev[1])
            cur = prev[0]
        return out[::-1]

    def topological_order(self, names: Iterable[str] | None = None) -> list[str]:
        """Parents before children (ties by name). Models can form a cycle through their
        history (A@2 derived from B@1, itself derived from A@1); such models follow the rest,
        by name."""
        chosen = set(self.nodes) if names is None else set(names)
        for n in chosen:
            self.node(n)
        indegree = {n: sum(1 for e in self._parents.get(n, []) if e.parent in chosen) for n in chosen}
        ready = [n for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        out: list[str] = []
        while ready:
            n = heapq.heappop(ready)
            out.append(n)
            for e in self._children.get(n, []):
                if e.child in chosen:
                    indegree[e.child] -= 1
                    if indegree[e.child] == 0:
                        heapq.heappush(ready, e.child)
        placed = set(out)
        return out + sorted(n for n in chosen if n not in placed)

    def select(self, pattern: str | None = None, *, tag: str | None = None, relation: str | None = None) -> list[str]:
        """Models whose name matches a glob, whose latest version has a tag (`key` or
        `key=value`), and that were derived by a relation; every given criterion must hold."""
        out = []
        for name, node in sorted(self.nodes.items()):
            if pattern is not None and not fnmatch.fnmatchcase(name, pattern):
                continue
            if tag is not None and not tag_matches(tag, node.tags):
                continue
            if relation is not None and not any(e.relation == relation for e in self._parents.get(name, [])):
                continue
            out.append(name)
        return out

    def selection(
        self,
        pattern: str | None = None,
        *,
        tag: str | None = None,
        relation: str | None = None,
        around: str | None = None,
        depth: int | None = None,
    ) -> list[str]:
        """`select`, narrowed to a model (`around`), its ancestors and its descendants (up to
        `depth` generations each way); NoMatchError when nothing is left."""
        names = self.select(pattern, tag=tag, relation=relation)
        if around is not None:
            centre = self.node(around).name
            near = {centre, *self.ancestors(centre, depth=depth), *self.descendants(centre, depth=depth)}
            names = [n for n in names if n in near]
        if not names:
            if not self.nodes:
                raise NoMatchError(None)
            asked = " ".join(
                f"{k} {v}"
                for k, v in (("name", pattern), ("--tag", tag), ("--relation", relation), ("--around", around))
                if v is not None
            )
            raise NoMatchError(asked)
        return names

    def edges_leaving(self, names: Iterable[str]) -> list[LineageEdge]:
        """Edges between a model of `names` and one left out of them."""
        order = list(dict.fromkeys(names))
        chosen = set(order)
        return [
            e
            for n in order
            for e in [*self._parents.get(n, []), *self._children.get(n, [])]
            if (e.parent in chosen) != (e.child in chosen)
        ]

    def subgraph(self, names: Iterable[str] | None = None) -> LineageGraph:
        """The models named (all by default) and the edges among them, in topological order,
        with each model's versions."""
        order = self.topological_order(names)
        chosen = set(order)
        edges = [e for n in order for e in self._parents.get(n, []) if e.parent in chosen]
        return LineageGraph([self.nodes[n] for n in order], edges, {n: list(self._model_versions[n]) for n in order})

    def tree(self, name: str | None = None, *, up: bool = False, depth: int | None = None) -> list[TreeNode]:
        """Trees for printing: from `name` down to its descendants (or up to its ancestors
        with `up`), or, without a name, every root down."""
        tops = [name] if name is not None else self.roots()
        for t in tops:
            self.node(t)
        if up and name is not None:
            return [self._tree_up(self.node(name).head, None, 0, depth, set())]
        printed: set[str] = set()

        def grow(n: str, edge: LineageEdge | None, level: int) -> TreeNode:
            if n in printed:
                return TreeNode(self.nodes[n], edge, [], repeated=True)
            printed.add(n)
            kids: list[TreeNode] = []
            if depth is None or level < depth:
                step = self._parents.get(n, []) if up else self._children.get(n, [])
                kids = [grow(e.parent if up else e.child, e, level + 1) for e in step]
            return TreeNode(self.nodes[n], edge, kids)

        trees = [grow(t, None, 0) for t in tops]
        if name is None:  # models on a cycle have no root above them
            trees += [grow(n, None, 0) for n in self.topological_order() if n not in printed]
        return trees

    def _tree_up(
        self, vid: str, edge: LineageEdge | None, level: int, depth: int | None, printed: set[str]
    ) -> TreeNode:
        """A version and, above it, the versions it was built on, each with its own parents."""
        node = self._version_node(vid)
        if vid in printed:
            return TreeNode(node, edge, [], repeated=True)
        printed.add(vid)
        kids = []
        if depth is None or level < depth:
            kids = [
                self._tree_up(p, self._edge_up(vid, p, relation), level + 1, depth, printed)
                for _, p, relation in self._by_child.get(vid, [])
                if p in self._versions
            ]
        return TreeNode(node, edge, kids)
