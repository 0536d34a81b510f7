"""Leases and the gc lock: how a push and a remote gc (mgit.sync.remote_gc) on one remote
never lose an object to each other, on any backend (docs/format.md, "Remote gc").

A remote cannot refresh an object's time cheaply (S3, GCS and Azure have no touch; a copy
onto itself is a whole upload), so a push does not touch the objects it re-references:

    leases/<32 hex>   zstd of {"format": 1, "objects": [<id>, ...], "versions": [<id>, ...]}:
                      every object a running push sends or finds there, and the versions
                      there it builds on (a gc keeps their histories as a head's); written
                      before it looks at what the remote has, deleted after its refs move
    gc/lock           {"format": 1, "beat": <seconds>}: a gc is deleting; created only if
                      absent (compare-and-swap), its beat renewed while it runs, deleted
                      when it ends
    gc/ran            written when a gc takes the lock: objects may have been deleted here

A gc keeps every object a lease younger than LEASE_TTL names (by the listing's time, the
remote's clock). A push writes its lease, then reads the lock: a gc that takes the lock
later reads the lease; a gc that holds it is waited for. Of two linearizable steps on each
side (a lease written then the lock read; the lock taken then the leases read), one always
sees the other. Once any gc has run (gc/ran), a push trusts only the heads it read now (not
the remote-tracking refs of an earlier fetch: what they named may be gone), and checks
before its refs move that those heads did not move meanwhile (a head unmoved was reachable
until the lease took over).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import zstandard

from mgit.errors import MissingKeyError, RemoteConflictError, RemoteError, RemoteTooLargeError
from mgit.remotes.pack import decoded_limit
from mgit.remotes.repository import RemoteRepository
from mgit.store.objects import OID_RE

LEASES = "leases/"
GC_LOCK = "gc/lock"
GC_RAN = "gc/ran"
LEASE_FORMAT = 1
LEASE_TTL = 24 * 3600.0  # a lease older than this is a killed push's: it protects nothing
GC_STALE = 600.0  # a lock whose beat is older than this is a killed gc's
GC_BEAT = 60.0  # how often a running gc renews its beat (well within GC_STALE)
MAX_LEASE = 1 << 30  # decompressed: 65 bytes an id, ~16 M objects
MAX_LEASE_WIRE = 256 << 20
POLL = 0.5


def lease_key(lid: str) -> str:
    return f"{LEASES}{lid}"


def write_lease(remote: RemoteRepository, oids: Iterable[str], versions: Iterable[str] = ()) -> str:
    """Record that a push relies on these objects, and on these versions the remote has
    (with their histories: a gc walks from them as from heads); the lease's id."""
    lid = os.urandom(16).hex()
    value = {"format": LEASE_FORMAT, "objects": sorted(oids), "versions": sorted(versions)}
    body = json.dumps(value, separators=(",", ":")).encode()
    remote.backend.write(lease_key(lid), zstandard.ZstdCompressor(level=3).compress(body))
    return lid


def drop_lease(remote: RemoteRepository, lid: str) -> None:
    remote.backend.delete(lease_key(lid))


def read_lease(remote: RemoteRepository, key: str) -> tuple[set[str], set[str]]:
    """The objects and the versions a lease names (RemoteError if it is not a lease: a gc
    then stops rather than guess)."""
    try:
        raw = remote.backend.read(key, limit=MAX_LEASE_WIRE)
        # No bomb: a lease's ids (random hex) compress about 2 to 1, so it is held to the
        # ratio a metadata pack is held to, and decompression stops one byte past it.
        limit = min(MAX_LEASE, decoded_limit(len(raw)))
        body = zstandard.ZstdDecompressor().stream_reader(raw).read(limit + 1)
    except MissingKeyError:
        return set(), set()  # its push ended meanwhile: its refs moved, and those are read after
    except (zstandard.ZstdError, RemoteTooLargeError):
        raise RemoteError(f"{key} on {remote.url} is not a readable lease", hint="Delete it by hand") from None
    if len(body) > limit:
        raise RemoteError(f"{key} on {remote.url} is larger than a lease can be")
    try:
        value = json.loads(body)
        lists = [value["objects"], value.get("versions", [])] if value.get("format") == LEASE_FORMAT else []
    except (ValueError, AttributeError, KeyError, TypeError):
        lists = []
    if not lists or not all(
        isinstance(ids, list) and all(isinstance(o, str) and OID_RE.match(o) for o in ids) for ids in lists
    ):
        raise RemoteError(f"{key} on {remote.url} is not a readable lease", hint="Delete it by hand")
    return set(lists[0]), set(lists[1])


