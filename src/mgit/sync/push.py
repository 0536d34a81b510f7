"""`push`: send versions the remote lacks, then move its refs by compare-and-swap.

In order, so that a kill at any point leaves both sides consistent: the remote's heads are
read (with the tokens a compare-and-swap needs); each model's move is judged (new,
fast-forward, or refused unless forced: the remote's head must be an ancestor of what is
pushed); the objects the remote lacks are sent (decided by ids: what the versions it already
has need is never asked about, the rest is asked about once); a metadata pack describing
the sent versions is written; test registrations and results follow, and tags set later
(mgit.sync.tags: one changed on the remote since last seen is not overwritten); the refs move last,
each by compare-and-swap, so of two pushes of one model at the same instant one lands and
the other is refused. A re-run after a kill sends only what is still missing. Before it
asks what the remote has, a push writes a lease naming every object it relies on, so that a
remote gc running meanwhile keeps them (mgit.remotes.leases); it is dropped at the end.
"""

from __future__ import annotations

import fnmatch

from mgit.errors import MgitError, PushRefusedError, RemoteConflictError, RemoteError
from mgit.index.catalog import storage_class
from mgit.remotes.leases import drop_lease, gc_has_run, gc_state, write_lease
from mgit.remotes.pack import MAX_VALUE, MetadataPack
from mgit.repo.repository import Repo
from mgit.store.lazy import LazyStore
from mgit.store.memory import MemoryStore
from mgit.store.objects import walk_history
from mgit.store.transfer import (
    RECORD_LIMIT,
    TransferStats,
    closure,
    history,
    present_on,
    upload,
    version_objects,
)
from mgit.sync.check_results import push_checks
from mgit.sync.connection import DEFAULT_REMOTE, Connection, connect
from mgit.sync.renames import push_retired
from mgit.sync.reports import ModelUpdate, PushResult
from mgit.sync.signatures import push_signatures
from mgit.sync.tags import push_tags
from mgit.util.faults import crash_point
from mgit.util.parallel import StartTransfer

MAX_WALK = 10_000  # remote records read to number a head this repository does not have


def choose_models(repo: Repo, targets: list[str] | None) -> dict[str, str]:
    """{model: version to push}: every model by default; names, globs or `NAME@N`."""
    local = repo.refs.all()
    if not targets:
        return local
    chosen: dict[str, str] = {}
    for target in targets:
        if any(c in target for c in "*?["):
            matched = {n: v for n, v in local.items() if fnmatch.fnmatchcase(n, target)}
            if not matched:
                raise RemoteError(f"no model matches {target!r}", hint="See: mgit ls")
            chosen.update(matched)
        else:
            vid = repo.resolve(target)
            chosen[repo.model_of(vid)] = vid
    return chosen


def push(
    repo: Repo,
    remote: str = DEFAULT_REMOTE,
    targets: list[str] | None = None,
    *,
    force: bool = False,
    progress: StartTransfer | None = None,
) -> PushResult:
    """Send models (every one by default) to a remote; see the module docstring."""
    conn = connect(repo, remote)
    try:
        return _push(repo, conn, choose_models(repo, targets), force=force, progress=progress)
    finally:
        for lid in conn.leases:  # (its refs moved, or it failed: its objects are then the grace period's)
            drop_lease(conn.remote, lid)
        conn.close()


