"""`push --delete NAME` and `push --prune`: take models off a remote by compare-and-swap.

A model's ref on the remote goes only from where this repository last saw it (its
remote-tracking ref; for a remote given by URL, the head read now): a push that moved it
meanwhile wins, and the delete is refused (DeleteRefusedError), nothing deleted. `--prune`
deletes the remote's models that were removed here (`mgit rm`, or renamed away: this
repository retired the name and has no model under it), never one it merely has not pulled.
The remote's numbers of the name are raised first (refs/retired/NAME, mgit.sync.renames),
so that a model pushed later under it goes on from them. The objects stay until a remote gc
(`mgit gc --remote`) finds nothing reaches them.
"""

from __future__ import annotations

from mgit.errors import DeleteRefusedError, RemoteConflictError
from mgit.index.refs import validate_model_name
from mgit.repo.repository import Repo
from mgit.sync.connection import DEFAULT_REMOTE, Connection, connect
from mgit.sync.renames import push_retired
from mgit.sync.reports import ModelUpdate


def delete_remote_models(
    repo: Repo, remote: str = DEFAULT_REMOTE, names: list[str] | None = None, *, prune: bool = False
) -> list[ModelUpdate]:
    """Delete these models on the remote (and, with `prune`, every model removed here);
    one ModelUpdate ("deleted") each."""
    conn = connect(repo, remote)
    try:
        conn.remote.check()
        chosen = [validate_model_name(n) for n in names or []]
        if prune:
            retired = repo.retired.all()
            there = conn.remote.model_names()
            chosen += [n for n in there if n in retired and repo.refs.get(n) is None and n not in chosen]
        deleted = [_delete(repo, conn, name) for name in chosen]
        if deleted:
            conn.remote.refresh_heads({})  # the heads index (a hint) follows the refs
        return deleted
    finally:
        conn.close()


def _delete(repo: Repo, conn: Connection, name: str) -> ModelUpdate:
    head, token = conn.remote.head(name)
    seen = conn.tracking.get(name) if conn.tracking is not None else head
    if head is None or token is None:
        raise DeleteRefusedError(name, conn.name, "there is no such model there")
    if seen != head:
        why = "it moved since this repository last fetched it (a push landed there)"
        raise DeleteRefusedError(name, conn.name, why if seen else "this repository has never fetched it")
    push_retired(repo, conn, {}, {name: head})
    try:
        conn.remote.delete_head(name, expected=head, token=token)
    except RemoteConflictError:
        raise DeleteRefusedError(name, conn.name, "a push moved it while it was being deleted") from None
    if conn.tracking is not None:
        conn.tracking.update(name, None, expected=head)
    return ModelUpdate(name, "deleted", head, None)
