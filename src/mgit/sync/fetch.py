"""`fetch` and `clone`: bring a remote's versions here, verified, and record its heads.

A fetch reads the remote's heads, then the metadata packs it has not read yet (the records
of many versions in one request each), then any record still missing along the heads'
histories, then the objects those versions need (all of them; in a lazy clone none but the
records). Everything arrives in a quarantine, is verified against its id, and is kept only
when all of it verifies; the remote-tracking refs (`origin/NAME`) move last. Local heads
are not touched: `pull` does that.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from mgit.atomicfile import write_atomic
from mgit.catalog import ObjectRow
from mgit.errors import InvalidOptionError, RemoteError
from mgit.faults import crash_point
from mgit.incoming import Incoming
from mgit.layout import REPO_DIR
from mgit.lazystore import LazyStore
from mgit.refs import RefStore
from mgit.remotes import normalize_url
from mgit.remotes.config import remotes_of, update_config
from mgit.remotes.pack import MAX_PACK, MetadataPack
from mgit.repo import Repo
from mgit.sync.connection import DEFAULT_REMOTE, Connection, add_remote, connect
from mgit.sync.reports import ChecksTravel, CloneResult, FetchResult, ModelUpdate
from mgit.sync.results import pull_checks
from mgit.transfer import RECORD_LIMIT, SLACK, TransferStats, limits, receive

Progress = Callable[[int], None]


def fetch(repo: Repo, remote: str = DEFAULT_REMOTE, *, models: str | None = None,
          progress: Callable[[int, int], Progress] | None = None) -> FetchResult:  # fmt: skip
    """Fetch a remote's models (those matching the glob `models`, default all); see above."""
    conn = connect(repo, remote)
    try:
        return fetch_from(repo, conn, models=models, progress=progress)
    finally:
        conn.close()


def fetch_from(repo: Repo, conn: Connection, *, models: str | None = None,
               progress: Callable[[int, int], Progress] | None = None) -> FetchResult:  # fmt: skip
    remote, lazy = conn.remote, isinstance(repo.store, LazyStore)
    remote.check()
    heads = {n: h for n, (h, _) in remote.heads().items() if models is None or fnmatch.fnmatchcase(n, models)}
    if models is not None and not heads:
        raise RemoteError(f"no model on {conn.name} matches {models!r}")
    received = TransferStats()
    moved = []
    # Shared with adds, exclusive for gc: what arrives is not deleted before a ref names it.
    with repo.store.lock(), Incoming(repo.store) as incoming:
        versions = _arrive(repo, conn, incoming, list(heads.values()), received, progress)
        if conn.tracking is not None:
            known = conn.tracking.all()
            changes = {n: (h, known.get(n)) for n, h in heads.items() if known.get(n) != h}
            conn.tracking.update_many(changes)
            moved = [ModelUpdate(n, "new" if old is None else "fast-forward", old, h) for n, (h, old) in changes.items()]
    checks = pull_checks(repo, conn) if not repo.bare else ChecksTravel()
    return FetchResult(conn.name, remote.url, moved, len(versions), received, lazy, checks)


def fetch_versions(repo: Repo, conn: Connection, vids: list[str]) -> TransferStats:
    """Bring these versions by id (whether or not a ref on the remote names them: a cluster
    task's output before the driver moves its ref) with what they need, as a fetch does:
    verified, and in a lazy clone records only; indexed, so that their ids resolve. No ref
    moves."""
    received = TransferStats()
    with repo.store.lock(), Incoming(repo.store) as incoming:
        _arrive(repo, conn, incoming, vids, received, None)
    repo.catalog.index(repo.store, *vids)
    return received


