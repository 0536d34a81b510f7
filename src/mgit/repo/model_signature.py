"""OpenSSF model signatures: the format of the `model-signing` package (1.x, its "key" method)
over a model folder, written by `mgit checkout --model-signature FILE` and checked by
`mgit add DIR` when DIR carries `model.sig` (docs/format.md, "OpenSSF model signatures").

A signature is a Sigstore bundle (media type v0.3) holding a DSSE envelope whose payload is an
in-toto statement: the sha256 of every file of the folder (but git's files and the signature
itself, which model-signing ignores too), and in its subject the sha256 over those digests in
order. The envelope is signed with an ECDSA key; the bundle carries no key, only a hint (the
sha256 of the public key in PEM). So `model_signing verify key --public_key PUB DIR` accepts a
folder mgit signed, and mgit checks a folder model-signing signed against the keys of the
`verify.allowed-signers` file (OpenSSH's format, as `git` uses it): the key whose hint matches
is the signer, and its principal is recorded on the version (`SIGNER_TAG`).

Writing needs only `cryptography`; checking uses model-signing's own verifier (imported when a
folder carries a signature), so what mgit accepts is what model-signing accepts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import shlex
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from mgit.errors import MissingDependencyError, ModelSignatureError
from mgit.formats.paths import SIGNATURE_FILE
from mgit.util.atomicfile import write_atomic

SIGNER_TAG = "model-signing.signer"  # set on a version only by a verified SIGNATURE_FILE
KEY_SETTING = "signing.key"  # in config.json's settings: an OpenSSH private key file
ALLOWED_SETTING = "verify.allowed-signers"  # in config.json's settings: an OpenSSH allowed-signers file
# model-signing's ignore_git_paths: never part of a signature, at the top of the folder
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")  # (.git first: mgit skips it too)
MAX_SIGNATURE_BYTES = 32 << 20  # ~150 bytes per file: far more files than any model has
MAX_ALLOWED_SIGNERS_BYTES = 4 << 20
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"
# model-signing's key method: ECDSA on these curves, hashed as the curve's size asks
CURVES = {"secp256r1": ("nistp256", "sha256"), "secp384r1": ("nistp384", "sha384"), "secp521r1": ("nistp521", "sha512")}
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


def setting_path(config: dict[str, Any], key: str, root: Path) -> Path | None:
    """A path setting of config.json (`~` expanded, relative to the work folder), or None: under
    "settings", as `mgit config` keeps it, else a top-level key of that name."""
    found = config.get("settings")
    value = found[key] if isinstance(found, dict) and key in found else config.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ModelSignatureError("config.json", f"{key} is not a path")
    return root / Path(value).expanduser()


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives import serialization
    except ImportError:
        raise MissingDependencyError("cryptography", "an OpenSSF model signature", "signing") from None
    return serialization


def load_signing_key(config: dict[str, Any], root: Path) -> Any:
    """The repository's `signing.key` (an OpenSSH private key file, unencrypted), checked to be
    a key model-signing's key method verifies: ECDSA on P-256, P-384 or P-521."""
    path = setting_path(config, KEY_SETTING, root)
    if path is None:
        raise ModelSignatureError(
            "config.json", f"no {KEY_SETTING} to sign with", hint=f"Set {KEY_SETTING} to an OpenSSH ECDSA private key"
        )
    serialization = _crypto()
    try:
        key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
    except OSError as exc:
        raise ModelSignatureError(str(path), f"cannot read the signing key ({exc.strerror or exc})") from None
    except (ValueError, TypeError) as exc:
        raise ModelSignatureError(str(path), f"not an unencrypted OpenSSH private key ({exc})") from None
    curve = getattr(getattr(key, "curve", None), "name", None)
    if curve not in CURVES:
        raise ModelSignatureError(
            str(path),
            f"a {type(key).__name__.removeprefix('_').replace('PrivateKey', '')} key: model-signing's key method "
            "verifies ECDSA keys only (P-256, P-384, P-521)",
            hint="Make one with: ssh-keygen -t ecdsa -b 256",
        )
    return key


def key_hint(public_key: Any) -> str:
    """What a bundle names its key by: the sha256 of the public key in PEM (SubjectPublicKeyInfo)."""
    serialization = _crypto()
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def _describe(public_key: Any, principal: str | None) -> ModelSigner:
    serialization = _crypto()
    line = public_key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).split()
    digest = base64.b64encode(hashlib.sha256(base64.b64decode(line[1])).digest()).decode().rstrip("=")
    return ModelSigner(principal, line[0].decode(), f"SHA256:{digest}")


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


