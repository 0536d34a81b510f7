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
import time
from collections.abc import Collection, Mapping
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from mgit.codecs import Codec
from mgit.errors import InputError, InvalidOptionError, MgitError, RefConflictError
from mgit.formats.adapter import CONFIG as ADAPTER_CONFIG
from mgit.formats.folder import ModelSource, scan_path, scan_state_dict
from mgit.formats.gguf import gguf_names
from mgit.index.catalog import Catalog, ObjectRow
from mgit.index.refs import RefStore, validate_model_name
from mgit.index.retired import RetiredNames
from mgit.lineage.inference import DEFAULT_MIN_CONFIDENCE, ParentSuggestion, suggest
from mgit.lineage.sketch import Sketch, sketch_added, sketch_source, stored_sketches
from mgit.repo.adapters import RELATION, adapter_parents, merged_chains
from mgit.repo.checkout import restore_manifest
from mgit.repo.checkpoints import check_run_bases, checkpoint_base
from mgit.repo.declared import declared_parents
from mgit.repo.gate import Gate, GateResult
from mgit.repo.ingest import DeltaPlan, SnapshotStats, write_snapshot
from mgit.repo.location import trust_recipe
from mgit.repo.model_signature import SIGNER_TAG, ModelSigner
from mgit.repo.permuted import permuted_chains
from mgit.reports import AddResult
from mgit.store.base import ObjectStore, PutResult
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
from mgit.util.parallel import Progress, StartProgress, default_jobs


@dataclass(frozen=True)
class AddOptions:
    """What an add is asked for, as `Repo.add`'s keywords say it (its docstring tells each in
    full): `Repo.add` builds one from them, the command line from its options, merges and
    recipe runs their own, and `Repo.add_with` takes it. Checked when made."""

    name: str  # the model that gets the version
    parents: tuple[str, ...] = ()  # lineage parents, as refs; none: those of the version before
    relation: str | None = None  # how it derives from them (default: the model card's, else finetune)
    message: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)  # none: those of the version before
    author: str | None = None  # default: $MGIT_AUTHOR, else user@host
    jobs: int | None = None  # threads (default: one per core, at most 8)
    progress: StartProgress | None = None  # total_bytes -> a callback for bytes done
    lossy: LossyPolicy | None = None  # lossy storage's bounds and guard; None: lossless
    gate: Gate | None = None  # the metric check lossy storage must also pass
    model_card: bool = True  # without parents: those named by README.md's base_model, a GGUF's general.base_model
    recipe: str | Mapping[str, Any] | None = None  # how it was made: "module:function", or a record
    params: Mapping[str, Any] | None = None  # the recipe's parameters
    resources: Mapping[str, float] | None = None  # what a run of the recipe declares to a cluster
    auto_parent: bool = False  # without parents: inferred from the weights
    expected_head: str | None = None  # commit only if the model's latest version is still this one
    run: Mapping[str, Any] | None = None  # a training run's checkpoint (mgit.repo.checkpoints): the record's `run`
    run_bases: str = "skip"  # a checkpoint's delta base among the run's (mgit.repo.checkpoints.run_base)
    sign: bool = False  # sign the version with signing.key (signing.always signs every add anyway)
    # Set by merges (mgit.merging) and their re-runs, never by users: by tensor name, the codec
    # chains that predict a tensor from stored ones, tried beside the usual encodings (`derived`),
    # or that made it, stored as they are (`exact`; see `mgit.repo.ingest.DeltaPlan`).
    derived: Mapping[str, list[Codec]] = field(default_factory=dict)
    exact: Mapping[str, list[Codec]] = field(default_factory=dict)
    signer: ModelSigner | None = None  # set by Repo.add_with from a verified model.sig, never by users

    def __post_init__(self) -> None:
        validate_model_name(self.name)
        if SIGNER_TAG in self.tags:
            raise InvalidOptionError(f"the tag {SIGNER_TAG} is set only by a verified model.sig")
        if self.auto_parent and self.parents:
            raise InvalidOptionError(
                "auto_parent infers the parent; it cannot be combined with a given parent",
                hint="Drop --parent or --auto-parent",
            )
        check_run_bases(self.run_bases)
        if self.gate is not None and self.lossy is None:
            raise InvalidOptionError("a gate only checks lossy storage", hint="Add --lossy EPS or --lossy-rel R")


