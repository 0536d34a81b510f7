"""Tags set later (`mgit tag`, mgit.index.tags) travel with push, pull and clone.

On a remote, `refs/tags/<version id>` holds a version's overlay as JSON (`{}` once its tags
were all taken back), moved by compare-and-swap like a model's head. Whose change is newer
is judged against what the remote had when this repository last pulled from or pushed to it
(`refs/remote-tags/<remote>/<id>`), as a three-way merge does:

- the same on both sides: nothing moves;
- changed on one side only: that side's tags win (push writes them there, pull takes them here);
- changed on both sides, differently: a push leaves the remote's as they are and reports the
  version (`tags.conflicts`: run `mgit pull`); a pull keeps the ones here, reports the version,
  and remembers the remote's as seen, so that the next push sends the ones here over them
  (the pull showed them; `mgit tag` takes them instead).

A remote given by URL (no name, so nothing remembered of it) gets only tags it has none of.
"""

from __future__ import annotations

from collections.abc import Iterable

from mgit.errors import RemoteConflictError, RemoteError
from mgit.index.tags import Overlay, TagStore, check_overlay
from mgit.repo.repository import Repo
from mgit.store.objects import OID_RE, RecordError
from mgit.sync.connection import Connection
from mgit.sync.reports import TagsTravel

TAGS = "refs/tags/"


def _seen(repo: Repo, conn: Connection) -> TagStore | None:
    if conn.tracking is None:
        return None
    return TagStore(repo.dir, fsync=repo.tags.fsync, namespace=f"remote-tags/{conn.name}")


def _theirs(conn: Connection, vids: Iterable[str]) -> dict[str, tuple[Overlay, str | None]]:
    """{version: (the remote's overlay, its token)} for these versions ({} and None: none)."""
    wanted = sorted(vids)
    found = conn.remote.map(lambda v: conn.remote.read_json(TAGS + v), wanted)
    out = {}
    for vid, (value, token) in zip(wanted, found, strict=True):
        try:
            out[vid] = (check_overlay(value) if value is not None else {}, token)
        except RecordError as exc:
            raise RemoteError(f"the tags of {vid[:12]} on {conn.name} are not valid: {exc}") from None
    return out


def _label(repo: Repo, vid: str) -> str:
    row = repo.catalog.version(vid)
    return f"{row.model}@{row.seq}" if row else vid[:12]


def push_tags(repo: Repo, conn: Connection, on_remote: set[str]) -> TagsTravel:
    """Send the tags changed here since last seen there, of versions the remote has."""
    seen = _seen(repo, conn)
    mine, base_all = repo.tags.all(), seen.all() if seen else {}
    vids = {v for v in [*mine, *base_all] if v in on_remote}
    if not vids:
        return TagsTravel()
    sent, conflicts = 0, []
    for vid, (theirs, token) in _theirs(conn, vids).items():
        here, base = mine.get(vid, {}), base_all.get(vid, {} if seen else None)
        if theirs == here:
            pass
        elif theirs == base or (base is None and token is None):
            try:
                conn.remote.write_json(TAGS + vid, here, token=token, create_only=token is None)
                sent += 1
            except RemoteConflictError:  # changed there between our read and our write
                conflicts.append(_label(repo, vid))
                continue
        elif here == base:
            continue  # changed there only: a pull takes it
        else:
            conflicts.append(_label(repo, vid))
            continue
        if seen is not None:
            seen.put(vid, here)
    return TagsTravel(sent, 0, sorted(conflicts))


def pull_tags(repo: Repo, conn: Connection) -> TagsTravel:
    """Take the tags changed on the remote since last seen, of versions this repository has."""
    keys = conn.remote.list_keys(TAGS)
    vids = {k[len(TAGS) :] for k in keys if OID_RE.match(k[len(TAGS) :])}
    vids = {v for v in vids if repo.catalog.has_version(v) or repo.store.has(v)}
    if not vids:
        return TagsTravel()
    seen = _seen(repo, conn)
    base_all = seen.all() if seen else {}
    taken, conflicts = 0, []
    for vid, (theirs, _token) in _theirs(conn, vids).items():
        here, base = repo.tags.get(vid), base_all.get(vid, {})
        if theirs == here:
            pass
        elif here == base:
            repo.tags.update(vid, theirs, expected=here)
            taken += 1
        elif theirs == base:
            continue  # changed here only: a push sends it
        else:
            conflicts.append(_label(repo, vid))  # the ones here are kept; theirs are now seen
        if seen is not None:
            seen.put(vid, theirs)
    repo.catalog.sync_tags(lambda: repo.store, repo.tags)
    return TagsTravel(0, taken, sorted(conflicts))


def copy_tags(repo: Repo, renamed: dict[str, str]) -> None:
    """Tags set on versions a pull replayed (new ids) follow them to their new ids."""
    for old, new in renamed.items():
        overlay = repo.tags.get(old)
        if overlay:
            repo.tags.update(new, overlay, expected=repo.tags.get(new))
