"""Adding a version: what `Repo.add` does between a model folder (or state dict) and a moved ref.

In order: the parents (given, named by the folder's model card, or inferred from the weights),
the objects (losslessly, or lossily when asked and accepted by the fidelity guard and the
user's gate), the manifest and version records, the ref (compare-and-swap under the model's
lock), then the catalog and the parent-inference sketch. Objects are durable before the
records that name them, and the records before the ref: a crash at any point leaves the old
head or the new one (the crash points mark where the crash tests kill).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from mgit.errors import InputError, InvalidOptionError, MgitError, RefConflictError
from mgit.formats.folder import ModelSource, scan_path, scan_state_dict
from mgit.formats.model_card import CARD, read_lineage
from mgit.index.catalog import Catalog, ObjectRow
from mgit.index.refs import RefStore, is_model_name
from mgit.lineage.inference import DEFAULT_MIN_CONFIDENCE, suggest
from mgit.lineage.sketch import Sketch, sketch_added, sketch_source, stored_sketches
from mgit.repo.checkout import restore_manifest
from mgit.repo.gate import GateResult, evaluate
from mgit.repo.ingest import DeltaPlan, SnapshotStats, write_snapshot
from mgit.reports import AddResult, ParentSuggestion
from mgit.store.base import ObjectStore
from mgit.store.cache import DecodedCache
from mgit.store.lossy_policy import LossyPolicy, verdict
from mgit.store.memory import MemoryStore
from mgit.store.objects import (
    RELATIONS,
    Manifest,
    Parent,
    RecordError,
    Version,
    check_version_fields,
    user_at_host,
    utc_now,
)
from mgit.util.faults import crash_point
from mgit.util.parallel import Progress

MAX_CARD_BYTES = 1 << 20  # a model card larger than this is not read for lineage


def add_version(store: ObjectStore, refs: RefStore, catalog: Catalog,
                source: str | os.PathLike[str] | Mapping[str, Any] | ModelSource, *, name: str, parents: list[str],
                relation: str | None, message: str, tags: dict[str, str], author: str | None, jobs: int,
                progress: Callable[[int, int], Progress] | None, policy: LossyPolicy | None,
                gate: tuple[str | None, float, float], model_card: bool, recipe: dict[str, Any] | None,
                auto_parent: bool, max_depth: int, expected_head: str | None = None,
                reuse: DecodedCache | None = None, derived: dict[str, list[Any]] | None = None,
                exact: dict[str, list[Any]] | None = None) -> AddResult:  # fmt: skip
    """The body of `Repo.add` (see its docstring), with its options checked and `parents`
    resolved to version ids, over the repository's store, refs and catalog."""
    author = author or os.environ.get("MGIT_AUTHOR") or user_at_host()
    try:  # what every reader of the record will check, refused before anything is written
        check_version_fields(model=name, message=message, author=author, tags=tags, parents=len(parents),
                             recipe=recipe)
    except RecordError as exc:
        raise InvalidOptionError(str(exc), hint="A message may hold newlines and tabs; no field other control "
                                 "characters") from None  # fmt: skip
    asked_relation = relation
    recipe_record = recipe
    parent_ids = parents
    card_notes: list[str] = []
    if not parent_ids and model_card and not isinstance(source, Mapping | ModelSource):
        parent_ids, card_relation, card_notes = _card_parents(refs, Path(source))
        relation = relation or card_relation
    relation = relation or "finetune"
    if relation not in RELATIONS:
        raise InvalidOptionError(f"unknown relation {relation!r}", hint=f"Use one of: {', '.join(RELATIONS)}")
    lineage = tuple(Parent(p, relation) for p in parent_ids)
    src: ModelSource = source if isinstance(source, ModelSource) else \
        scan_state_dict(source) if isinstance(source, Mapping) else scan_path(Path(source))  # fmt: skip
    src.notes.extend(card_notes)
    auto, sketch = None, None
    if auto_parent and not parent_ids:
        label = str(source) if isinstance(source, str | os.PathLike) else "state dict"
        sketch = sketch_source(src)
        # Versions of `name` itself are history, not lineage.
        auto = suggest_parents(store, catalog, sketch, label, limit=5, exclude={name})
        parent_ids = list(auto.parents)
        lineage = tuple(Parent(v, asked_relation or auto.relation or relation) for v in auto.parents)
        src.notes.append(f"auto-parent: {'chose ' if auto.parents else 'no parent: '}{auto.verdict}")
    tick = progress(src.logical_bytes, 0) if progress else None
    with catalog.explained():
        plan = replace(_delta_plan(store, refs, name, lineage, max_depth), derived=dict(derived or {}),
                       exact=dict(exact or {}))  # fmt: skip
    crash_point("after-scan")
    with store.lock():
        manifest, stats, outcome = _snapshot(store, src, source, plan, policy, jobs, tick, gate, reuse)
        crash_point("after-objects")
        mres = store.put_record("manifest", manifest.to_json())
        store.sync()
        with refs.lock(name):
            head = refs.get(name)
            if expected_head is not None and head != expected_head:
                raise RefConflictError(name, expected_head, head)
            prev = store.get_version(head) if head else None
            if prev is not None and not parent_ids:
                lineage = prev.parents
            if recipe_record is None and prev is not None:
                recipe_record = prev.recipe  # a new version made the same way as the last
            if not tags and prev is not None:
                tags = dict(prev.tags)  # and tagged the same way, unless new tags are given
            if (prev is not None and prev.manifest == mres.oid and prev.parents == lineage
                    and prev.recipe == recipe_record and prev.tags == tags):  # fmt: skip
                return replace(_add_result(catalog, head, prev, stats, created=False, notes=src.notes, lossy=outcome),
                               auto_parent=auto)
            version = Version(
                model=name, manifest=mres.oid, parents=lineage, predecessor=head, message=message,
                author=author, time=utc_now(), tags=tags,
                summary={"files": len(manifest.files), "tensors": len(manifest.tensors()),
                         "params": sum(t.params for t in manifest.tensors()),
                         "logical_bytes": manifest.logical_bytes},
                lossy=outcome.get("record"), recipe=recipe_record,
            )  # fmt: skip
            vres = store.put_record("version", version.to_json())
            store.sync()
            crash_point("before-ref")
            refs.set_locked(name, vres.oid, expected=head)
            crash_point("after-ref")
    stats.record(mres)
    stats.record(vres)
    catalog.add_objects(ObjectRow.written(r) for r in stats.new_objects)
    catalog.index(store, vres.oid)
    _save_sketch(catalog, vres.oid, manifest, src, sketch if version.lossy is None else None)
    # Only this model's head moved (an add removes no version, so nothing to prune); a
    # full sync would read every ref and walk every version, slow with thousands.
    catalog.set_head(name, lambda: refs.get(name))
    return replace(_add_result(catalog, vres.oid, version, stats, created=True, notes=src.notes, lossy=outcome),
                   auto_parent=auto)


