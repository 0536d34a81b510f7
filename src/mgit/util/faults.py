"""Fault injection for the crash tests: `MGIT_CRASH_AT=<name>` SIGKILLs the process at the
crash point of that name (in `add` and after a cascade's commit). A module of its own so that any layer
can place one without importing upwards."""

from __future__ import annotations

import os
import signal


def crash_point(name: str) -> None:
    """SIGKILL this process here when `MGIT_CRASH_AT` names this point."""
    if os.environ.get("MGIT_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
