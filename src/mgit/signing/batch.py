"""Many signatures checked at once: each against the name it is stored under (the sha256 of
its bytes) and the version it claims to sign, in this process or in a worker process.

A clone checks every signature it receives (5,000 for a repository of 5,000 signed versions:
about a second of one core here, most of it in OpenSSL). Checked on threads while the clone
writes its records, the checks took the GIL between the writes' system calls and slowed them
by more than they cost; checked after the records, they added their whole time to the clone's.
`CheckProcess` checks them in a worker process started before the records are fetched, so that
they run on the other core meanwhile; the worker answers, for each signature, only whether it
passed or why not, and the caller keeps what passed with its check recorded (no second
verification). If the worker cannot start or dies, the caller checks in-process: the answer is
the same, only later.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from mgit.errors import SignatureError
from mgit.signing.store import check_signature, signature_name

if TYPE_CHECKING:
    from mgit.signing.sshsig import SshSignature

Item = tuple[str, str, bytes]  # (version id, signature name, armored bytes)
WAIT_BASE, WAIT_PER_ITEM = 60.0, 0.01  # seconds a worker is given: far above its ~0.3 ms a signature


def check_named(vid: str, name: str, armored: bytes) -> SshSignature | str:
    """`armored` checked to hash to `name` and to sign version `vid`: the parsed signature, or
    why not."""
    if signature_name(armored) != name:
        return "its content does not hash to its name"
    try:
        return check_signature(vid, armored)
    except SignatureError as exc:
        return exc.message


def verdicts(items: list[Item]) -> list[str | None]:
    """For each item, None if it passes `check_named`, else why not (what a worker returns)."""
    return [r if isinstance(r, str) else None for r in (check_named(*item) for item in items)]


def passed(vid: str, armored: bytes) -> SshSignature:
    """A signature a worker found to sign `vid`, parsed here with that check recorded, so
    that judging and keeping it verifies nothing again."""
    from mgit.signing.sshsig import VERSION_NAMESPACE, SshSignature, version_message

    sig = SshSignature.parse(armored)
    if sig.namespace != VERSION_NAMESPACE:  # (the worker checked it; a parse here must agree)
        raise SignatureError(f"the signature by {sig.public.fingerprint} on {vid[:12]} is for {sig.namespace!r}")
    sig.checked[(version_message(vid), VERSION_NAMESPACE)] = True
    return sig


class CheckProcess:
    """`verdicts` of `items` computed in a worker process (`python -m mgit.signing.batch FILE`:
    a fresh interpreter, sharing no lock or thread with this one, and started without the
    caller's main module) while the caller goes on. The items go in a temporary file, the
    answers come back on the worker's stdout as JSON. `results()` waits for them: None when the
    worker could not give them (it did not start, died, answered something else, or outlived
    a generous bound), and the caller then checks in-process. `close()` stops the worker
    whatever it is doing (a fetch refused meanwhile) and removes the file."""

    def __init__(self, items: list[Item]) -> None:
        self.items = items
        self._process: subprocess.Popen[bytes] | None = None
        self._file: str | None = None
        try:
            fd, self._file = tempfile.mkstemp(prefix="mgit-signatures-", suffix=".json")
            with os.fdopen(fd, "w", encoding="ascii") as out:
                json.dump([[vid, name, armored.decode("ascii")] for vid, name, armored in items], out)
            package = str(Path(__file__).resolve().parents[2])  # (where this mgit is, on the path first)
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package, os.environ.get("PYTHONPATH")]))}
            self._process = subprocess.Popen(
                [sys.executable, "-m", "mgit.signing.batch", self._file],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=env,
            )
        except (OSError, UnicodeDecodeError):  # (a signature that is not ASCII: checked in-process)
            self.close()

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def results(self) -> list[str | None] | None:
        process = self._process
        if process is None:
            return None
        try:  # (bounded: a worker that hangs is given up)
            out, _ = process.communicate(timeout=WAIT_BASE + WAIT_PER_ITEM * len(self.items))
            answers = json.loads(out) if process.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            answers = None
        finally:
            self.close()
        ok = isinstance(answers, list) and len(answers) == len(self.items)
        return answers if ok and all(a is None or isinstance(a, str) for a in answers) else None

    def close(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.communicate()
        file, self._file = self._file, None
        if file is not None:
            with contextlib.suppress(OSError):
                os.unlink(file)


def main(path: str) -> None:
    """The worker: the items in `path`, their verdicts as JSON on stdout."""
    with open(path, encoding="ascii") as f:
        items = [(vid, name, armored.encode("ascii")) for vid, name, armored in json.load(f)]
    sys.stdout.write(json.dumps(verdicts(items)))


if __name__ == "__main__":
    main(sys.argv[1])