@dataclass
class Leases:
    """What the live leases of a remote name, how many there are, and the expired ones' keys."""

    objects: set[str] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)
    live: int = 0
    expired: list[str] = field(default_factory=list)


def live_leases(remote: RemoteRepository, now: float) -> Leases:
    found, live = Leases(), []
    for info in remote.backend.list_info(LEASES):
        (live if now - info.modified < LEASE_TTL else found.expired).append(info.key)
    for objects, versions in remote.map(lambda k: read_lease(remote, k), live):
        found.objects |= objects
        found.versions |= versions
    found.live = len(live)
    return found


# --- the gc lock ------------------------------------------------------------------------------
def _lock_body() -> bytes:
    return json.dumps({"format": 1, "beat": time.time()}).encode()


def _beat(data: bytes | None) -> float | None:
    """When a lock was last renewed (by its gc's clock), or None for no lock; a lock that is
    not readable counts as just renewed (nothing is assumed dead that may not be)."""
    if data is None:
        return None
    try:
        beat = json.loads(data)["beat"]
        return float(beat) if isinstance(beat, int | float) else time.time()
    except (ValueError, KeyError, TypeError):
        return time.time()


class GcLock:
    """The lock a remote gc holds while it deletes (one gc at a time; pushes wait for it)."""

    def __init__(self, remote: RemoteRepository) -> None:
        self.remote = remote
        self.token: str | None = None
        self.renewed = 0.0

    def acquire(self) -> None:
        backend = self.remote.backend
        data, token = backend.read_versioned(GC_LOCK, limit=4096)
        beat = _beat(data)
        if beat is not None and time.time() - beat < GC_STALE:
            raise RemoteConflictError(self.remote.url, f"{GC_LOCK} (another gc is running; try again later)")
        backend.write_if(GC_LOCK, _lock_body(), token=token)  # a stale one is taken over
        backend.write(GC_RAN, json.dumps({"format": 1, "at": time.time()}).encode())
        self.token, self.renewed = backend.read_versioned(GC_LOCK, limit=4096)[1], time.time()

    def renew(self) -> None:
        """Renew the beat if it is due; RemoteConflictError if the lock is no longer ours
        (it went stale and another gc took it): the caller stops deleting."""
        if time.time() - self.renewed < GC_BEAT:
            return
        backend = self.remote.backend
        try:
            backend.write_if(GC_LOCK, _lock_body(), token=self.token)
        except RemoteConflictError:
            self.token = None  # not ours to release
            raise
        self.token, self.renewed = backend.read_versioned(GC_LOCK, limit=4096)[1], time.time()

    def release(self) -> None:
        if self.token is not None:
            self.remote.backend.delete(GC_LOCK)
            self.token = None


def gc_has_run(remote: RemoteRepository) -> bool:
    """Whether a gc has ever run on this remote (one that holds the lock but has not marked
    it yet is found by `gc_state`, which a push reads after its lease)."""
    return remote.backend.exists(GC_RAN)


def gc_state(remote: RemoteRepository, *, wait: float = GC_STALE + GC_BEAT) -> bool:
    """Wait while a gc holds the lock (at most `wait` seconds: then it is stale); whether any
    gc has ever run on the remote (then what a push saw there before may be gone)."""
    deadline = time.monotonic() + wait
    while True:
        data, _ = remote.backend.read_versioned(GC_LOCK, limit=4096)
        beat = _beat(data)
        if beat is None or time.time() - beat >= GC_STALE or time.monotonic() >= deadline:
            return data is not None or remote.backend.exists(GC_RAN)
        time.sleep(POLL)
