"""`prune-run`: keep some checkpoints of a training run and let the others go.

A run's checkpoints are versions of one model, each the predecessor of the next, each coded
as deltas against the one before. Removing some of them takes three steps, all before the
model's ref moves (a crash before it leaves the model as it was; objects coded again hold the
same content under the same id, so nothing ever reads wrong):

1. every kept tensor whose chain of delta bases passes through an object only removed
   checkpoints name is coded again against its namesake in the kept checkpoint before it (or
   on its own), the stored file replaced atomically;
2. from the first removed checkpoint on, each kept version is recorded again with the kept
   version before it as its predecessor and its number unchanged (`ft@17` stays `ft@17`;
   the new record has a new id, and tags set since are folded into it);
3. the ref moves to the new head (compare-and-swap). `gc` then frees the removed checkpoints.

Always kept: the latest version, versions that are not checkpoints, tagged ones (chosen:
`mgit tag ft@17 release`), and a version another version names as a lineage parent together
with the history before it (the child names it by id, so its record, and with it its
predecessors, cannot change).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from mgit.errors import InvalidOptionError, RefConflictError, UnknownRefError
from mgit.index.catalog import Catalog, ObjectRow
from mgit.index.refs import RefStore
from mgit.index.tags import TagStore, effective
from mgit.reports import Report
from mgit.store.base import ObjectStore, PutResult
from mgit.store.cache import UNBOUNDED, DecodedCache
from mgit.store.decoding import BaseReader
from mgit.store.objects import Manifest, TensorEntry, Version, tensor_meta, walk_history
from mgit.store.reader import tensor_bytes


@dataclass(frozen=True)
class RunCheckpoint(Report):
    """One checkpoint of a run as `prune-run` judged it: kept (and why) or removed."""

    ref: str
    version: str
    step: int | None
    kept: str | None  # why it stays (None: removed)
    stored_bytes: int = 0  # of the objects it alone uses, freed by gc when it is removed


@dataclass(frozen=True)
class PruneResult(Report):
    """What `prune-run` removed from a run (or, with `dry_run`, would remove)."""

    model: str
    dry_run: bool
    checkpoints: list[RunCheckpoint]  # oldest first
    freed_bytes: int  # stored bytes of the objects only removed checkpoints use: what gc frees
    relinked: int = 0  # kept versions recorded again, their predecessor the kept one before
    recoded: int = 0  # kept tensors coded again, against a kept base, so their old bases can go
    head: str | None = None  # the model's latest version afterwards (its id changes when relinked)

    @property
    def removed(self) -> list[RunCheckpoint]:
        return [c for c in self.checkpoints if c.kept is None]


@dataclass(frozen=True)
class RetentionPolicy:
    """Which checkpoints stay: the last `keep_last`, those whose step is a multiple of
    `keep_every`, and the best by metric `keep_best` (lowest, or highest with `maximize`)."""

    keep_last: int = 0
    keep_every: int | None = None
    keep_best: str | None = None
    maximize: bool = False

    def __post_init__(self) -> None:
        if self.keep_last < 0 or (self.keep_every is not None and self.keep_every < 1):
            raise InvalidOptionError(
                "--keep-last is 0 or more and --keep-every 1 or more", hint="See: mgit prune-run --help"
            )

    def reasons(self, checkpoints: list[tuple[str, Version]]) -> dict[str, str]:
        """Why each kept checkpoint (oldest first) is kept, by version id."""
        why: dict[str, str] = {}
        if self.keep_best is not None:
            scored = [(v.run["metrics"].get(self.keep_best), vid) for vid, v in checkpoints if v.run]
            scored = [(m, vid) for m, vid in scored if m is not None]
            if not scored:
                raise InvalidOptionError(
                    f"no checkpoint logged metric {self.keep_best!r}", hint="See: mgit log MODEL (the metrics logged)"
                )
            best = (max if self.maximize else min)(scored, key=lambda s: s[0])
            why[best[1]] = f"best {self.keep_best} ({best[0]:.6g})"
        if self.keep_every is not None:
            for vid, v in checkpoints:
                step = v.run["step"] if v.run else None
                if step is not None and step % self.keep_every == 0:
                    why.setdefault(vid, f"step a multiple of {self.keep_every}")
        for vid, _ in checkpoints[len(checkpoints) - self.keep_last :] if self.keep_last else []:
            why.setdefault(vid, f"one of the last {self.keep_last}")
        return why


def prune_run(
    store: ObjectStore,
    refs: RefStore,
    catalog: Catalog,
    tags: TagStore,
    model: str,
    policy: RetentionPolicy,
    *,
    dry_run: bool = False,
) -> PruneResult:
    """The body of `Repo.prune_run` (the caller holds the store's shared lock)."""
    with refs.lock(model):
        head = refs.get(model)
        if head is None:
            raise UnknownRefError(model, "no model")
        order = list(reversed(list(walk_history(head, lambda v: store.get_version(v).predecessor))))
        versions = {vid: store.get_version(vid) for vid in order}
        catalog.index(store, head)
        rows = catalog.versions_of(order)
        why = _kept(order, versions, catalog, tags, policy)
        removed = [vid for vid in order if vid not in why]
        exclusive = _exclusive_sizes(catalog, removed)
        checkpoints = [
            RunCheckpoint(
                f"{model}@{rows[vid].seq}",
                vid,
                (versions[vid].run or {}).get("step"),
                why.get(vid),
                exclusive.get(vid, 0),
            )
            for vid in order
        ]
        freed = sum(exclusive.values())
        if dry_run or not removed:
            return PruneResult(model, dry_run, checkpoints, freed, head=head)
        first = order.index(removed[0])
        kept_after = [vid for vid in order[first:] if vid in why]
        doomed = _doomed(store, versions, removed, [vid for vid in order if vid in why])
        previous = order[first - 1] if first else None
        recoded = relinked = 0
        new_head = previous
        for vid in kept_after:
            version = versions[vid]
            base = store.get_manifest(versions[previous].manifest) if previous else None
            recoded += _recode(store, catalog, store.get_manifest(version.manifest), base, doomed)
            record = replace(
                version,
                predecessor=new_head,
                number=rows[vid].seq,
                tags=effective(version.tags, tags.get(vid)),
            )
            new_head = store.put_record("version", record.to_json()).oid
            previous = vid
            relinked += 1
        store.sync()
        if refs.get(model) != head:
            raise RefConflictError(model, head, refs.get(model))
        refs.set_locked(model, new_head, expected=head)
    if new_head is not None:
        catalog.index(store, new_head)
    catalog.set_heads(refs.all)
    return PruneResult(model, False, checkpoints, freed, relinked, recoded, new_head)


def _kept(
    order: list[str], versions: dict[str, Version], catalog: Catalog, tags: TagStore, policy: RetentionPolicy
) -> dict[str, str]:
    """Why each version of the history (oldest first) that stays, stays."""
    checkpoints = [(vid, versions[vid]) for vid in order if versions[vid].run is not None]
    why = policy.reasons(checkpoints)
    pinned = None
    for vid in order:
        if versions[vid].run is None:
            why[vid] = "not a checkpoint"
        overlay = {k: v for k, v in tags.get(vid).items() if v is not None}
        if overlay:
            why[vid] = "tagged " + ", ".join(f"{k}={v}" for k, v in sorted(overlay.items()))
        children = catalog.children_of(vid)
        if children:
            why[vid] = "a parent of " + ", ".join(children[:3]) + (" and more" if len(children) > 3 else "")
            pinned = vid
    why[order[-1]] = why.get(order[-1], "the latest")
    if pinned is not None:
        for vid in order[: order.index(pinned)]:
            why.setdefault(vid, "history of a version others derive from")
    return why


def _exclusive_sizes(catalog: Catalog, removed: list[str]) -> dict[str, int]:
    """Per removed version, the stored bytes of the objects no version that stays uses."""
    if not removed:
        return {}
    gone = set(removed)
    others = [row[0] for row in catalog.graph_rows()[0] if row[0] not in gone]  # (GRAPH_COLUMNS: the id first)
    staying = set(catalog.object_sizes(others))
    out: dict[str, int] = {}
    counted: set[str] = set()
    for vid in removed:
        sizes = catalog.object_sizes([vid])
        mine = [oid for oid in sizes if oid not in staying and oid not in counted]
        counted.update(mine)
        out[vid] = sum(sizes[oid] for oid in mine)
    return out


def _doomed(store: ObjectStore, versions: dict[str, Version], removed: list[str], kept: list[str]) -> set[str]:
    """Objects that only removed checkpoints of this history name (others may still hold some:
    coding a tensor again because of one costs time, never correctness)."""

    def named(vids: list[str]) -> set[str]:
        return {oid for vid in vids for oid in store.get_manifest(versions[vid].manifest).object_ids()}

    return named(removed) - named(kept)


def _chain(store: ObjectStore, oid: str) -> set[str]:
    """Every object `oid` is coded against, directly or through others."""
    seen: set[str] = set()
    stack = list(store.header(oid).bases)
    while stack:
        base = stack.pop()
        if base not in seen:
            seen.add(base)
            stack.extend(store.header(base).bases)
    return seen


def _recode(store: ObjectStore, catalog: Catalog, manifest: Manifest, base: Manifest | None, doomed: set[str]) -> int:
    """Code again the tensors of a kept version whose delta chains pass through doomed
    objects, against the same-named tensor of the kept version before (`base`) when that
    does not lead back to the tensor itself, else on its own. Returns how many were."""
    bases = {t.name: t.object for t in base.tensors()} if base else {}
    reader = BaseReader(store, DecodedCache(UNBOUNDED))
    written = []
    for entry in _unique(manifest.tensors()):
        if entry.object in doomed or not _chain(store, entry.object) & doomed:
            continue
        candidate = bases.get(entry.name)
        if candidate is None or candidate == entry.object or entry.object in _chain(store, candidate):
            candidate = None
        written.append(_put_again(store, entry, [candidate] if candidate else [], reader))
    catalog.add_objects(ObjectRow.written(r) for r in written)
    return len(written)


def _unique(entries: list[TensorEntry]) -> list[TensorEntry]:
    return list({e.object: e for e in entries}.values())


def _put_again(store: ObjectStore, entry: TensorEntry, bases: list[str], reader: BaseReader) -> PutResult:
    """Replace a stored tensor's file by another encoding of the same content (same id), no
    deeper than it was: the objects coded against it then stay readable as they are, at
    every moment (a reader wants a depth above its bases', not exactly one above)."""
    data = tensor_bytes(store, entry)
    meta = tensor_meta(entry.dtype, tuple(entry.shape))
    depth = store.header(entry.object).depth
    encoding = store.encode("tensor", meta, data, bases=bases, max_depth=depth, reuse=reader)
    if encoding.depth > depth:  # (a codec that ends a family went one past the bound)
        encoding = store.encode("tensor", meta, data, reuse=reader)
    frames = None
    if encoding.deferred:
        count = -(-data.nbytes // encoding.blocks)
        frames = (store.encode_block(encoding, data, k, reader) for k in range(count))
    result = store.put_encoded(entry.object, "tensor", meta, data.nbytes, encoding, frames)
    store.forget(entry.object)  # what this process parsed of the file it replaced
    return result