@dataclass(frozen=True)
class Snapshot:
    """The objects of a version, written: its manifest and what was new, and for a lossy add the
    verdict: the lossy record the version keeps (None: stored losslessly), why lossy storage was
    refused, and the gate's metrics when it ran."""

    manifest: Manifest
    stats: SnapshotStats
    lossy: dict[str, Any] | None = None
    refusal: str | None = None
    gate: dict[str, dict[str, float]] | None = None
    earlier: list[PutResult] = field(default_factory=list)  # what a refused lossy pass wrote first


def add_version(
    store: ObjectStore,
    refs: RefStore,
    retired: RetiredNames,
    catalog: Catalog,
    source: str | os.PathLike[str] | Mapping[str, Any] | ModelSource,
    options: AddOptions,
    *,
    parents: list[str],
    recipe: dict[str, Any] | None,
    max_depth: int,
    reuse: DecodedCache | None = None,
) -> AddResult:
    """The body of `Repo.add` (see its docstring) over the repository's store, refs and catalog:
    `parents` are the options' parents resolved to version ids, `recipe` the record of its
    recipe (`Repo.recipe_record`)."""
    name, message, tags = options.name, options.message, dict(options.tags or {})
    author = options.author or os.environ.get("MGIT_AUTHOR") or user_at_host()
    jobs = options.jobs or default_jobs()
    try:  # what every reader of the record will check, refused before anything is written
        check_version_fields(model=name, message=message, author=author, tags=tags, parents=len(parents), recipe=recipe)
    except RecordError as exc:
        raise InvalidOptionError(
            str(exc), hint="A message may hold newlines and tabs; no field other control characters"
        ) from None
    asked_relation = relation = options.relation
    recipe_record = recipe
    parent_ids = parents
    adapter, parent_ids, card_notes = adapter_parents(store, catalog, source, parent_ids, own=name)
    relation = relation or (RELATION if adapter is not None else None)
    if not parent_ids and options.model_card and not isinstance(source, Mapping | ModelSource):
        parent_ids, card_relation, card_notes = declared_parents(refs, Path(source))
        relation = relation or card_relation
    own = [p for p in parent_ids if _model_of(store, catalog, p) == name]
    if own:  # the version before is the new one's predecessor: as a parent too it would be its own ancestor
        ref = catalog.parent_infos([(own[0], relation or "finetune")])[0].ref
        seq = ref.rpartition("@")[2]
        raise InvalidOptionError(
            f"{ref} cannot be a lineage parent of {name}: it is {name}'s own history, "
            f"and the new version follows {name}'s latest already",
            hint=f"A parent is another model; to branch from {name}@{seq}, add the new version under another name",
        )
    relation = relation or "finetune"
    if relation not in RELATIONS:
        raise InvalidOptionError(f"unknown relation {relation!r}", hint=f"Use one of: {', '.join(RELATIONS)}")
    lineage = tuple(Parent(p, relation) for p in parent_ids)
    src: ModelSource = (
        source
        if isinstance(source, ModelSource)
        else scan_state_dict(source)
        if isinstance(source, Mapping)
        else scan_path(Path(source))
    )
    src.notes.extend(card_notes + list(options.signer.notes if options.signer else ()))
    auto, sketch = None, None
    if options.auto_parent and not parent_ids:
        label = str(source) if isinstance(source, str | os.PathLike) else "state dict"
        sketch = sketch_source(src)
        # Versions of `name` itself are history, not lineage.
        auto = suggest_parents(store, catalog, sketch, label, limit=5, own=name)
        parent_ids = list(auto.parents)
        lineage = tuple(Parent(v, asked_relation or auto.relation or relation) for v in auto.parents)
        src.notes.append(f"auto-parent: {'chose ' if auto.parents else 'no parent: '}{auto.verdict}")
    tick = options.progress(src.logical_bytes) if options.progress else None
    with catalog.explained():
        # the versions whose tensors are delta bases: the model's latest (a checkpoint: its run's) and the parents
        previous, depth, alone = checkpoint_base(
            store, catalog, refs.get(name), options.run, options.run_bases, max_depth
        )
        plan = _delta_plan(store, previous, () if alone else lineage, depth, src)
        plan = replace(plan, derived={**plan.derived, **options.derived}, exact=dict(options.exact))
    crash_point("after-scan")
    with store.lock():
        snapshot = _snapshot(store, src, source, plan, options, jobs, tick, reuse)
        manifest = snapshot.manifest
        crash_point("after-objects")
        mres = store.put_record("manifest", manifest.to_json())
        store.sync()
        with refs.lock(name):
            head = refs.get(name)
            if options.expected_head is not None and head != options.expected_head:
                raise RefConflictError(name, options.expected_head, head)
            prev = store.get_version(head) if head else None
            src.notes.extend(_odd(store, catalog, name, manifest, prev, head))
            if prev is not None and not parent_ids:
                lineage = prev.parents
            if recipe_record is None and prev is not None:
                recipe_record = prev.recipe  # a new version made the same way as the last
            if not tags and prev is not None:  # and tagged the same way, unless new tags are given
                tags = {k: v for k, v in prev.tags.items() if k != SIGNER_TAG}  # (a signer is this folder's)
            tags |= {SIGNER_TAG: options.signer.tag} if options.signer else {}
            if (
                prev is not None
                and prev.manifest == mres.oid
                and prev.parents == lineage
                and prev.recipe == recipe_record
                and prev.tags == tags
                and prev.run == options.run
            ):
                return replace(
                    _add_result(catalog, head, prev, snapshot, created=False, notes=src.notes), auto_parent=auto
                )
            version = Version(
                number=_number(store, catalog, retired, name, head),
                model=name,
                manifest=mres.oid,
                parents=lineage,
                predecessor=head,
                message=message,
                author=author,
                time=utc_now(),
                tags=tags,
                summary={
                    "files": len(manifest.files),
                    "tensors": len(manifest.tensors()),
                    "params": sum(t.params for t in manifest.tensors()),
                    "logical_bytes": manifest.logical_bytes,
                },
                lossy=snapshot.lossy,
                recipe=recipe_record,
                run=dict(options.run) if options.run is not None else None,
            )
            vres = store.put_record("version", version.to_json())
            store.sync()
            crash_point("before-ref")
            refs.set_locked(name, vres.oid, expected=head)
            crash_point("after-ref")
    snapshot.stats.record(mres)
    snapshot.stats.record(vres)
    catalog.add_objects(ObjectRow.written(r) for r in snapshot.stats.new_objects)
    catalog.index(store, vres.oid)
    _save_sketch(catalog, vres.oid, manifest, src, sketch if version.lossy is None else None)
    # Only this model's head moved (an add removes no version, so nothing to prune); a
    # full sync would read every ref and walk every version, slow with thousands.
    catalog.set_head(name, lambda: refs.get(name))
    return replace(_add_result(catalog, vres.oid, version, snapshot, created=True, notes=src.notes), auto_parent=auto)


