"""`mgit tag`: tags set on a version after it was added, kept beside the refs
(`mgit.index.tags`, compare-and-swap under the version's lock) and indexed by the catalog.

A tag given to `add` is in the version's record and carried to the model's next version; a
tag set here stays on its version, as a git tag stays on its commit (a `stage=prod` on ft@2
does not move to ft@3 by itself).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from mgit.errors import InvalidOptionError, TagConflictError
from mgit.index.catalog import Catalog
from mgit.index.tags import TagStore, check_overlay, effective
from mgit.repo.model_signature import SIGNER_TAG
from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.store.objects import RecordError

ATTEMPTS = 8  # compare-and-swap rounds against other writers before giving up


@dataclass(frozen=True)
class TagsResult(Report):
    """A version's tags (`mgit tag`): what it has now, and what was set on it after it was
    added (`null`: a tag of its record removed)."""

    model: str
    seq: int
    version: str
    tags: dict[str, str]
    set_later: dict[str, str | None]
    changed: bool = False

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"


def tags_of(store: ObjectStore, tags: TagStore, vid: str, model: str, seq: int) -> TagsResult:
    overlay = tags.get(vid)
    return TagsResult(model, seq, vid, effective(store.get_version(vid).tags, overlay), overlay)


def change_tags(
    store: ObjectStore,
    tags: TagStore,
    catalog: Catalog,
    vid: str,
    model: str,
    seq: int,
    *,
    put: Mapping[str, str] | None = None,
    delete: Collection[str] = (),
) -> TagsResult:
    """Set `put` and remove `delete` on version `vid` (model@seq), then index the result. A
    key to remove that the version does not have is an error, and nothing changes."""
    record = store.get_version(vid).tags
    ref = f"{model}@{seq}"
    if SIGNER_TAG in (put or {}) or SIGNER_TAG in delete:  # what a verified model.sig said, not a label
        raise InvalidOptionError(f"the tag {SIGNER_TAG} is set only by a verified model.sig, when the version is added")
    for _ in range(ATTEMPTS):
        before = tags.get(vid)
        now = effective(record, before)
        missing = sorted(k for k in delete if k not in now)
        if missing:
            raise InvalidOptionError(f"{ref} has no tag {missing[0]!r}", hint=f"See: mgit tag {ref}")
        overlay = dict(before)
        for key in delete:
            if key in record:
                overlay[key] = None
            else:
                overlay.pop(key, None)
        for key, value in (put or {}).items():
            if record.get(key) == value:
                overlay.pop(key, None)  # back to what the record says
            else:
                overlay[key] = value
        try:
            check_overlay(overlay)
            if len(effective(record, overlay)) > 256:
                raise RecordError("more than 256 tags")
        except RecordError as exc:
            raise InvalidOptionError(
                str(exc), hint="A tag's key is 1 to 128 characters, its value up to 1,024"
            ) from None
        if overlay == before:
            break
        try:
            tags.update(vid, overlay, expected=before)
        except TagConflictError:
            continue  # another writer changed them between our read and our lock: read again
        break
    else:
        raise TagConflictError(ref)
    catalog.sync_tags(lambda: store, tags)
    result = tags_of(store, tags, vid, model, seq)
    return TagsResult(**{**result.__dict__, "changed": overlay != before})
