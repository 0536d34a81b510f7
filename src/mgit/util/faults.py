"""Fault injection for the crash tests: `MGIT_CRASH_AT=<name>` SIGKILLs the process the first
time it reaches the crash point of that name, `MGIT_CRASH_AT=<name>:<n>` the n-th time (so a
test can kill an add after its third object, or a gc after its hundredth deletion). A module
of its own so that any layer can place one without importing upwards.

The points: in `add`, after-scan, after-objects, before-ref, after-ref, object-written (an
object file in place) and block-written (a coded block of a large object handed to its
file); in `checkout`, checkout-piece-written (a tensor, or a block of one, written into the
file being rebuilt); in `gc`, gc-deleted (a garbage object removed); push-before-refs,
push-between-refs, push-after-objects, upload-part-sent (a part of a resumable upload landed);
fetch-after-download, fetch-records-staged (records from packs written, not yet renamed in), fetch-object-kept
(an object a fetch verified renamed into objects/), fetch-after-promote,
clone-before-heads; cascade-after-commit; rename-after-retired, rename-after-new-ref;
delete-after-tombstone (`push --delete`), remote-gc-deleted (a remote gc's deletion).

`MGIT_STALL_AT=<name>[:<n>]` with `MGIT_STALL_FILE=<path>` makes the process pause at that point
(the n-th time) instead: it creates `<path>.reached` and waits (at most STALL_WAIT seconds) until `<path>`
exists, so that a test can run another process in between (a gc while a push is between
its objects and its refs).
"""

from __future__ import annotations

import os
import signal
import threading
import time

STALL_WAIT = 120.0
_reached: dict[str, int] = {}
_counting = threading.Lock()


def crash_point(name: str) -> None:
    """SIGKILL this process here when `MGIT_CRASH_AT` names this point (and this is the n-th
    time this process reaches it, with `:<n>`)."""
    stall = os.environ.get("MGIT_STALL_AT")
    if stall == name or stall and ":" in stall and _nth_time("MGIT_STALL_AT", name):  # (no count: every time)
        _stall(os.environ.get("MGIT_STALL_FILE", ""))
    if _nth_time("MGIT_CRASH_AT", name):
        os.kill(os.getpid(), signal.SIGKILL)


def _nth_time(variable: str, name: str) -> bool:
    """Whether the variable names this point and this is the time it asks for (each variable
    counts its own passes)."""
    wanted = os.environ.get(variable)
    if not wanted:
        return False
    point, _, nth = wanted.partition(":")
    if point != name:
        return False
    with _counting:
        key = f"{variable}:{name}"
        _reached[key] = _reached.get(key, 0) + 1
        return _reached[key] == (int(nth) if nth.isdigit() else 1)


def _stall(path: str) -> None:
    if not path:
        return
    with open(f"{path}.reached", "w"):
        pass
    deadline = time.monotonic() + STALL_WAIT
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
