"""What sharing verbs return: per model what moved, and what travelled (objects and bytes
sent, received and skipped), the same data for people and for `--json`."""

from __future__ import annotations

from dataclasses import dataclass, field

from mgit.reports import Report
from mgit.store.transfer import TransferStats


@dataclass(frozen=True)
class ModelUpdate(Report):
    """One model's head on one side: `new` (the other side had none), `fast-forward`,
    `forced`, `rebased`, `up-to-date`, `ahead` (this side has more: left alone), `renamed`
    (the remote's model was renamed: its remote-tracking ref goes; `note` says to what)."""

    model: str
    status: str
    old: str | None
    new: str | None
    note: str | None = None


@dataclass(frozen=True)
class ChecksTravel(Report):
    """Test registrations and recorded results that moved (or were kept: a registration of
    the same name that differs stays as it is on the side that has it)."""

    registrations: int = 0
    results: int = 0
    differing: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TagsTravel(Report):
    """Tags set later (`mgit tag`) that moved, by version, and the versions whose tags both
    sides changed differently since they last agreed: left as they are on each side."""

    sent: int = 0
    received: int = 0
    conflicts: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class PushResult(Report):
    remote: str
    url: str
    models: list[ModelUpdate]
    versions: int  # version records sent
    sent: TransferStats
    checks: ChecksTravel
    tags: TagsTravel = field(default_factory=TagsTravel)
    notes: list[str] = field(default_factory=list)  # what became of renamed models' old names there


@dataclass(frozen=True)
class FetchResult(Report):
    remote: str
    url: str
    models: list[ModelUpdate]  # remote-tracking heads (`origin/NAME`) that moved
    versions: int  # version records received
    received: TransferStats
    lazy: bool  # records only: tensors come when something reads them
    checks: ChecksTravel


@dataclass(frozen=True)
class Renumbered(Report):
    """A local version replayed after the remote's: same content, a new id and number."""

    model: str
    old: str
    new: str
    old_ref: str
    new_ref: str


@dataclass(frozen=True)
class PullResult(Report):
    fetch: FetchResult
    models: list[ModelUpdate]  # local heads that moved
    renumbered: list[Renumbered]
    tags: TagsTravel = field(default_factory=TagsTravel)


@dataclass(frozen=True)
class CloneResult(Report):
    path: str
    url: str
    lazy: bool
    models: list[str]
    fetch: FetchResult


@dataclass(frozen=True)
class RemoteModel(Report):
    """A model here and on a remote: `same`, `ahead` (versions here the remote lacks),
    `behind`, `diverged`, `local only` or `remote only`."""

    model: str
    state: str
    local: str | None
    remote: str | None
    ahead: int = 0
    behind: int = 0


@dataclass(frozen=True)
class RemoteInfo(Report):
    name: str
    url: str
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None


@dataclass(frozen=True)
class RemoteShow(Report):
    remote: RemoteInfo
    models: list[RemoteModel]


@dataclass(frozen=True)
class RemoteGcResult(Report):
    """What `gc --remote` removed (or would, with `dry_run`): objects by id and their bytes;
    what it kept: reachable objects, unreachable ones within the grace period (`young`) or
    named by a running push's lease (`leased`); and the leases it honoured, the expired
    leases and the tags of removed versions it deleted."""

    remote: str
    url: str
    dry_run: bool
    expire: float  # the grace period, in seconds
    removed: list[str]
    removed_bytes: int
    kept: int
    young: int
    leased: int
    leases: int
    expired_leases: int
    tags: int
