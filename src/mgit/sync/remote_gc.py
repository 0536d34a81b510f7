"""`gc --remote`: delete the objects of a remote that nothing there reaches, never one a
running push relies on (docs/format.md, "Remote gc"; the protocol is mgit.remotes.leases).

What is kept: everything the remote's refs reach (model heads, and in a folder remote that
is a bare repository its remote-tracking refs and pins), everything a live lease names (a
push between its objects and its refs), and every object written within the grace period
(`expire`, by the remote's clock: a push by an older mgit writes no lease). In order: take
the gc lock, read the leases, then the refs (a push drops its lease only after its refs
move, so one of the two names what it sent), walk what the refs reach (records read from the
remote and verified), list the objects, delete the rest in batches (renewing the lock), then
the tags of deleted versions, expired leases and the tombstones of killed deletes.

The decision is over object ids (`plan`), the deletion over keys. A data pack is judged by
its objects and its own time of writing: one whose objects are all garbage goes whole (its
index first, then the pack, so no index ever names missing bytes); one with some garbage is
consolidated with the other small packs by `repack(keep=...)`, under the lock, and the keys
it supersedes are deleted (indexes first). A pack no index names (a push killed between the
two, or a running one between the two) goes once older than the grace period and a lease's
life (24 hours).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mgit.errors import GcRefusedError, InvalidOptionError, MissingKeyError, MissingObjectError
from mgit.remotes import datapack
from mgit.remotes.leases import LEASE_TTL, GcLock, live_leases
from mgit.remotes.repack import SMALL, repack
from mgit.remotes.repository import REFS, TOMBSTONE, RemoteRepository, object_key
from mgit.repo.fsck import walk
from mgit.repo.repository import Repo
from mgit.store.objects import OID_RE
from mgit.store.remote import RemoteStore
from mgit.sync.connection import DEFAULT_REMOTE, connect
from mgit.sync.reports import RemoteGcResult
from mgit.sync.tags import TAGS
from mgit.util.faults import crash_point

DEFAULT_EXPIRE = 14 * 24 * 3600.0  # git's prune expiry: two weeks
BATCH = 64  # deletions between two renewals of the lock (when one is due)
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
EXPIRE_RE = re.compile(r"^(\d{1,6})\s*([smhdw])\Z")


def parse_expire(text: str) -> float:
    """`now`, or a count and a unit (`30m`, `12h`, `3d`, `2w`): seconds."""
    text = text.strip().lower()
    if text == "now":
        return 0.0
    match = EXPIRE_RE.match(text)
    if not match:
        raise InvalidOptionError(f"not a grace period: {text!r}", hint="Use now, or e.g. 30m, 12h, 3d, 2w")
    return float(int(match[1]) * UNITS[match[2]])


@dataclass
class Plan:
    """What a remote gc decided: object ids to delete (with their sizes) and what it kept."""

    garbage: dict[str, int] = field(default_factory=dict)
    reachable: int = 0
    young: int = 0  # unreachable, but written within the grace period
    leased: int = 0  # unreachable, but a live lease names them
    leases: int = 0
    expired_leases: list[str] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)
    dead_packs: list[str] = field(default_factory=list)  # packs whose objects are all garbage
    mixed_packs: list[str] = field(default_factory=list)  # packs holding garbage and objects kept
    orphans: list[str] = field(default_factory=list)  # pack keys no index names, older than a lease lives
    loose: set[str] = field(default_factory=set)  # the objects listed under objects/


class _RemoteRecords(RemoteStore):
    """A remote's objects for a walk. A tensor's delta bases are in its header: a loose object
    (large, on a remote with packs) gives it by two ranged reads, not its whole payload; a
    packed one (small) is read whole, once (a header is two reads of a record)."""

    def __init__(self, remote: RemoteRepository) -> None:
        super().__init__(remote)
        self._repo = remote
        self._last: tuple[str, np.ndarray] | None = None

    def read_record(self, oid: str) -> np.ndarray:
        if self._last is None or self._last[0] != oid:
            self._last = (oid, super().read_record(oid))
        return self._last[1]

    def read_range(self, oid: str, offset: int, length: int) -> Any:
        if oid in self._repo.packed():
            return super().read_range(oid, offset, length)
        try:
            return self._repo.backend.read_range(object_key(oid), offset, length)
        except MissingKeyError:
            raise MissingObjectError(oid) from None


def _other_roots(remote: RemoteRepository) -> dict[str, str]:
    """Heads a folder remote that is a bare repository keeps besides its models: its
    remote-tracking refs (`refs/remotes/NAME/MODEL`)."""
    roots = {}
    for key in remote.list_keys("refs/remotes/"):
        data, _ = remote.backend.read_versioned(key, limit=4096)
        value = (data or b"").decode("ascii", "replace").strip()
        if OID_RE.match(value):
            roots[key] = value
    return roots


def plan(remote: RemoteRepository, *, expire: float, now: float) -> Plan:
    """Decide (reading only): leases first, then refs, then what they reach, then the listing."""
    result = Plan()
    leases = live_leases(remote, now)
    protected, result.leases, result.expired_leases = leases.objects, leases.live, leases.expired
    names = remote.model_names()
    heads = {n: h for n, (h, _) in remote.heads(names, exact=True).items()}  # (no hint: a gc deletes)
    for name in set(names) - set(heads):
        data, _ = remote.backend.read_versioned(REFS + name, limit=4096)
        if data == TOMBSTONE:
            result.tombstones.append(REFS + name)
    leased = {f"a lease's {v[:12]}": v for v in leases.versions}
    roots = {**leased, **heads, **_other_roots(remote)}
    pins = {k.rpartition("/")[2] for k in remote.list_keys("refs/pins/")}
    seen = walk(_RemoteRecords(remote), roots, pins={p for p in pins if OID_RE.match(p)})
    if seen.problems:
        raise GcRefusedError(seen.problems[0].object, seen.problems[0].kind)
    result.reachable = len(seen.objects)
    held: set[str] = set()  # unreachable objects kept somewhere: no copy of them goes

    def judge(oid: str, modified: float, size: int) -> None:
        if oid in protected:
            result.leased += 1
        elif now - modified < expire:
            result.young += 1
        else:
            result.garbage[oid] = max(size, result.garbage.get(oid, 0))
            return
        held.add(oid)

    for info in remote.backend.list_info("objects/"):
        oid = info.key.replace("objects/", "", 1).replace("/", "")
        if not OID_RE.match(oid) or info.key != object_key(oid) or oid in seen.objects:
            continue  # (a key that is not an object's is not gc's to judge)
        judge(oid, info.modified, info.size)
        result.loose.add(oid)
    remote.packed(refresh=True)
    indexes = remote.pack_indexes()
    for info in remote.backend.list_info("packs/"):
        pid = info.key.removeprefix("packs/").removesuffix(".objpack")
        if info.key != datapack.pack_key(pid) or not OID_RE.match(pid):
            continue  # (metadata packs; indexes are judged with their pack)
        if pid not in indexes:
            # A killed push's, or a running push's before its index: kept as long as a lease lives.
            if now - info.modified >= max(expire, LEASE_TTL):
                result.orphans.append(info.key)
            continue
        for oid, _, length in indexes[pid].entries:
            if oid not in seen.objects:
                judge(oid, info.modified, length)
    for oid in held:
        result.garbage.pop(oid, None)
    for index in indexes.values():  # a large pack is not rewritten: its garbage stays while it holds more
        if index.size >= SMALL and not all(o in result.garbage for o, _, _ in index.entries):
            for oid, _, _ in index.entries:
                result.garbage.pop(oid, None)
    for pid, index in sorted(indexes.items()):
        dropped = [o in result.garbage for o, _, _ in index.entries]
        if all(dropped):
            result.dead_packs.append(pid)
        elif any(dropped):
            result.mixed_packs.append(pid)
    return result


def gc_remote(
    repo: Repo, remote: str = DEFAULT_REMOTE, *, expire: float = DEFAULT_EXPIRE, dry_run: bool = False
) -> RemoteGcResult:
    """Collect a remote's garbage; see the module docstring. `--dry-run` takes no lock and
    deletes nothing."""
    if expire < 0:
        raise InvalidOptionError("a grace period cannot be negative")
    conn = connect(repo, remote)
    try:
        conn.remote.check()
        lock = GcLock(conn.remote)
        if not dry_run:
            lock.acquire()
        try:
            decided = plan(conn.remote, expire=expire, now=time.time())
            tags = [k for k in conn.remote.list_keys(TAGS) if k[len(TAGS) :] in decided.garbage]
            if not dry_run:
                _delete(conn.remote, lock, [object_key(o) for o in sorted(decided.garbage) if o in decided.loose])
                _delete_packs(conn.remote, lock, decided)
                _delete(conn.remote, lock, tags + decided.expired_leases + decided.tombstones)
        finally:
            lock.release()
    finally:
        conn.close()
    return RemoteGcResult(
        conn.name,
        conn.remote.url,
        dry_run,
        expire,
        sorted(decided.garbage),
        sum(decided.garbage.values()),
        decided.reachable,
        decided.young,
        decided.leased,
        decided.leases,
        len(decided.expired_leases),
        len(tags),
    )


def _delete_packs(remote: RemoteRepository, lock: GcLock, decided: Plan) -> None:
    """Packs all garbage (before the repack, which need not read them); packs part garbage
    consolidated without it, and the keys the new packs supersede; packs no index names.
    Indexes go before their packs in separate batches (a batch is deleted in parallel), so
    no index ever names a pack that is not there."""
    dead = decided.dead_packs
    _delete(remote, lock, [datapack.index_key(p) for p in dead])
    _delete(remote, lock, [datapack.pack_key(p) for p in dead])
    if decided.mixed_packs:
        lock.renew()
        garbage = decided.garbage
        superseded = repack(remote, keep=lambda o: o not in garbage).superseded
        _delete(remote, lock, [k for k in superseded if k.endswith(".objidx")])
        _delete(remote, lock, [k for k in superseded if not k.endswith(".objidx")])
    _delete(remote, lock, decided.orphans)


def _delete(remote: RemoteRepository, lock: GcLock, keys: Iterable[str]) -> None:
    """Delete keys in batches, renewing the lock between them (a lock lost stops the gc)."""
    keys = list(keys)
    for start in range(0, len(keys), BATCH):
        lock.renew()

        def delete(key: str) -> None:
            remote.backend.delete(key)
            if key.startswith(("objects/", "packs/")):
                crash_point("remote-gc-deleted")

        remote.map(delete, keys[start : start + BATCH])