def _arrive(repo: Repo, conn: Connection, incoming: Incoming, tips: list[str], received: TransferStats,
            progress: Callable[[int, int], Progress] | None) -> list[str]:  # fmt: skip
    """The versions along `tips`' histories that are not here, and what they need, received,
    verified and kept (the new packs' descriptions too); those versions, ancestors first."""
    lazy = isinstance(repo.store, LazyStore)
    rows, sketches, packed = _read_packs(repo, conn, received)
    versions = fetch_records(conn, incoming, tips, received, packed=packed)
    if lazy:  # records and a recipe's source only: tensors and files come when read
        wanted = {o: RECORD_LIMIT for v in versions for o in {v} | incoming.overlay.get_version(v).linked_objects()}
    else:
        wanted = limits(incoming.overlay, versions)
    hold_packed(incoming, packed, wanted, received)
    known = {r.id: r.stored_size for r in rows}
    tick = progress(sum(known.get(o, n - SLACK) for o, n in wanted.items()), 0) if progress else None
    received.add(receive(conn.remote, incoming, wanted, progress=tick))
    arrived = list(dict.fromkeys(incoming.arrived))
    crash_point("fetch-after-download")
    incoming.verify(arrived, jobs=os.cpu_count() or 2)
    incoming.promote()
    crash_point("fetch-after-promote")
    if lazy:
        _describe_objects(repo, versions, rows)
    _keep_sketches(repo, sketches)
    return versions


def _read_packs(repo: Repo, conn: Connection, stats: TransferStats
                ) -> tuple[list[ObjectRow], dict[str, bytes], dict[str, bytes]]:  # fmt: skip
    """Read the packs not read before: their object rows, sketches and records. A record
    goes to the quarantine (verified there like any object) only when the fetch brings its
    version: kept without the version's objects, it would pass for a version that is here."""
    remote = conn.remote
    seen_file = repo.dir / "remotes" / conn.name / "packs.json" if conn.tracking is not None else None
    seen = set(json.loads(seen_file.read_text())) if seen_file and seen_file.is_file() else set()
    new = [p for p in remote.pack_ids() if p not in seen]
    rows: list[ObjectRow] = []
    sketches: dict[str, bytes] = {}
    records: dict[str, bytes] = {}
    for pid, data in zip(new, remote.map(lambda p: remote.read_pack(p, limit=MAX_PACK), new), strict=True):
        pack = MetadataPack.from_bytes(pid, data, where=conn.name)
        stats.bytes += len(data)
        records.update(pack.records)
        rows += [ObjectRow(*r) for r in pack.objects]
        sketches.update(pack.sketches)
    if seen_file is not None and new:
        seen_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(seen_file, [json.dumps(sorted(seen | set(new))).encode()])
    return rows, sketches, records


def fetch_records(conn: Connection, incoming: Incoming, tips: list[str], stats: TransferStats, *,
                  packed: dict[str, bytes] | None = None) -> list[str]:  # fmt: skip
    """The versions along the heads' histories that this repository lacks, their records and
    manifests brought into the quarantine (each verified when parsed), ancestors first.
    Records that `packed` (from metadata packs) holds are taken from it, not asked for."""
    packed = packed or {}
    remote, overlay, local = conn.remote, incoming.overlay, incoming.store
    order: list[str] = []
    seen: set[str] = set()
    frontier = [t for t in tips if not local.has(t)]
    while frontier:
        missing = [v for v in dict.fromkeys(frontier) if not overlay.has(v)]
        hold_packed(incoming, packed, missing, stats)
        stats.add(receive(remote, incoming, {v: RECORD_LIMIT for v in missing if v not in packed}))
        following = []
        manifests = {}
        for vid in dict.fromkeys(frontier):
            if vid in seen:
                continue
            seen.add(vid)
            version = overlay.get_version(vid)  # verified: its content hashes to its id
            order.append(vid)
            manifests[version.manifest] = RECORD_LIMIT
            following += [v for v in version.linked_versions() if not local.has(v) and v not in seen]
        hold_packed(incoming, packed, manifests, stats)
        stats.add(receive(remote, incoming, {m: n for m, n in manifests.items() if not overlay.has(m)}))
        for m in manifests:
            overlay.get_manifest(m)  # verified, paths checked
        frontier = following
    return order[::-1]