def sign_folder(folder: Path, signature: Path, key: Any, *, jobs: int = 4) -> ModelSigner:
    """Write `signature`, a model-signing bundle over the files of `folder` signed with `key`
    (from `load_signing_key`); a signature inside the folder leaves itself out."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    ignored = list(GIT_PATHS)
    with suppress(ValueError):  # (a signature outside the folder)
        ignored.append(signature.resolve().relative_to(folder.resolve()).as_posix())
    payload = json.dumps(statement(folder, ignored, jobs=jobs), indent=2).encode()
    algorithm = getattr(hashes, CURVES[key.curve.name][1].upper())()
    sig = key.sign(pae(payload), ec.ECDSA(algorithm))
    bundle = {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": key_hint(key.public_key())}, "tlogEntries": []},
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": PAYLOAD_TYPE,
            "signatures": [{"sig": base64.b64encode(sig).decode(), "keyid": ""}],
        },
    }
    write_atomic(signature, [json.dumps(bundle).encode()])
    return _describe(key.public_key(), None)


def allowed_signers(path: Path) -> list[tuple[str, Any]]:
    """The (principals, public key) pairs of an OpenSSH allowed-signers file that can sign now:
    ECDSA keys, not certificate authorities, inside their `valid-after`/`valid-before`."""
    serialization = _crypto()
    try:
        if path.stat().st_size > MAX_ALLOWED_SIGNERS_BYTES:
            raise ModelSignatureError(str(path), "is too large for an allowed-signers file")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelSignatureError(str(path), f"cannot read the allowed-signers file ({exc})") from None
    now = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            fields = shlex.split(line, comments=False)
        except ValueError:
            raise ModelSignatureError(str(path), f"line {number} is not an allowed signer") from None
        at = next((i for i, f in enumerate(fields) if f.startswith(("ecdsa-sha2-", "ssh-", "sk-"))), None)
        if at is None or at == 0 or at + 1 >= len(fields):
            raise ModelSignatureError(str(path), f"line {number} names no key")
        principals = fields[0]
        if not principals.isprintable() or len(principals) > 256:
            raise ModelSignatureError(str(path), f"line {number}'s principals are not printable text")
        options = dict(o.partition("=")[::2] for f in fields[1:at] for o in f.split(","))
        if "cert-authority" in options or not fields[at].startswith("ecdsa-sha2-"):
            continue
        after, before = (options.get(o, "").rstrip("Zz") for o in ("valid-after", "valid-before"))
        if (after and after.ljust(14, "0") > now) or (before and before.ljust(14, "0") <= now):
            continue
        try:
            key = serialization.load_ssh_public_key(f"{fields[at]} {fields[at + 1]}".encode())
        except (ValueError, binascii.Error, TypeError):
            raise ModelSignatureError(str(path), f"line {number}'s key is not a valid {fields[at]} key") from None
        found.append((principals, key))
    return found


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


def verify_folder(folder: Path, config: dict[str, Any], root: Path) -> ModelSigner | None:
    """Check the `model.sig` at the top of `folder` with model-signing's verifier against the
    keys of `verify.allowed-signers`; None when there is none. Every file must match, none be
    missing or extra (but what model-signing ignores: git's files, said in the notes)."""
    signature = folder / SIGNATURE_FILE
    if not os.path.lexists(signature) or not folder.is_dir():
        return None
    try:
        import model_signing
    except ImportError:
        raise MissingDependencyError("model-signing", f"checking {signature}", "signing") from None
    hint, payload = _bundle(signature)
    allowed = setting_path(config, ALLOWED_SETTING, root)
    if allowed is None:
        raise ModelSignatureError(
            str(signature),
            f"cannot be checked: no {ALLOWED_SETTING} names the keys to trust",
            hint=f"Set {ALLOWED_SETTING} to an OpenSSH allowed-signers file, or move {SIGNATURE_FILE} out",
        )
    match = next(((p, k) for p, k in allowed_signers(allowed) if key_hint(k) == hint), None)
    if match is None:
        raise ModelSignatureError(
            str(signature), f"is signed by a key that {allowed} does not allow (key hint {hint[:16]})"
        )
    serialization = _crypto()
    pem = match[1].public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
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
    notes = [f"{SIGNATURE_FILE} verified: signed by {match[0]}; the signature itself is not stored"]
    if unsigned:
        notes.append(f"{SIGNATURE_FILE} does not cover {', '.join(unsigned)}: model-signing leaves git's files out")
    return replace(_describe(match[1], match[0]), notes=tuple(notes))


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