def _push(
    repo: Repo, conn: Connection, chosen: dict[str, str], *, force: bool, progress: StartTransfer | None
) -> PushResult:
    remote = conn.remote
    remote.check()
    theirs = remote.heads(chosen)
    # A ref that moves is judged, and swapped, from the ref itself, never from the heads index.
    moves = [n for n, vid in chosen.items() if n in theirs and theirs[n][0] != vid]
    read = remote.heads(moves, exact=True) if moves else {}
    for name in moves:
        theirs.pop(name)
        if name in read:
            theirs[name] = read[name]
    updates, moving, refused = [], {}, []
    for name, vid in chosen.items():
        old, token = theirs.get(name, (None, None))
        if old == vid:
            updates.append(ModelUpdate(name, "up-to-date", old, vid))
            continue
        if old is None:
            status = "new"
        elif old in repo.chain(vid):
            status = "fast-forward"
        elif force:
            status = "forced"
        else:
            refused.append((name, old))
            continue
        note = _dropped(repo, conn, old, vid) if status == "forced" else None
        updates.append(ModelUpdate(name, status, old, vid, note))
        moving[name] = (vid, old, token)
    if refused:
        name, old = refused[0]
        raise PushRefusedError(name, conn.name, _describe(repo, conn, old), len(refused) - 1)
    remote.check_new_names(n for n, (_, old, _) in moving.items() if old is None)  # before sending anything

    # What the remote has: every version its heads reach (the ones read now, and those it
    # had when last seen unless a gc has run there since), as far as this repository knows them.
    known_tips = [h for h, _ in theirs.values()]
    remembered = list(conn.tracking.all().values() if conn.tracking else [])
    known, versions, sent = publish_to(
        repo, conn, [vid for vid, _, _ in moving.values()], known_tips, progress=progress, remembered=remembered
    )
    if versions and conn.gc_ran:  # what the sent versions build on is still there
        still = {n: h for n, (h, _) in remote.heads(list(theirs)).items()}
        if any(still.get(n) != h for n, (h, _) in theirs.items() if n not in moving):
            raise RemoteConflictError(conn.name, "a model moved during this push (run it again)")
    checks = push_checks(repo, conn, known | set(versions))
    tags = push_tags(repo, conn, known | set(versions))
    push_signatures(repo, conn, known | set(versions))  # before the heads: a policy finds them with the versions
    others = remote.heads() if repo.retired.dir.is_dir() else {}  # names removed or renamed here
    notes = push_retired(repo, conn, chosen, {n: h for n, (h, _) in others.items()})
    crash_point("push-before-refs")
    conflicts, moved = [], {}
    for i, (name, (vid, old, token)) in enumerate(moving.items()):
        if i:
            crash_point("push-between-refs")
        try:
            moved[name] = (vid, move_head(conn, name, vid, expected=old, token=token))
        except RemoteConflictError:
            conflicts.append(name)
    if moved:  # the heads index (a hint) follows the refs
        crash_point("push-before-heads-index")
        remote.refresh_heads({**theirs, **moved})
    if conflicts:
        raise RemoteConflictError(conn.name, f"{conflicts[0]} (another push landed first; run: mgit pull)")
    return PushResult(conn.name, remote.url, updates, len(versions), sent, checks, tags, notes)


def move_head(conn: Connection, name: str, vid: str, *, expected: str | None, token: str | None) -> str | None:
    """Move the remote's head of `name` to `vid` by compare-and-swap from `expected` (read
    with `token`), then the remote-tracking ref to match; RemoteConflictError if it moved.
    The ref's new token, where the backend gives it."""
    new = conn.remote.move_head(name, vid, expected=expected, token=token)
    if conn.tracking is not None:
        conn.tracking.update(name, vid, expected=conn.tracking.get(name))
    return new


def publish_to(
    repo: Repo,
    conn: Connection,
    tips: list[str],
    known_tips: list[str],
    *,
    progress: StartTransfer | None = None,
    remembered: list[str] | None = None,
) -> tuple[set[str], list[str], TransferStats]:
    """Send the versions reachable from `tips` that the remote lacks, with every object they
    need that it lacks, and a metadata pack describing them; move no ref. `known_tips` are
    versions the remote has (their histories are not sent or asked about); `remembered`
    ones it had when last seen, trusted only where no gc has ever run. A lease names what
    the sent versions rely on (mgit.remotes.leases; the caller drops `conn.leases` once
    its refs moved). Returns (the versions known to be there, those sent, what travelled)."""
    store = repo.store
    ran = gc_has_run(conn.remote) if tips else False
    trusted = known_tips + ([] if ran else list(remembered or []))
    links = repo.catalog.links()  # (the catalog's rows, not thousands of records parsed)
    known = set(history(store, [t for t in trusted if store.has(t)], links=links))
    versions = history(store, tips, stop=known.__contains__, links=links)
    sent = TransferStats()
    if versions:
        needed = closure(store, versions)
        boundary = {v for vid in versions for v in store.get_version(vid).linked_versions() if v in known}
        relied = closure(store, boundary)
        conn.leases.append(write_lease(conn.remote, needed | relied, boundary))
        conn.gc_ran = gc_state(conn.remote)
        if conn.gc_ran and not ran:  # a gc began since: what was remembered may be gone
            raise RemoteConflictError(conn.name, "a gc ran there during this push (run it again)")
        candidates = needed - relied
        present = present_on(conn.remote, store, candidates)
        missing = candidates - present
        if isinstance(store, LazyStore):  # a lazy clone sends elsewhere what it has not fetched yet
            store.fetch([o for o in missing if not store.has(o)])
        tick = progress(sum(store.stored_size(o) for o in missing), len(missing)) if progress else None
        sent = upload(conn.remote, store, missing, progress=tick)
        crash_point("push-after-objects")
        sent.skipped = len(needed) - len(missing)
        rows = repo.catalog.object_rows(present)
        sent.skipped_bytes = sum(rows[o].stored_size if o in rows else 0 for o in present)
        pid, data = _pack(repo, versions, needed).to_bytes()
        conn.remote.write_pack(pid, data)
    return known, versions, sent


