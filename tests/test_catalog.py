"""The catalog: what it reads back is what was indexed, field by field."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from mgit.index.catalog import Catalog
from mgit.lineage.graph import Lineage
from mgit.store.memory import MemoryStore
from mgit.store.objects import Manifest, Parent, Version

RECIPE = {"fn": "recipes:tune", "params": {"lr": 1}, "source_sha256": "0" * 64}
LOSSY = {"eps": 0.5, "mode": "abs", "max_error": 0.25, "tensors": 3, "guard": 1.0}
RUN = {"id": "run-7", "step": 23, "metrics": {"loss": 0.5}}


def indexed(tmp_path: Path) -> tuple[Catalog, dict[str, Any]]:
    """A catalog of two models, `base` and `m` (two versions, the second derived from base),
    and every field of m@2 as the catalog must give it back: no two of them alike, so a
    value read into the wrong field is seen."""
    store = MemoryStore()
    manifest = store.put_record("manifest", Manifest(()).to_json()).oid
    base = store.put_record("version", Version("base", manifest, time="2026-01-01T00:00:00Z").to_json()).oid
    first = store.put_record("version", Version("m", manifest, time="2026-01-01T00:00:01Z").to_json()).oid
    second = Version(
        "m",
        manifest,
        parents=(Parent(base, "finetune"),),
        predecessor=first,
        message="tuned",
        author="ann",
        time="2026-01-02T03:04:05Z",
        tags={"team": "a"},
        summary={"files": 11, "tensors": 13, "params": 17, "logical_bytes": 19},
        recipe=RECIPE,
        lossy=LOSSY,
        # The catalog keeps a run's id, step and metrics, not the optimizer's scalars.
        run={**RUN, "optimizer": {"(dict)": [["lr", 0.1]]}},
    )
    vid = store.put_record("version", second.to_json()).oid
    catalog = Catalog(tmp_path / "catalog.sqlite")
    catalog.index(store, vid)
    catalog.set_heads(lambda: {"base": base, "m": vid})
    expected = {
        "id": vid,
        "model": "m",
        "seq": 2,
        "manifest": manifest,
        "predecessor": first,
        "message": "tuned",
        "author": "ann",
        "time": "2026-01-02T03:04:05Z",
        "tags": {"team": "a"},
        "files": 11,
        "tensors": 13,
        "params": 17,
        "logical_bytes": 19,
        "stored_bytes": store.stored_size(manifest) + store.stored_size(vid),  # the manifest is shared
        "new_bytes": store.stored_size(vid),
        "lossy": LOSSY,
        "parents": ((base, "finetune"),),
        "recipe": RECIPE,
        "removed": False,
        "run": RUN,
    }
    assert len({repr(v) for v in expected.values()}) == len(expected)
    return catalog, expected


def test_a_version_row_holds_each_column_in_its_own_field(tmp_path: Path) -> None:
    catalog, expected = indexed(tmp_path)
    row = catalog.version(expected["id"])
    assert row is not None
    assert {f.name: getattr(row, f.name) for f in fields(row)} == expected
    assert catalog.versions_of([expected["id"]]) == {expected["id"]: row}


def test_a_lineage_version_node_holds_each_column_in_its_own_field(tmp_path: Path) -> None:
    catalog, expected = indexed(tmp_path)
    node = Lineage.load(catalog).versions("m")[0]
    assert {f.name: getattr(node, f.name) for f in fields(node)} == {f.name: expected[f.name] for f in fields(node)}


def test_links_are_what_each_indexed_record_links_to_and_sketches_go_in_one_batch(tmp_path: Path) -> None:
    """The rows a push walks histories by instead of parsing records: predecessor first, then
    lineage parents, as Version.linked_versions gives them."""
    catalog, expected = indexed(tmp_path)
    links = catalog.links()
    base = expected["parents"][0][0]
    assert links == {base: [], expected["predecessor"]: [], expected["id"]: [expected["predecessor"], base]}
    catalog.put_sketches({base: b"one", expected["id"]: b"two"})
    catalog.put_sketches({base: b"kept?", expected["predecessor"]: b"three"}, keep=True)
    assert [catalog.sketch(v) for v in (base, expected["id"], expected["predecessor"])] == [b"one", b"two", b"three"]
