"""Signatures travel with push, fetch, pull and clone (lazy or not), and fetches answer to
the signature policy (`verify.require`, `remote.NAME.verify`: mgit.signing.policy).

On a remote a version's signatures are `signatures/<id>/<sha256>.sig`, written once each
(named by their content: two pushers never conflict). A push sends the signatures here of
every version the remote has or receives, before any head moves, so a fetcher whose policy
demands them finds them with the version. A fetch lists `signatures/` once, reads those of
the arriving versions it lacks, and checks each against its version's id before anything is
kept: a signature that does not parse, or that signs another version, refuses the fetch
(the remote is lying). Then the policy judges every arriving version with its signatures
(those just read and those here already); a version it refuses refuses the whole fetch,
naming the version and its signer, and nothing is kept. `--no-verify` skips the policy, and
the command says so. Old remotes have no `signatures/`: their versions arrive unsigned.
A fetch checks them on every core (OpenSSL leaves the GIL) once the records are in; a clone
of many reads them before its records and checks them in a worker process meanwhile
(mgit.signing.batch). What arrives is kept in one bundle file here (mgit.signing.store).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field

import blake3

from mgit.errors import ReceivedError, RemoteTooLargeError, UnverifiedVersionError
from mgit.repo.repository import Repo
from mgit.signing import policy
from mgit.signing.batch import CheckProcess, check_named, passed
from mgit.signing.sshsig import MAX_ARMORED, SshSignature
from mgit.signing.store import MAX_PER_VERSION, bundle_body, parse_bundle, signature_name
from mgit.store.base import ObjectStore
from mgit.sync.connection import Connection
from mgit.util.atomicfile import write_atomic

CHECK_CHUNK = 256  # signatures checked per task (fewer handoffs between the threads)
ELSEWHERE_FROM = 512  # a clone receiving this many signatures checks them in a worker process
MAX_BUNDLE = 32 << 20  # about 50,000 signatures: a push of more writes them one by one only
Arrived = dict[str, list[SshSignature]]  # version id -> signatures read from the remote, checked


def push_signatures(repo: Repo, conn: Connection, on_remote: set[str]) -> int:
    """Send the signatures of versions the remote has that it lacks; how many were sent."""
    mine = [v for v in repo.signatures.versions() if v in on_remote]
    if not mine:
        return 0
    theirs, _ = conn.remote.signature_names()
    sending = []
    for vid in mine:  # a signature file is named by its content: only those the remote lacks are read
        if repo.signatures.names(vid) - theirs.get(vid, set()):
            sending += [
                (vid, n, s) for s in repo.signatures.get(vid) if (n := signature_name(s)) not in theirs.get(vid, set())
            ]
    conn.remote.map(lambda item: conn.remote.write_signature(*item), sending)
    if len(sending) > 1:  # what a clone reads in one request instead of one each
        bundle: dict[str, list[bytes]] = {}
        for vid, _, data in sending:
            bundle.setdefault(vid, []).append(data)
        body = bundle_body(bundle)
        if len(body) <= MAX_BUNDLE:
            conn.remote.write_signature_bundle(blake3.blake3(body).hexdigest(), body)
    return len(sending)


def _bundled(repo: Repo, conn: Connection, bundles: list[str]) -> dict[str, dict[str, bytes]]:
    """{version id: {name: signature}} from the signature bundles not read before, each checked
    to hash to its name and to be a JSON object of version ids and lists of signatures."""
    seen_path = repo.dir / "remotes" / conn.name / "signature-bundles.json"
    seen = set(json.loads(seen_path.read_text())) if conn.tracking is not None and seen_path.is_file() else set()
    where, out = conn.remote.url, {}
    todo = [b for b in bundles if b not in seen]
    for bid, data in zip(todo, conn.remote.map(lambda b: _read_bundle(conn, b), todo), strict=True):
        value = parse_bundle(data, bid)
        if value is None:
            raise ReceivedError(f"signature bundle {bid[:12]} on {where} is malformed", where=where)
        for vid, sigs in value.items():
            out.setdefault(vid, {}).update(sigs)
    return out


def _read_bundle(conn: Connection, bid: str) -> bytes:
    try:
        return conn.remote.read_signature_bundle(bid, limit=MAX_BUNDLE)
    except RemoteTooLargeError:
        where = conn.remote.url
        raise ReceivedError(f"signature bundle {bid[:12]} on {where} is too large", where=where) from None


def remember_bundles(repo: Repo, conn: Connection, bundles: list[str]) -> None:
    """The bundles a fetch read (after what it brought was kept): not read again."""
    if conn.tracking is None or not bundles:
        return
    path = repo.dir / "remotes" / conn.name / "signature-bundles.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    old = set(json.loads(path.read_text())) if path.is_file() else set()
    write_atomic(path, [json.dumps(sorted(old | set(bundles))).encode()])


@dataclass
class Listed:
    """The remote's signatures as a fetch found them: {version id: names}, the bundles read and
    what they hold, the bytes read of the others; and, for a clone, their checks under way in
    a worker process (`early`)."""

    names: dict[str, set[str]]
    bundles: list[str]
    bundled: dict[str, dict[str, bytes]]
    loose: dict[tuple[str, str], bytes] = field(default_factory=dict)
    early: CheckProcess | None = None

    def data(self, vid: str, name: str) -> bytes | None:
        """A signature's bytes as read (a file, then a bundle), or None if not read yet (an
        empty file is bytes too: it is checked, and refused, like any other)."""
        if (vid, name) in self.loose:
            return self.loose[(vid, name)]
        return self.bundled.get(vid, {}).get(name)

    def verdicts(self) -> dict[tuple[str, str], str | None]:
        """The worker's answers by (version id, name): empty if there is none or it gave none."""
        answers = self.early.results() if self.early is not None else None
        return {} if answers is None else dict(zip(((v, n) for v, n, _ in self.early.items), answers, strict=True))

    def close(self) -> None:
        if self.early is not None:
            self.early.close()


