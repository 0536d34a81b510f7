"""Signing a version and verifying one (or its whole lineage): what `mgit sign`, `mgit
verify`, `add --sign`, `signing.always` and the checkout policy do, over the repository's
store and its signatures (mgit.signing).

Verifying a version checks two things: that its content is what its id names (the record
and manifest read again and re-hashed; with `objects`, every object they name decoded and
re-hashed too), and what its signatures are worth under the allowed signers. `--lineage`
walks every ancestor (predecessors and lineage parents) and reports the first link that
the level asked for (`trusted` unless told) refuses.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mgit.errors import CorruptObjectError, MissingObjectError, UnverifiedVersionError
from mgit.index.catalog import Catalog
from mgit.signing.policy import SignatureCheck, allowed_signers, judge, refusal
from mgit.signing.store import SignatureStore
from mgit.store.objects import Version

if TYPE_CHECKING:  # (show reads signatures through here: the keys are loaded only to sign or judge one)
    from mgit.signing.allowed import AllowedSigners
    from mgit.signing.keys import Signer
    from mgit.store.base import ObjectStore


@dataclass(frozen=True)
class SignResult:
    """A version signed: by which key, and whether that key had signed it already."""

    id: str
    ref: str
    fingerprint: str
    added: bool  # False: this key had signed it already

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "ref": self.ref, "fingerprint": self.fingerprint, "added": self.added}


@dataclass(frozen=True)
class VersionVerdict:
    """One version verified: its content (`content_ok`, or the problem), its signatures,
    and why the level refuses it (None: it passes)."""

    id: str
    ref: str
    content_ok: bool
    signatures: list[SignatureCheck]
    refused: str | None
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ref": self.ref,
            "content_ok": self.content_ok,
            "problem": self.problem,
            "signatures": [s.to_dict() for s in self.signatures],
            "refused": self.refused,
        }


@dataclass(frozen=True)
class VerifyResult:
    """A version (or its lineage) verified under a level; `first_bad` the link that breaks it."""

    level: str
    versions: list[VersionVerdict] = field(default_factory=list)
    first_bad: VersionVerdict | None = None

    @property
    def ok(self) -> bool:
        return self.first_bad is None

    def raise_if_refused(self, *, kept: bool = True) -> None:
        """UnverifiedVersionError naming the first version refused, and why."""
        if self.first_bad is not None:
            raise UnverifiedVersionError(self.first_bad.ref, self.first_bad.refused or "", kept=kept)

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "ok": self.ok,
            "versions": [v.to_json() for v in self.versions],
            "first_bad": self.first_bad.to_json() if self.first_bad else None,
        }


def label(catalog: Catalog, vid: str) -> str:
    """How a version is named to a user: MODEL@N, or its short id if not indexed."""
    row = catalog.version(vid)
    return f"{row.model}@{row.seq}" if row else vid[:12]


def sign_version(signatures: SignatureStore, catalog: Catalog, signer: Signer, vid: str) -> SignResult:
    """Sign version `vid` with `signer` and keep the signature beside it."""
    from mgit.signing.sshsig import sign, version_message

    sig = sign(signer, version_message(vid))
    added = signatures.add(vid, sig.armored)
    return SignResult(vid, label(catalog, vid), signer.public.fingerprint, added)


def checks_of(signatures: SignatureStore, vid: str, allowed: AllowedSigners) -> list[SignatureCheck]:
    return judge(vid, signatures.get(vid), allowed)


def verify_version(
    store: ObjectStore,
    signatures: SignatureStore,
    vid: str,
    ref: str,
    allowed: AllowedSigners,
    level: str,
    *,
    objects: bool = False,
) -> tuple[VersionVerdict, Version | None]:
    """One version verified, and its record (read again and re-hashed here; None when it did
    not read), whose links a lineage walk follows without reading it once more."""
    problem, version = None, None
    try:
        version = store.get_version(vid, fresh=True)
        manifest = store.get_manifest(version.manifest, fresh=True)
        if objects:
            for oid in sorted(manifest.object_ids() | (version.linked_objects() - {version.manifest})):
                store.get(oid)
    except (CorruptObjectError, MissingObjectError) as exc:
        problem = exc.message
    checks = checks_of(signatures, vid, allowed)
    why = f"content does not match its id ({problem})" if problem else refusal(checks, level)
    return VersionVerdict(vid, ref, problem is None, checks, why, problem), version


def verify_lineage(
    store: ObjectStore,
    signatures: SignatureStore,
    catalog: Catalog,
    config: dict[str, Any],
    vid: str,
    level: str | None = None,
    lineage: bool = False,
    objects: bool = False,
) -> VerifyResult:
    """`vid` verified under `level` (default trusted) against the configured allowed signers
    (with `lineage`, and every version it derives from, predecessors and lineage parents,
    nearest first, each once, stopping at the first one refused: the link that breaks the
    chain). The walk follows the records as they are verified, so each is read once."""
    out, level, allowed = [], level or "trusted", allowed_signers(config)
    seen, queue = {vid}, deque([vid])
    while queue:
        v = queue.popleft()
        verdict, version = verify_version(store, signatures, v, label(catalog, v), allowed, level, objects=objects)
        out.append(verdict)
        if verdict.refused is not None:
            return VerifyResult(level, out, verdict)
        if lineage and version is not None:
            following = [linked for linked in version.linked_versions() if linked not in seen]
            seen.update(following)
            queue.extend(following)
    return VerifyResult(level, out)
