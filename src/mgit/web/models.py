"""The models list and a model's page, as data: the same dict renders the HTML page and is
the JSON of its /api twin.

The list reads the lineage snapshot (every model, its head, parents, tags and sizes in two
queries) and the latest test results of every head (one query), so a thousand models cost
one pass; search, filters, sorting and pages work on that list in memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgit.checks import Checks
from mgit.errors import UnknownRefError
from mgit.repo.tensors import version_tensors
from mgit.reports import json_safe
from mgit.signing.policy import signature_checks
from mgit.store.objects import RELATIONS, tag_matches
from mgit.web.card import version_card
from mgit.web.params import choice, number, paginate, text
from mgit.web.repoview import RepoView
from mgit.web.runs import run_chart

SORTS = ("name", "updated", "size", "stored", "versions", "tests")
STATUS_ORDER = {"fail": 0, "error": 1, "not run": 2, "pass": 3, None: 4}  # worst first


def models_page(view: RepoView, query: Mapping[str, str]) -> dict[str, Any]:
    q, tag = text(query, "q").strip().lower(), text(query, "tag").strip()
    relation = choice(query, "relation", ("", *RELATIONS), "")
    sort = choice(query, "sort", SORTS, "name")
    order = choice(query, "order", ("asc", "desc"), "desc" if sort in ("updated", "size", "stored") else "asc")
    rows = model_rows(view)  # not kept: test results change while heads stay
    chosen = [
        r
        for r in rows
        if (not q or q in r["name"].lower() or any(q in f"{k}={v}".lower() for k, v in r["tags"].items()))
        and (not tag or tag_matches(tag, r["tags"]))
        and (not relation or any(p["relation"] == relation for p in r["parents"]))
    ]
    sort_key = {
        "name": lambda r: r["name"],
        "updated": lambda r: r["time"],
        "size": lambda r: r["logical_bytes"],
        "stored": lambda r: r["stored_bytes"],
        "versions": lambda r: r["seq"],
        "tests": lambda r: (STATUS_ORDER[r["tests"]["status"]], r["name"]),
    }[sort]
    chosen.sort(key=sort_key, reverse=order == "desc")
    paged = paginate(chosen, query)
    tags = sorted({f"{k}={v}" for r in rows for k, v in r["tags"].items()})
    return {
        "models": paged.items,
        **paged.meta(),
        "all_models": len(rows),
        "query": {"q": text(query, "q"), "tag": tag, "relation": relation, "sort": sort, "order": order},
        "tags": tags[:500],
        "relations": list(RELATIONS),
    }


def model_rows(view: RepoView) -> list[dict[str, Any]]:
    """One row per live model: what the list shows and filters on."""
    lineage = view.lineage
    live = [n for n in lineage.nodes.values() if not n.removed]
    statuses = test_summaries(view, [n.name for n in live])
    rows = []
    for n in live:
        head = lineage.versions(n.name)[0]
        rows.append(
            {
                "name": n.name,
                "seq": n.seq,
                "head": n.head,
                "tags": n.tags,
                "logical_bytes": n.logical_bytes,
                "stored_bytes": n.stored_bytes,
                "params": n.params,
                "time": head.time,
                "lossy": bool(n.lossy),
                "parents": [
                    {
                        "model": e.parent,
                        "seq": e.parent_seq,
                        "relation": e.relation,
                        "stale": e.stale,
                        "latest_seq": e.latest_seq,
                    }
                    for e in lineage.parents(n.name)
                ],
                "tests": statuses[n.name],
            }
        )
    return rows


def test_summaries(view: RepoView, names: list[str]) -> dict[str, dict[str, Any]]:
    """Per model: how many of the tests that apply to its head passed, failed, errored or
    were not run, and the worst of them (`status`, None when no test applies)."""
    lineage, checks = view.lineage, Checks(view.repo)
    applicable = checks.applicable_all(lineage)
    heads = {n: lineage.nodes[n].head for n in names}
    found = checks.latest(list(heads.values()), {v: (n, lineage.nodes[n].seq) for n, v in heads.items()})
    out = {}
    for name in names:
        results = found[heads[name]]
        counts = {"pass": 0, "fail": 0, "error": 0, "not run": 0}
        for test in {t.name for t in applicable[name]} | set(results):
            counts[results[test].status if test in results else "not run"] += 1
        worst = min((s for s, c in counts.items() if c), key=STATUS_ORDER.__getitem__, default=None)
        out[name] = {"status": worst, **counts}
    return out


def model_page(view: RepoView, name: str, query: Mapping[str, str]) -> dict[str, Any]:
    repo, lineage = view.repo, view.lineage
    node = lineage.node(name)  # UnknownRefError (404) for anything else
    versions = lineage.versions(name)
    seq = number(query, "version", node.seq, hi=max(v.seq for v in versions))
    shown_node = next((v for v in versions if v.seq == seq), None)
    if shown_node is None:
        raise UnknownRefError(f"{name}@{seq}", "no version", hint=f"See the versions of {name}")
    vid = shown_node.id
    shown = repo.show(vid)
    log = repo.log(node.head)
    manifest = repo.manifest(vid)
    tensors = paginate(
        [t.to_json() for t in version_tensors(repo.store, repo.catalog, vid, manifest)],
        query,
        prefix="t",
        per_page=100,
    )
    card = version_card(manifest, repo.store)
    checks = Checks(repo)
    results = checks.latest([v.id for v in versions], {v.id: (name, v.seq) for v in versions})
    tests = sorted({t for r in results.values() for t in r} | {t.name for t in checks.applicable(name, lineage)})
    return {
        "model": node.to_json(),
        "version": shown.to_json(),
        "versions": [v.to_json() for v in log],
        "parents": [e.to_json() for e in lineage.parents(name)],
        "children": [e.to_json() for e in lineage.children(name)],
        "card": card.to_json() if card else None,
        "run": run_chart(log, query),
        "signatures": [c.to_dict() for c in signature_checks(repo.signatures, repo.config, [vid])[vid]],
        "tensors": {"items": tensors.items, **tensors.meta()},
        "tests": {
            "names": tests,
            "versions": [
                {
                    "seq": v.seq,
                    "version": v.id,
                    "results": {
                        t: {"status": o.status, "metrics": json_safe(o.metrics), "reasons": o.reasons}
                        for t, o in results[v.id].items()
                    },
                }
                for v in versions
            ],
        },
    }
