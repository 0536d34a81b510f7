"""OpenSSF model signatures: the format of the `model-signing` package (1.x, its "key" method)
over a model folder, written by `mgit checkout --model-signature FILE` and checked by
`mgit add DIR` when DIR carries `model.sig` (docs/format.md, "OpenSSF model signatures").

A signature is a Sigstore bundle (media type v0.3) holding a DSSE envelope whose payload is an
in-toto statement: the sha256 of every file of the folder (but git's files and the signature
itself, which model-signing ignores too), and in its subject the sha256 over those digests in
order. The envelope is signed with an ECDSA key; the bundle carries no key, only a hint (the
sha256 of the public key in PEM). So `model_signing verify key --public_key PUB DIR` accepts a
folder mgit signed, and mgit checks a folder model-signing signed against the keys of the
`verify.allowed-signers` file (OpenSSH's format, as `git` uses it, read by
mgit.signing.allowed with its time windows and revoked keys): the key whose hint matches is
the signer, and its principal is recorded on the version (`SIGNER_TAG`). The key that signs
is the one versions are signed with (`signing.key`, mgit.signing.keys), if it is ECDSA.

Writing needs only `cryptography`; checking uses model-signing's own verifier (imported when a
folder carries a signature), so what mgit accepts is what model-signing accepts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from mgit.errors import MissingDependencyError, ModelSignatureError
from mgit.formats.paths import SIGNATURE_FILE
from mgit.signing import policy
from mgit.signing.keys import CURVES, PublicKey, Signer, Wire
from mgit.util.atomicfile import write_atomic

SIGNER_TAG = "model-signing.signer"  # set on a version only by a verified SIGNATURE_FILE
ALLOWED_SETTING = "verify.allowed-signers"  # the keys a folder's signature may be by
# model-signing's ignore_git_paths: never part of a signature, at the top of the folder
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")  # (.git first: mgit skips it too)
MAX_SIGNATURE_BYTES = 32 << 20  # ~150 bytes per file: far more files than any model has
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
CHUNK = 1 << 20


@dataclass(frozen=True)
class ModelSigner:
    """Who signed a folder: the principal an allowed-signers file gives the key (None for the
    repository's own key when signing), the key's type and its fingerprint as `ssh-keygen -l`
    prints it. `notes` say what the signature leaves out of what mgit stores."""

    principal: str | None
    key_type: str
    fingerprint: str
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def key(self) -> str:
        """The key: `KEYTYPE SHA256:...`."""
        return f"{self.key_type} {self.fingerprint}"

    @property
    def tag(self) -> str:
        """The value of SIGNER_TAG: `PRINCIPALS KEYTYPE SHA256:...`."""
        return f"{self.principal} {self.key}"


def model_signer(signer: Signer) -> Signer:
    """`signer` (Repo.signer: the key `signing.key` names), checked to be one model-signing's
    key method verifies: ECDSA on P-256, P-384 or P-521 (its hash is the one SSH uses too)."""
    if signer.public.kind not in CURVES:
        raise ModelSignatureError(
            signer.where,
            f"an {signer.public.kind} key: model-signing's key method verifies ECDSA keys only (P-256, P-384, P-521)",
            hint="Make one with: ssh-keygen -t ecdsa -b 256",
        )
    return signer


def key_hint(key: PublicKey) -> str:
    """What a bundle names its key by: the sha256 of the public key in PEM (SubjectPublicKeyInfo)."""
    from cryptography.hazmat.primitives import serialization

    pem = key.crypto().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _der(ssh_signature: bytes) -> bytes:
    """An SSH ecdsa signature (string type, string (mpint r, mpint s)) as DSSE carries it: DER."""
    from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

    wire = Wire(ssh_signature, "an ecdsa signature")
    wire.text()
    inner = Wire(wire.string(), "an ecdsa signature")
    r, s = (int.from_bytes(inner.string(), "big") for _ in range(2))
    return encode_dss_signature(r, s)


def _signed_files(folder: Path, ignored: list[str]) -> list[str]:
    """The files of `folder` model-signing hashes: every file (links refused, as it does),
    except the ignored paths at the top of the folder and what is under them."""
    found = []
    for dirpath, dirs, names in os.walk(folder):
        here = Path(dirpath)
        for name in sorted(dirs) + sorted(names):
            full = here / name
            rel = full.relative_to(folder).as_posix()
            if any(rel == i or rel.startswith(i + "/") for i in ignored):
                if name in dirs:
                    dirs.remove(name)
                continue
            if full.is_symlink():
                raise ModelSignatureError(str(full), "is a link: model-signing signs regular files only")
            if full.is_file():
                found.append(rel)
    return sorted(found, key=PurePosixPath)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def statement(folder: Path, ignored: list[str], *, jobs: int = 4) -> dict[str, Any]:
    """The in-toto statement model-signing 1.x makes of a folder (file-wise sha256)."""
    names = _signed_files(folder, ignored)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        digests = list(pool.map(lambda n: _sha256(folder / n), names))
    root = hashlib.sha256(b"".join(bytes.fromhex(d) for d in digests)).hexdigest()
    resources = [{"name": n, "algorithm": "sha256", "digest": d} for n, d in zip(names, digests, strict=True)]
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": folder.resolve().name, "digest": {"sha256": root}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "resources": resources,
            "serialization": {
                "allow_symlinks": False,
                "ignore_paths": ignored,
                "hash_type": "sha256",
                "method": "files",
            },
        },
    }


def pae(payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what the envelope's signature is over."""
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload), payload)


