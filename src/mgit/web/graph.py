"""The lineage graph as a page and as Graphviz DOT.

`render_html` writes one self-contained file: the layout is computed here (`layout.py`), the
page's script and style are inlined from `static/`, and the graph travels as JSON inside a
`<script type="application/json">` element. Nothing is fetched: the page works offline, and
its Content-Security-Policy allows only its own script and style (by hash), so a model name,
message or tag can never run code or load anything, whatever it contains.

`render_dot` writes the same graph for Graphviz (`dot -Tsvg graph.dot > graph.svg`).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import re
from importlib import resources
from typing import Any

from mgit.lineage.graph import LineageEdge, LineageGraph, ModelNode, VersionNode
from mgit.reports import VersionStorage, human_size, json_safe
from mgit.web.layout import Box, layered_layout

CHAR_WIDTH = 7.3  # the page draws labels in a 12px monospace font
NODE_HEIGHT = 38.0
MAX_LABEL = 48  # longer names are cut on the node (the panel shows them whole)


def render_html(
    graph: LineageGraph,
    *,
    title: str = "MGit lineage",
    storage: dict[str, VersionStorage] | None = None,
    outside: list[LineageEdge] | None = None,
    selected: str | None = None,
    links: list[tuple[str, str]] | None = None,
    model_pages: str | None = None,
) -> str:
    """The page for `graph`. `storage` (by version id) adds how each version is stored;
    `outside` lists edges to models left out of a selection, named in the panel, not drawn;
    `selected` is a model to open and centre on; `links` are (label, href) of other pages,
    shown in the header (`mgit serve`'s; none in a file); `model_pages` is where a model's own
    page is (its name appended), linked from the panel."""
    data = page_data(graph, storage=storage or {}, outside=outside or [])
    data["title"] = title
    if selected is not None:
        data["selected"] = selected
    if model_pages is not None:
        data["model_pages"] = model_pages
    values = {
        "title": html.escape(title),
        "csp": page_csp(),
        "style": _static("graph.css"),
        "script": _static("graph.js"),
        "data": script_json(data),
        "links": "".join(f'<a href="{html.escape(href)}">{html.escape(label)}</a>' for label, href in links or []),
    }
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m[1]], _static("page.html"))


def page_csp() -> str:
    """The page's Content-Security-Policy: its own script and style (by hash), nothing else."""
    return (
        f"default-src 'none'; script-src '{_sha256(_static('graph.js'))}'; style-src '{_sha256(_static('graph.css'))}'"
    )


def page_data(graph: LineageGraph, *, storage: dict[str, VersionStorage], outside: list[LineageEdge]) -> dict[str, Any]:
    """What the page's script draws: nodes with their place, edges with their route, and
    what the panel shows for each model."""
    boxes = [Box(n.name, _label_width(n), NODE_HEIGHT) for n in graph.nodes]
    layout = layered_layout(boxes, [(e.parent, e.child) for e in graph.edges])
    nodes = []
    for n in graph.nodes:
        x, y = layout.positions[n.name]
        versions = graph.versions.get(n.name, [])
        tensors: dict[str, int] = {}
        for v in versions:
            for kind, count in storage.get(v.id, VersionStorage(0)).tensors.items():
                tensors[kind] = tensors.get(kind, 0) + count
        nodes.append(
            {
                "name": n.name,
                "x": round(x, 1),
                "y": round(y, 1),
                "w": round(_label_width(n), 1),
                "h": NODE_HEIGHT,
                "label": _cut(n.name),
                "sub": _sub_label(n),
                "head": n.head,
                "seq": n.seq,
                "params": n.params,
                "logical_bytes": n.logical_bytes,
                "stored_bytes": n.stored_bytes,
                "tags": n.tags,
                "lossy": json_safe(n.lossy),
                "removed": n.removed,
                "tensors": tensors,
                "versions": [_version(v, storage.get(v.id)) for v in versions],
            }
        )
    edges = [
        {**e.to_json(), "points": [[round(x, 1), round(y, 1)] for x, y in route]}
        for e, route in zip(graph.edges, layout.routes, strict=True)
    ]
    return {
        "width": round(layout.width, 1),
        "height": round(layout.height, 1),
        "nodes": nodes,
        "edges": edges,
        "outside": [e.to_json() for e in outside],
    }


def graph_json(graph: LineageGraph, *, storage: dict[str, VersionStorage] | None = None) -> dict[str, Any]:
    """`graph.to_json()` plus `storage` by version id, from the records' flat `to_json`
    (`dataclasses.asdict`, which deep-copies, took 0.4 s for 5,000 versions)."""
    return {
        "nodes": [n.to_json() for n in graph.nodes],
        "edges": [e.to_json() for e in graph.edges],
        "versions": {m: [v.to_json() for v in vs] for m, vs in graph.versions.items()},
        "storage": {vid: {"stored_bytes": s.stored_bytes, "tensors": s.tensors} for vid, s in (storage or {}).items()},
    }


def script_json(value: Any) -> str:
    """JSON that is safe inside a <script> element: no `<`, `>` or `&` (so no `</script>` or
    `<!--`), and no U+2028/U+2029, each written as its \\u escape, which JSON.parse reads back."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for ch in "<>&\u2028\u2029":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def render_dot(graph: LineageGraph) -> str:
    """Graphviz DOT, left to right. Edges say their relation and the parent version; a stale
    edge is dashed; a removed model is grey and dashed, a lossy one has a double border."""
    lines = [
        "digraph mgit {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded", fontname="Helvetica", fontsize=11];',
        '  edge [fontname="Helvetica", fontsize=9];',
    ]
    for n in graph.nodes:
        attrs = {
            "label": f"{n.name}\n@{n.seq} · {human_size(n.logical_bytes)}"
            + (" · lossy" if n.lossy else "")
            + (" · removed" if n.removed else ""),
            "tooltip": f"{n.name} {n.head[:12]}",
        }
        if n.removed:
            attrs.update(style="rounded,dashed", color="gray50", fontcolor="gray40")
        if n.lossy:
            attrs["peripheries"] = "2"
        lines.append(f"  {dot_id(n.name)} [{_dot_attrs(attrs)}];")
    for e in graph.edges:
        attrs = {"label": f"{e.relation} @{e.parent_seq}" + (f" (now @{e.latest_seq})" if e.stale else "")}
        if e.stale:
            attrs["style"] = "dashed"
        lines.append(f"  {dot_id(e.parent)} -> {dot_id(e.child)} [{_dot_attrs(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def dot_id(text: str) -> str:
    """A double-quoted DOT string: backslashes and quotes escaped, line breaks as `\\n`."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "").replace("\n", "\\n")
    return f'"{escaped}"'


# --- helpers ------------------------------------------------------------------------------
def _dot_attrs(attrs: dict[str, str]) -> str:
    return ", ".join(f"{k}={dot_id(v)}" for k, v in attrs.items())


def _cut(name: str) -> str:
    return name if len(name) <= MAX_LABEL else name[: MAX_LABEL - 1] + "…"


def _sub_label(n: ModelNode) -> str:
    marks = (" · lossy" if n.lossy else "") + (" · removed" if n.removed else "")
    return f"@{n.seq} · {human_size(n.logical_bytes)}{marks}"


def _label_width(n: ModelNode) -> float:
    return max(len(_cut(n.name)), len(_sub_label(n)), 8) * CHAR_WIDTH + 20


def _version(v: VersionNode, storage: VersionStorage | None) -> dict[str, Any]:
    return {
        "id": v.id,
        "seq": v.seq,
        "time": v.time,
        "message": v.message,
        "tags": v.tags,
        "params": v.params,
        "logical_bytes": v.logical_bytes,
        "new_bytes": v.new_bytes,
        "lossy": json_safe(v.lossy),
        "stored_bytes": storage.stored_bytes if storage else None,
        "tensors": storage.tensors if storage else None,
    }


def _static(name: str) -> str:
    return resources.files("mgit.web").joinpath("static", name).read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
