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
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from mgit.errors import (
    InvalidOptionError,
    MissingKeyError,
    ReceivedError,
    RemoteAuthError,
    RemoteError,
    RemoteNotFoundError,
    RemoteUnavailableError,
    StorageFullError,
    UnverifiedVersionError,
)
from mgit.index.catalog import ObjectRow
from mgit.index.refs import RefStore
from mgit.remotes import normalize_url, pack
from mgit.remotes.config import remotes_of, update_config
from mgit.remotes.pack import MAX_PACK, PackSpool
from mgit.remotes.repository import RemoteRepository
from mgit.repo.location import REPO_DIR
from mgit.repo.repository import Repo
from mgit.signing.policy import SETTINGS_KEY, check_setting
from mgit.store.base import ObjectStore
from mgit.store.lazy import LazyStore
from mgit.store.objectformat import Expected, expected_by
from mgit.store.objects import ancestors_first
from mgit.store.quarantine import Incoming
from mgit.store.transfer import RECORD_LIMIT, SLACK, TransferStats, limits, receive, version_objects
from mgit.sync.check_results import pull_checks
from mgit.sync.connection import DEFAULT_REMOTE, Connection, add_remote, connect
from mgit.sync.renames import learn_numbers, remote_retired, renamed_away, renames_of
from mgit.sync.reports import ChecksTravel, CloneResult, FetchResult, ModelUpdate
from mgit.sync.signatures import enforce_policy, fetch_signatures, keep_signatures, listing, remember_bundles
from mgit.sync.tags import pull_tags
from mgit.util.atomicfile import write_atomic
from mgit.util.faults import crash_point
from mgit.util.parallel import StartTransfer


def fetch(
    repo: Repo,
    remote: str = DEFAULT_REMOTE,
    *,
    models: str | None = None,
    progress: StartTransfer | None = None,
    prune: bool = False,
    verify: bool = True,
) -> FetchResult:
    """Fetch a remote's models (those matching the glob `models`, default all); see above.
    `prune` drops the remote-tracking refs of models the remote no longer has; `verify=False`
    does not apply the signature policy (mgit.sync.signatures) to them."""
    conn = connect(repo, remote)
    conn.verify = verify
    try:
        return fetch_from(repo, conn, models=models, progress=progress, prune=prune)
    finally:
        conn.close()


def fetch_from(
    repo: Repo,
    conn: Connection,
    *,
    models: str | None = None,
    progress: StartTransfer | None = None,
    prune: bool = False,
) -> FetchResult:
    remote, lazy = conn.remote, isinstance(repo.store, LazyStore)
    remote.check()
    every = {n: h for n, (h, _) in _heads(remote).items()}
    markers = remote_retired(remote)
    renames = renames_of(markers)
    renamed = renamed_away(renames, every)  # old names a push marked renamed: not models there any more
    heads = {n: h for n, h in every.items() if n not in renamed and (models is None or fnmatch.fnmatchcase(n, models))}
    if models is not None and not heads:
        raise RemoteError(f"no model on {conn.name} matches {models!r}")
    received = TransferStats()
    moved = []
    # Shared with adds, exclusive for gc: what arrives is not deleted before a ref names it.
    with repo.store.lock(), Incoming(repo.store) as incoming:
        versions = _arrive(repo, conn, incoming, heads, received, progress, every_model=models is None, renames=renames)
        if conn.tracking is not None:
            known = conn.tracking.all()
            changes: dict[str, tuple[str | None, str | None]] = {
                n: (h, known.get(n)) for n, h in heads.items() if known.get(n) != h
            }
            gone = {n: (None, known[n]) for n in renamed if n in known}
            deleted = {
                n: (None, old)
                for n, old in known.items()
                if prune and n not in every and (models is None or fnmatch.fnmatchcase(n, models))
            }
            conn.tracking.update_many({**changes, **gone, **deleted})
            moved = [
                ModelUpdate(n, "new" if old is None else "fast-forward", old, h) for n, (h, old) in changes.items()
            ]
            moved += [ModelUpdate(n, "renamed", old, None, f"renamed to {renamed[n]}") for n, (_, old) in gone.items()]
            moved += [ModelUpdate(n, "deleted", old, None, "deleted on the remote") for n, (_, old) in deleted.items()]
    learn_numbers(repo, markers)  # numbers the remote's names had: never given again here
    checks = pull_checks(repo, conn) if not repo.bare else ChecksTravel()
    return FetchResult(conn.name, remote.url, moved, len(versions), received, lazy, checks)