def sign_folder(folder: Path, signature: Path, signer: Signer, *, jobs: int = 4) -> ModelSigner:
    """Write `signature`, a model-signing bundle over the files of `folder` signed by
    `signer` (from `model_signer`); a signature inside the folder leaves itself out."""
    ignored = list(GIT_PATHS)
    with suppress(ValueError):  # (a signature outside the folder)
        ignored.append(signature.resolve().relative_to(folder.resolve()).as_posix())
    payload = json.dumps(statement(folder, ignored, jobs=jobs), indent=2).encode()
    sig = _der(model_signer(signer).sign(pae(payload)))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key_hint(signer.public)}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}],
        },
    }
    write_atomic(signature, [json.dumps(bundle).encode()])
    return ModelSigner(None, signer.public.kind, signer.public.fingerprint)


def _bundle(path: Path) -> tuple[str, dict[str, Any]]:
    """The key hint and the (yet unverified) statement of a signature file, its shape checked
    before model-signing reads it: a file it would choke on is refused here in one line."""
    size = path.lstat().st_size
    if not path.is_file() or path.is_symlink():
        raise ModelSignatureError(str(path), "is not a regular file")
    if size > MAX_SIGNATURE_BYTES:
        raise ModelSignatureError(str(path), f"is {size} bytes, more than any model signature ({MAX_SIGNATURE_BYTES})")
    try:
        bundle = json.loads(path.read_bytes())
        material, envelope = bundle["verificationMaterial"], bundle["dsseEnvelope"]
        hint = material.get("publicKey", {}).get("hint")
        payload = json.loads(base64.b64decode(envelope["payload"], validate=True))
        shaped = (
            bundle.get("mediaType") == BUNDLE_MEDIA_TYPE
            and isinstance(envelope["signatures"], list)
            and isinstance(payload, dict)
            and isinstance(payload.get("predicate"), dict)
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, binascii.Error):
        shaped = False
    if not shaped:
        raise ModelSignatureError(str(path), "is not a model-signing signature (a Sigstore bundle)")
    if not isinstance(hint, str) or "certificate" in material or "x509CertificateChain" in material:
        raise ModelSignatureError(
            str(path),
            "is signed with a certificate or by Sigstore (keyless): mgit checks model-signing's key method only",
            hint=f"Verify it with model_signing, then move {SIGNATURE_FILE} out of the folder to add it",
        )
    return hint, payload


def _hashing(statement: dict[str, Any]) -> Any:
    """model-signing's hashing config for what the statement says it used, leaving out the
    signature file as its own command line does."""
    import model_signing

    serialization = statement["predicate"].get("serialization")
    method = serialization.get("method") if isinstance(serialization, dict) else None
    config = model_signing.hashing.Config()
    if method == "shards":
        config.use_shard_serialization(
            hashing_algorithm=serialization.get("hash_type"), shard_size=serialization.get("shard_size")
        )
    elif method == "files":
        config.use_file_serialization(hashing_algorithm=serialization.get("hash_type"))
    else:
        raise ModelSignatureError(SIGNATURE_FILE, f"names an unknown serialization method {method!r}")
    return config.set_ignored_paths(paths=[SIGNATURE_FILE], ignore_git_paths=True)


