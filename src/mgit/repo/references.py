"""What a reference names: `NAME`, `NAME@N`, `NAME@HEXPREFIX` or a unique id prefix, read
against the refs, the catalog and what the names had before (`mgit.index.retired`), and the
error for one that names nothing, saying why (removed, renamed, a close name)."""

from __future__ import annotations

import re
from collections.abc import Callable

from mgit.errors import RemovedVersionError, RenamedModelError, UnknownRefError
from mgit.index.catalog import Catalog, VersionRow
from mgit.index.refs import RefStore, is_model_name
from mgit.index.refspec import REF_RE, pick_version
from mgit.index.retired import RetiredNames


def resolve_ref(
    ref: str,
    refs: RefStore,
    retired: RetiredNames,
    catalog: Catalog,
    chain: Callable[[str], list[str]],
    row_of: Callable[[str], VersionRow],
    remote_head: Callable[[str], str | None] = lambda _name: None,
) -> str:
    """A version id (see `Repo.resolve`); `chain` walks a history, `row_of` indexes a row,
    `remote_head` gives the head of a model a remote holds that has no ref here."""
    m = REF_RE.match(ref.strip()) if isinstance(ref, str) else None
    if not m:
        raise UnknownRefError(str(ref), "no version", hint="Use NAME, NAME@N or NAME@HEXPREFIX")
    name, sel = m["name"], m["sel"]
    head = refs.get(name) if is_model_name(name) else None
    if head is None and sel is not None and is_model_name(name):
        head = remote_head(name)  # NAME@N of a remote-only model (NAME alone: after id prefixes)
    if head is not None:
        if sel is None:
            return head
        vids = chain(head)
        rows = catalog.versions_of(vids)
        numbered = [(v, (rows[v] if v in rows else row_of(v)).seq) for v in vids]
        try:
            vid = pick_version(ref, name, numbered, sel)
        except UnknownRefError:
            # A number the name had before (its version removed) is named as such, never
            # taken for another version.
            if sel.isascii() and sel.isdigit() and len(sel) <= 18:
                gone = catalog.removed_version(name, int(sel))
                if gone is not None or 1 <= int(sel) <= retired.last(name):
                    raise RemovedVersionError(ref, name, gone) from None
            raise
        if (rows[vid] if vid in rows else row_of(vid)).removed:  # taken out of the middle of its history
            raise RemovedVersionError(ref, name, vid)
        return vid
    if sel is None and re.fullmatch(r"[0-9a-fA-F]{4,64}", name):
        found = catalog.versions_by_prefix(name.lower())
        if len(found) == 1:
            return found[0]
        if found:
            raise UnknownRefError(ref, "ambiguous version prefix", hint="Give more hex digits")
    remote = remote_head(name) if sel is None and is_model_name(name) else None
    if remote is not None:  # a model a remote holds, known here by its versions' records
        return remote
    raise unknown_model(ref, name, refs, retired)


def unknown_model(ref: str, name: str, refs: RefStore, retired: RetiredNames) -> UnknownRefError:
    """The error for a name no model has: renamed, removed, or perhaps a typo."""
    import difflib

    before = retired.get(name) if is_model_name(name) else None
    if before is not None and before.renamed_to is not None:
        return RenamedModelError(ref, name, before.renamed_to)
    if before is not None:
        return UnknownRefError(
            ref,
            "no model",
            hint=f"{name} was removed (mgit rm); adding a model named {name} goes on at @{before.last + 1}",
        )
    close = difflib.get_close_matches(name, list(refs.all()), n=1)
    return UnknownRefError(ref, "no model", hint=f"Did you mean {close[0]!r}? See: mgit ls" if close else None)