def _wanted_level(repo: Repo, conn: Connection) -> str | None:
    return policy.required(repo.config, conn.name) if getattr(conn, "verify", True) else None


def list_signatures(repo: Repo, conn: Connection) -> Listed | None:
    """The remote's signatures listed, and its bundles read (None: this fetch reads none).
    Into a repository with no versions yet (a clone: every listed signature is of a version
    that arrives), the others are read too and, from ELSEWHERE_FROM of them, checked in a
    worker process while the records are fetched (mgit.signing.batch says why); the caller
    closes what this returns."""
    if _wanted_level(repo, conn) is None:
        try:
            import cryptography  # noqa: F401
        except ImportError:  # nothing demands them and nothing here can check them: left there
            return None
    names, bundles = conn.remote.signature_names()
    bundled = _bundled(repo, conn, bundles)
    for vid, sigs in bundled.items():
        names.setdefault(vid, set()).update(sigs)
    listed = Listed(names, bundles, bundled)
    count = sum(len(n) for n in names.values())
    if count < ELSEWHERE_FROM or repo.catalog.heads() or repo.signatures.versions() or (os.cpu_count() or 1) < 2:
        return listed
    if any(len(n) > MAX_PER_VERSION for n in names.values()):
        return listed  # (refused by fetch_signatures, with the version named, if it arrives)
    todo = [(vid, n) for vid in sorted(names) for n in sorted(names[vid])]
    listed.loose = _read_loose(conn, [item for item in todo if item[1] not in bundled.get(item[0], {})])
    listed.early = CheckProcess([(vid, n, listed.data(vid, n)) for vid, n in todo])
    return listed


@contextmanager
def listing(repo: Repo, conn: Connection) -> Iterator[Listed | None]:
    """`list_signatures`, its worker stopped on the way out (a fetch refused meanwhile)."""
    listed = list_signatures(repo, conn)
    try:
        yield listed
    finally:
        if listed is not None:
            listed.close()


