"""The SSHSIG format (OpenSSH's PROTOCOL.sshsig), what `ssh-keygen -Y sign` writes and git
stores for `gpg.format=ssh`:

    -----BEGIN SSH SIGNATURE-----
    base64 of: "SSHSIG" uint32(1) string(public key) string(namespace) string(reserved="")
               string(hash algorithm: "sha512" or "sha256") string(signature)
    -----END SSH SIGNATURE-----

The signature is the key's over `"SSHSIG" string(namespace) string(reserved)
string(hash algorithm) string(H(message))`, so a signature made for one namespace (purpose)
never verifies for another. MGit signs with namespace `mgit-version` the message
`<version id>\\n` (VERSION_NAMESPACE, version_message): `ssh-keygen -Y verify -n
mgit-version` accepts it given that line, and a signature `ssh-keygen -Y sign` made over
that line is one MGit accepts.

Parsing checks every length against what is left (mgit.signing.keys.Wire) and the whole
against MAX_ARMORED before decoding anything."""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from dataclasses import dataclass, field

from mgit.errors import SignatureError
from mgit.signing.keys import PublicKey, Signer, Wire, ssh_string
from mgit.store.objects import OID_RE

MAGIC = b"SSHSIG"
BEGIN, END = "-----BEGIN SSH SIGNATURE-----", "-----END SSH SIGNATURE-----"
VERSION_NAMESPACE = "mgit-version"
HASHES = ("sha512", "sha256")
MAX_ARMORED = 8 << 10  # an ecdsa p521 signature is about 600 bytes armored
MAX_NAMESPACE = 256


def version_message(vid: str) -> bytes:
    """What a signature of version `vid` signs: its id and a newline (a text file
    `ssh-keygen -Y sign` can be given)."""
    if not OID_RE.match(vid):
        raise SignatureError(f"signatures are made over a version id, not {vid[:20]!r}")
    return f"{vid}\n".encode()


def _signed_data(namespace: str, hash_alg: str, message: bytes) -> bytes:
    digest = hashlib.new(hash_alg, message).digest()
    return MAGIC + ssh_string(namespace) + ssh_string(b"") + ssh_string(hash_alg) + ssh_string(digest)


@dataclass(frozen=True)
class SshSignature:
    """One parsed SSHSIG: who (the public key), for what purpose (namespace), and the
    signature itself; `armored` is its text, byte for byte as stored."""

    public: PublicKey
    namespace: str
    hash_alg: str
    signature: bytes
    armored: bytes
    # (message, namespace) -> verified: a fetch checks, judges and keeps one signature once
    checked: dict[tuple[bytes, str], bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, armored: bytes) -> SshSignature:
        """An armored SSHSIG, checked field by field; raises SignatureError saying why not."""
        if len(armored) > MAX_ARMORED:
            raise SignatureError(f"a signature of {len(armored)} bytes is larger than any SSH signature")
        try:
            text = armored.decode("ascii")
        except UnicodeDecodeError:
            raise SignatureError("a signature that is not ASCII text") from None
        lines = text.strip().splitlines()
        if len(lines) < 3 or lines[0].strip() != BEGIN or lines[-1].strip() != END:
            raise SignatureError("not an SSH signature (no BEGIN/END SSH SIGNATURE lines)")
        try:
            blob = base64.b64decode("".join(x.strip() for x in lines[1:-1]), validate=True)
        except (binascii.Error, ValueError):
            raise SignatureError("an SSH signature whose body is not base64") from None
        if blob[:6] != MAGIC:
            raise SignatureError("an SSH signature without the SSHSIG magic")
        wire = Wire(blob[6:], "an SSH signature")
        if (version := wire.uint32()) != 1:
            raise SignatureError(f"an SSH signature of version {version} (this mgit reads version 1)")
        public = PublicKey.from_blob(wire.string())
        namespace = wire.text()
        if not namespace or len(namespace) > MAX_NAMESPACE:
            raise SignatureError("an SSH signature without a namespace")
        wire.string()  # reserved
        hash_alg = wire.text()
        if hash_alg not in HASHES:
            raise SignatureError(f"an SSH signature with hash {hash_alg!r} (sha512 or sha256)")
        signature = wire.string()
        wire.end()
        return cls(public, namespace, hash_alg, signature, armored)

    def verifies(self, message: bytes, namespace: str) -> bool:
        """Whether this is a signature of `message` for `namespace` by its own key."""
        if self.namespace != namespace:
            return False
        if (message, namespace) not in self.checked:
            data = _signed_data(namespace, self.hash_alg, message)
            self.checked[(message, namespace)] = self.public.verifies(self.signature, data)
        return self.checked[(message, namespace)]


def armor(blob: bytes) -> bytes:
    body = base64.b64encode(blob).decode()
    lines = [body[i : i + 70] for i in range(0, len(body), 70)]
    return "\n".join([BEGIN, *lines, END]).encode() + b"\n"


def sign(signer: Signer, message: bytes, namespace: str = VERSION_NAMESPACE) -> SshSignature:
    """`message` signed for `namespace` (sha512, as ssh-keygen does), armored."""
    signature = signer.sign(_signed_data(namespace, "sha512", message))
    blob = (
        MAGIC
        + struct.pack(">I", 1)
        + ssh_string(signer.public.blob)
        + ssh_string(namespace)
        + ssh_string(b"")
        + ssh_string("sha512")
        + ssh_string(signature)
    )
    return SshSignature.parse(armor(blob))
