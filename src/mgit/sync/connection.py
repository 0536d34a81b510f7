"""Reaching a remote from a repository: by name (config.json's "remotes", with its
remote-tracking refs under refs/remotes/NAME) or by URL, and the named remotes themselves."""

from __future__ import annotations

from dataclasses import dataclass, field

from mgit.errors import InvalidOptionError
from mgit.index.refs import RefStore
from mgit.remotes import RemoteSpec, normalize_url, open_backend
from mgit.remotes.config import remote_of, remotes_of, update_config, validate_remote_name
from mgit.remotes.journal import TransferJournal
from mgit.remotes.repository import RemoteRepository
from mgit.repo.repository import Repo
from mgit.sync.reports import RemoteInfo

DEFAULT_REMOTE = "origin"
TRANSFERS = "transfers"  # the transfer journal's folder in a repository (mgit.remotes.journal)


@dataclass
class Connection:
    name: str  # the remote's name, or its URL when it has none
    remote: RemoteRepository
    tracking: RefStore | None  # remote-tracking refs of a named remote
    leases: list[str] = field(default_factory=list)  # written by this push (mgit.remotes.leases)
    gc_ran: bool = False  # a gc has run on the remote (seen after this push's lease)
    verify: bool = True  # False: --no-verify, the signature policy is not applied to what arrives

    def close(self) -> None:
        self.remote.close()


def looks_like_url(text: str) -> bool:
    return "://" in text or text.startswith((".", "/", "~"))


def connect(repo: Repo, remote: str) -> Connection:
    """A named remote of `repo`, or a URL (then no remote-tracking refs are kept)."""
    if looks_like_url(remote) and remote not in remotes_of(repo.config):
        spec = RemoteSpec(normalize_url(remote))
        return Connection(spec.url, RemoteRepository(open_backend(spec), journal=journal_of(repo)), None)
    spec = remote_of(repo.config, remote)
    tracking = RefStore(repo.dir, fsync=bool(repo.config.get("fsync", True)), namespace=f"remotes/{remote}")
    return Connection(remote, RemoteRepository(open_backend(spec), journal=journal_of(repo)), tracking)


def journal_of(repo: Repo) -> TransferJournal:
    """Where the repository keeps its large transfers under way (docs/format.md)."""
    return TransferJournal(repo.dir / TRANSFERS)


def add_remote(
    repo: Repo,
    name: str,
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    profile: str | None = None,
) -> RemoteInfo:
    """Record a named remote (nothing is contacted: `mgit fetch` does that)."""
    validate_remote_name(name)
    spec = RemoteSpec(normalize_url(url), endpoint_url, region, profile)
    if endpoint_url is not None:
        normalize_endpoint(endpoint_url)

    def change(config: dict) -> None:
        remotes = config.setdefault("remotes", {})
        if name in remotes:
            raise InvalidOptionError(f"a remote named {name!r} exists", hint=f"Remove it first: mgit remote rm {name}")
        remotes[name] = {k: v for k, v in vars(spec).items() if v is not None}

    repo.config = update_config(repo.dir, change)
    return RemoteInfo(name, spec.url, endpoint_url, region, profile)


def remove_remote(repo: Repo, name: str) -> RemoteInfo:
    spec = remote_of(repo.config, name)
    if repo.config.get("lazy") == name:
        raise InvalidOptionError(
            f"{name!r} is where this lazy clone fetches its objects from",
            hint=f"Fetch them all first: mgit fetch --objects --all {name}",
        )

    def change(config: dict) -> None:
        config.get("remotes", {}).pop(name, None)

    repo.config = update_config(repo.dir, change)
    tracking = RefStore(repo.dir, namespace=f"remotes/{name}")
    for model, head in tracking.all().items():
        tracking.update(model, None, expected=head)
    return RemoteInfo(name, spec.url, spec.endpoint_url, spec.region, spec.profile)


def list_remotes(repo: Repo) -> list[RemoteInfo]:
    return [RemoteInfo(n, s.url, s.endpoint_url, s.region, s.profile) for n, s in remotes_of(repo.config).items()]


def normalize_endpoint(url: str) -> str:
    if "@" in url.split("://", 1)[-1].split("/", 1)[0]:
        raise InvalidOptionError(
            "refusing an endpoint URL that holds credentials",
            hint="Give credentials through the AWS chain, never in a URL",
        )
    if not url.startswith(("http://", "https://")):
        raise InvalidOptionError(f"endpoint {url!r} is not an http:// or https:// URL")
    return url