def _model_of(store: ObjectStore, catalog: Catalog, vid: str) -> str:
    """The model a version is under now: the catalog's (a renamed model's), else its record's."""
    row = catalog.version(vid)
    return row.model if row else store.get_version(vid).model


def _number(store: ObjectStore, catalog: Catalog, retired: RetiredNames, name: str, head: str | None) -> int | None:
    """The new version's number when it is not the head's plus one (None): a name whose
    numbers went higher before (versions removed) goes on from the highest."""
    if head and not catalog.has_version(head):
        catalog.index(store, head)
    row = catalog.version(head) if head else None
    natural = row.seq + 1 if row else 1
    last = retired.last(name)
    return last + 1 if last >= natural else None


def _odd(
    store: ObjectStore, catalog: Catalog, name: str, manifest: Manifest, prev: Version | None, head: str | None
) -> list[str]:
    """What looks like a mistake in an add, said and not refused: a model of no tensors, or a new
    version that shares few tensors (by name and shape) with the one before."""
    new = {(t.name, tuple(t.shape)) for t in manifest.tensors()}
    if not new:
        return [
            "the model holds no tensors: only its files are stored (is PATH the model's folder? a PyTorch "
            ".bin inside a folder is kept as a file: add the .bin itself to store its tensors)"
        ]
    if prev is None or head is None:
        return []
    old = {(t.name, tuple(t.shape)) for t in store.get_manifest(prev.manifest).tensors()}
    if not old or len(new & old) >= 0.5 * max(len(new), len(old)):
        return []
    ref = catalog.parent_infos([(head, "finetune")])[0].ref
    return [
        f"this version shares {len(new & old)} of {len(new)} tensors (by name and shape) with {ref}: another "
        f"architecture as a new version of {name}? (another name keeps both as models of their own)"
    ]