def _read_loose(conn: Connection, items: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
    where = conn.remote.url

    def read(item: tuple[str, str]) -> bytes:
        try:
            return conn.remote.read_signature(*item, limit=MAX_ARMORED)
        except RemoteTooLargeError:
            raise ReceivedError(
                f"signature {item[1][:12]} of version {item[0][:12]} on {where} is larger than any SSH signature",
                where=where,
            ) from None

    return dict(zip(items, conn.remote.map(read, items), strict=True))


def fetch_signatures(repo: Repo, conn: Connection, versions: Iterable[str], listed: Listed | None) -> Arrived:
    """The remote's signatures (`listed`) of `versions` (and new ones of versions here) that
    are not here, each checked to sign its version (a ReceivedError names the first that does
    not). The checks run once the records are in, in chunks on a thread per core (OpenSSL
    verifies outside the GIL): run beside the records' writes, they made each of those system
    calls wait for the GIL, and the clone slower than checking afterwards. A clone's were
    checked meanwhile in a worker process (`list_signatures`): their answers are taken."""
    if listed is None:
        return {}
    where = conn.remote.url
    arriving = set(versions)
    here = {v for v in listed.names if v not in arriving and repo.catalog.has_version(v)}  # signed since last fetched
    todo = []
    kept = set(repo.signatures.versions())  # (a clone has none: no lookup per version)
    for vid in sorted((arriving | here) & set(listed.names)):
        have = repo.signatures.names(vid) if vid in kept else set()
        names = sorted(listed.names[vid] - have)
        if len(names) + len(have) > MAX_PER_VERSION:
            raise ReceivedError(f"version {vid[:12]} has {len(listed.names[vid])} signatures on {where}", where=where)
        todo += [(vid, n) for n in names]
    verdicts = listed.verdicts()
    found: Arrived = {}
    unchecked = []
    for vid, name in todo:
        data = listed.data(vid, name)
        if data is not None and (vid, name) in verdicts:
            if (why := verdicts[(vid, name)]) is not None:
                raise ReceivedError(f"signature {name[:12]} of version {vid[:12]} on {where}: {why}", where=where)
            found.setdefault(vid, []).append(passed(vid, data))
        else:
            unchecked.append((vid, name))
    listed.loose.update(_read_loose(conn, [i for i in unchecked if listed.data(*i) is None]))
    items = [(item, listed.data(*item)) for item in unchecked]
    chunks = [items[i : i + CHECK_CHUNK] for i in range(0, len(items), CHECK_CHUNK)]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="mgit-verify") as pool:
        checked = [sig for chunk in pool.map(_check_all, chunks) for sig in chunk]
    for ((vid, name), _), sig in zip(items, checked, strict=True):
        if isinstance(sig, str):
            raise ReceivedError(f"signature {name[:12]} of version {vid[:12]} on {where}: {sig}", where=where)
        found.setdefault(vid, []).append(sig)
    return found


def _check_all(chunk: list[tuple[tuple[str, str], bytes]]) -> list[SshSignature | str]:
    return [check_named(vid, name, data) for (vid, name), data in chunk]


def enforce_policy(repo: Repo, conn: Connection, store: ObjectStore, versions: list[str], arrived: Arrived) -> None:
    """Refuse the fetch (UnverifiedVersionError, nothing kept) if the policy refuses one of
    the arriving `versions` (read from `store`, the fetch's quarantine)."""
    level = _wanted_level(repo, conn)
    if level is None or not versions:
        return
    allowed = policy.allowed_signers(repo.config)
    kept = set(repo.signatures.versions())
    for vid in versions:
        signatures: list[bytes | SshSignature] = [
            *(repo.signatures.get(vid) if vid in kept else []),
            *arrived.get(vid, []),
        ]
        why = policy.refusal(policy.judge(vid, signatures, allowed), level)
        if why is not None:
            version = store.get_version(vid)
            raise UnverifiedVersionError(f"{vid[:12]} of {version.model!r} from {conn.name}", why, kept=False)


def keep_signatures(repo: Repo, arrived: Arrived) -> int:
    """Keep what a fetch brought (after its versions were kept)."""
    return repo.signatures.add_many((vid, s) for vid, sigs in arrived.items() for s in sigs)