def suggest_parents(store: ObjectStore, catalog: Catalog, sketch: Sketch, label: str, *, limit: int,
                    min_confidence: float = DEFAULT_MIN_CONFIDENCE, exclude: Collection[str] = (),
                    started: float | None = None) -> ParentSuggestion:  # fmt: skip
    """Stored versions ranked as parents of a model by its sketch (see mgit.lineage.inference);
    `exclude` leaves out versions, by id or by model name."""
    if not len(sketch):
        raise InputError(label, "holds no tensors to compare",
                         hint="Give a model folder with .safetensors files, or a PyTorch checkpoint on its own")  # fmt: skip
    left_out = set(exclude)
    stored = [(v, ref, s) for v, ref, s in stored_sketches(store, catalog)
              if v not in left_out and ref.rpartition("@")[0] not in left_out]  # fmt: skip
    return suggest(sketch, stored, label=label, limit=limit, min_confidence=min_confidence, started=started)


def _card_parents(refs: RefStore, path: Path) -> tuple[list[str], str | None, list[str]]:
    """Parents named by a folder's model card that exist here (their heads), their relation,
    and notes."""
    card = path / CARD
    if not path.is_dir() or not card.is_file() or card.stat().st_size > MAX_CARD_BYTES:
        return [], None, []
    found = read_lineage(card.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return [], None, []
    heads = {b: refs.get(b) for b in found.base_models if is_model_name(b)}
    known = [b for b, head in heads.items() if head is not None]
    missing = [b for b in found.base_models if b not in known]
    notes = [f"{CARD} names base_model {', '.join(map(repr, missing))}, not in this repository: "
             "not recorded as a parent"] if missing else []  # fmt: skip
    if not known:
        return [], None, notes
    relation = found.relation or ("merge" if len(known) > 1 else None)
    notes.append(f"parent{'s' if len(known) > 1 else ''} {', '.join(known)} "
                 f"({relation or 'finetune'}) from the base_model of {CARD}")  # fmt: skip
    return [heads[b] for b in known], relation, notes  # type: ignore[misc]


def _snapshot(store: ObjectStore, src: ModelSource, source: Any, plan: DeltaPlan, policy: LossyPolicy | None, jobs: int,
              tick: Progress | None, gate: tuple[str | None, float, float], reuse: DecodedCache | None
              ) -> tuple[Manifest, SnapshotStats, dict[str, Any]]:  # fmt: skip
    """Write the objects of a version: lossily if asked and accepted, else losslessly.
    Lossy objects are written first but only become visible if the version is committed;
    when refused they stay unreferenced (gc removes them) and the files are added again."""
    if policy is None:
        return *write_snapshot(store, src, jobs=jobs, progress=tick, plan=plan, reuse=reuse), {}
    manifest, stats = write_snapshot(store, src, jobs=jobs, progress=tick, plan=replace(plan, lossy=policy),
                                     reuse=reuse)  # fmt: skip
    record, refusal = verdict(stats.lossy, policy)
    outcome: dict[str, Any] = {}
    spec, max_drop, timeout = gate
    if record is not None and spec is not None:
        result = _run_gate(store, src, source, manifest, spec, max_drop, timeout, jobs)
        outcome["gate"] = {"original": result.original, "reconstruction": result.reconstruction}
        if not result.passed:
            record, refusal = None, f"the gate refused it: {result.reason}"
    if record is None:
        manifest, stats = write_snapshot(store, src, jobs=jobs, plan=plan, reuse=reuse)
    return manifest, stats, {**outcome, "record": record, "refusal": refusal}


def _run_gate(store: ObjectStore, src: ModelSource, source: Any, manifest: Manifest, spec: str, max_drop: float,
              timeout: float, jobs: int) -> GateResult:  # fmt: skip
    """The gate on the source folder and on the reconstruction rebuilt from the new objects
    (a file or a state dict is first written out as it will check out, losslessly)."""
    with tempfile.TemporaryDirectory(prefix="mgit-gate-") as tmp:
        recon = Path(tmp) / "reconstruction"
        restore_manifest(store, manifest, recon, jobs=jobs)
        if isinstance(source, str | os.PathLike) and Path(source).is_dir():
            original = Path(source)
        else:
            original, scratch = Path(tmp) / "original", MemoryStore()
            restore_manifest(scratch, write_snapshot(scratch, src, jobs=jobs)[0], original, jobs=jobs)
        return evaluate(spec, original, recon, max_drop=max_drop, timeout=timeout)


def _delta_plan(store: ObjectStore, refs: RefStore, name: str, parents: tuple[Parent, ...],
                max_depth: int) -> DeltaPlan:  # fmt: skip
    """Tensors of the previous version of `name` and of the lineage parents, as delta bases.
    Only a hint for compression: a head that moves meanwhile costs space, never correctness."""
    related = [v for v in [refs.get(name), *(p.version for p in parents)] if v]
    if not related and not parents:
        return DeltaPlan(max_depth=max_depth)
    manifests = [store.get_manifest(store.get_version(v).manifest) for v in dict.fromkeys(related)]
    return DeltaPlan.from_parents(manifests, max_depth=max_depth)


def _add_result(catalog: Catalog, vid: str, version: Version, stats: SnapshotStats, *, created: bool,
                notes: list[str], lossy: dict[str, Any]) -> AddResult:  # fmt: skip
    row = catalog.version(vid)
    return AddResult(
        model=version.model, version=vid, seq=row.seq if row else 0, created=created,
        files=stats.files, tensors=stats.tensors, tensors_new=stats.tensors_new,
        logical_bytes=version.summary.get("logical_bytes", 0),
        # The catalog's count: a refused lossy pass may have written objects that the
        # lossless pass then found already there.
        new_bytes=(row.new_bytes if row else sum(r.stored_size for r in stats.new_objects)) if created else 0,
        parents=catalog.parent_infos(version.parents), notes=list(notes), lossy=version.lossy,
        lossless_reason=lossy.get("refusal"), gate=lossy.get("gate"),
    )  # fmt: skip


def _save_sketch(catalog: Catalog, vid: str, manifest: Manifest, src: ModelSource, sketch: Sketch | None) -> None:
    """Store the sketch of a version just added, from its source files. The version is
    committed already: a sketch that cannot be made now is made when it is needed (as for a
    source read once, a merge's, rather than merging again)."""
    if sketch is None and not all(f.replayable for f in src.files):
        return
    try:
        catalog.put_sketch(vid, (sketch or sketch_added(manifest, src)).to_bytes())
    except (ValueError, OSError, MgitError) as exc:
        src.notes.append(f"no parent-inference sketch stored yet ({exc}); it is computed when needed")
