"""Signers for the tests of signed versions: SSH keys made by the real `ssh-keygen`, an
allowed-signers file naming them, and a repository configured to sign with one."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from conftest import run_cli

KEYGEN = "/usr/bin/ssh-keygen"


def keygen(folder: Path, name: str, kind: str = "ed25519", extra: list[str] | None = None) -> Path:
    """A new key pair `folder/name` and `folder/name.pub`, without a passphrase."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    subprocess.run([KEYGEN, "-q", "-t", kind, *(extra or []), "-N", "", "-C", name, "-f", str(path)], check=True)
    return path


def allowed_file(path: Path, *entries: tuple[str, Path] | str) -> Path:
    """An allowed-signers file: (principal, key) pairs, or raw lines."""
    lines = [e if isinstance(e, str) else f"{e[0]} {e[1].with_suffix('.pub').read_text().strip()}" for e in entries]
    path.write_text("\n".join(lines) + "\n")
    return path


def configure(root: Path, **settings: str | Path) -> None:
    """`mgit config KEY VALUE` in `root` for each setting (underscores for dots and dashes:
    signing_key, verify_allowed_signers, verify_require)."""
    names = {
        "signing_key": "signing.key",
        "signing_always": "signing.always",
        "verify_allowed_signers": "verify.allowed-signers",
        "verify_revoked": "verify.revoked",
        "verify_require": "verify.require",
    }
    for key, value in settings.items():
        code, _, err = run_cli("-C", str(root), "config", names.get(key, key), str(value))
        assert code == 0, err


@contextmanager
def ssh_agent(sock: Path) -> Iterator[Path]:
    """A real ssh-agent on the socket `sock`, of its own, stopped by its pid."""
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    for _ in range(100):
        if sock.exists():
            break
        time.sleep(0.05)
    try:
        yield sock
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