def _heads(remote: RemoteRepository) -> dict[str, tuple[str, str | None]]:
    """The remote's heads; a ref that is not a valid name or version id is refused as
    received data (the fetch has kept nothing yet)."""
    try:
        return remote.heads()
    except (RemoteNotFoundError, RemoteUnavailableError, RemoteAuthError, MissingKeyError):
        raise
    except RemoteError as exc:
        if isinstance(exc, ReceivedError):
            raise
        raise ReceivedError(exc.message, where=remote.url) from None


def fetch_versions(repo: Repo, conn: Connection, vids: list[str], *, verify: bool = True) -> TransferStats:
    """Bring these versions by id (whether or not a ref on the remote names them: a cluster
    task's output before the driver moves its ref) with what they need, as a fetch does:
    verified, and in a lazy clone records only; indexed, so that their ids resolve. No ref
    moves. `verify=False`: the signature policy does not apply (a cluster task's own output,
    which the driver signs)."""
    received = TransferStats()
    was, conn.verify = conn.verify, verify and conn.verify
    try:
        with repo.store.lock(), Incoming(repo.store) as incoming:
            _arrive(repo, conn, incoming, {v: None for v in vids}, received, None, every_model=False)
    finally:
        conn.verify = was
    repo.catalog.index(repo.store, *vids)
    return received


def _arrive(
    repo: Repo,
    conn: Connection,
    incoming: Incoming,
    tips: dict[str, str | None] | dict[str, str],
    received: TransferStats,
    progress: StartTransfer | None,
    *,
    every_model: bool,
    renames: dict[str, tuple[str, str]] | None = None,
) -> list[str]:
    """The versions along the histories of `tips` ({model: head} of the remote's refs, or
    {version id: None}) that are not here, and what they need, received, verified and kept
    (with the packs' sketches and rows of those versions); those versions, ancestors first.
    Anything the remote sent that is refused names it, and nothing is kept."""
    lazy, where = isinstance(repo.store, LazyStore), conn.remote.url
    named = {n: h for n, h in tips.items() if h is not None}
    heads = list(named.values()) if named else list(tips)
    with (
        incoming.refusing(where),
        _packs(repo, conn, incoming, received) as (spool, read),
        listing(repo, conn) as listed,
    ):
        versions = fetch_records(conn, incoming, heads, received, packed=spool)
        check_histories(incoming.overlay, named, versions, where=where, renames=renames)
        signed = fetch_signatures(repo, conn, versions, listed)
        enforce_policy(repo, conn, incoming.overlay, versions, signed)
        # A lazy clone takes records and a recipe's source only: tensors and files come when
        # read. A clone of some models (`partial`, their glob) takes theirs whole, and of their
        # lineage ancestors' models the records only.
        partial = repo.config.get("partial") if lazy else None
        whole = [v for v in versions if partial and fnmatch.fnmatchcase(incoming.overlay.get_version(v).model, partial)]
        wanted = {o: RECORD_LIMIT for v in versions for o in {v} | incoming.overlay.get_version(v).linked_objects()}
        wanted = limits(incoming.overlay, versions) if not lazy else {**wanted, **limits(incoming.overlay, whole)}
        hold_packed(incoming, spool, wanted, received)
        # A lazy clone's rows: for the objects of these versions and of any a killed run of
        # this fetch kept but did not index (its rows went with it).
        unindexed = _unindexed(repo, incoming.overlay, heads) if lazy else versions
        rows = {} if spool is None else _rows(spool, _described(incoming.overlay, unindexed))
        sketches = {} if spool is None else _sketches(incoming.overlay, spool.sketches(versions))
        coming = {o: n for o, n in wanted.items() if not incoming.overlay.has(o)}  # (records: in the pack)
        total = sum(rows[o][3] if o in rows else n - SLACK for o, n in coming.items())
        tick = progress(total, len(coming)) if progress else None
        received.add(receive(conn.remote, incoming, wanted, progress=tick))
        arrived = list(dict.fromkeys(incoming.arrived))
        crash_point("fetch-after-download")
        incoming.verify(arrived, jobs=os.cpu_count() or 2)
    incoming.promote()
    crash_point("fetch-after-promote")
    keep_signatures(repo, signed)
    remember_bundles(repo, conn, listed.bundles if listed is not None else [])
    if lazy:
        _describe_objects(repo, unindexed, [ObjectRow(*r) for r in rows.values()])
    repo.catalog.put_sketches(sketches, keep=True)  # (one transaction for thousands)
    if every_model:  # a fetch of some models may want the rest of these packs later
        _remember_packs(repo, conn, read)
    return versions


