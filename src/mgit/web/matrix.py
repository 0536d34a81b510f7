"""The tests page: models by tests, each cell the latest recorded result of that test on the
model's head (pass, fail, error), `not run` where the test applies but has no result, and
its change against the lineage parent's result (the exact parent version); and one result
with its metrics, reasons and output."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgit.checks import Checks
from mgit.errors import UnknownRefError
from mgit.reports import json_safe
from mgit.store.objects import OID_RE
from mgit.web.params import choice, paginate, text
from mgit.web.repoview import RepoView

SHOW = ("all", "failing", "changed")


def matrix_page(view: RepoView, query: Mapping[str, str]) -> dict[str, Any]:
    lineage, checks = view.lineage, Checks(view.repo)
    q, show = text(query, "q").strip().lower(), choice(query, "show", SHOW, "all")
    specs = checks.tests()
    applies = checks.applicable_all(lineage, specs=specs)
    live = [n for n in lineage.nodes.values() if not n.removed]
    parents = {n.name: lineage.parents(n.name) for n in live}
    parent_vids = [e.parent_version for es in parents.values() for e in es[:1]]
    found = checks.latest([n.head for n in live] + parent_vids)
    names = sorted({t.name for t in specs} | {t for n in live for t in found[n.head]})
    rows = []
    for n in live:
        applicable = {t.name for t in applies[n.name]}
        results = found[n.head]
        if not applicable and not results:
            continue
        edge = parents[n.name][0] if parents[n.name] else None
        cells = {}
        for test in names:
            o = results.get(test)
            if o is None and test not in applicable:
                continue
            before = found.get(edge.parent_version, {}).get(test) if edge else None
            status = o.status if o else "not run"
            cells[test] = {
                "status": status,
                "parent_status": before.status if before else None,
                "change": _change(before.status if before else None, status),
                "metrics": json_safe(o.metrics) if o else {},
            }
        rows.append(
            {
                "model": n.name,
                "seq": n.seq,
                "version": n.head,
                "parent": f"{edge.parent}@{edge.parent_seq}" if edge else None,
                "cells": cells,
            }
        )
    rows = [
        r
        for r in rows
        if (not q or q in r["model"].lower())
        and (show != "failing" or any(c["status"] in ("fail", "error") for c in r["cells"].values()))
        and (show != "changed" or any(c["change"] for c in r["cells"].values()))
    ]
    paged = paginate(rows, query)
    totals = {
        s: sum(1 for r in rows for c in r["cells"].values() if c["status"] == s)
        for s in ("pass", "fail", "error", "not run")
    }
    return {
        "tests": [t.to_json() for t in specs],
        "names": names,
        "rows": paged.items,
        **paged.meta(),
        "totals": totals,
        "query": {"q": text(query, "q"), "show": show},
    }


def _change(before: str | None, now: str) -> str | None:
    """`broke` (the parent passed, this does not), `fixed` (the other way), or None."""
    if before is None or now == "not run":
        return None
    if before == "pass" and now != "pass":
        return "broke"
    if before != "pass" and now == "pass":
        return "fixed"
    return None


def result_page(view: RepoView, query: Mapping[str, str]) -> dict[str, Any]:
    vid, test = text(query, "version"), text(query, "test")
    if not OID_RE.fullmatch(vid):  # match() would take a newline after the id
        raise UnknownRefError(vid, "no version", hint="Open a result from the tests page")
    info = view.repo.info(vid)
    found = [o for o in Checks(view.repo).show(vid) if o.test == test]
    if not found:
        raise UnknownRefError(f"{test} on {info.ref}", "no recorded result", hint="See: mgit test show")
    outcome = found[0]
    return {"result": outcome.to_json(output=True), "ref": info.ref, "model": info.model}
