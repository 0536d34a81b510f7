"""Where a repository keeps signatures: `signatures/<version id>/<sha256 of the signature>.sig`,
each file one armored SSHSIG exactly as made (`ssh-keygen -Y verify -s FILE` reads it).

A signature is not part of the version it signs (the version's id cannot cover what is made
after it), so, like git's tags, signatures live beside the objects, attached by id: adding
one never changes a record, a version may have several (an author and a reviewer), and two
writers never conflict (a file is named by its content, written once, atomically). Only a
signature that verifies, by its own key and for `mgit-version`, over its version's id is
kept: one copied onto another version never lands. Old repositories have no `signatures/`
folder and read as having no signatures.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from mgit.errors import SignatureError
from mgit.store.objects import OID_RE
from mgit.util.atomicfile import TMP_PREFIX, disk_full_as_error, sync_files, temporary_sibling, write_atomic

if TYPE_CHECKING:
    from mgit.signing.sshsig import SshSignature

MAX_PER_VERSION = 32  # signers of one version: an author, reviewers, a CI; far above any real count
FOLDER = "signatures"


def signature_name(armored: bytes) -> str:
    import hashlib  # (OpenSSL's start-up: show and log read signatures without naming them)

    return hashlib.sha256(armored).hexdigest()


def check_signature(vid: str, armored: bytes | SshSignature) -> SshSignature:
    """`armored` (or a signature parsed already) verified as a signature of version `vid`;
    raises SignatureError."""
    from mgit.signing.sshsig import (
        VERSION_NAMESPACE,
        SshSignature,
        version_message,
    )  # (reading signatures does without)

    sig = armored if isinstance(armored, SshSignature) else SshSignature.parse(armored)
    if sig.namespace != VERSION_NAMESPACE:
        raise SignatureError(
            f"the signature by {sig.public.fingerprint} on {vid[:12]} is for {sig.namespace!r}, not {VERSION_NAMESPACE}"
        )
    if not sig.verifies(version_message(vid), VERSION_NAMESPACE):
        raise SignatureError(f"the signature by {sig.public.fingerprint} does not sign version {vid[:12]}")
    return sig


class SignatureStore:
    """`<repo>/signatures/`: the signatures attached to each version."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.dir = root / FOLDER
        self.fsync = fsync

    def _folder(self, vid: str) -> Path:
        if not OID_RE.match(vid):
            raise SignatureError(f"signatures are attached to a version id, not {vid[:20]!r}")
        return self.dir / vid

    def _files(self, vid: str) -> list[str]:
        try:
            names = os.listdir(self._folder(vid))
        except (FileNotFoundError, NotADirectoryError):
            return []
        return sorted(n for n in names if n.endswith(".sig") and not n.startswith(TMP_PREFIX))[:MAX_PER_VERSION]

    def get(self, vid: str) -> list[bytes]:
        """The signatures kept for `vid`, as stored (unchecked: the caller judges them)."""
        out = []
        for name in self._files(vid):
            path = self._folder(vid) / name
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as f:
                    out.append(f.read(1 << 16))
        return out

    def names(self, vid: str) -> set[str]:
        """The names of the signatures kept for `vid` (each file is named by its content)."""
        return {n.removesuffix(".sig") for n in self._files(vid)}

    def versions(self) -> list[str]:
        """Every version with a signature kept here."""
        if not self.dir.is_dir():
            return []
        return sorted(n for n in os.listdir(self.dir) if OID_RE.match(n) and self._files(n))

    def add(self, vid: str, signature: bytes | SshSignature) -> bool:
        """Keep a signature of `vid` after checking it signs `vid`; False if it was kept already."""
        armored = check_signature(vid, signature).armored
        folder = self._folder(vid)
        path = folder / f"{signature_name(armored)}.sig"
        if path.exists():
            return False
        if len(self._files(vid)) >= MAX_PER_VERSION:
            raise SignatureError(f"version {vid[:12]} already has {MAX_PER_VERSION} signatures")
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(path, [armored], fsync=self.fsync)
        return True

    def add_many(self, signatures: Iterable[tuple[str, bytes | SshSignature]]) -> int:
        """Keep many signatures at once (what a fetch or clone brought), each checked as `add`
        checks it, all before any is written; their bytes are made durable together (one
        syncfs for many, where an fsync of each file and folder cost a clone of thousands of
        signed versions more than verifying them), then each is renamed into place. How many
        were new."""
        new: dict[Path, bytes] = {}
        counts: dict[str, int] = {}
        for vid, signature in signatures:
            armored = check_signature(vid, signature).armored
            path = self._folder(vid) / f"{signature_name(armored)}.sig"
            if path in new or path.exists():
                continue
            counts[vid] = counts.get(vid, len(self._files(vid))) + 1
            if counts[vid] > MAX_PER_VERSION:
                raise SignatureError(f"version {vid[:12]} already has {MAX_PER_VERSION} signatures")
            new[path] = armored
        written: dict[Path, Path] = {}
        try:
            for path, armored in new.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                written[path] = temporary_sibling(path)
                with disk_full_as_error(path), open(written[path], "xb") as f:
                    f.write(armored)
            if self.fsync:
                sync_files(list(written.values()))
            for path, tmp in written.items():
                os.replace(tmp, path)
        finally:
            for tmp in written.values():
                tmp.unlink(missing_ok=True)
        if self.fsync and new:
            sync_files(sorted({p.parent for p in new} | {self.dir}))  # the renames (folders are files too)
        return len(new)

    def temporary_files(self) -> list[Path]:
        return list(self.dir.glob(f"*/{TMP_PREFIX}*")) if self.dir.is_dir() else []