@contextmanager
def _packs(
    repo: Repo, conn: Connection, incoming: Incoming, stats: TransferStats
) -> Iterator[tuple[PackSpool | None, list[str]]]:
    """The packs not read before, downloaded into the quarantine and their entries spooled
    there as they decompress: (the spool, or None without a new pack; the packs read). A
    pack is refused when it does not hash to its name or decodes to more than its size
    allows; packs past what one fetch decodes (MAX_FETCH_PACKS) are left for their records
    to be read one by one."""
    remote = conn.remote
    seen = _packs_read(repo, conn)
    new = [p for p in remote.pack_ids() if p not in seen]
    if not new:
        yield None, []
        return
    folder = incoming.dir / "packs"
    folder.mkdir(parents=True, exist_ok=True)
    sizes = remote.map(lambda p: remote.read_pack_into(p, folder / f"{p}.mgpack", limit=MAX_PACK), new)
    spool = PackSpool(folder / "spool.sqlite")
    try:
        budget, read = pack.MAX_FETCH_PACKS, []
        for pid, size in zip(new, sizes, strict=True):
            path = folder / f"{pid}.mgpack"
            declared = pack.declared_size(pid, path, where=remote.url)
            if declared <= budget:
                spool.add(pack.read_entries(pid, path, where=remote.url, budget=budget))
                budget -= declared
                read.append(pid)
            stats.bytes += size
            path.unlink()
        yield spool, read
    finally:
        spool.close()


def _packs_read(repo: Repo, conn: Connection) -> set[str]:
    path = repo.dir / "remotes" / conn.name / "packs.json"
    return set(json.loads(path.read_text())) if conn.tracking is not None and path.is_file() else set()


def _remember_packs(repo: Repo, conn: Connection, read: list[str]) -> None:
    """Record the packs this fetch read (after what it brought was kept), not to read them again."""
    if conn.tracking is None or not read:
        return
    path = repo.dir / "remotes" / conn.name / "packs.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, [json.dumps(sorted(_packs_read(repo, conn) | set(read))).encode()])


def check_histories(
    store: ObjectStore,
    heads: dict[str, str],
    versions: Iterable[str],
    *,
    where: str,
    renames: dict[str, tuple[str, str]] | None = None,
) -> None:
    """A remote's history of a model holds only versions of that model: its head is one, and
    so is every predecessor of a version that arrived (lineage parents may be of any model).
    A forged record would otherwise show under another model's history. A model renamed
    there (`renames`: {old: (new, head)}, mgit.sync.renames) counts its old name's versions
    as its own."""
    renames = renames or {}

    def same(model: str, name: str) -> bool:
        seen = set()
        while model != name and model in renames and model not in seen:
            seen.add(model)
            model = renames[model][0]
        return model == name

    for name, head in heads.items():
        model = store.get_version(head).model
        if not same(model, name):
            raise ReceivedError(
                f"version {head[:12]}, the head of {name!r} on {where}, is a version of {model!r}", where=where
            )
    for vid in versions:
        version = store.get_version(vid)
        if version.predecessor is not None:
            before = store.get_version(version.predecessor).model
            if not same(before, version.model):
                raise ReceivedError(
                    f"version {vid[:12]} of {version.model!r} from {where} follows "
                    f"{version.predecessor[:12]}, a version of {before!r}",
                    where=where,
                )


