"""Entry point: the command group, and the one place where errors become one line and an
exit code (1 for errors, 2 for usage; a traceback only with MGIT_DEBUG=1)."""

from __future__ import annotations

import errno
import importlib
import io
import os
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

import click

from mgit import __version__
from mgit.cli.output import err
from mgit.errors import MgitError, StorageFullError

if TYPE_CHECKING:
    from mgit.repo.repository import Repo

# Each command is imported when it runs (or when --help lists it): a command module loads
# what its command needs, and `mgit ls` must not wait for numpy, the codecs or rich.
COMMANDS = {
    **{name: f"mgit.cli.commands:{name}" for name in ("init", "add", "checkout", "ls", "log", "show", "du", "fsck",
                                                      "gc", "rm")},
    "diff": "mgit.cli.diff_cmd:diff",
    "lineage": "mgit.cli.lineage_cmd:lineage",
    "graph": "mgit.cli.graph_cmd:graph",
    "serve": "mgit.cli.serve_cmd:serve",
    "test": "mgit.cli.test_cmd:test_group",
    "bisect": "mgit.cli.test_cmd:bisect",
    "cascade": "mgit.cli.cascade_cmd:cascade",
    "merge": "mgit.cli.merge_cmd:merge",
    "import-hf": "mgit.cli.hf_cmd:import_hf",
    "export-hf": "mgit.cli.hf_cmd:export_hf",
    "remote": "mgit.cli.remote_cmd:remote_group",
    **{name: f"mgit.cli.remote_cmd:{name}" for name in ("push", "fetch", "pull", "clone")},
}  # fmt: skip


class LazyGroup(click.Group):
    """A group whose commands are imported by name, on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            module, _, attr = COMMANDS[name].partition(":")
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return self.commands.get(name)


class AppContext:
    """What every command gets: where to look for the repository."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def repo(self) -> Repo:
        from mgit.repo.repository import Repo

        return Repo(Path(self.directory) if self.directory else None)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-C", "directory", metavar="DIR", help="Run as if mgit was started in DIR.")
@click.version_option(__version__, prog_name="mgit")
@click.pass_context
def cli(ctx: click.Context, directory: str | None) -> None:
    """MGit: version and manage families of machine-learning models.

    \b
    Start with:
      mgit init
      mgit add ./bert-base --name bert-base
      mgit add ./bert-sst2 --name bert-sst2 --parent bert-base --relation finetune
      mgit ls
    """
    ctx.obj = AppContext(directory)


def _fail(message: str, code: int = 1) -> int:
    err.print(f"Error: {message}")
    return code


def _show(exc: click.ClickException) -> None:
    """A usage error as click words it, its control characters escaped like every other line."""
    text = io.StringIO()
    exc.show(file=text)
    err.print(text.getvalue(), end="")


def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get("MGIT_DEBUG") == "1"
    try:
        # Without standalone mode click returns the code of ctx.exit(code) instead of exiting.
        code = cli.main(args=argv, prog_name="mgit", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        _show(exc)
        return exc.exit_code
    except click.exceptions.Abort:
        return _fail("aborted", 130)
    except KeyboardInterrupt:
        return _fail("interrupted", 130)
    except MgitError as exc:
        if debug:
            traceback.print_exc()
        return _fail(str(exc))
    except OSError as exc:
        if debug:
            traceback.print_exc()
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # met outside the atomic writers: said as they say it
            return _fail(str(StorageFullError(exc.filename or "a file")))
        return _fail(f"{exc.strerror or exc}{where}")


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
