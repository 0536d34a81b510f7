"""`rm`: take a model's ref away, or one version out of a model. Its objects go at the next
gc unless other versions use them; what other versions were built on goes only when forced.
The name keeps its numbers (`mgit.index.retired`): a model added under it later, or a version
added after its removed latest, goes on from the last, so `NAME@N` never names two versions.

One version: its model's latest moves the ref back to its predecessor (the model goes when it
had no other); one inside the history (`--force`, since the versions after it name it as
their predecessor) is marked removed, and stays stored as long as they do. A version another
version names as a lineage parent stays stored for that child too, as a removed model does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from mgit.errors import RefConflictError, RemoveRefusedError, VersionRemoveRefusedError
from mgit.index.catalog import Catalog
from mgit.index.refs import RefStore
from mgit.index.retired import RetiredNames
from mgit.lineage.graph import Lineage
from mgit.reports import Report


@dataclass(frozen=True)
class RemoveResult(Report):
    """What `rm` removed: a model (its head, how many versions), or one version of it
    (`version`; `head` is then the model's head after, None if it had no other)."""

    model: str
    head: str | None
    versions: int
    version: str | None = None
    seq: int | None = None
    kept_by: list[str] = field(default_factory=list)  # what still builds on it (with --force)


def remove_model(
    refs: RefStore,
    retired: RetiredNames,
    catalog: Catalog,
    name: str,
    *,
    force: bool,
    chain: Callable[[str], list[str]],
    unknown: Callable[[str], Exception],
) -> RemoveResult:
    """Remove model `name`'s ref under its lock (RemoveRefusedError lists the models built
    on it unless `force`; `unknown(name)` is the error for a name with no model)."""
    with refs.lock(name):
        head = refs.get(name)
        if head is None:
            raise unknown(name)
        lineage = Lineage.load(catalog)
        children = sorted({e.child for e in lineage.children(name)} - {name}) if name in lineage.nodes else []
        if children and not force:
            raise RemoveRefusedError(name, children)
        count = len(chain(head))
        row = catalog.version(head)
        retired.retire_locked(name, row.seq if row else count)  # first: a crash here leaves the model as it was
        refs.set_locked(name, None, expected=head)
    catalog.set_heads(refs.all)
    return RemoveResult(name, head, count)


def remove_version(
    refs: RefStore,
    retired: RetiredNames,
    catalog: Catalog,
    name: str,
    vid: str,
    *,
    force: bool,
    chain: Callable[[str], list[str]],
) -> RemoveResult:
    """Remove version `vid` of model `name` (VersionRemoveRefusedError lists what builds on
    it unless `force`)."""
    with refs.lock(name):
        head = refs.get(name)
        history = chain(head) if head else []
        if vid not in history:  # moved meanwhile
            raise RefConflictError(name, vid, head)
        row = catalog.version(vid)
        assert row is not None
        ref = f"{name}@{row.seq}"
        later = history[: history.index(vid)]  # newer versions of the model, newest first
        users = catalog.children_of(vid)
        if later:
            nxt = catalog.version(later[-1])
            users.insert(0, f"{name}@{nxt.seq if nxt else '?'} (next in its history)")
        if users and not force:
            raise VersionRemoveRefusedError(ref, users)
        if later:
            retired.retire_locked(name, 0, removed=(vid,), keep_rename=True)
            new_head: str | None = head
        else:
            new_head = history[1] if len(history) > 1 else None
            retired.retire_locked(name, row.seq, keep_rename=True)  # first: a crash leaves the model as it was
            refs.set_locked(name, new_head, expected=head)
    catalog.set_heads(refs.all)
    return RemoveResult(name, new_head, 1, vid, row.seq, users)
