"""A renamed model on a remote (`mgit rename OLD NEW`, then `mgit push`).

A remote's refs are never deleted (its backends only create and compare-and-swap), so a push
of NEW leaves OLD's ref in place and writes `refs/retired/OLD` beside it:
`{"renamed_to": NEW, "head": the version OLD was at}`. A fetch (so a pull and a clone) then
takes OLD as renamed while its ref is still at that version: it is not listed, its
remote-tracking ref goes, and the fetch says where it went. If someone pushes new versions
to OLD afterwards, OLD is a model of its own again, as that push meant it to be. The marker
is written before the new ref (a fetch lists OLD until NEW is there too), and tells a fetch
that NEW's history may hold versions recorded under OLD.
"""

from __future__ import annotations

from mgit.errors import RemoteConflictError
from mgit.index.refs import is_model_name
from mgit.remotes.repository import RemoteRepository
from mgit.repo.repository import Repo
from mgit.store.objects import OID_RE
from mgit.sync.connection import Connection

RETIRED = "refs/retired/"


def push_renames(repo: Repo, conn: Connection, pushed: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """Mark on the remote the old names of the models pushed under new names, where the
    remote's old ref is still at a version of the new name's history; the notes to show."""
    notes = []
    for old, head in sorted(theirs.items()):
        before = repo.retired.get(old) if repo.refs.get(old) is None else None
        new = before.renamed_to if before else None
        if new is None or new not in pushed or head not in repo.chain(pushed[new]):
            continue
        value, token = conn.remote.read_json(RETIRED + old)
        if value != {"renamed_to": new, "head": head}:
            try:
                conn.remote.write_json(RETIRED + old, {"renamed_to": new, "head": head}, token=token, create_only=True)
            except RemoteConflictError:
                notes.append(f"{old} on {conn.name} changed meanwhile: left as it is there")
                continue
        if conn.tracking is not None and conn.tracking.get(old) is not None:
            conn.tracking.update(old, None, expected=conn.tracking.get(old))
        notes.append(f"{old} on {conn.name} is marked renamed to {new} (a fetch there no longer lists it)")
    return notes


def remote_renames(remote: RemoteRepository) -> dict[str, tuple[str, str]]:
    """{old name: (new name, the version the old name was at)} of every model a push marked
    renamed on the remote (a marker that is not valid is ignored: it only hides a name)."""
    out = {}
    keys = [k for k in remote.list_keys(RETIRED) if is_model_name(k[len(RETIRED) :])]
    for key, (value, _) in zip(keys, remote.map(remote.read_json, keys), strict=True):
        if (
            isinstance(value, dict)
            and isinstance(value.get("renamed_to"), str)
            and is_model_name(value["renamed_to"])
            and isinstance(value.get("head"), str)
            and OID_RE.match(value["head"])
        ):
            out[key[len(RETIRED) :]] = (value["renamed_to"], value["head"])
    return out


def renamed_away(renames: dict[str, tuple[str, str]], heads: dict[str, str]) -> dict[str, str]:
    """{old name: new name} of the remote's models that were renamed and are still at the
    version they were renamed at, their new name there too."""
    return {old: new for old, (new, head) in renames.items() if heads.get(old) == head and new in heads and new != old}
