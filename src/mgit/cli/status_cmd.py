"""`mgit status`: where the work folder stands against its remotes (as of the last fetch),
what a lazy clone holds here, and what interrupted operations left, each with the command
to run next. Text and `--json` print the same `StatusReport`."""

from __future__ import annotations

import click

from mgit.cli.commands import json_option
from mgit.cli.output import out, plural, print_json, short, size, table


@click.command()
@click.option("--fetch", "fetch_first", is_flag=True, help="Fetch from the remote(s) first (the network is used).")
@click.option("--remote", metavar="NAME", default=None, help="Compare with this remote only (default: every one).")
@json_option
@click.pass_context
def status(ctx: click.Context, fetch_first: bool, remote: str | None, as_json: bool) -> None:
    """Where each model stands against its remote (ahead, behind, diverged) as of the last
    fetch, what a lazy clone has here, and what interrupted operations left to resume or
    collect, each with the command to run next. No network unless --fetch.

    \b
    Examples:
      mgit status
      mgit status --fetch --json
    """
    from mgit.status import status as status_of

    report = status_of(ctx.obj.repo(), remote=remote, fetch_first=fetch_first)
    if as_json:
        print_json({**report.to_json(), "clean": report.clean})
        return
    if report.fetched:
        out.print(f"fetched {', '.join(report.fetched)}")
    if report.models:
        t = table("model", "remote", "state", "here", "remote's", "next")
        for m in report.models:
            state = m.state
            if m.state == "diverged":
                state += f" ({m.ahead} ahead, {m.behind} behind)"
            elif m.ahead or m.behind:
                state += f" {m.ahead or m.behind}"
            t.add_row(m.model, m.remote or "-", state, short(m.head), short(m.tracking), m.next or "")
        out.print(t)
        if any(m.remote for m in report.models) and not report.fetched:
            out.print("(the remotes' heads as of the last fetch; mgit status --fetch asks them now)")
    else:
        out.print("No models yet. Add one with: mgit add PATH --name NAME")
    if report.lazy is not None:
        z = report.lazy
        out.print(
            f"lazy clone of {z.remote}: {z.versions_here} of {plural(z.versions, 'version')} readable offline; "
            f"{z.objects_here} of {plural(z.objects, 'object')} here ({size(z.bytes_here)}, "
            f"{size(z.bytes_remote_only)} on the remote only, fetched when read)"
            + (f"; next: {z.next}" if z.next else "")
        )
    for left in report.leftovers:
        what = f"{left.count} {left.kind}" + (f" ({size(left.bytes)})" if left.bytes else "")
        out.print(f"{what}: {left.message}; next: {left.next}")
        for where in left.where[:5]:
            out.print(f"  {where}")
        if len(left.where) > 5:
            out.print(f"  ... and {len(left.where) - 5} more")
    if report.clean:
        out.print("Nothing to do.")
