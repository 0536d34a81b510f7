"""Test registrations and recorded results travel with push and pull.

On a remote they are small JSON files, each written once: `checks/tests/<key>.json` a
registration (the key is the blake3 of its name) with the id of its source object, and
`checks/results/<key>.json` a recorded result (the key is the blake3 of its canonical
JSON). A result is keyed by version, test and source hash, so results from both sides merge
without conflict, each naming where it was recorded. A registration of a name the other
side has with another definition is left as it is there, and reported. A registration
pulled is checked (mgit.checks.parse_registration: its function reference a module path or
a file below the work folder) and is not trusted here: it runs only with --trust-remote-code.
"""

from __future__ import annotations

import blake3

from mgit.checks import Checks, parse_registration
from mgit.errors import RemoteConflictError
from mgit.repo.repository import Repo
from mgit.store.objects import canonical_json
from mgit.store.transfer import RECORD_LIMIT, fetch_objects, present_on, upload
from mgit.sync.connection import Connection
from mgit.sync.reports import ChecksTravel

TESTS, RESULTS = "checks/tests/", "checks/results/"


def _key(prefix: str, data: bytes) -> str:
    return f"{prefix}{blake3.blake3(data).hexdigest()}.json"


def result_key(record: dict) -> str:
    return _key(RESULTS, canonical_json(record))


def registration_key(name: str) -> str:
    return _key(TESTS, name.encode())


def push_checks(repo: Repo, conn: Connection, on_remote: set[str]) -> ChecksTravel:
    """Send the registrations the remote lacks (with their source objects) and the results
    of versions it has; a no-op sends nothing (listing the remote's keys is all)."""
    if not (repo.dir / "checks.sqlite").exists():
        return ChecksTravel()
    checks, remote = Checks(repo), conn.remote
    theirs_tests = set(remote.list_keys(TESTS))
    mine = [r for r in checks.registrations() if registration_key(r["name"]) not in theirs_tests]
    sources = {r["source"] for r in mine if r.get("source")}
    upload(remote, repo.store, sources - present_on(remote, repo.store, sources))
    sent_tests = 0
    for record in mine:
        try:
            remote.write_json(registration_key(record["name"]), record, token=None, create_only=True)
            sent_tests += 1
        except RemoteConflictError:
            pass  # another push registered that name meanwhile: theirs stays
    theirs_results = set(remote.list_keys(RESULTS))
    results = [r for r in checks.result_records() if r["version"] in on_remote and result_key(r) not in theirs_results]
    remote.map(lambda r: remote.write_json(result_key(r), r, token=None), results)
    return ChecksTravel(sent_tests, len(results))


def pull_checks(repo: Repo, conn: Connection) -> ChecksTravel:
    """Take the registrations and results this repository lacks from the remote."""
    remote = conn.remote
    keys_tests, keys_results = remote.list_keys(TESTS), remote.list_keys(RESULTS)
    if not keys_tests and not keys_results:
        return ChecksTravel()
    checks = Checks(repo)
    have_results = {result_key(r) for r in checks.result_records()}
    records = [rec for rec, _ in remote.map(remote.read_json, keys_tests)]  # few: each is compared
    for record in records:  # every one checked before any is taken (a RemoteError names the first bad one)
        parse_registration(record)
    here = {r["name"] for r in checks.registrations()}
    sources = {
        r["source"]: RECORD_LIMIT
        for r in records
        if isinstance(r, dict) and isinstance(r.get("source"), str) and r.get("name") not in here
    }
    fetch_objects(remote, repo.store, {o: n for o, n in sources.items() if not repo.store.has(o)}, jobs=2)
    added, differing = 0, []
    for record in records:
        outcome = checks.add_registration(record, origin=conn.name)
        added += outcome == "added"
        if outcome == "differs":
            differing.append(record["name"])
    results = [rec for rec, _ in remote.map(remote.read_json, [k for k in keys_results if k not in have_results])]
    return ChecksTravel(added, checks.add_results(results), differing)
