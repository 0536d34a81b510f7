"""`rm`: take a model's ref away. Its objects go at the next gc unless other versions use
them; a model other models were built on goes only when forced. The name keeps its numbers
(`mgit.index.retired`): a model added under it later goes on from the last."""

from __future__ import annotations

from collections.abc import Callable

from mgit.errors import RemoveRefusedError
from mgit.index.catalog import Catalog
from mgit.index.refs import RefStore
from mgit.index.retired import RetiredNames
from mgit.lineage.graph import Lineage
from mgit.reports import RemoveResult


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
