"""SSH keys: public keys as OpenSSH writes them (`ssh-ed25519 AAAA...`, ecdsa-sha2-nistp256,
-384, -521), the signatures they verify (the SSH wire encoding of an ed25519 or ecdsa
signature), and the signing key `signing.key` names: a private key file (signed here, with
the `cryptography` library) or a public key whose private half the ssh-agent holds
(mgit.signing.agent). RSA and certificates are refused by name: git's SSH signing people
use today is ed25519 or ecdsa, and a refusal is clearer than half support."""

from __future__ import annotations

import base64
import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from mgit.errors import MissingDependencyError, SignatureError, SigningKeyError

ED25519 = "ssh-ed25519"
CURVES = {  # key type -> (curve name in the blob, the hash ecdsa signs with)
    "ecdsa-sha2-nistp256": ("nistp256", "sha256"),
    "ecdsa-sha2-nistp384": ("nistp384", "sha384"),
    "ecdsa-sha2-nistp521": ("nistp521", "sha512"),
}
KEY_TYPES = (ED25519, *CURVES)
MAX_KEY_FILE = 64 << 10  # an OpenSSH private key is a few hundred bytes


def need_cryptography() -> None:
    """The `cryptography` package (the `signing` extra), or MissingDependencyError."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        raise MissingDependencyError("cryptography", "Signing and verifying versions", "signing") from None


class Wire:
    """A reader of SSH wire data (RFC 4251 strings and uint32s) that checks every length
    against what is left before taking it."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def uint32(self) -> int:
        if self.pos + 4 > len(self.data):
            raise SignatureError(f"{self.what} is truncated")
        (value,) = struct.unpack_from(">I", self.data, self.pos)
        self.pos += 4
        return value

    def string(self) -> bytes:
        n = self.uint32()
        if n > len(self.data) - self.pos:
            raise SignatureError(f"{self.what} is truncated (a field of {n} bytes, {len(self.data) - self.pos} left)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def text(self) -> str:
        try:
            return self.string().decode("ascii")
        except UnicodeDecodeError:
            raise SignatureError(f"{self.what} has a field that is not ASCII") from None

    def end(self) -> None:
        if self.pos != len(self.data):
            raise SignatureError(f"{self.what} has {len(self.data) - self.pos} bytes after its end")


def ssh_string(data: bytes | str) -> bytes:
    raw = data.encode() if isinstance(data, str) else data
    return struct.pack(">I", len(raw)) + raw


MAX_PARSED = 1024  # distinct public keys remembered by one process
_PARSED: dict[bytes, PublicKey] = {}  # blob -> the key parsed from it (valid: refused blobs are not kept)


@dataclass(frozen=True)
class PublicKey:
    """An SSH public key by its wire blob; `line` is how OpenSSH writes it."""

    blob: bytes

    @classmethod
    def from_blob(cls, blob: bytes) -> PublicKey:
        """The key of an SSH wire blob, checked (a point on its curve); a blob seen before gives
        the key parsed then (a clone meets its few signers' keys once per signed version)."""
        known = _PARSED.get(blob)
        if known is not None:
            return known
        wire = Wire(blob, "a public key")
        kind = wire.text()
        if kind == ED25519:
            if len(wire.string()) != 32:
                raise SignatureError("an ed25519 public key is not 32 bytes")
        elif kind in CURVES:
            if wire.text() != CURVES[kind][0]:
                raise SignatureError(f"a {kind} public key names another curve")
            wire.string()
        else:
            raise SignatureError(f"public keys of type {kind!r} are not supported (ed25519 or ecdsa)")
        wire.end()
        key = cls(blob)
        key.crypto()  # the point is on its curve
        if len(_PARSED) < MAX_PARSED:
            _PARSED[blob] = key
        return key

    @classmethod
    def from_line(cls, line: str) -> PublicKey:
        """`TYPE BASE64 [comment]`, as in a .pub file or an allowed-signers line."""
        parts = line.split()
        if len(parts) < 2 or parts[0] not in KEY_TYPES:
            raise SignatureError(f"not an ed25519 or ecdsa public key: {line[:40]!r}")
        try:
            blob = base64.b64decode(parts[1], validate=True)
        except ValueError:
            raise SignatureError(f"a public key that is not base64: {parts[1][:20]!r}") from None
        key = cls.from_blob(blob)
        if key.kind != parts[0]:
            raise SignatureError(f"a public key that says {parts[0]} holds a {key.kind}")
        return key

    @property
    def kind(self) -> str:
        return Wire(self.blob, "a public key").text()

    @property
    def line(self) -> str:
        return f"{self.kind} {base64.b64encode(self.blob).decode()}"

    @property
    def fingerprint(self) -> str:
        """As `ssh-keygen -l` shows it: SHA256:<base64 without padding>."""
        return "SHA256:" + base64.b64encode(hashlib.sha256(self.blob).digest()).decode().rstrip("=")

    def crypto(self):  # noqa: ANN201 - a cryptography public key
        """The key as `cryptography` holds it (parsed once: from_blob checks the point with
        it, every signature it verifies then uses it)."""
        return self._crypto

    @cached_property
    def _crypto(self):  # noqa: ANN202
        need_cryptography()
        from cryptography.hazmat.primitives.serialization import load_ssh_public_key

        try:
            return load_ssh_public_key(self.line.encode())
        except (ValueError, TypeError):
            raise SignatureError(f"a {self.kind} public key that is not a valid point") from None

    def verifies(self, signature: bytes, data: bytes) -> bool:
        """Whether `signature` (SSH wire: string type, string signature) is this key's over `data`."""
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

        wire = Wire(signature, "a signature")
        kind, raw = wire.text(), wire.string()
        wire.end()
        if kind != self.kind:
            return False
        try:
            if kind == ED25519:
                self.crypto().verify(raw, data)
            else:
                inner = Wire(raw, "an ecdsa signature")
                r, s = (int.from_bytes(inner.string(), "big") for _ in range(2))
                inner.end()
                algorithm = getattr(hashes, CURVES[kind][1].upper())()
                self.crypto().verify(encode_dss_signature(r, s), data, ec.ECDSA(algorithm))
        except InvalidSignature:
            return False
        return True


@dataclass(frozen=True)
class Signer:
    """A key that signs: its public half, and the function that signs bytes with it
    (returning the SSH wire signature). `where` says which it is (a file, the agent);
    `private` is the `cryptography` private key when it was read from a file (for a signer of
    another format over the same key), None when the ssh-agent holds it."""

    public: PublicKey
    sign: Callable[[bytes], bytes]
    where: str
    private: object | None = None


def _mpint(value: int) -> bytes:
    raw = value.to_bytes((value.bit_length() + 8) // 8 or 1, "big")  # a leading zero keeps it positive
    return ssh_string(raw)


def private_signer(private, where: str) -> Signer:  # noqa: ANN001 - a cryptography private key
    """A Signer over a `cryptography` ed25519 or ecdsa private key."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519
    from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

    if not isinstance(private, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey)):
        raise SigningKeyError(f"{where}: only ed25519 and ecdsa keys sign versions")
    line = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    public = PublicKey.from_line(line.decode())
    kind = public.kind

    def sign(data: bytes) -> bytes:
        if isinstance(private, ed25519.Ed25519PrivateKey):
            return ssh_string(kind) + ssh_string(private.sign(data))
        algorithm = getattr(hashes, CURVES[kind][1].upper())()
        r, s = decode_dss_signature(private.sign(data, ec.ECDSA(algorithm)))
        return ssh_string(kind) + ssh_string(_mpint(r) + _mpint(s))

    return Signer(public, sign, where, private)


def load_signing_key(path: str | os.PathLike[str]) -> Signer:
    """The key `signing.key` names, ready to sign. A private key file (OpenSSH or PEM, not
    encrypted) signs here; a public key (`.pub`, or any file holding one line `TYPE BASE64`)
    signs through the ssh-agent at SSH_AUTH_SOCK, which must hold its private half. The
    private key never leaves this process: nothing here sends it anywhere."""
    need_cryptography()
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    file = Path(path).expanduser()
    try:
        if file.stat().st_size > MAX_KEY_FILE:
            raise SigningKeyError(f"{file} is too large to be a key")
        data = file.read_bytes()
    except OSError as exc:
        raise SigningKeyError(f"cannot read the signing key {file}: {exc.strerror}") from None
    text = data.decode("ascii", "replace").strip()
    if text.split(" ", 1)[0] in KEY_TYPES:
        from mgit.signing.agent import agent_signer

        return agent_signer(PublicKey.from_line(text), where=str(file))
    if text.split(" ", 1)[0].startswith(("ssh-rsa", "ssh-dss", "sk-")) or "-cert-v01@" in text:
        raise SigningKeyError(f"{file}: only ed25519 and ecdsa keys sign versions")
    try:
        if b"OPENSSH PRIVATE KEY" in data:
            private = serialization.load_ssh_private_key(data, password=None)
        else:
            private = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise SigningKeyError(
            f"the signing key {file} is encrypted",
            hint=f"Add it to the ssh-agent (ssh-add {file}) and set signing.key to its .pub",
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise SigningKeyError(f"{file} is not an ed25519 or ecdsa private key ({exc})") from None
    return private_signer(private, str(file))