def suggest_parents(
    store: ObjectStore,
    catalog: Catalog,
    sketch: Sketch,
    label: str,
    *,
    limit: int,
    min_confidence: float = DEFAULT_MIN_CONFIDENCE,
    exclude: Collection[str] = (),
    own: str | None = None,
    started: float | None = None,
) -> ParentSuggestion:
    """Stored versions ranked as parents of a model by its sketch (see mgit.lineage.inference);
    `exclude` leaves out versions, by id or by model name. `own` is the name the model is added
    under: its versions are history, not lineage, and when one holds the model's every tensor
    the model is that version stored already."""
    if not len(sketch):
        raise InputError(
            label,
            "holds no tensors to compare",
            hint="Give a model folder with .safetensors files, or a PyTorch checkpoint on its own",
        )
    left_out = set(exclude)
    stored, history = [], []
    for v, ref, s in stored_sketches(store, catalog):
        model = ref.rpartition("@")[0]
        if model == own:
            history.append((v, ref, s))
        elif v not in left_out and model not in left_out:
            stored.append((v, ref, s))
    return suggest(
        sketch,
        stored,
        label=label,
        limit=limit,
        min_confidence=min_confidence,
        started=started,
        history=history,
    )


def recipe_record(
    store: ObjectStore,
    repo_dir: Path,
    root: Path,
    recipe: str | Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    *,
    resources: Mapping[str, float] | None = None,
    recorded: bool = False,
) -> dict[str, Any]:
    """What a version records of a recipe: the function located (never run) and anchored
    at the work folder `root`, its parameters, declared resources, its source file's hash and
    the file as an object (a teammate without it runs that), trusted here (mgit.repo.location).
    A record (a mapping) is taken as it is; a reference `recorded` is a version's, read from
    the work folder whatever the current one (`usercode.anchored`)."""
    if isinstance(recipe, Mapping):  # recorded already (a cascade running a recorded source)
        return dict(recipe)
    from mgit.usercode import recipe_record_of, source_file

    record = recipe_record_of(recipe, params, root=root, resources=resources, recorded=recorded)
    record["source"] = store.put_blob(source_file(record["fn"], cwd=root).read_bytes()).oid
    return trust_recipe(repo_dir, record)  # recorded here: the user's own code


def suggest_parents_of(
    store: ObjectStore,
    catalog: Catalog,
    source: str | os.PathLike[str] | Mapping[str, Any],
    *,
    limit: int,
    min_confidence: float | None,
    exclude: Collection[str],
) -> ParentSuggestion:
    """`Repo.suggest_parents`: a model folder, file or state dict scanned and sketched, then
    ranked against the stored versions (`suggest_parents`)."""
    started = time.perf_counter()
    src = scan_state_dict(source) if isinstance(source, Mapping) else scan_path(Path(source))
    label = "state dict" if isinstance(source, Mapping) else str(source)
    return suggest_parents(
        store,
        catalog,
        sketch_source(src),
        label,
        limit=limit,
        min_confidence=DEFAULT_MIN_CONFIDENCE if min_confidence is None else min_confidence,
        exclude=exclude,
        started=started,
    )


def _snapshot(
    store: ObjectStore,
    src: ModelSource,
    source: Any,
    plan: DeltaPlan,
    options: AddOptions,
    jobs: int,
    tick: Progress | None,
    reuse: DecodedCache | None,
) -> Snapshot:
    """Write the objects of a version: lossily if asked and accepted, else losslessly.
    Lossy objects are written first but only become visible if the version is committed;
    when refused they stay unreferenced (gc removes them) and the files are added again."""
    policy = options.lossy
    if policy is None:
        return Snapshot(*write_snapshot(store, src, jobs=jobs, progress=tick, plan=plan, reuse=reuse))
    manifest, stats = write_snapshot(
        store, src, jobs=jobs, progress=tick, plan=replace(plan, lossy=policy), reuse=reuse
    )
    record, refusal = verdict(stats.lossy, policy, new_tensors=stats.tensors_new)
    metrics = None
    if record is not None and options.gate is not None:
        result = _run_gate(store, src, source, manifest, options.gate, jobs)
        metrics = {"original": result.original, "reconstruction": result.reconstruction}
        if not result.passed:
            record, refusal = None, f"the gate refused it: {result.reason}"
    earlier: list[PutResult] = []
    if record is None:
        earlier = stats.new_objects
        manifest, stats = write_snapshot(store, src, jobs=jobs, plan=plan, reuse=reuse)
    return Snapshot(manifest, stats, record, refusal, metrics, earlier)


