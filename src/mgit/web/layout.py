"""A layered drawing of a lineage graph, left to right: parents in a column before their
children (Sugiyama's scheme, kept simple).

1. Layers: a model goes one column right of its furthest-right parent, in topological order.
   An edge that closes a cycle (models can be derived from one another through their
   histories) points backwards and is drawn as a plain curve.
2. An edge spanning several columns gets a bend point in each column it crosses, so that it
   is routed around the nodes and takes part in the ordering.
3. Order within a column: barycenter sweeps, right and left, keeping the order with the
   fewest crossings (counted exactly, in O(E log V) per pair of columns).
4. Heights: each node moves towards the mean height of its neighbours while the column
   keeps its order and spacing (an isotonic regression), a few sweeps each way.

About 0.1 s for a thousand models; the page only draws what this computes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

GAP_X = 90.0  # between columns
GAP_Y = 14.0  # between nodes of a column
SWEEPS = 8


@dataclass(frozen=True)
class Box:
    """A node to place: its name and its size on the page."""

    name: str
    width: float
    height: float


@dataclass(frozen=True)
class Layout:
    positions: dict[str, tuple[float, float]]  # top-left corner of each node
    routes: list[list[tuple[float, float]]]  # per edge, in input order: points from parent to child
    width: float
    height: float


def layered_layout(boxes: Sequence[Box], edges: Sequence[tuple[str, str]]) -> Layout:
    """Place `boxes` (in topological order: parents first) and route `edges` (parent, child)."""
    index = {b.name: i for i, b in enumerate(boxes)}
    layer = [0] * len(boxes)
    parents: list[list[int]] = [[] for _ in boxes]
    for p, c in edges:
        parents[index[c]].append(index[p])
    for i in range(len(boxes)):  # parents come first unless on a cycle
        layer[i] = max((layer[p] + 1 for p in parents[i] if p < i), default=0)

    # Real nodes keep their index; bend points of long edges are appended after them.
    node_layer = list(layer)
    up: list[list[int]] = [[] for _ in boxes]  # neighbours one column left
    down: list[list[int]] = [[] for _ in boxes]  # neighbours one column right
    chains: list[list[int]] = []
    for p, c in edges:
        a, b = index[p], index[c]
        if layer[b] <= layer[a]:  # a back edge: not part of the ordering
            chains.append([a, b])
            continue
        chain = [a]
        for level in range(layer[a] + 1, layer[b]):
            node_layer.append(level)
            up.append([])
            down.append([])
            chain.append(len(node_layer) - 1)
        chain.append(b)
        for u, v in zip(chain, chain[1:], strict=False):
            down[u].append(v)
            up[v].append(u)
        chains.append(chain)

    columns: list[list[int]] = [[] for _ in range(max(node_layer, default=-1) + 1)]
    for n, level in enumerate(node_layer):
        columns[level].append(n)
    columns = _order(columns, up, down)

    sizes = [(b.width, b.height) for b in boxes] + [(0.0, 0.0)] * (len(node_layer) - len(boxes))
    col_width = [max((sizes[n][0] for n in col), default=0.0) for col in columns]
    col_x, x = [], 0.0
    for w in col_width:
        col_x.append(x)
        x += w + GAP_X
    centre = _heights(columns, up, down, sizes)

    positions = {}
    for i, b in enumerate(boxes):
        positions[b.name] = (col_x[layer[i]] + (col_width[layer[i]] - b.width) / 2, centre[i] - b.height / 2)
    routes = []
    for chain in chains:
        a, b = chain[0], chain[-1]
        ax, ay = positions[boxes[a].name]
        bx, by = positions[boxes[b].name]
        points = [(ax + boxes[a].width, centre[a])]
        for d in chain[1:-1]:
            level = node_layer[d]
            points.append((col_x[level] + col_width[level] / 2, centre[d]))
        points.append((bx, centre[b]))
        routes.append(points)
    height = max((centre[n] + sizes[n][1] / 2 for n in range(len(node_layer))), default=0.0)
    return Layout(positions, routes, max(x - GAP_X, 0.0), height)


def _order(columns: list[list[int]], up: list[list[int]], down: list[list[int]]) -> list[list[int]]:
    """Barycenter sweeps; the ordering with the fewest crossings seen wins."""
    pos = {n: i for col in columns for i, n in enumerate(col)}
    best, best_crossings = [list(c) for c in columns], _crossings(columns, down, pos)
    for sweep in range(SWEEPS):
        rightwards = sweep % 2 == 0
        levels = range(1, len(columns)) if rightwards else range(len(columns) - 2, -1, -1)
        for level in levels:
            col = columns[level]
            near = up if rightwards else down

            def key(n: int, near: list[list[int]] = near) -> tuple[float, int]:
                ns = near[n]
                return (sum(pos[m] for m in ns) / len(ns) if ns else float(pos[n]), pos[n])

            col.sort(key=key)
            for i, n in enumerate(col):
                pos[n] = i
        crossings = _crossings(columns, down, pos)
        if crossings < best_crossings:
            best, best_crossings = [list(c) for c in columns], crossings
        if best_crossings == 0:
            break
    return best


def _crossings(columns: list[list[int]], down: list[list[int]], pos: dict[int, int]) -> int:
    """Edge crossings between neighbouring columns (Barth, Jünger and Mutzel's accumulator)."""
    total = 0
    for level in range(len(columns) - 1):
        targets = sorted((pos[n], pos[m]) for n in columns[level] for m in down[n])
        size = len(columns[level + 1])
        tree = [0] * (size + 1)  # Fenwick tree over positions in the next column
        for seen, (_, t) in enumerate(targets):
            i, below = t + 1, 0
            while i > 0:
                below += tree[i]
                i -= i & -i
            total += seen - below
            i = t + 1
            while i <= size:
                tree[i] += 1
                i += i & -i
    return total


def _heights(
    columns: list[list[int]], up: list[list[int]], down: list[list[int]], sizes: list[tuple[float, float]]
) -> list[float]:
    """The vertical centre of every node: stacked first, then pulled towards neighbours."""
    centre = [0.0] * len(sizes)
    for col in columns:
        y = 0.0
        for n in col:
            centre[n] = y + sizes[n][1] / 2
            y += sizes[n][1] + GAP_Y
    for sweep in range(4):
        rightwards = sweep % 2 == 0
        levels = range(1, len(columns)) if rightwards else range(len(columns) - 2, -1, -1)
        for level in levels:
            col = columns[level]
            near = up if rightwards else down
            wanted = [sum(centre[m] for m in near[n]) / len(near[n]) if near[n] else centre[n] for n in col]
            for n, y in zip(col, _spaced(wanted, [sizes[n][1] for n in col]), strict=True):
                centre[n] = y
    low = min(centre[n] - sizes[n][1] / 2 for n in range(len(sizes))) if sizes else 0.0
    return [c - low for c in centre]


def _spaced(wanted: list[float], heights: list[float]) -> list[float]:
    """Heights closest to `wanted` (least squares) that keep the order and the spacing: with
    y_i = z_i + offset_i the constraint is z non-decreasing, an isotonic regression solved by
    pooling adjacent violators."""
    offsets, acc = [], 0.0
    for i, h in enumerate(heights):
        if i:
            acc += (heights[i - 1] + h) / 2 + GAP_Y
        offsets.append(acc)
    blocks: list[list[float]] = []  # [mean, count]
    for w, off in zip(wanted, offsets, strict=True):
        blocks.append([w - off, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, c2 = blocks.pop()
            m1, c1 = blocks[-1]
            blocks[-1] = [(m1 * c1 + m2 * c2) / (c1 + c2), c1 + c2]
    z = [m for m, c in blocks for _ in range(int(c))]
    return [zi + off for zi, off in zip(z, offsets, strict=True)]
