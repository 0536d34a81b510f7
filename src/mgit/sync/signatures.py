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
Verifying runs on every core (OpenSSL leaves the GIL); what arrives is kept in one bundle
file here (mgit.signing.store).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

import blake3

from mgit.errors import ReceivedError, RemoteTooLargeError, SignatureError, UnverifiedVersionError
from mgit.repo.repository import Repo
from mgit.signing import policy
from mgit.signing.sshsig import MAX_ARMORED, SshSignature
from mgit.signing.store import MAX_PER_VERSION, bundle_body, check_signature, parse_bundle, signature_name
from mgit.store.base import ObjectStore
from mgit.sync.connection import Connection
from mgit.util.atomicfile import write_atomic

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


def _wanted_level(repo: Repo, conn: Connection) -> str | None:
    return policy.required(repo.config, conn.name) if getattr(conn, "verify", True) else None


class SignatureFetch:
    """`with SignatureFetch(repo, conn) as sigs:` the remote's signatures, read and checked
    while a fetch's records arrive. Started first: signatures/ listed once, the bundles not
    read before read, and each bundled signature checked in a thread per core (OpenSSL
    verifies outside the GIL, so thousands of checks run beside the records' writes).
    `finish(versions)`: the signatures of `versions` (and new ones of versions here) that are
    not here, the rest read from their files, each checked to sign its version (a
    ReceivedError names the first that does not); a bundled signature of a version that did
    not arrive is not judged."""

    def __init__(self, repo: Repo, conn: Connection) -> None:
        self.repo, self.conn, self.where = repo, conn, conn.remote.url
        self.listed: dict[str, set[str]] = {}
        self.bundles: list[str] = []
        self.bundled: dict[str, dict[str, bytes]] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._early: dict[tuple[str, str], Future[SshSignature | str]] = {}
        if _wanted_level(repo, conn) is None:
            try:
                import cryptography  # noqa: F401
            except ImportError:  # nothing demands them and nothing here can check them: left there
                return
        self.listed, self.bundles = conn.remote.signature_names()
        self.bundled = _bundled(repo, conn, self.bundles)
        self._pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="mgit-verify")
        for vid, sigs in self.bundled.items():
            self.listed.setdefault(vid, set()).update(sigs)
            for name, data in sigs.items():
                self._early[(vid, name)] = self._pool.submit(_check, vid, name, data)

    def finish(self, versions: Iterable[str]) -> tuple[Arrived, list[str]]:
        """(the signatures that arrived, checked, by version; the bundles read)."""
        if self._pool is None:
            return {}, []
        listed, where, arriving = self.listed, self.where, set(versions)
        here = {v for v in listed if v not in arriving and self.repo.catalog.has_version(v)}  # signed since
        todo = []
        for vid in sorted((arriving | here) & set(listed)):
            have = self.repo.signatures.names(vid)
            names = sorted(listed[vid] - have)
            if len(names) + len(have) > MAX_PER_VERSION:
                raise ReceivedError(f"version {vid[:12]} has {len(listed[vid])} signatures on {where}", where=where)
            todo += [(vid, n) for n in names]
        loose = [item for item in todo if item not in self._early]
        for item, data in zip(loose, self.conn.remote.map(self._read, loose), strict=True):
            self._early[item] = self._pool.submit(_check, *item, data)
        found: Arrived = {}
        for vid, name in todo:
            sig = self._early[(vid, name)].result()
            if isinstance(sig, str):
                raise ReceivedError(f"signature {name[:12]} of version {vid[:12]} on {where}: {sig}", where=where)
            found.setdefault(vid, []).append(sig)
        return found, self.bundles

    def _read(self, item: tuple[str, str]) -> bytes:
        try:
            return self.conn.remote.read_signature(*item, limit=MAX_ARMORED)
        except RemoteTooLargeError:
            raise ReceivedError(
                f"signature {item[1][:12]} of version {item[0][:12]} on {self.where} is larger than any SSH signature",
                where=self.where,
            ) from None

    def __enter__(self) -> SignatureFetch:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _check(vid: str, name: str, data: bytes) -> SshSignature | str:
    """A signature checked to be named by its content and to sign `vid`, or why not."""
    if signature_name(data) != name:
        return "its content does not hash to its name"
    try:
        return check_signature(vid, data)
    except SignatureError as exc:
        return exc.message


def enforce_policy(repo: Repo, conn: Connection, store: ObjectStore, versions: list[str], arrived: Arrived) -> None:
    """Refuse the fetch (UnverifiedVersionError, nothing kept) if the policy refuses one of
    the arriving `versions` (read from `store`, the fetch's quarantine)."""
    level = _wanted_level(repo, conn)
    if level is None or not versions:
        return
    allowed = policy.allowed_signers(repo.config)
    for vid in versions:
        signatures: list[bytes | SshSignature] = [*repo.signatures.get(vid), *arrived.get(vid, [])]
        why = policy.refusal(policy.judge(vid, signatures, allowed), level)
        if why is not None:
            version = store.get_version(vid)
            raise UnverifiedVersionError(f"{vid[:12]} of {version.model!r} from {conn.name}", why, kept=False)


def keep_signatures(repo: Repo, arrived: Arrived) -> int:
    """Keep what a fetch brought (after its versions were kept)."""
    return repo.signatures.add_many((vid, s) for vid, sigs in arrived.items() for s in sigs)
