"""Where a repository keeps signatures: `signatures/<version id>/<sha256 of the signature>.sig`,
each file one armored SSHSIG exactly as made (`ssh-keygen -Y verify -s FILE` reads it), and
`signatures/bundles/<blake3>.json`, many versions' signatures in one file (what a clone or
fetch brought: a file per signature cost a clone of thousands of signed versions more than
verifying them).

A signature is not part of the version it signs (the version's id cannot cover what is made
after it), so, like git's tags, signatures live beside the objects, attached by id: adding
one never changes a record, a version may have several (an author and a reviewer), and two
writers never conflict (a file is named by its content, written once, atomically). Only a
signature that verifies, by its own key and for `mgit-version`, over its version's id is
kept: one copied onto another version never lands. Old repositories have no `signatures/`
folder and read as having no signatures. A bundle that does not hash to its name or is not
JSON of its shape is read as holding nothing (its signatures count as absent, so a policy
that needs them refuses) and `damaged_bundles` names it for fsck; gc merges the bundles into
one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import blake3

from mgit.errors import SignatureError
from mgit.store.objects import OID_RE
from mgit.util.atomicfile import TMP_PREFIX, disk_full_as_error, sync_files, temporary_sibling, write_atomic

if TYPE_CHECKING:
    from mgit.signing.sshsig import SshSignature

MAX_PER_VERSION = 32  # signers of one version: an author, reviewers, a CI; far above any real count
FOLDER = "signatures"
BUNDLES = "bundles"  # (not a version id: no version's folder can have this name)
BUNDLE_FROM = 8  # an add_many of this many signatures or more writes one bundle file
MAX_BUNDLE = 64 << 20  # a bundle larger than this is not read (about 100,000 signatures)


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


def bundle_body(signatures: dict[str, list[bytes]]) -> bytes:
    """A bundle's bytes: `{"<version id>": ["<armored>", ...]}`, keys sorted, no spaces (the
    format of a remote's bundles, docs/format.md)."""
    text = {vid: [s.decode("ascii") for s in sigs] for vid, sigs in signatures.items()}
    return json.dumps(text, sort_keys=True, separators=(",", ":")).encode()


def parse_bundle(data: bytes, bid: str) -> dict[str, dict[str, bytes]] | None:
    """{version id: {name: armored}} of a bundle whose bytes hash (blake3) to `bid`, or None
    when they do not or are not a JSON object of version ids and lists of texts."""
    if blake3.blake3(data).hexdigest() != bid:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    ok = isinstance(value, dict) and all(
        isinstance(k, str) and OID_RE.match(k) and isinstance(v, list) and all(isinstance(x, str) for x in v)
        for k, v in value.items()
    )
    if not ok:
        return None
    encoded = {vid: [x.encode() for x in sigs] for vid, sigs in value.items()}
    return {vid: {signature_name(b): b for b in sigs} for vid, sigs in encoded.items()}


