"""`pull`: fetch, then bring each local head up to the remote's.

A model the remote has and this repository does not gets a head; a local head that the
remote's descends from fast-forwards to it; a local head ahead of the remote's stays. When
both sides added versions to one model, the local ones are replayed after the remote's, as
`git pull --rebase` does: the same content, parents, message and time, each with the next
sequence number, and any local version of another model derived from a replayed one is
replayed too, so lineage links point at the new ids. `ff_only` refuses instead. Recorded
test results and tags set later follow the versions they were recorded for; the remote's
changed tags are taken as mgit.sync.tags says.
"""

from __future__ import annotations

from dataclasses import replace

from mgit.checks import Checks
from mgit.errors import DivergedError, RemoteError
from mgit.repo.repository import Repo
from mgit.signing.policy import signs_always
from mgit.store.objects import Parent
from mgit.store.transfer import history
from mgit.sync.connection import DEFAULT_REMOTE, connect
from mgit.sync.fetch import fetch_from
from mgit.sync.push import number_of
from mgit.sync.reports import ModelUpdate, PullResult, Renumbered
from mgit.sync.tags import copy_tags, pull_tags
from mgit.util.parallel import StartTransfer


def pull(
    repo: Repo,
    remote: str = DEFAULT_REMOTE,
    *,
    ff_only: bool = False,
    progress: StartTransfer | None = None,
    verify: bool = True,
) -> PullResult:
    conn = connect(repo, remote)
    conn.verify = verify
    try:
        fetched = fetch_from(repo, conn, progress=progress)
    finally:
        conn.close()
    if conn.tracking is None:
        raise RemoteError(
            "pull needs a named remote (its heads are remembered as origin/NAME)",
            hint="Add it first: mgit remote add NAME URL",
        )
    theirs = conn.tracking.all()
    mine = repo.refs.all()
    plan: dict[str, tuple[str, str | None, str]] = {}  # model -> (status, old local head, new head)
    diverged = []
    for name, head in theirs.items():
        local = mine.get(name)
        if local is None:
            plan[name] = ("new", None, head)
        elif local == head or head in repo.chain(local):
            continue
        elif local in repo.chain(head):
            plan[name] = ("fast-forward", local, head)
        else:
            diverged.append(name)
    if diverged and ff_only:
        raise DivergedError(diverged[0], conn.name, len(diverged) - 1)
    remote_known = set(history(repo.store, theirs.values()))
    renamed: dict[str, str] = {}
    updates = []
    with repo.store.lock():  # replayed records are not collected before the refs name them
        for name in diverged:
            local = mine[name]
            # Local versions that the remote's history of this model lacks, oldest first (one
            # the remote has only as another model's lineage parent, as when a cluster cascade
            # built on it while a push moved this model, is replayed too: never dropped).
            theirs_chain = set(repo.chain(theirs[name]))
            own = [v for v in repo.chain(local) if v not in theirs_chain][::-1]
            plan[name] = ("rebased", local, _replay(repo, own, theirs[name], renamed))
        _replay_dependents(repo, mine, plan, remote_known, renamed)
        for name, (status, old, new) in sorted(plan.items()):
            repo.refs.update(name, new, expected=old)
            updates.append(ModelUpdate(name, status, old, new))
    repo.sync_catalog()
    renumbered = [_renumbered(repo, old, new) for old, new in renamed.items()]
    if renamed and (repo.dir / "checks.sqlite").exists():
        Checks(repo).copy_results(renamed)
    copy_tags(repo, renamed)
    if signs_always(repo.config):  # replayed versions are new versions: signed as any made here
        for new in renamed.values():
            repo.sign(new)
    conn = connect(repo, remote)
    try:
        tags = pull_tags(repo, conn)
    finally:
        conn.close()
    return PullResult(fetched, updates, renumbered, tags)


def _replay(repo: Repo, own: list[str], onto: str, renamed: dict[str, str]) -> str:
    """Write `own` (oldest first) again, the first after `onto`, parents renamed; return
    the new head."""
    head = onto
    for vid in own:
        version = repo.store.get_version(vid)
        parents = tuple(Parent(renamed.get(p.version, p.version), p.relation) for p in version.parents)
        # Numbered after the remote's (number=None: its predecessor's plus one).
        replayed = replace(version, predecessor=head, parents=parents, number=None)
        head = repo.store.put_record("version", replayed.to_json()).oid
        renamed[vid] = head
    repo.store.sync()
    return head


def _replay_dependents(
    repo: Repo,
    mine: dict[str, str],
    plan: dict[str, tuple[str, str | None, str]],
    remote_known: set[str],
    renamed: dict[str, str],
) -> None:
    """Local-only versions of other models that name a replayed version (as a lineage
    parent): replay them from the first that does, until nothing changes."""
    for _ in range(len(mine) + 1):
        changed = False
        for name, head in mine.items():
            if name in plan and plan[name][0] != "fast-forward":
                continue
            chain = [v for v in repo.chain(head) if v not in remote_known and v not in renamed][::-1]
            first = next(
                (
                    i
                    for i, v in enumerate(chain)
                    if any(p.version in renamed for p in repo.store.get_version(v).parents)
                ),
                None,
            )
            if first is None:
                continue
            start = repo.store.get_version(chain[first]).predecessor
            new = _replay(repo, chain[first:], renamed.get(start, start) if start else None, renamed)  # type: ignore[arg-type]
            plan[name] = ("rebased", head, new)
            changed = True
        if not changed:
            return


def _renumbered(repo: Repo, old: str, new: str) -> Renumbered:
    info = repo.info(new)
    return Renumbered(info.model, old, new, f"{info.model}@{number_of(repo, old)}", info.ref)
