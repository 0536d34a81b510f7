"""`rename`: a model under another name. Its versions keep their ids and their numbers (the
records still say the old name; the catalog files them under the ref's), the old name is
refused afterwards ("it was renamed to NEW") until a model is added under it, which then goes
on from the old name's last number (`mgit.index.retired`), so that `OLD@N` never names two
versions.

Write order, each step atomic, so that a crash leaves either the old name or both names on
the same version (re-running the rename finishes it): the old name's record (`retired`,
naming the new one), the new ref, then the old ref's removal, under both names' locks.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field

from mgit.errors import InvalidOptionError
from mgit.index.catalog import Catalog
from mgit.index.refs import RefStore, validate_model_name
from mgit.index.retired import RetiredNames
from mgit.reports import Report
from mgit.util.faults import crash_point


@dataclass(frozen=True)
class RenameResult(Report):
    """`rename`: the model's old and new names, its head and that head's number (kept)."""

    old: str
    new: str
    head: str
    seq: int
    retargeted_tests: list[str] = field(default_factory=list)  # registered tests whose target followed


def rename_model(
    refs: RefStore,
    retired: RetiredNames,
    catalog: Catalog,
    old: str,
    new: str,
    *,
    unknown: Callable[[str], Exception],
) -> RenameResult:
    """Move model `old` to the name `new` (a name no model has, and that never had versions:
    its numbers would name other versions)."""
    validate_model_name(new)
    if new == old:
        raise InvalidOptionError(f"{old} is already named {new}")
    with ExitStack() as locks:
        for name in sorted({old, new}):
            locks.enter_context(refs.lock(name))
        head = refs.get(old)
        if head is None:
            raise unknown(old)
        taken = refs.get(new)
        if taken is not None and taken != head:
            raise InvalidOptionError(f"a model named {new!r} exists", hint=f"Choose another name, or: mgit rm {new}")
        before = retired.get(new)
        if taken is None and before is not None:
            raise InvalidOptionError(
                f"{new!r} had versions up to {new}@{before.last} (removed or renamed)",
                hint=f"{new}@1..{before.last} would name two versions; choose another name",
            )
        row = catalog.version(head)
        retired.retire_locked(old, row.seq if row else 0, renamed_to=new)
        crash_point("rename-after-retired")
        if taken is None:
            refs.set_locked(new, head, expected=None)
        crash_point("rename-after-new-ref")
        refs.set_locked(old, None, expected=head)
    catalog.set_heads(refs.all)
    return RenameResult(old, new, head, row.seq if row else 0)