def hold_packed(incoming: Incoming, packed: dict[str, bytes], oids: Iterable[str], stats: TransferStats) -> None:
    """Put in the quarantine those of `oids` that a pack brought and that are not here."""
    held = {o: packed[o] for o in oids if o in packed and not incoming.overlay.has(o)}
    incoming.hold(held)
    stats.objects += len(held)


def _describe_objects(repo: Repo, versions: list[str], rows: list[ObjectRow]) -> None:
    """A lazy clone's catalog rows for objects it does not have: as the packs describe them
    (sizes, codecs, delta bases), else from the manifests (sizes; bases found on fetch)."""
    known = repo.catalog.object_rows(r.id for r in rows)
    described = {r.id: r for r in rows if r.id not in known}
    for vid in versions:
        manifest = repo.store.get_manifest(repo.store.get_version(vid).manifest)
        for f in manifest.files:
            described.setdefault(f.object, ObjectRow(f.object, "blob", f.size, 0, "unknown"))
            for t in f.tensors:
                described.setdefault(t.object, ObjectRow(t.object, "tensor", t.nbytes, 0, "unknown"))
    known = repo.catalog.object_rows(described)
    repo.catalog.add_objects(r for r in described.values() if r.id not in known)


def _keep_sketches(repo: Repo, sketches: dict[str, bytes]) -> None:
    """Sketches from packs: parent inference then needs no tensor of these versions."""
    for vid, data in sketches.items():
        if repo.catalog.sketch(vid) is None:
            repo.catalog.put_sketch(vid, data)


def clone(url: str, directory: str | os.PathLike[str] | None = None, *, models: str | None = None,
          lazy: bool = False, endpoint_url: str | None = None, region: str | None = None,
          profile: str | None = None, progress: Callable[[int, int], Progress] | None = None) -> CloneResult:  # fmt: skip
    """A new repository in `directory` with `url` as its remote `origin`, every model (or
    those matching `models`) fetched and checked in as local heads. `lazy` fetches records
    only; objects come when something reads them."""
    target = Path(directory) if directory is not None else Path(url.rstrip("/").rpartition("/")[2] or "models")
    repo = _clone_target(target, url, lazy)
    if DEFAULT_REMOTE not in remotes_of(repo.config):
        add_remote(repo, DEFAULT_REMOTE, url, endpoint_url=endpoint_url, region=region, profile=profile)
    if lazy and repo.config.get("lazy") != DEFAULT_REMOTE:
        update_config(repo.dir, lambda config: config.__setitem__("lazy", DEFAULT_REMOTE))
    repo = Repo(repo.dir)
    result = fetch(repo, DEFAULT_REMOTE, models=models, progress=progress)
    heads = RefStore(repo.dir, namespace=f"remotes/{DEFAULT_REMOTE}").all()
    crash_point("clone-before-heads")
    repo.refs.update_many({name: (head, None) for name, head in heads.items()})
    repo.sync_catalog()
    return CloneResult(str(repo.root), result.url, lazy, sorted(heads), result)


def _clone_target(target: Path, url: str, lazy: bool) -> Repo:
    """A new repository in `target`, or the one a killed clone of the same URL left there
    (no model checked in yet): the clone then resumes, fetching only what is missing."""
    if (target / REPO_DIR / "config.json").is_file():
        repo = Repo(target)
        origin = remotes_of(repo.config).get(DEFAULT_REMOTE)
        if not repo.refs.all() and (origin is None or origin.url == normalize_url(url)) and not (repo.lazy and not lazy):
            return repo
    if target.exists() and any(target.iterdir()):
        raise InvalidOptionError(f"{target} exists and is not empty", hint="Clone into a new or empty folder")
    return Repo.init(target)