def fetch_records(
    conn: Connection, incoming: Incoming, tips: list[str], stats: TransferStats, *, packed: PackSpool | None = None
) -> list[str]:
    """The versions along the heads' histories that this repository lacks, their records and
    manifests brought into the quarantine (each verified when parsed), ancestors first.
    Records that `packed` (the metadata packs' spool) holds are taken from it, not asked for."""
    remote, overlay, local = conn.remote, incoming.overlay, incoming.store
    order: list[str] = []
    seen: set[str] = set()
    frontier = [t for t in tips if not local.has(t)]
    while frontier:
        missing = [v for v in dict.fromkeys(frontier) if not overlay.has(v)]
        hold_packed(incoming, packed, missing, stats)
        stats.add(receive(remote, incoming, {v: RECORD_LIMIT for v in missing if not overlay.has(v)}))
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


def hold_packed(incoming: Incoming, packed: PackSpool | None, oids: Iterable[str], stats: TransferStats) -> None:
    """Put in the quarantine those of `oids` that a pack brought and that are not here."""
    if packed is None:
        return
    held = packed.records(o for o in oids if not incoming.overlay.has(o))
    incoming.hold(held)
    stats.objects += len(held)


def _unindexed(repo: Repo, store: ObjectStore, heads: list[str]) -> list[str]:
    """The versions along the histories of `heads` that the catalog has not indexed: those
    that arrive now, and those a killed fetch kept without indexing them."""
    return ancestors_first(heads, lambda v: store.get_version(v).linked_versions(), stop=repo.catalog.has_version)


def _described(store: ObjectStore, versions: list[str]) -> set[str]:
    """The objects these versions name (their rows are what a lazy clone keeps of packs)."""
    out: set[str] = set()
    for vid in versions:
        out |= version_objects(store, vid)[2]
    return out


def _rows(spool: PackSpool, oids: set[str]) -> dict[str, pack.ObjectInfo]:
    """The packs' rows of these objects and, recursively, of the delta bases they name."""
    rows: dict[str, pack.ObjectInfo] = {}
    while oids:
        found = spool.rows(oids)
        rows.update(found)
        oids = {b for r in found.values() for b in r[5]} - rows.keys()
    return rows


def _sketches(store: ObjectStore, found: dict[str, bytes]) -> dict[str, bytes]:
    """Of the packs' sketches of fetched versions, those that describe their version's
    tensors (a sketch is a hint: one that does not is recomputed when needed)."""
    from mgit.lineage.sketch import Sketch  # numpy: only when a pack brought sketches

    kept = {}
    for vid, data in found.items():
        tensors = store.get_manifest(store.get_version(vid).manifest).tensors()
        try:
            sketch = Sketch.from_bytes(data)
        except ValueError:
            continue
        names = {t.name for t in tensors}
        if (
            len(set(sketch.names)) == len(sketch.names)
            and set(sketch.names) == names
            and set(zip(sketch.names, sketch.oids, strict=True)) <= {(t.name, t.object) for t in tensors}
        ):
            kept[vid] = data
    return kept


