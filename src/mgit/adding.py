"""Adding a version: what `Repo.add` does between a model folder (or state dict) and a moved ref.

In order: the parents (given, named by the folder's model card, or inferred from the weights),
the objects (losslessly, or lossily when asked and accepted by the fidelity guard and the
user's gate), the manifest and version records, the ref (compare-and-swap under the model's
lock), then the catalog and the parent-inference sketch. Objects are durable before the
records that name them, and the records before the ref: a crash at any point leaves the old
head or the new one (the crash points mark where the crash tests kill).
"""

from __future__ import annotations

import getpass
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import MgitError, RefConflictError
from mgit.faults import crash_point
from mgit.formats.folder import ModelSource, scan_path, scan_state_dict
from mgit.formats.model_card import CARD, read_lineage
from mgit.gate import GateResult, evaluate
from mgit.integrity import load_manifest, load_version
from mgit.lossy import LossyPolicy, verdict
from mgit.objects import RELATIONS, Manifest, Parent, Version, utc_now
from mgit.refs import is_model_name
from mgit.reports import AddResult, ParentSuggestion
from mgit.sketch import Sketch, sketch_added, sketch_source
from mgit.snapshot import DeltaPlan, Progress, SnapshotStats, restore_manifest, write_snapshot
from mgit.store import MemoryStore

if TYPE_CHECKING:
    from mgit.repo import Repo

MAX_CARD_BYTES = 1 << 20  # a model card larger than this is not read for lineage


def add_version(repo: Repo, source: str | os.PathLike[str] | Mapping[str, Any], *, name: str, parents: list[str],
                relation: str | None, message: str, tags: dict[str, str], author: str | None, jobs: int,
                progress: Callable[[int, int], Progress] | None, policy: LossyPolicy | None,
                gate: tuple[str | None, float, float], model_card: bool, recipe: dict[str, Any] | None,
                auto_parent: bool, expected_head: str | None = None) -> AddResult:  # fmt: skip
    """The body of `Repo.add` (see its docstring), with its options checked and resolved."""
    asked_relation = relation
    recipe_record = recipe
    parent_refs = parents
    card_notes: list[str] = []
    if not parent_refs and model_card and not isinstance(source, Mapping):
        parent_refs, card_relation, card_notes = _card_parents(repo, Path(source))
        relation = relation or card_relation
    relation = relation or "finetune"
    if relation not in RELATIONS:
        raise MgitError(f"unknown relation {relation!r}", hint=f"Use one of: {', '.join(RELATIONS)}")
    lineage = tuple(Parent(repo.resolve(p), relation) for p in parent_refs)
    src: ModelSource = scan_state_dict(source) if isinstance(source, Mapping) else scan_path(Path(source))
    src.notes.extend(card_notes)
    auto, sketch = None, None
    if auto_parent and not parent_refs:
        auto, sketch = _auto_parents(repo, src, name, str(source) if not isinstance(source, Mapping) else "state dict")
        parent_refs = list(auto.parents)
        lineage = tuple(Parent(v, asked_relation or auto.relation or relation) for v in auto.parents)
        src.notes.append(f"auto-parent: {'chose ' if auto.parents else 'no parent: '}{auto.verdict}")
    tick = progress(src.logical_bytes, 0) if progress else None
    plan = _delta_plan(repo, name, lineage)
    crash_point("after-scan")
    with repo._writer_lock():
        manifest, stats, outcome = _snapshot(repo, src, source, plan, policy, jobs, tick, gate)
        crash_point("after-objects")
        mres = repo.store.put_record("manifest", manifest.to_json())
        repo.store.sync()
        with repo.refs.lock(name):
            head = repo.refs.get(name)
            if expected_head is not None and head != expected_head:
                raise RefConflictError(name, expected_head, head)
            prev = load_version(repo.store, head) if head else None
            if prev is not None and not parent_refs:
                lineage = prev.parents
            if recipe_record is None and prev is not None:
                recipe_record = prev.recipe  # a new version made the same way as the last
            if not tags and prev is not None:
                tags = dict(prev.tags)  # and tagged the same way, unless new tags are given
            if (prev is not None and prev.manifest == mres.oid and prev.parents == lineage
                    and prev.recipe == recipe_record and prev.tags == tags):  # fmt: skip
                return replace(_add_result(repo, head, prev, stats, created=False, notes=src.notes, lossy=outcome),
                               auto_parent=auto)
            version = Version(
                model=name, manifest=mres.oid, parents=lineage, predecessor=head, message=message,
                author=author or os.environ.get("MGIT_AUTHOR") or default_author(), time=utc_now(), tags=tags,
                summary={"files": len(manifest.files), "tensors": len(manifest.tensors()),
                         "params": sum(t.params for t in manifest.tensors()),
                         "logical_bytes": manifest.logical_bytes},
                lossy=outcome.get("record"), recipe=recipe_record,
            )  # fmt: skip
            vres = repo.store.put_record("version", version.to_json())
            repo.store.sync()
            crash_point("before-ref")
            repo.refs.set_locked(name, vres.oid, expected=head)
            crash_point("after-ref")
    stats.record("manifest", mres)
    stats.record("version", vres)
    repo.catalog.add_objects(stats.new_objects)
    repo._index(vres.oid)
    _save_sketch(repo, vres.oid, manifest, src, sketch if version.lossy is None else None)
    # Only this model's head moved (an add removes no version, so nothing to prune); a
    # full sync would read every ref and walk every version, slow with thousands.
    repo.catalog.set_head(name, lambda: repo.refs.get(name))
    return replace(_add_result(repo, vres.oid, version, stats, created=True, notes=src.notes, lossy=outcome),
                   auto_parent=auto)


