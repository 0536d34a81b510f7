"""What a model name had, on a remote: the highest number it has had (so that no copy of the
repository gives a removed number to another version) and, for a renamed model, its new name.

A remote's refs are never deleted (its backends only create and compare-and-swap), so a push
writes `refs/retired/NAME` beside them: `{"last": N, "renamed_to": NEW or null, "head": id or
null}`. `last` only grows: a push raises it to this repository's (mgit.index.retired), a
fetch raises this repository's to it. For a model renamed here (`mgit rename OLD NEW`, then a
push of NEW), the marker of OLD names NEW and the version OLD's ref is at; it is written
before NEW's ref moves. A fetch (so a pull and a clone) then takes OLD as renamed while its
ref is still at that version and NEW is there: it is not listed, its remote-tracking ref
goes, the fetch says where it went, and NEW's history may hold versions recorded under OLD.
If someone pushes new versions to OLD afterwards, OLD is a model of its own again, as that
push meant it to be.
"""

from __future__ import annotations

from dataclasses import dataclass

from mgit.errors import RemoteConflictError
from mgit.index.refs import is_model_name
from mgit.remotes.repository import RemoteRepository
from mgit.repo.repository import Repo
from mgit.store.objects import OID_RE
from mgit.sync.connection import Connection

RETIRED = "refs/retired/"


@dataclass(frozen=True)
class RemoteRetired:
    last: int = 0
    renamed_to: str | None = None
    head: str | None = None  # the version the old name was at when renamed

    def to_json(self) -> dict[str, object]:
        return {"last": self.last, "renamed_to": self.renamed_to, "head": self.head}


def _parse(value: object) -> RemoteRetired | None:
    """A marker as a remote holds it; one that is not valid is ignored (it only hides a name
    or raises a number)."""
    if not isinstance(value, dict):
        return None
    last, new, head = value.get("last", 0), value.get("renamed_to"), value.get("head")
    if not (isinstance(last, int) and not isinstance(last, bool) and 0 <= last < 2**62):
        return None
    if (new is None) != (head is None) or (new is not None and not (is_model_name(new) and OID_RE.match(str(head)))):
        return None
    return RemoteRetired(last, new, head)


def remote_retired(remote: RemoteRepository) -> dict[str, RemoteRetired]:
    """Every valid marker on the remote, by name."""
    keys = [k for k in remote.list_keys(RETIRED) if is_model_name(k[len(RETIRED) :])]
    out = {}
    for key, (value, _) in zip(keys, remote.map(remote.read_json, keys), strict=True):
        found = _parse(value)
        if found is not None:
            out[key[len(RETIRED) :]] = found
    return out


def renames_of(markers: dict[str, RemoteRetired]) -> dict[str, tuple[str, str]]:
    """{old name: (new name, the version the old name was at)} of the renamed models."""
    return {n: (m.renamed_to, m.head) for n, m in markers.items() if m.renamed_to is not None and m.head is not None}


def renamed_away(renames: dict[str, tuple[str, str]], heads: dict[str, str]) -> dict[str, str]:
    """{old name: new name} of the remote's models that were renamed and are still at the
    version they were renamed at, their new name there too."""
    return {old: new for old, (new, head) in renames.items() if heads.get(old) == head and new in heads and new != old}


def learn_numbers(repo: Repo, markers: dict[str, RemoteRetired]) -> None:
    """Raise this repository's highest number of each name to the remote's."""
    for name, marker in markers.items():
        if marker.last > repo.retired.last(name):
            with repo.refs.lock(name):
                repo.retired.retire_locked(name, marker.last, keep_rename=True)


def push_retired(repo: Repo, conn: Connection, pushed: dict[str, str], theirs: dict[str, str]) -> list[str]:
    """Raise the remote's numbers of the names it has (or is sent) to this repository's, and
    mark the old names of models pushed under new names, where the remote's old ref is still
    at a version of the new name's history; the notes to show."""
    notes = []
    for name, mine in repo.retired.all().items():
        if name not in pushed and name not in theirs:
            continue
        value, token = conn.remote.read_json(RETIRED + name)
        before = _parse(value) or RemoteRetired()
        want = RemoteRetired(max(before.last, mine.last), before.renamed_to, before.head)
        new = mine.renamed_to if repo.refs.get(name) is None else None
        renamed = new is not None and new in pushed and theirs.get(name) in repo.chain(pushed[new])
        if renamed:
            want = RemoteRetired(want.last, new, theirs[name])
        if want != before:
            try:
                conn.remote.write_json(RETIRED + name, want.to_json(), token=token, create_only=token is None)
            except RemoteConflictError:
                notes.append(f"{name} on {conn.name} changed meanwhile: left as it is there")
                continue
        if renamed:
            if conn.tracking is not None and conn.tracking.get(name) is not None:
                conn.tracking.update(name, None, expected=conn.tracking.get(name))
            notes.append(f"{name} on {conn.name} is marked renamed to {new} (a fetch there no longer lists it)")
    return notes