def _remote_chain(repo: Repo, conn: Connection, vid: str) -> tuple[list[str], str | None]:
    """The remote's history from `vid` back to the first version this repository has:
    (the versions only the remote has, newest first; that first shared version or None).
    Records are read and verified one by one, at most MAX_WALK of them."""
    scratch = MemoryStore()

    def predecessor(v: str) -> str | None:
        scratch.write_record(v, [conn.remote.read_object(v, limit=RECORD_LIMIT)])
        return scratch.get_version(v).predecessor

    walked: list[str] = []
    for cur in walk_history(vid, predecessor):
        if repo.store.has(cur):
            return walked, cur
        if len(walked) >= MAX_WALK:
            raise RemoteError(f"the history of {vid[:12]} on {conn.name} is longer than {MAX_WALK} versions")
        walked.append(cur)
    return walked, None


def number_of(repo: Repo, vid: str) -> int:
    """A version's number in its model's history (the catalog's; else its place in it)."""
    row = repo.catalog.version(vid)
    return row.seq if row else len(repo.chain(vid))


def _describe(repo: Repo, conn: Connection, vid: str) -> str:
    """`@4`: the remote head's number in its model's history."""
    try:
        walked, shared = _remote_chain(repo, conn, vid)
        return f"@{len(walked) + (number_of(repo, shared) if shared else 0)}"
    except MgitError:
        return f"a version ({vid[:12]})"


def _dropped(repo: Repo, conn: Connection, theirs: str, mine: str) -> str:
    """What a forced push drops: the remote's versions that `mine` does not descend from."""
    ours = set(repo.chain(mine))
    try:
        if theirs in ours:
            return ""
        walked, shared = _remote_chain(repo, conn, theirs)
        base = number_of(repo, shared) if shared else 0
        here = [v for v in repo.chain(shared) if v not in ours] if shared else []
        count = len(walked) + len(here)
        return f"drops {count} version{'s' if count != 1 else ''} of {conn.name}'s history, up to @{base + len(walked)}"
    except MgitError:
        return f"drops {conn.name}'s head {theirs[:12]} and what only it had"


def _pack(repo: Repo, versions: list[str], needed: set[str]) -> MetadataPack:
    """What a clone needs to know about these versions: their records, a row per object
    they need (with its delta bases), their sketches. A record or sketch over MAX_VALUE is
    left out (the record is read from objects/, the sketch recomputed), and so are the
    sketches when they would make the pack decode to more than its size allows (sketches
    of versions whose tensors are the same compress together)."""
    store, catalog = repo.store, repo.catalog
    pack = MetadataPack()
    for vid in versions:
        version, _, _ = version_objects(store, vid)
        for oid in {vid} | version.linked_objects():
            if store.stored_size(oid) <= MAX_VALUE:
                pack.records[oid] = store.path_of(oid).read_bytes()
        sketch = catalog.sketch(vid)
        if sketch is not None and len(sketch) <= MAX_VALUE:
            pack.sketches[vid] = sketch
    rows = catalog.object_rows(needed)
    for oid in sorted(needed):
        row = rows.get(oid)
        if store.has(oid) and (row is None or (not row.bases and storage_class(row.codec) != "standalone")):
            header = store.header(oid)
            pack.objects.append(
                (oid, header.kind, header.size, store.stored_size(oid), header.codec_names, tuple(header.bases))
            )
        elif row is not None:  # (a lazy clone's object it has not fetched: described as its rows say)
            pack.objects.append((oid, row.kind, row.logical_size, row.stored_size, row.codec, row.bases))
    if not pack.fits():
        pack.sketches.clear()
    return pack