def _card_parents(repo: Repo, path: Path) -> tuple[list[str], str | None, list[str]]:
    """Parents named by a folder's model card that exist here, their relation, and notes."""
    card = path / CARD
    if not path.is_dir() or not card.is_file() or card.stat().st_size > MAX_CARD_BYTES:
        return [], None, []
    found = read_lineage(card.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return [], None, []
    known = [b for b in found.base_models if is_model_name(b) and repo.refs.get(b) is not None]
    missing = [b for b in found.base_models if b not in known]
    notes = [f"{CARD} names base_model {', '.join(map(repr, missing))}, not in this repository: "
             "not recorded as a parent"] if missing else []  # fmt: skip
    if not known:
        return [], None, notes
    relation = found.relation or ("merge" if len(known) > 1 else None)
    notes.append(f"parent{'s' if len(known) > 1 else ''} {', '.join(known)} "
                 f"({relation or 'finetune'}) from the base_model of {CARD}")  # fmt: skip
    return known, relation, notes


def _snapshot(repo: Repo, src: ModelSource, source: Any, plan: DeltaPlan, policy: LossyPolicy | None, jobs: int,
              tick: Progress | None, gate: tuple[str | None, float, float]
              ) -> tuple[Manifest, SnapshotStats, dict[str, Any]]:  # fmt: skip
    """Write the objects of a version: lossily if asked and accepted, else losslessly.
    Lossy objects are written first but only become visible if the version is committed;
    when refused they stay unreferenced (gc removes them) and the files are added again."""
    if policy is None:
        return *write_snapshot(repo.store, src, jobs=jobs, progress=tick, plan=plan), {}
    manifest, stats = write_snapshot(repo.store, src, jobs=jobs, progress=tick, plan=replace(plan, lossy=policy))
    record, refusal = verdict(stats.lossy, policy)
    outcome: dict[str, Any] = {}
    spec, max_drop, timeout = gate
    if record is not None and spec is not None:
        result = _run_gate(repo, src, source, manifest, spec, max_drop, timeout, jobs)
        outcome["gate"] = {"original": result.original, "reconstruction": result.reconstruction}
        if not result.passed:
            record, refusal = None, f"the gate refused it: {result.reason}"
    if record is None:
        manifest, stats = write_snapshot(repo.store, src, jobs=jobs, plan=plan)
    return manifest, stats, {**outcome, "record": record, "refusal": refusal}


def _run_gate(repo: Repo, src: ModelSource, source: Any, manifest: Manifest, spec: str, max_drop: float,
              timeout: float, jobs: int) -> GateResult:  # fmt: skip
    """The gate on the source folder and on the reconstruction rebuilt from the new objects
    (a file or a state dict is first written out as it will check out, losslessly)."""
    with tempfile.TemporaryDirectory(prefix="mgit-gate-") as tmp:
        recon = Path(tmp) / "reconstruction"
        restore_manifest(repo.store, manifest, recon, jobs=jobs)
        if not isinstance(source, Mapping) and Path(source).is_dir():
            original = Path(source)
        else:
            original, scratch = Path(tmp) / "original", MemoryStore()
            restore_manifest(scratch, write_snapshot(scratch, src, jobs=jobs)[0], original, jobs=jobs)
        return evaluate(spec, original, recon, max_drop=max_drop, timeout=timeout)


def _delta_plan(repo: Repo, name: str, parents: tuple[Parent, ...]) -> DeltaPlan:
    """Tensors of the previous version of `name` and of the lineage parents, as delta bases.
    Only a hint for compression: a head that moves meanwhile costs space, never correctness."""
    related = [v for v in [repo.refs.get(name), *(p.version for p in parents)] if v]
    if not related and not parents:
        return DeltaPlan(max_depth=repo.max_depth)
    with repo._explained():
        manifests = [load_manifest(repo.store, load_version(repo.store, v).manifest) for v in dict.fromkeys(related)]
    return DeltaPlan.from_parents(manifests, max_depth=repo.max_depth)


def _add_result(repo: Repo, vid: str, version: Version, stats: Any, *, created: bool, notes: list[str],
                lossy: dict[str, Any]) -> AddResult:  # fmt: skip
    row = repo.catalog.version(vid)
    return AddResult(
        model=version.model, version=vid, seq=row.seq if row else len(repo.chain(vid)), created=created,
        files=stats.files, tensors=stats.tensors, tensors_new=stats.tensors_new,
        logical_bytes=version.summary.get("logical_bytes", 0),
        # The catalog's count: a refused lossy pass may have written objects that the
        # lossless pass then found already there.
        new_bytes=(row.new_bytes if row else sum(r.stored_size for r in stats.new_objects)) if created else 0,
        parents=repo._parent_infos(version.parents), notes=list(notes), lossy=version.lossy,
        lossless_reason=lossy.get("refusal"), gate=lossy.get("gate"),
    )  # fmt: skip


def _auto_parents(repo: Repo, src: ModelSource, name: str, label: str) -> tuple[ParentSuggestion, Sketch]:
    """Parents for `add(auto_parent=True)`: versions of `name` itself are history, not lineage."""
    sketch = sketch_source(src)
    return repo._suggest(sketch, label, limit=5, exclude={name}), sketch


def _save_sketch(repo: Repo, vid: str, manifest: Manifest, src: ModelSource, sketch: Sketch | None) -> None:
    """Store the sketch of a version just added, from its source files. The version is
    committed already: a sketch that cannot be made now is made when it is needed."""
    try:
        repo.catalog.put_sketch(vid, (sketch or sketch_added(manifest, src)).to_bytes())
    except (ValueError, OSError, MgitError) as exc:
        src.notes.append(f"no parent-inference sketch stored yet ({exc}); it is computed when needed")


def default_author() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{os.uname().nodename}"
