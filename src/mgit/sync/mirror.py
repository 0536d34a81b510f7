"""A read-only mirror of a remote: a lazy clone kept in a cache folder, one per remote URL,
brought up to date each time it is opened. What `mgit serve URL` browses: records only, the
objects a page reads fetched (and verified) when it reads them.

A mirror has no work of its own: opening it fetches the remote's records and moves every
local head to the remote's (a model the remote no longer has, deleted or renamed, goes). Its catalog
is built here from what the fetch verified: nothing the remote says about itself (a folder
remote's catalog.sqlite) is read.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mgit.index.refs import RefStore
from mgit.remotes import normalize_url
from mgit.repo.location import REPO_DIR
from mgit.repo.repository import Repo
from mgit.sync.connection import DEFAULT_REMOTE
from mgit.sync.fetch import clone, fetch
from mgit.util.locks import FileLock

CACHE_VARIABLE = "MGIT_MIRROR_CACHE"
LOCK_WAIT = 600.0  # another process opening the same mirror (a clone of a large remote) is waited for
REFRESH_WAIT = 1.0  # a server bringing its mirror up to date tries again later rather than wait


def mirror_root() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    return Path(configured) if configured else Path.home() / ".cache" / "mgit" / "mirrors"


@dataclass(frozen=True)
class Mirror:
    repo: Repo
    url: str
    created: bool  # cloned now (else brought up to date)
    moved: list[str]  # models whose head moved to the remote's


@contextmanager
def cached_clone(
    root: Path,
    url: str,
    *,
    what: str,
    wait: float,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
) -> Iterator[tuple[Repo, bool]]:
    """The lazy clone of `url` kept under `root` (in a folder named by the URL's hash), made
    by the first caller: (repo, made now), held under a file lock while the block runs, so
    that processes opening it at once wait for one clone (`wait` seconds at most). What a
    mirror and a cluster node's cache are."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)  # private: its catalogs are trusted
    folder = root / hashlib.sha256(url.encode()).hexdigest()[:16]
    with FileLock(root / f"{folder.name}.lock", what=what, timeout=wait):
        made = not (folder / REPO_DIR / "config.json").is_file() or not Repo(folder).lazy
        if made:
            clone(url, folder, lazy=True, endpoint_url=endpoint_url, region=region, profile=profile)
        yield Repo(folder), made


def open_mirror(
    url: str,
    *,
    root: Path | None = None,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
) -> Mirror:
    """The mirror of `url` under `root` (default: MGIT_MIRROR_CACHE, else
    ~/.cache/mgit/mirrors), made on first use, else fetched and its heads moved to the
    remote's."""
    url = normalize_url(url)
    with cached_clone(
        root or mirror_root(),
        url,
        what=f"the mirror of {url}",
        wait=LOCK_WAIT,
        endpoint_url=endpoint_url,
        region=region,
        profile=profile,
    ) as (repo, made):
        if made:
            return Mirror(repo, url, True, sorted(repo.refs.all()))
        return Mirror(repo, url, False, _update(repo))


def refresh_mirror(repo: Repo, *, wait: float = REFRESH_WAIT) -> list[str]:
    """Bring an open mirror up to date again (a server does, now and then, while it serves
    it): the models whose head moved. Another process holding it for longer than `wait`
    seconds is a LockTimeoutError."""
    folder = repo.root
    with FileLock(folder.parent / f"{folder.name}.lock", what=f"the mirror in {folder}", timeout=wait):
        return _update(repo)


def _update(repo: Repo) -> list[str]:
    fetch(repo, DEFAULT_REMOTE, prune=True)
    theirs = RefStore(repo.dir, namespace=f"remotes/{DEFAULT_REMOTE}").all()
    ours = repo.refs.all()
    moves: dict[str, tuple[str | None, str | None]] = {
        name: (head, ours.get(name)) for name, head in theirs.items() if ours.get(name) != head
    }
    moves.update({name: (None, head) for name, head in ours.items() if name not in theirs})  # deleted there
    repo.refs.update_many(moves)
    repo.sync_catalog()
    return sorted(moves)
