"""Moving objects between a repository and a remote: what a version needs, sending object
files as they are, and receiving them through a quarantine where each is verified.

What travels is decided by object ids: `closure` names every object a set of versions
needs (records, files, tensors, each delta's bases, a recipe's source), and a transfer
sends only those the other side lacks. An object file is sent byte for byte, encoded as it
is stored, so a fine-tune sent after its base costs its delta. A download is bounded before
it starts (`limits`): a record by the largest record MGit writes, a tensor or file by what
its manifest says it holds, a delta base by the largest tensor it could be the base of.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from mgit.errors import ReceivedCorruptError, ReceivedMissingError
from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.store.local import LocalStore
from mgit.store.objectformat import MAX_DEPTH_LIMIT, MAX_HEADER, MAX_RECORD, PREFIX, Expected
from mgit.store.objects import Manifest, Version, ancestors_first
from mgit.store.quarantine import Incoming
from mgit.store.remote import RemoteObjects
from mgit.util.parallel import TransferProgress

SLACK = PREFIX + MAX_HEADER  # what an object file holds besides its payload, at most
RECORD_LIMIT = MAX_RECORD + SLACK
BASE_FACTOR = 8  # a base is at most this many times its child (an int8 copy's float64 parent)


@dataclass
class TransferStats(Report):
    """Objects and bytes (stored, as they travel) sent or received, and those skipped
    because the other side had them (for a fetch: this side, in the repository or received
    whole by a killed run of the fetch, in its quarantine)."""

    objects: int = 0
    bytes: int = 0
    skipped: int = 0
    skipped_bytes: int = 0

    def add(self, other: TransferStats) -> None:
        self.objects += other.objects
        self.bytes += other.bytes
        self.skipped += other.skipped
        self.skipped_bytes += other.skipped_bytes


# --- what versions need ----------------------------------------------------------------------
def history(
    store: ObjectStore,
    tips: Iterable[str],
    *,
    stop: Callable[[str], bool] = lambda v: False,
    links: Mapping[str, list[str]] | None = None,
) -> list[str]:
    """Versions reachable from `tips` through predecessors and lineage parents, ancestors
    first, not walking past a version for which `stop` is true (the other side has it).
    `links` ({version: what it links to}, a catalog's rows) spares reading those records."""
    links = links or {}

    def linked(vid: str) -> list[str]:
        found = links.get(vid)
        return found if found is not None else store.get_version(vid).linked_versions()

    return ancestors_first(tips, linked, stop=stop)


def version_objects(store: ObjectStore, vid: str) -> tuple[Version, Manifest, set[str]]:
    """A version, its manifest, and the objects they name directly (not bases)."""
    version = store.get_version(vid)
    manifest = store.get_manifest(version.manifest)
    return version, manifest, {vid} | version.linked_objects() | manifest.object_ids()


def closure(
    store: ObjectStore,
    versions: Iterable[str],
    *,
    bases_of: Callable[[str], Iterable[str]] | None = None,
) -> set[str]:
    """Every object these versions need: records, files, tensors and, recursively, the
    delta bases of each (read from the headers, or from `bases_of`)."""
    needed: set[str] = set()
    for vid in versions:
        needed |= version_objects(store, vid)[2]

    def recorded_bases(oid: str) -> Iterable[str]:  # a lazy clone's remote-only object: not fetched to see
        promised = store.promised(oid)
        return promised if promised is not None else store.header(oid).bases

    bases_of = bases_of or recorded_bases
    stack = list(needed)
    while stack:
        for base in bases_of(stack.pop()):
            if base not in needed:
                needed.add(base)
                stack.append(base)
    return needed


def limits(store: ObjectStore, versions: Iterable[str]) -> dict[str, int]:
    """The most bytes each object these versions name may take on the wire."""
    out: dict[str, int] = {}
    for vid in versions:
        version, manifest, _ = version_objects(store, vid)
        out[vid] = out[version.manifest] = RECORD_LIMIT
        for o in version.linked_objects() - {version.manifest}:
            out[o] = RECORD_LIMIT  # a recipe's source file
        for f in manifest.files:
            out[f.object] = max(out.get(f.object, 0), f.size + SLACK)
            for t in f.tensors:
                out[t.object] = max(out.get(t.object, 0), t.nbytes + SLACK)
    return out


# --- sending -------------------------------------------------------------------------------------
def present_on(remote: RemoteObjects, store: ObjectStore, oids: Iterable[str]) -> set[str]:
    """Which of these objects the remote holds whole: a file of the size it has here (an
    object this store has only on that remote counts whatever its size)."""
    return remote.has_objects({o: store.stored_size(o) if store.has(o) else None for o in oids})


def upload(
    remote: RemoteObjects, store: LocalStore, oids: Iterable[str], *, progress: TransferProgress | None = None
) -> TransferStats:
    """Send these object files as they are stored (the caller knows the remote lacks them):
    those smaller than the remote's pack threshold in data packs, the rest one by one, first
    aborting what a killed push left of their uploads."""
    wanted = sorted(set(oids))
    sizes = {o: store.stored_size(o) for o in wanted}
    small = [o for o in wanted if sizes[o] < remote.pack_threshold]
    large = [o for o in wanted if sizes[o] >= remote.pack_threshold]
    if large:
        remote.abort_unfinished(large)

    def send(oid: str) -> None:
        remote.write_object(oid, store.path_of(oid), progress=progress)
        if progress:
            progress(0, 1)

    remote.write_packed([(o, store.path_of(o), sizes[o]) for o in small], progress=progress)
    remote.map(send, large)
    return TransferStats(objects=len(wanted), bytes=sum(sizes.values()))


# --- receiving -----------------------------------------------------------------------------------
def receive(
    remote: RemoteObjects,
    incoming: Incoming,
    wanted: Mapping[str, int],
    *,
    progress: TransferProgress | None = None,
    used_by: Callable[[str], list[str]] | None = None,
) -> TransferStats:
    """Download `wanted` objects ({id: most bytes it may take}) that the repository lacks
    into the quarantine, with every delta base they need; verify nothing yet (the caller
    verifies and promotes once everything of the fetch has arrived)."""
    store, overlay = incoming.store, incoming.overlay
    stats = TransferStats()
    pending = {o: n for o, n in wanted.items() if not overlay.has(o)}
    # Already there: in the repository. What arrived in this fetch's packs was counted as received.
    stats.skipped = sum(1 for o in wanted if o not in pending and not incoming.has(o))
    seen = set(wanted)
    for _round in range(MAX_DEPTH_LIMIT + 2):
        if not pending:
            return stats

        fresh: dict[str, int] = {}
        for oid, limit in sorted(pending.items()):  # what a killed run of this fetch received whole
            salvaged = incoming.salvage(oid, limit=limit)
            if salvaged is None:
                fresh[oid] = limit
                continue
            stats.skipped += 1
            if progress:
                progress(salvaged, 1)
        got = remote.read_objects_into({o: (incoming.path_for(o), n) for o, n in fresh.items()}, progress=progress)
        absent = sorted(o for o, size in got.items() if size is None)
        if absent:
            raise ReceivedMissingError(absent[0], where=remote.url, used_by=used_by(absent[0]) if used_by else None)
        stats.objects += len(got)
        stats.bytes += sum(size or 0 for size in got.values())
        following: dict[str, int] = {}
        for oid, limit in pending.items():
            header = incoming.quarantine.header(oid)  # checked: magic, lengths, kind, sizes
            for base in header.bases:
                if base not in seen and not store.has(base):
                    following[base] = max(header.size * BASE_FACTOR, limit) + SLACK
                    seen.add(base)
        pending = following
    raise ReceivedCorruptError(
        next(iter(pending)), f"its delta bases go deeper than {MAX_DEPTH_LIMIT}", where=remote.url
    )


def fetch_objects(
    remote: RemoteObjects,
    store: LocalStore,
    wanted: Mapping[str, int],
    *,
    jobs: int,
    progress: TransferProgress | None = None,
    expect: Mapping[str, Expected] | None = None,
) -> TransferStats:
    """Download, verify and keep objects (with their bases): all of them, or none (then the error
    names the remote). `expect`: what the records naming them say of them, checked before each
    is decoded."""
    with Incoming(store) as incoming:
        with incoming.refusing(remote.url):
            stats = receive(remote, incoming, wanted, progress=progress)
            incoming.verify(list(dict.fromkeys(incoming.arrived)), jobs=jobs, expect=expect)
        incoming.promote()
    return stats