def _describe_objects(repo: Repo, versions: list[str], rows: list[ObjectRow]) -> None:
    """A lazy clone's catalog rows for objects it does not have: from the manifests (kind and
    size, which a lazy read then bounds its decode by), with a pack's stored size, codec and
    delta bases where its row agrees with them. A pack's rows are hints: one that disagrees
    with a manifest is dropped, and a row for an object no manifest names (a delta base) is
    kept as a hint only (a base's read is bounded by its child)."""
    expected: dict[str, Expected] = {}
    for vid in versions:
        for oid, want in expected_by(repo.store.get_manifest(repo.store.get_version(vid).manifest)).items():
            expected.setdefault(oid, want)
    described: dict[str, ObjectRow] = {}
    for r in rows:
        want = expected.get(r.id)
        if want is None or (r.kind == want.kind and r.logical_size == want.size):
            described.setdefault(r.id, r)
    for oid, want in expected.items():
        described.setdefault(oid, ObjectRow(oid, want.kind or "blob", want.size or 0, 0, "unknown"))
    known = repo.catalog.object_rows(described)
    repo.catalog.add_objects(r for r in described.values() if r.id not in known)


def clone(
    url: str,
    directory: str | os.PathLike[str] | None = None,
    *,
    models: str | None = None,
    lazy: bool = False,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    progress: StartTransfer | None = None,
    verify: bool = True,
    settings: dict[str, str] | None = None,
) -> CloneResult:
    """A new repository in `directory` with `url` as its remote `origin`, every model (or
    those matching `models`) fetched and checked in as local heads. `lazy` fetches records
    only; objects come when something reads them. With `models` the other models' versions
    that are lineage ancestors of those come as records (remote-only: `show` and `checkout`
    fetch what they read, as in a lazy clone). `settings` (mgit config's, such as
    verify.require and verify.allowed-signers) are set in the new repository before anything
    is fetched; `verify=False` skips the signature policy."""
    target = Path(directory) if directory is not None else Path(url.rstrip("/").rpartition("/")[2] or "models")
    made = not target.exists()
    made_repo = not (target / REPO_DIR).exists()
    repo = _clone_target(target, url, lazy, models)
    if DEFAULT_REMOTE not in remotes_of(repo.config):
        add_remote(repo, DEFAULT_REMOTE, url, endpoint_url=endpoint_url, region=region, profile=profile)
    if (lazy or models is not None) and repo.config.get("lazy") != DEFAULT_REMOTE:
        # Some models: theirs come whole, their lineage ancestors' as records fetched when read.
        partial = None if lazy else models
        update_config(repo.dir, lambda config: config.update({"lazy": DEFAULT_REMOTE, "partial": partial}))
    if settings:
        values = {k: check_setting(k, v) for k, v in settings.items()}
        update_config(repo.dir, lambda config: config.setdefault(SETTINGS_KEY, {}).update(values))
    repo = Repo(repo.dir)
    try:
        result = fetch(repo, DEFAULT_REMOTE, models=models, progress=progress, verify=verify)
    except (
        ReceivedError,
        StorageFullError,
        UnverifiedVersionError,
    ):  # nothing of the remote was kept: neither is the repository made for it
        if made_repo:
            repo.catalog.close()
            shutil.rmtree(target if made else target / REPO_DIR, ignore_errors=True)
        raise
    heads = RefStore(repo.dir, namespace=f"remotes/{DEFAULT_REMOTE}").all()
    crash_point("clone-before-heads")
    repo.refs.update_many({name: (head, None) for name, head in heads.items()})
    repo.sync_catalog()
    conn = connect(repo, DEFAULT_REMOTE)
    try:
        pull_tags(repo, conn)  # tags set later on the versions it has
    finally:
        conn.close()
    return CloneResult(str(repo.root), result.url, lazy, sorted(heads), result)


def _clone_target(target: Path, url: str, lazy: bool, models: str | None) -> Repo:
    """A new repository in `target`, or the one a killed clone of the same URL left there
    (no model checked in yet): the clone then resumes, fetching only what is missing."""
    if (target / REPO_DIR / "config.json").is_file():
        repo = Repo(target)
        origin = remotes_of(repo.config).get(DEFAULT_REMOTE)
        if (
            not repo.refs.all()
            and (origin is None or origin.url == normalize_url(url))
            and not (repo.lazy and not lazy and repo.config.get("partial") != models)
        ):
            return repo
    if target.exists() and any(target.iterdir()):
        raise InvalidOptionError(f"{target} exists and is not empty", hint="Clone into a new or empty folder")
    return Repo.init(target)
