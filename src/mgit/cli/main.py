"""Entry point: the command group, and the one place where errors become one line and an
exit code (1 for errors, 2 for usage; a traceback only with MGIT_DEBUG=1). With `--json` an
error is also a JSON object on stdout (`{"error", "hint", "type"}`), the exit code the same."""

from __future__ import annotations

import errno
import importlib
import io
import os
import sys
from typing import TYPE_CHECKING

import click

from mgit import __version__
from mgit.errors import MgitError, StorageFullError

if TYPE_CHECKING:
    from mgit.repo.repository import Repo

# Each command is imported when it runs (or when --help lists it): a command module loads
# what its command needs, and `mgit ls` must not wait for numpy, the codecs or rich. This
# module itself imports little beyond click, so that `mgit --version` costs about `import
# click`: what only an error needs (the printer, traceback, difflib) is imported there.
# A new command: a "name": "module:function" entry here; its module imports at its top click,
# mgit.cli.output (json_option is there) and what its options need to be declared, and the
# rest (numpy, torch, rich, the codecs, remotes) in the command's body; never another
# command's module for a helper, which would load all of that module's imports.
# tests/test_layers.py (STARTUP_IMPORTS) lists what ls, log, show, lineage and du load.
COMMANDS = {
    **{name: f"mgit.cli.commands:{name}" for name in ("init", "add", "checkout")},
    **{name: f"mgit.cli.upkeep_cmd:{name}" for name in ("fsck", "gc", "rm")},
    **{name: f"mgit.cli.inspect_cmd:{name}" for name in ("ls", "log", "show", "du")},
    "diff": "mgit.cli.diff_cmd:diff",
    "status": "mgit.cli.status_cmd:status",
    "lineage": "mgit.cli.lineage_cmd:lineage",
    "tag": "mgit.cli.refs_cmd:tag",
    **{name: f"mgit.cli.sign_cmd:{name}" for name in ("sign", "verify", "config")},
    "rename": "mgit.cli.refs_cmd:rename",
    "prune-run": "mgit.cli.run_cmd:prune_run",
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
}


class SuggestingGroup(click.Group):
    """A group that answers an unknown command with the closest one it has, as git does."""

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            ctx.fail(f"No such command '{name}'." + (f" Did you mean '{close[0]}'?" if close else ""))
        return super().resolve_command(ctx, args)


class LazyGroup(SuggestingGroup):
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

        return Repo(os.getcwd() if self.directory else None)  # a bare repository given with -C too


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "-C",
    "directory",
    metavar="DIR",
    help="Run as if mgit was started in DIR: the repository and every relative path (PATH, -o, --fn) are "
    "found from there, as with git -C.",
)
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
    if directory:
        try:
            os.chdir(directory)
        except OSError as exc:
            raise click.UsageError(f"cannot change to {directory!r}: {exc.strerror}") from None
    ctx.obj = AppContext(directory)


def _fail(message: str, code: int = 1, *, as_json: bool = False, hint: str | None = None, kind: str = "Error") -> int:
    from mgit.cli.output import err, print_json

    err.print(f"Error: {message}" + (f". {hint}" if hint else ""))
    if as_json:
        print_json({"error": message, "hint": hint, "type": kind})
    return code


def _show(exc: click.ClickException, *, as_json: bool = False) -> None:
    """A usage error as click words it, its control characters escaped like every other line."""
    from mgit.cli.output import err, print_json

    text = io.StringIO()
    exc.show(file=text)
    err.print(text.getvalue(), end="")
    if as_json:
        print_json({"error": exc.format_message(), "hint": None, "type": type(exc).__name__})


def wants_json(argv: list[str]) -> bool:
    """Whether the command line asks for JSON (`--json`, or graph's `--format json`), options
    only: what follows `--` is arguments."""
    args = argv[: argv.index("--")] if "--" in argv else argv
    pairs = zip(args, [*args[1:], ""], strict=True)
    return "--json" in args or "--format=json" in args or any(a == "--format" and b == "json" for a, b in pairs)


def _traceback() -> None:
    import traceback

    traceback.print_exc()


def main(argv: list[str] | None = None) -> int:
    debug = os.environ.get("MGIT_DEBUG") == "1"
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = wants_json(args)
    try:
        cwd: str | None = os.getcwd()  # -C changes it for the command; a caller in this process gets its own back
    except FileNotFoundError:
        cwd = None
    try:
        # Without standalone mode click returns the code of ctx.exit(code) instead of exiting.
        code = cli.main(args=args, prog_name="mgit", standalone_mode=False)
        return code if isinstance(code, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        _show(exc, as_json=as_json)
        return exc.exit_code
    except click.exceptions.Abort:
        return _fail("aborted", 130, as_json=as_json, kind="Aborted")
    except KeyboardInterrupt:
        return _fail("interrupted", 130, as_json=as_json, kind="Interrupted")
    except MgitError as exc:
        if debug:
            _traceback()
        return _fail(exc.message, as_json=as_json, hint=exc.hint, kind=type(exc).__name__)
    except OSError as exc:
        if debug:
            _traceback()
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # met outside the atomic writers: said as they say it
            full = StorageFullError(exc.filename or "a file")
            return _fail(full.message, as_json=as_json, hint=full.hint, kind="StorageFullError")
        return _fail(f"{exc.strerror or exc}{where}", as_json=as_json, kind=type(exc).__name__)
    finally:
        if cwd is not None:
            os.chdir(cwd)


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
