"""Sharing: `mgit remote add|ls|rm|show`, `push`, `fetch`, `pull`, `clone`. Each is a few
lines over `mgit.sync`; `--json` prints the same result as data."""

from __future__ import annotations

import click

from mgit import sync
from mgit.cli.main import SuggestingGroup
from mgit.cli.output import err, out, plural, print_json, short, size, table, transfer_bar
from mgit.repo.repository import Repo
from mgit.store.transfer import TransferStats
from mgit.sync.reports import FetchResult, ModelUpdate, TagsTravel

json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
endpoint_option = click.option(
    "--endpoint-url",
    metavar="URL",
    help="An S3-compatible endpoint (default: AWS, or AWS_ENDPOINT_URL); for gs:// or az://, the cloud's "
    "endpoint (an emulator's, a private one).",
)
region_option = click.option("--region", metavar="REGION", help="The S3 region (default: the AWS chain's).")
profile_option = click.option("--profile", metavar="NAME", help="A profile of the AWS shared config files.")


def _traffic(verb: str, stats: TransferStats) -> str:
    skipped = f"; {stats.skipped} already there" if stats.skipped else ""
    return f"{verb} {plural(stats.objects, 'object')} ({size(stats.bytes)}){skipped}"


def _updates(updates: list[ModelUpdate], where: str) -> None:
    for u in updates:
        if u.status == "up-to-date":
            continue
        arrow = f"{short(u.old)} -> {short(u.new)}" if u.old else short(u.new)
        out.print(f"  {u.model:<30} {u.status:<13} {arrow}{f'  ({u.note})' if u.note else ''}")
    if not [u for u in updates if u.status != "up-to-date"]:
        out.print(f"  everything up to date {where}")


@click.group(name="remote", cls=SuggestingGroup)
def remote_group() -> None:
    """Remotes: where this repository is shared (a folder, s3://BUCKET/PREFIX,
    gs://BUCKET/PREFIX or az://CONTAINER/PREFIX).

    \b
    Examples:
      mgit remote add origin s3://team-models/bert --region eu-west-1
      mgit remote add shared /mnt/models/bert.mgit
      mgit remote show origin
    """


