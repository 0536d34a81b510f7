"""Signing through the ssh-agent (draft-miller-ssh-agent): SSH2_AGENTC_SIGN_REQUEST over the
unix socket SSH_AUTH_SOCK names, for a key the agent holds. The private key stays in the
agent; this process sees only the signature, which is checked against the public key before
it is used (an agent answering with another key's signature is refused)."""

from __future__ import annotations

import os
import socket
import struct

from mgit.errors import SigningKeyError
from mgit.signing.keys import PublicKey, Signer, Wire, ssh_string

SIGN_REQUEST, SIGN_RESPONSE, FAILURE = 13, 14, 5
MAX_REPLY = 16 << 10  # a signature is under 200 bytes
TIMEOUT = 30.0  # seconds: an agent may ask its user to confirm


def _recv(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise SigningKeyError("the ssh-agent closed the connection before it answered")
        out += chunk
    return bytes(out)


def agent_sign(socket_path: str, key: PublicKey, data: bytes) -> bytes:
    """The agent's signature of `data` with `key` (SSH wire form)."""
    request = bytes([SIGN_REQUEST]) + ssh_string(key.blob) + ssh_string(data) + struct.pack(">I", 0)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT)
            sock.connect(socket_path)
            sock.sendall(struct.pack(">I", len(request)) + request)
            (length,) = struct.unpack(">I", _recv(sock, 4))
            if not 0 < length <= MAX_REPLY:
                raise SigningKeyError(f"the ssh-agent answered with a message of {length} bytes")
            reply = _recv(sock, length)
    except OSError as exc:
        raise SigningKeyError(f"cannot reach the ssh-agent at {socket_path}: {exc.strerror or exc}") from None
    if reply[0] != SIGN_RESPONSE:
        raise SigningKeyError(
            f"the ssh-agent refused to sign with {key.fingerprint}",
            hint="Is the key loaded? See: ssh-add -l",
        )
    wire = Wire(reply[1:], "the ssh-agent's answer")
    signature = wire.string()
    wire.end()
    if not key.verifies(signature, data):
        raise SigningKeyError(f"the ssh-agent answered with a signature that {key.fingerprint} does not verify")
    return signature


def agent_signer(key: PublicKey, *, where: str) -> Signer:
    """A Signer for the public key `key` through the agent at SSH_AUTH_SOCK."""
    path = os.environ.get("SSH_AUTH_SOCK")
    if not path:
        raise SigningKeyError(
            f"{where} is a public key and no ssh-agent is running (SSH_AUTH_SOCK is not set)",
            hint="Start one and ssh-add the key, or set signing.key to the private key file",
        )
    return Signer(key, lambda data: agent_sign(path, key, data), f"{where} (ssh-agent)")