def _run_gate(
    store: ObjectStore, src: ModelSource, source: Any, manifest: Manifest, gate: Gate, jobs: int
) -> GateResult:
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
        return gate.evaluate(original, recon)


def _delta_plan(
    store: ObjectStore, previous: str | None, parents: tuple[Parent, ...], max_depth: int, src: ModelSource
) -> DeltaPlan:
    """Tensors of the previous version of the model (its head; for a checkpoint, the one its
    run codes it against) and of the lineage parents, as delta bases, paired with the source's
    tensors by name across a wrapper prefix. Only a hint for compression: a head that moves
    meanwhile costs space, never correctness."""
    related = [v for v in [previous, *(p.version for p in parents)] if v]
    if not related and not parents:
        return DeltaPlan(max_depth=max_depth)
    by_version = {v: store.get_manifest(store.get_version(v).manifest) for v in dict.fromkeys(related)}
    manifests = list(by_version.values())
    names = [span.name for f in src.files if f.layout is not None for span in f.layout.tensors]
    arch = next((f.layout.metadata.get("general.architecture") for f in src.files if f.kind == "gguf"), None)
    rename = partial(gguf_names, arch) if isinstance(arch, str) else None  # a GGUF of a safetensors parent
    plan = DeltaPlan.from_parents(manifests, max_depth=max_depth, names=names, rename=rename)
    if rename:
        return replace(plan, derived=permuted_chains(src, manifests))
    if len(parents) < 2:
        return plan
    return replace(plan, derived=_adapter_merges(store, [by_version[p.version] for p in parents]))


def _adapter_merges(store: ObjectStore, parents: list[Manifest]) -> dict[str, list[Codec]]:
    """A model whose parents are a base and a LoRA adapter (`mgit merge --adapter`, its
    re-run by a cascade, or a merge made by peft and added): its weights predicted as the merge
    (mgit.repo.adapters.merged_chains)."""
    chains: dict[str, list[Codec]] = {}
    for adapter in parents:
        if not any(f.path == ADAPTER_CONFIG for f in adapter.files):
            continue
        for base in parents:
            if base is not adapter:
                with suppress(MgitError):  # (a prediction only: else stored as deltas)
                    chains.update(merged_chains(store, base, adapter))
    return chains


def _add_result(
    catalog: Catalog, vid: str, version: Version, snapshot: Snapshot, *, created: bool, notes: list[str]
) -> AddResult:
    row, stats = catalog.version(vid), snapshot.stats
    return AddResult(
        model=row.model if row else version.model,  # a renamed model's: the record says the old name
        version=vid,
        seq=row.seq if row else 0,
        created=created,
        files=stats.files,
        tensors=stats.tensors,
        tensors_new=stats.tensors_new,
        logical_bytes=version.summary.get("logical_bytes", 0),
        # The catalog's count: a refused lossy pass may have written objects that the
        # lossless pass then found already there.
        new_bytes=(new := (row.new_bytes if row else sum(r.stored_size for r in stats.new_objects)) if created else 0),
        reused_bytes=_reused(new, vid, version, snapshot) if created else 0,
        parents=catalog.parent_infos(version.parents),
        notes=list(notes),
        lossy=version.lossy,
        lossless_reason=snapshot.refusal,
        gate=snapshot.gate,
    )


def _reused(new: int, vid: str, version: Version, snapshot: Snapshot) -> int:
    """Of a version's new bytes (objects no other version uses), those this add found on disk
    rather than wrote: what an interrupted add of the same model had written before."""
    mine = {vid, version.manifest, *snapshot.manifest.object_ids()}
    written = {r.oid: r.stored_size for r in [*snapshot.earlier, *snapshot.stats.new_objects] if r.oid in mine}
    return max(0, new - sum(written.values()))


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
