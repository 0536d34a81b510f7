"""The `mgit` command line: thin commands over `mgit.Repo` (the group and the one place where
errors become an exit code are in `main`, one module per command group beside it)."""

from __future__ import annotations

import sys


def entry() -> None:
    """The `mgit` console script. `mgit --version` is answered here, before click and the
    command group are imported: installers and scripts run it to check an install, and it
    costs what starting Python costs. Anything else goes to `mgit.cli.main`."""
    if sys.argv[1:] == ["--version"]:
        from mgit import __version__

        print(f"mgit, version {__version__}")  # as click's version option words it
        sys.exit(0)
    from mgit.cli.main import entry as run

    run()