class SignatureStore:
    """`<repo>/signatures/`: the signatures attached to each version."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.dir = root / FOLDER
        self.fsync = fsync
        self._bundled: dict[str, dict[str, bytes]] | None = None  # read once, on first use
        self._damaged: list[Path] = []

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

    def bundle_files(self) -> list[Path]:
        folder = self.dir / BUNDLES
        if not folder.is_dir() or folder.is_symlink():
            return []
        names = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(TMP_PREFIX))
        return [folder / n for n in names]

    def _bundles(self) -> dict[str, dict[str, bytes]]:
        """Every bundle's signatures, {version id: {name: armored}} (read once per store)."""
        if self._bundled is None:
            bundled: dict[str, dict[str, bytes]] = {}
            damaged = []
            for path in self.bundle_files():
                try:
                    with path.open("rb") as f:
                        data = f.read(MAX_BUNDLE + 1)
                except OSError:
                    data = b""
                found = parse_bundle(data, path.stem) if len(data) <= MAX_BUNDLE and path.is_file() else None
                if found is None:
                    damaged.append(path)
                for vid, sigs in (found or {}).items():
                    bundled.setdefault(vid, {}).update(sigs)
            self._bundled, self._damaged = bundled, damaged
        return self._bundled

    def damaged_bundles(self) -> list[Path]:
        """The bundle files that read as nothing (damaged or not what their names say)."""
        self._bundles()
        return list(self._damaged)

    def _all(self, vid: str) -> dict[str, bytes | None]:
        """{name: armored, or None for a file not yet read} of `vid`'s signatures, at most
        MAX_PER_VERSION, loose files first."""
        out: dict[str, bytes | None] = {n.removesuffix(".sig"): None for n in self._files(vid)}
        for name, armored in sorted(self._bundles().get(vid, {}).items()):
            out.setdefault(name, armored)
        return dict(list(out.items())[:MAX_PER_VERSION])

    def get(self, vid: str) -> list[bytes]:
        """The signatures kept for `vid`, as stored (unchecked: the caller judges them)."""
        out = []
        for name, armored in self._all(vid).items():
            if armored is not None:
                out.append(armored)
                continue
            path = self._folder(vid) / f"{name}.sig"
            if path.is_file() and not path.is_symlink():
                with path.open("rb") as f:
                    out.append(f.read(1 << 16))
        return out

    def names(self, vid: str) -> set[str]:
        """The names of the signatures kept for `vid` (each is named by its content)."""
        return set(self._all(vid))

    def versions(self) -> list[str]:
        """Every version with a signature kept here."""
        if not self.dir.is_dir():
            return []
        loose = {n for n in os.listdir(self.dir) if OID_RE.match(n) and self._files(n)}
        return sorted(loose | set(self._bundles()))

    def add(self, vid: str, signature: bytes | SshSignature) -> bool:
        """Keep a signature of `vid` after checking it signs `vid`; False if it was kept already."""
        return self.add_many([(vid, signature)]) == 1

    def add_many(self, signatures: Iterable[tuple[str, bytes | SshSignature]]) -> int:
        """Keep many signatures at once (what a fetch or clone brought), each checked as `add`
        checks it, all before any is written; how many were new. Fewer than BUNDLE_FROM new
        ones are written a file each, made durable together (one syncfs for many) before
        they are renamed into place; more, in one bundle file."""
        new: dict[tuple[str, str], bytes] = {}
        counts: dict[str, int] = {}
        folders = set(os.listdir(self.dir)) if self.dir.is_dir() else set()  # (not a listing per version)
        bundled = self._bundles()
        known: dict[str, dict[str, bytes | None]] = {}
        for vid, signature in signatures:
            armored = check_signature(vid, signature).armored
            key = (vid, signature_name(armored))
            if vid not in known:
                known[vid] = self._all(vid) if vid in folders or vid in bundled else {}
            if key in new or key[1] in known[vid]:
                continue
            counts[vid] = counts.get(vid, len(known[vid])) + 1
            if counts[vid] > MAX_PER_VERSION:
                raise SignatureError(f"version {vid[:12]} already has {MAX_PER_VERSION} signatures")
            new[key] = armored
        if len(new) >= BUNDLE_FROM:
            self._write_bundle(new)
        elif new:
            self._write_files(new)
        return len(new)

    def _write_bundle(self, new: dict[tuple[str, str], bytes]) -> None:
        grouped: dict[str, list[bytes]] = {}
        for (vid, _), armored in new.items():
            grouped.setdefault(vid, []).append(armored)
        body = bundle_body(grouped)
        folder = self.dir / BUNDLES
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{blake3.blake3(body).hexdigest()}.json", [body], fsync=self.fsync)
        if self.fsync:
            sync_files([self.dir])  # (the bundles folder, if new)
        bundled = self._bundles()
        for (vid, name), armored in new.items():
            bundled.setdefault(vid, {})[name] = armored

    def _write_files(self, new: dict[tuple[str, str], bytes]) -> None:
        paths = {self._folder(vid) / f"{name}.sig": armored for (vid, name), armored in new.items()}
        written: dict[Path, Path] = {}
        try:
            for path, armored in paths.items():
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
        if self.fsync:
            sync_files(sorted({p.parent for p in paths} | {self.dir}))  # the renames (folders are files too)

    def consolidate(self) -> int:
        """Merge every bundle into one (gc does: each fetch adds one); the new one is durable
        before the old ones go, so a crash between leaves duplicates, never a loss. Damaged
        bundles are left for fsck to name. How many bundles were merged."""
        damaged = set(self.damaged_bundles())
        files = [p for p in self.bundle_files() if p not in damaged]
        if len(files) < 2:
            return 0
        merged: dict[str, list[bytes]] = {}
        for vid, sigs in sorted(self._bundles().items()):
            merged[vid] = [sigs[n] for n in sorted(sigs)]
        body = bundle_body(merged)
        target = self.dir / BUNDLES / f"{blake3.blake3(body).hexdigest()}.json"
        write_atomic(target, [body], fsync=self.fsync)
        for path in files:
            if path != target:
                path.unlink(missing_ok=True)
        return len(files)

    def temporary_files(self) -> list[Path]:
        return list(self.dir.glob(f"*/{TMP_PREFIX}*")) if self.dir.is_dir() else []