@remote_group.command(name="add")
@click.argument("name")
@click.argument("url")
@endpoint_option
@region_option
@profile_option
@json_option
@click.pass_context
def remote_add(
    ctx: click.Context,
    name: str,
    url: str,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Record a remote (nothing is contacted). Credentials are never stored: S3 remotes use
    the standard AWS chain (environment, ~/.aws files, --profile), GCS remotes Google's
    Application Default Credentials, Azure remotes AZURE_STORAGE_CONNECTION_STRING (or
    AZURE_STORAGE_ACCOUNT and AZURE_STORAGE_KEY, a service principal, a managed identity).

    \b
    Examples:
      mgit remote add origin s3://team-models/bert
      mgit remote add minio s3://models/bert --endpoint-url http://127.0.0.1:9000
      mgit remote add gcs gs://team-models/bert
      mgit remote add azure az://models/bert
      mgit remote add shared /mnt/models/bert.mgit
    """
    info = sync.add_remote(ctx.obj.repo(), name, url, endpoint_url=endpoint_url, region=region, profile=profile)
    if as_json:
        print_json(info.to_json())
    else:
        out.print(f"remote {info.name}: {info.url}")


@remote_group.command(name="ls")
@json_option
@click.pass_context
def remote_ls(ctx: click.Context, as_json: bool) -> None:
    """List remotes.

    \b
    Example:
      mgit remote ls
    """
    remotes = sync.list_remotes(ctx.obj.repo())
    if as_json:
        print_json([r.to_json() for r in remotes])
        return
    if not remotes:
        out.print("No remotes. Add one with: mgit remote add origin URL")
        return
    t = table("remote", "url", "endpoint", "region", "profile")
    for r in remotes:
        t.add_row(r.name, r.url, r.endpoint_url or "-", r.region or "-", r.profile or "-")
    out.print(t)


@remote_group.command(name="rm")
@click.argument("name")
@json_option
@click.pass_context
def remote_rm(ctx: click.Context, name: str, as_json: bool) -> None:
    """Forget a remote (and its remote-tracking heads); nothing on it changes.

    \b
    Example:
      mgit remote rm old-origin
    """
    info = sync.remove_remote(ctx.obj.repo(), name)
    if as_json:
        print_json(info.to_json())
    else:
        out.print(f"removed remote {info.name} ({info.url})")


@remote_group.command(name="show")
@click.argument("name", default=sync.DEFAULT_REMOTE)
@json_option
@click.pass_context
def remote_show(ctx: click.Context, name: str, as_json: bool) -> None:
    """How each model here compares with the remote: same, ahead, behind, diverged.

    \b
    Example:
      mgit remote show origin
    """
    result = sync.remote_show(ctx.obj.repo(), name)
    if as_json:
        print_json(result.to_json())
        return
    out.print(f"remote {result.remote.name}: {result.remote.url}")
    t = table("model", "state", "here", "there", "ahead", "behind")
    for m in result.models:
        t.add_row(m.model, m.state, short(m.local), short(m.remote), str(m.ahead), str(m.behind))
    out.print(t)


@click.command()
@click.argument("remote", default=sync.DEFAULT_REMOTE)
@click.argument("targets", nargs=-1, metavar="[REF|GLOB]...")
@click.option(
    "--force", is_flag=True, help="Move the remote's head even where it is not an ancestor (says what it drops)."
)
@click.option(
    "--delete", "deletes", multiple=True, metavar="NAME", help="Delete model NAME on the remote (nothing is pushed)."
)
@click.option("--prune", is_flag=True, help="Also delete on the remote the models removed here (mgit rm).")
@json_option
@click.pass_context
def push(
    ctx: click.Context,
    remote: str,
    targets: tuple[str, ...],
    force: bool,
    deletes: tuple[str, ...],
    prune: bool,
    as_json: bool,
) -> None:
    """Send models (default: every one) to a remote: only the objects it lacks travel, and
    its heads move by compare-and-swap, last. --delete and --prune take models off the
    remote by compare-and-swap from where this repository last fetched them (a push that
    landed since wins); their objects go at the remote's next gc (mgit gc --remote).

    \b
    Examples:
      mgit push
      mgit push origin 'bert-*'
      mgit push origin bert-sst2 --force
      mgit rm bert-old && mgit push origin --prune
      mgit push origin --delete bert-old
    """
    repo = ctx.obj.repo()
    if deletes:
        if targets or prune or force:
            raise click.UsageError("--delete takes no models to push, --prune or --force")
        deleted = sync.delete_remote_models(repo, remote, list(deletes))
        if as_json:
            print_json({"remote": remote, "deleted": [u.to_json() for u in deleted]})
            return
        _updates(deleted, "on " + remote)
        return
    with transfer_bar(f"Pushing to {remote}", enabled=not as_json) as bar:
        result = sync.push(repo, remote, list(targets) or None, force=force, progress=bar)
    deleted = sync.delete_remote_models(repo, remote, prune=True) if prune else []
    if as_json:
        print_json({**result.to_json(), "deleted": [u.to_json() for u in deleted]})
        return
    out.print(f"{result.url}: {_traffic('sent', result.sent)}, {plural(result.versions, 'version')}")
    _updates(result.models + deleted, "on " + result.remote)
    if result.checks.registrations or result.checks.results:
        out.print(f"  tests: {result.checks.registrations} registrations, {result.checks.results} results sent")
    _tag_lines(result.tags, "sent", result.remote)
    for note in result.notes:
        out.print(f"  {note}")


def _tag_lines(tags: TagsTravel, verb: str, remote: str) -> None:
    if tags.sent or tags.received:
        out.print(f"  tags: {plural(tags.sent or tags.received, 'version')}' tags {verb}")
    for ref in tags.conflicts:
        if verb == "sent":
            err.print(
                f"note: the tags of {ref} changed on {remote} since last seen; left as they are there (run: mgit pull)"
            )
        else:
            err.print(
                f"note: the tags of {ref} changed both here and on {remote}; the ones here are kept and the next "
                f"push sends them (to take {remote}'s instead, set them with mgit tag {ref})"
            )


def _print_fetch(result: FetchResult) -> None:
    lazy = " (lazy: objects come when read)" if result.lazy else ""
    out.print(f"{result.url}: {_traffic('received', result.received)}, {plural(result.versions, 'version')}{lazy}")
    for u in result.models:
        note = f" ({u.note})" if u.note else ""
        out.print(f"  {result.remote}/{u.model:<30} {short(u.old)} -> {short(u.new)}{note}")
    c = result.checks
    if c.registrations or c.results:
        out.print(f"  tests: {c.registrations} registrations, {c.results} results received")
    for name in c.differing:
        err.print(f"note: test {name} differs on {result.remote}; the one here is kept")


no_verify_option = click.option(
    "--no-verify", is_flag=True, help="Do not apply the signature policy (verify.require) to what arrives; said so."
)


def _say_no_verify(no_verify: bool) -> None:
    if no_verify:
        err.print("note: --no-verify: the signature policy (verify.require) is not applied to what arrives")


@click.command()
@click.argument("args", nargs=-1, metavar="[REMOTE] | --objects REF...")
@click.option("--models", metavar="GLOB", help="Only the models matching GLOB.")
@click.option(
    "--objects",
    "objects",
    is_flag=True,
    help="In a lazy clone: bring every object of the REFs here now, for work offline.",
)
@click.option("--prune", is_flag=True, help="Drop REMOTE/NAME of the models the remote no longer has.")
@no_verify_option
@json_option
@click.pass_context
def fetch(
    ctx: click.Context,
    args: tuple[str, ...],
    models: str | None,
    objects: bool,
    prune: bool,
    no_verify: bool,
    as_json: bool,
) -> None:
    """Bring a remote's new versions here (verified) and record its heads as REMOTE/NAME;
    local heads are not moved (mgit pull does that).

    \b
    Examples:
      mgit fetch
      mgit fetch origin --models 'bert-*'
      mgit fetch --prune
      mgit fetch --objects bert-sst2 bert-base@2
    """
    repo = ctx.obj.repo()
    if objects:
        if not args:
            raise click.UsageError("--objects needs the refs whose objects to fetch")
        stats = sync.prefetch(repo, list(args))
        if as_json:
            print_json(stats.to_json())
        else:
            out.print(_traffic("fetched", stats))
        return
    if len(args) > 1:
        raise click.UsageError("give one REMOTE (refs only with --objects)")
    _say_no_verify(no_verify)
    with transfer_bar("Fetching", enabled=not as_json) as bar:
        remote = args[0] if args else sync.DEFAULT_REMOTE
        result = sync.fetch(repo, remote, models=models, progress=bar, prune=prune, verify=not no_verify)
    if as_json:
        print_json(result.to_json())
    else:
        _print_fetch(result)


@click.command()
@click.argument("remote", default=sync.DEFAULT_REMOTE)
@click.option("--ff-only", is_flag=True, help="Refuse instead of replaying local versions after the remote's.")
@no_verify_option
@json_option
@click.pass_context
def pull(ctx: click.Context, remote: str, ff_only: bool, no_verify: bool, as_json: bool) -> None:
    """Fetch, then bring local heads up to the remote's. Where both sides added versions to
    a model, yours are replayed after the remote's (same content, new numbers).

    \b
    Examples:
      mgit pull
      mgit pull origin --ff-only
    """
    _say_no_verify(no_verify)
    with transfer_bar("Pulling", enabled=not as_json) as bar:
        result = sync.pull(ctx.obj.repo(), remote, ff_only=ff_only, progress=bar, verify=not no_verify)
    if as_json:
        print_json(result.to_json())
        return
    _print_fetch(result.fetch)
    _updates(result.models, "here")
    for r in result.renumbered:
        out.print(f"  renumbered {r.old_ref} -> {r.new_ref} (replayed after {result.fetch.remote}'s versions)")
    _tag_lines(result.tags, "received", result.fetch.remote)


@click.command()
@click.argument("url")
@click.argument("directory", required=False)
@click.option(
    "--models",
    metavar="GLOB",
    help="Only the models matching GLOB, whole; the versions they derive from come as records "
    "(remote-only: show and checkout fetch what they read).",
)
@click.option("--lazy", is_flag=True, help="Records only: objects are fetched when something reads them.")
@click.option(
    "--verify",
    "require",
    type=click.Choice(["signed", "trusted"]),
    help="Set verify.require in the new repository first: every version must be signed (by an allowed signer).",
)
@click.option("--allowed-signers", metavar="PATH", help="Set verify.allowed-signers in the new repository first.")
@no_verify_option
@endpoint_option
@region_option
@profile_option
@json_option
def clone(
    url: str,
    directory: str | None,
    models: str | None,
    lazy: bool,
    require: str | None,
    allowed_signers: str | None,
    no_verify: bool,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """A new repository from a remote, its remote named origin.

    \b
    Examples:
      mgit clone s3://team-models/bert bert
      mgit clone /mnt/models/bert.mgit --lazy --models 'bert-sst2*'
      mgit clone s3://team-models/bert --verify trusted --allowed-signers ~/.config/mgit/allowed_signers
    """
    settings = {"verify.require": require, "verify.allowed-signers": allowed_signers}
    _say_no_verify(no_verify)
    with transfer_bar("Cloning", enabled=not as_json) as bar:
        result = sync.clone(
            url,
            directory,
            models=models,
            lazy=lazy,
            endpoint_url=endpoint_url,
            region=region,
            profile=profile,
            progress=bar,
            verify=not no_verify,
            settings={k: v for k, v in settings.items() if v is not None},
        )
    if as_json:
        print_json(result.to_json())
        return
    _print_fetch(result.fetch)
    out.print(f"cloned {plural(len(result.models), 'model')} into {result.path}")


def gc_remote(repo: Repo, remote: str, expire: str, *, dry_run: bool, as_json: bool) -> None:
    """`mgit gc --remote NAME` (the gc command lives with the repository commands)."""
    result = sync.gc_remote(repo, remote, expire=sync.parse_expire(expire), dry_run=dry_run)
    if as_json:
        print_json(result.to_json())
        return
    if dry_run:
        for oid in result.removed:
            out.print(f"  would remove {oid}")
    verb = "would remove" if dry_run else "removed"
    out.print(
        f"{result.remote}: {verb} {plural(len(result.removed), 'object')} ({size(result.removed_bytes)}); kept "
        f"{result.kept} in use, {result.young} younger than {expire}, {result.leased} a running push relies on"
    )
