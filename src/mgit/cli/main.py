"""Entry point: the command group, and the one place where errors become one line and an
exit code (1 for errors, 2 for usage; a traceback only with MGIT_DEBUG=1)."""

from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path

import click

from mgit import __version__
from mgit.cli import cascade_cmd, commands, diff_cmd, graph_cmd, lineage_cmd, remote_cmd, test_cmd
from mgit.errors import MgitError
from mgit.repo import Repo


class AppContext:
    """What every command gets: where to look for the repository."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory

    def repo(self) -> Repo:
        return Repo(Path(self.directory) if self.directory else None)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


commands.register(cli)
diff_cmd.register(cli)
lineage_cmd.register(cli)
graph_cmd.register(cli)
test_cmd.register(cli)
cascade_cmd.register(cli)
remote_cmd.register(cli)


def _fail(message: str, code: int = 1) -> int:
    click.echo(f"Error: {message}", err=True)
    return code


def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get("MGIT_DEBUG") == "1"
    try:
        # Without standalone mode click returns the code of ctx.exit(code) instead of exiting.
        code = cli.main(args=argv, prog_name="mgit", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
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
        if exc.errno == errno.ENOSPC:
            return _fail(f"no space left on the device{where}")
        return _fail(f"{exc.strerror or exc}{where}")


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
