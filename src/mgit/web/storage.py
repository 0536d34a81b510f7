"""The storage page: what each model costs and why, from `Repo.du()` (the numbers of `mgit
du`): logical bytes (every version as plain files) against the bytes of the objects its
versions use, and how its tensors are stored (deduplicated, delta, derived, standalone),
drawn as bars."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mgit.web.params import choice, paginate, text
from mgit.web.repoview import RepoView

KINDS = ("deduplicated", "delta", "derived", "standalone")
SORTS = ("stored", "logical", "reduction", "name")


def storage_page(view: RepoView, query: Mapping[str, str]) -> dict[str, Any]:
    du = view.kept("du", view.repo.du)
    q = text(query, "q").strip().lower()
    sort = choice(query, "sort", SORTS, "stored")
    key = {
        "stored": lambda m: -m.stored_bytes,
        "logical": lambda m: -m.logical_bytes,
        "reduction": lambda m: -m.reduction,
        "name": lambda m: m.name,
    }[sort]
    models = sorted((m for m in du.models if not q or q in m.name.lower()), key=key)
    paged = paginate(models, query)
    scale = max((m.logical_bytes for m in du.models), default=0) or 1
    rows = []
    for m in paged.items:
        tensors = sum(m.tensor_storage.get(k, 0) for k in KINDS) or 1
        rows.append(
            {
                **m.to_json(),
                "bars": {
                    "logical": m.logical_bytes / scale,
                    "stored": min(m.stored_bytes / scale, 1.0),
                    "kinds": [
                        {"kind": k, "count": m.tensor_storage.get(k, 0), "share": m.tensor_storage.get(k, 0) / tensors}
                        for k in KINDS
                    ],
                },
            }
        )
    return {
        "summary": {k: v for k, v in du.to_json().items() if k != "models"},
        "models": rows,
        **paged.meta(),
        "kinds": list(KINDS),
        "query": {"q": text(query, "q"), "sort": sort},
    }
