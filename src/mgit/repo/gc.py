"""`gc`: delete the objects no ref reaches (mgit.repo.fsck says what is reachable), the tags
set later on the versions among them, the leftovers of interrupted writes and the
quarantines of killed fetches.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mgit.errors import CorruptObjectError, GcRefusedError, MissingObjectError
from mgit.index.catalog import Catalog
from mgit.index.refs import RefStore
from mgit.index.tags import TagStore
from mgit.repo.fsck import quarantine_folders, root_heads, walk
from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.util.atomicfile import remove_files
from mgit.util.faults import crash_point

if TYPE_CHECKING:
    from mgit.signing.store import SignatureStore


@dataclass(frozen=True)
class GcResult(Report):
    """What `gc` removed (or, with `dry_run`, would remove) and what it kept."""

    dry_run: bool
    removed: list[str]
    removed_bytes: int
    kept: int
    leftovers: int


def gc(
    store: ObjectStore,
    refs: RefStore,
    catalog: Catalog,
    tags: TagStore,
    *,
    dry_run: bool = False,
    signatures: SignatureStore | None = None,
) -> GcResult:
    """Delete objects that no ref reaches, the tags set on deleted versions, and leftovers of
    interrupted writes; merge the signature bundles into one (the caller holds the
    repository's exclusive lock). Signatures themselves stay, as docs/format.md says."""
    seen = walk(store, root_heads(refs), pins=refs.pins())
    if seen.problems:
        raise GcRefusedError(seen.problems[0].object, seen.problems[0].kind)
    # A reachable tensor whose header cannot be read hides the delta bases it needs: deleting
    # them would leave a copy of it that a repair brings back undecodable. (A file's blob has
    # no bases: one that is missing makes collection no less safe.)
    for manifest in seen.manifests.values():
        for t in manifest.tensors():
            if store.promised(t.object) is not None:
                continue
            try:
                store.header(t.object)
            except (CorruptObjectError, MissingObjectError) as exc:
                raise GcRefusedError(
                    t.object, "missing" if isinstance(exc, MissingObjectError) else "corrupt"
                ) from None
    garbage = [oid for oid in store.ids() if oid not in seen.objects]
    freed = sum(store.stored_size(oid) for oid in garbage)
    leftovers = store.temporary_files() + refs.temporary_files() + tags.temporary_files()
    leftovers += signatures.temporary_files() if signatures is not None else []
    tagged = [vid for vid in tags.all() if vid not in seen.objects]  # a version that goes takes its tags
    quarantines = list(quarantine_folders(store))
    if not dry_run:
        # Rows first: a gc killed midway leaves files no row names, which the next gc finds by
        # listing the store; the reverse would leave rows for missing files.
        catalog.set_heads(refs.all)
        catalog.remove_objects(garbage)
        catalog.remove_strays(seen.versions, seen.objects)
        for oid in garbage:
            store.delete(oid)
            crash_point("gc-deleted")
        remove_files(leftovers)
        for vid in tagged:
            tags.put(vid, {})
        for folder in quarantines:  # a killed fetch's: nothing in it was ever kept
            shutil.rmtree(folder, ignore_errors=True)
        if signatures is not None:
            signatures.consolidate()
    return GcResult(dry_run, garbage, freed, len(seen.objects), len(leftovers) + len(quarantines))
