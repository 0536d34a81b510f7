"""Looking at a remote without changing anything here: how each model compares (`remote
show`), laying out an empty one (`init --bare`), checking one (`fsck URL`), and bringing a
lazy clone's objects here ahead of time (`fetch --objects`)."""

from __future__ import annotations

from pathlib import Path

from mgit.errors import InvalidOptionError
from mgit.remotes import RemoteSpec, normalize_url, open_backend
from mgit.remotes.config import update_config
from mgit.remotes.datapack import PACK_THRESHOLD
from mgit.remotes.repository import RemoteRepository
from mgit.repo.fsck import FsckResult, check_references, verify_objects, walk
from mgit.repo.repository import Repo
from mgit.store.lazy import LazyStore
from mgit.store.objects import Version, walk_history
from mgit.store.quarantine import Incoming
from mgit.store.remote import RemoteStore
from mgit.store.transfer import TransferStats
from mgit.sync.connection import DEFAULT_REMOTE, Connection, connect
from mgit.sync.fetch import fetch_records
from mgit.sync.reports import RemoteInfo, RemoteModel, RemoteShow


def remote_show(repo: Repo, remote: str = DEFAULT_REMOTE) -> RemoteShow:
    """Per model: the same here and there, ahead, behind, diverged, or on one side only. The
    remote's records needed to tell are read into a quarantine that is then thrown away."""
    conn = connect(repo, remote)
    try:
        return _show(repo, conn)
    finally:
        conn.close()


def _show(repo: Repo, conn: Connection) -> RemoteShow:
    remote = conn.remote
    remote.check()
    theirs = {n: h for n, (h, _) in remote.heads().items()}
    mine = repo.refs.all()
    with Incoming(repo.store) as incoming:
        with incoming.refusing(remote.url):
            fetch_records(conn, incoming, list(theirs.values()), TransferStats())

        def chain(vid: str) -> list[str]:
            return list(walk_history(vid, lambda v: incoming.overlay.get_version(v).predecessor))

        models = []
        for name in sorted(set(theirs) | set(mine)):
            local, there = mine.get(name), theirs.get(name)
            if there is None or local is None:
                models.append(RemoteModel(name, "local only" if there is None else "remote only", local, there))
                continue
            ours, others = chain(local), chain(there)
            ahead = len([v for v in ours if v not in set(others)])
            behind = len([v for v in others if v not in set(ours)])
            state = "same" if local == there else "ahead" if not behind else "behind" if not ahead else "diverged"
            models.append(RemoteModel(name, state, local, there, ahead, behind))
    spec = repo.config.get("remotes", {}).get(conn.name, {})
    info = RemoteInfo(conn.name, remote.url, spec.get("endpoint_url"), spec.get("region"), spec.get("profile"))
    return RemoteShow(info, models)


def init_bare(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
    packs: bool | None = None,
) -> RemoteInfo:
    """An empty remote: a bare repository in a folder, or the layout of one under an S3
    prefix of a bucket that exists (a missing bucket is an error, never created). `packs`:
    whether pushes send small objects in data packs (by default, in a bucket or container,
    where each request costs tens of milliseconds, and not in a folder)."""
    spec = RemoteSpec(normalize_url(url), endpoint_url, region, profile)
    threshold = PACK_THRESHOLD if (spec.kind != "folder" if packs is None else packs) else 0
    if spec.kind == "folder":
        folder = Path(spec.url)
        if folder.exists() and any(folder.iterdir()):
            raise InvalidOptionError(f"{folder} exists and is not empty", hint="Lay a remote out in a new folder")
        Repo.init(folder, bare=True)
        if threshold:
            update_config(folder, lambda config: config.__setitem__("pack_threshold", threshold))
    else:
        remote = RemoteRepository(open_backend(spec))
        try:
            remote.init_bare(pack_threshold=threshold)
        finally:
            remote.close()
    return RemoteInfo("", spec.url, endpoint_url, region, profile)


def fsck_remote(
    url: str, *, endpoint_url: str | None = None, region: str | None = None, profile: str | None = None, jobs: int = 4
) -> FsckResult:
    """Re-hash every object of a remote (downloading each) and check what its refs reach."""
    spec = RemoteSpec(normalize_url(url), endpoint_url, region, profile)
    remote = RemoteRepository(open_backend(spec))
    try:
        remote.check()
        heads = {n: h for n, (h, _) in remote.heads().items()}
        store = RemoteStore(remote)
        seen = walk(store, heads)
        oids = store.ids()
        problems, checked = verify_objects(store, list(oids), jobs=jobs)
        bad = {p.object for p in problems}
        problems += [p for p in seen.problems + check_references(store, seen) if p.object not in bad]
        return FsckResult(len(remote.object_ids()), checked, len(heads), len(seen.versions), problems, 0)
    finally:
        remote.close()


def prefetch(repo: Repo, refs: list[str], *, jobs: int = 8) -> TransferStats:
    """Bring every object these versions read into a lazy clone, for work offline."""
    if not isinstance(repo.store, LazyStore):
        raise InvalidOptionError("this repository is not a lazy clone: it has every object already")
    wanted: set[str] = set()
    for ref in refs:
        version: Version = repo.version(ref)
        wanted |= repo.store.get_manifest(version.manifest).object_ids() | version.linked_objects()
    return repo.store.fetch(sorted(wanted))