def verify_folder(folder: Path, config: dict[str, Any]) -> ModelSigner | None:
    """Check the `model.sig` at the top of `folder` with model-signing's verifier against the
    allowed signers of `config` (Repo.config); None when there is none. Every file must match,
    none be missing or extra (but what model-signing ignores: git's files, said in the notes)."""
    signature = folder / SIGNATURE_FILE
    if not os.path.lexists(signature) or not folder.is_dir():
        return None
    try:
        import model_signing
    except ImportError:
        raise MissingDependencyError("model-signing", f"checking {signature}", "signing") from None
    hint, payload = _bundle(signature)
    allowed_file = policy.path_setting(config, ALLOWED_SETTING)
    if allowed_file is None:
        raise ModelSignatureError(
            str(signature),
            f"cannot be checked: no {ALLOWED_SETTING} names the keys to trust",
            hint=f"Set {ALLOWED_SETTING} to an OpenSSH allowed-signers file, or move {SIGNATURE_FILE} out",
        )
    allowed = policy.allowed_signers(config)
    key = next((k.key for k in allowed.keys if k.key.kind in CURVES and key_hint(k.key) == hint), None)
    judged = allowed.judge_key(key, None) if key is not None else None
    if key is None or judged is None or not judged.trusted:
        why = f": {judged.status}" if judged is not None else ""
        raise ModelSignatureError(
            str(signature), f"is signed by a key that {allowed_file} does not allow (key hint {hint[:16]}{why})"
        )
    from cryptography.hazmat.primitives import serialization

    pem = key.crypto().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with tempfile.TemporaryDirectory(prefix="mgit-model-sig-") as tmp:
        (Path(tmp) / "key.pub").write_bytes(pem)
        try:
            checker = model_signing.verifying.Config().use_elliptic_key_verifier(public_key=Path(tmp) / "key.pub")
            checker.set_hashing_config(_hashing(payload)).verify(folder, signature)
        except Exception as exc:  # model-signing raises ValueError, KeyError, InvalidSignature ...
            try:
                why = (_mismatch(folder, payload) if "Signature mismatch" in str(exc) else None) or str(exc)
            except (KeyError, TypeError, AttributeError, ValueError, OSError):
                why = str(exc)
            why = " ".join(why.split())[:300] or f"bad signature ({type(exc).__name__})"
            raise ModelSignatureError(str(signature), f"does not verify: {why}") from None
    signed = {r.get("name") for r in payload["predicate"].get("resources", []) if isinstance(r, dict)}
    unsigned = [n for n in GIT_PATHS[1:] if n not in signed and os.path.lexists(folder / n)]
    principal = ",".join(judged.principals)
    notes = [f"{SIGNATURE_FILE} verified: signed by {principal}; the signature itself is not stored"]
    if unsigned:
        notes.append(f"{SIGNATURE_FILE} does not cover {', '.join(unsigned)}: model-signing leaves git's files out")
    return ModelSigner(principal, key.kind, key.fingerprint, tuple(notes))


def _mismatch(folder: Path, statement: dict[str, Any]) -> str | None:
    """What differs between a folder and the (verified) statement of a file-wise signature, in
    words rather than model-signing's digests: the files changed, extra or missing."""
    serialization = statement["predicate"]["serialization"]
    if serialization.get("method") != "files" or serialization.get("hash_type") != "sha256":
        return None
    signed = {r["name"]: r["digest"] for r in statement["predicate"]["resources"]}
    found = set(_signed_files(folder, [*GIT_PATHS, SIGNATURE_FILE, *serialization.get("ignore_paths", [])]))
    parts = [f"{n} changed" for n in sorted(found & set(signed)) if _sha256(folder / n) != signed[n]]
    parts += [f"extra file {n}" for n in sorted(found - set(signed))]
    parts += [f"missing file {n}" for n in sorted(set(signed) - found)]
    return "; ".join(parts) or None
