"""Repository upkeep: fsck, gc (local, or a remote's with --remote) and rm.

Each is a few lines over one `Repo` call; `--json` prints the same result as data.
"""

from __future__ import annotations

import click

from mgit.cli.commands import _repo, jobs_option
from mgit.cli.output import json_option, out, plural, print_json, progress_bar, short, size


@click.command()
@click.argument("url", required=False)
@jobs_option
@click.option("--rebuild-catalog", is_flag=True, help="Drop and rebuild the SQLite catalog first.")
@click.option("--endpoint-url", metavar="URL", help="With an s3:// URL: an S3-compatible endpoint.")
@json_option
@click.pass_context
def fsck(
    ctx: click.Context,
    url: str | None,
    jobs: int | None,
    rebuild_catalog: bool,
    endpoint_url: str | None,
    as_json: bool,
) -> None:
    """Re-hash every object and check every reference. Exit code 1 if anything is wrong.

    With a URL (a bare remote: a folder or s3://BUCKET/PREFIX), checks that remote,
    downloading every object.

    \b
    Examples:
      mgit fsck
      mgit fsck s3://team-models/bert
    """
    if url is not None:
        from mgit.sync import fsck_remote

        result = fsck_remote(url, endpoint_url=endpoint_url, jobs=jobs or 4)
    else:
        repo = _repo(ctx)
        if rebuild_catalog:
            repo.rebuild_catalog()
        with progress_bar("Checking objects", enabled=not as_json, unit_bytes=False) as bar:
            result = repo.fsck(jobs=jobs, progress=bar)
    if as_json:
        print_json(result.to_json())
    else:
        for p in result.problems:
            users = f" (used by {', '.join(p.used_by)})" if p.used_by else ""
            out.print(f"{p.kind}: {short(p.object)} {p.message}{users}")
        verdict = "ok" if result.ok else f"{len(result.problems)} problems"
        out.print(
            f"checked {result.objects_checked} objects ({size(result.bytes_checked)}), {result.refs_checked} "
            f"models, {result.versions_checked} versions: {verdict}"
        )
        if result.leftovers:
            out.print(f"{result.leftovers} temporary files of interrupted writes; mgit gc removes them")
        if result.unreferenced:
            out.print(
                f"{result.unreferenced} unreferenced objects ({size(result.unreferenced_bytes)}): written by an "
                "interrupted add or left by a removed model; mgit gc removes them"
            )
    if not result.ok:
        ctx.exit(1)


@click.command()
@click.option("--dry-run", "-n", is_flag=True, help="Show what would be removed, remove nothing.")
@click.option("--remote", metavar="NAME", help="Collect a remote's garbage instead (NAME or URL).")
@click.option(
    "--expire",
    default="2w",
    show_default=True,
    metavar="AGE",
    help="With --remote: keep unreferenced objects younger than AGE (now, 30m, 12h, 3d, 2w).",
)
@json_option
@click.pass_context
def gc(ctx: click.Context, dry_run: bool, remote: str | None, expire: str, as_json: bool) -> None:
    """Remove objects that no model uses any more. With --remote, on a remote: what no ref
    there reaches, once older than --expire, and never what a running push relies on.

    \b
    Examples:
      mgit gc --dry-run
      mgit gc --remote origin --dry-run
    """
    if remote is not None:
        from mgit.cli.remote_cmd import gc_remote

        gc_remote(_repo(ctx), remote, expire, dry_run=dry_run, as_json=as_json)
        return
    result = _repo(ctx).gc(dry_run=dry_run)
    if as_json:
        print_json(result.to_json())
        return
    verb = "would remove" if dry_run else "removed"
    out.print(
        f"{verb} {len(result.removed)} objects ({size(result.removed_bytes)}) and {result.leftovers} "
        f"temporary files; {result.kept} objects in use"
    )


@click.command()
@click.argument("ref", metavar="NAME[@N]")
@click.option("--force", "-f", is_flag=True, help="Remove it even though other models or versions were built on it.")
@json_option
@click.pass_context
def rm(ctx: click.Context, ref: str, force: bool, as_json: bool) -> None:
    """Remove a model, or one version of it (NAME@N). Objects go at the next gc unless other
    versions use them. What others were built on is removed only with --force (their lineage
    keeps it). Removing a model's latest version moves the model back to the one before; the
    removed numbers are never given to another version.

    \b
    Examples:
      mgit rm bert-sst2-old && mgit gc
      mgit rm bert-sst2@4
    """
    repo = _repo(ctx)
    result = repo.rm(ref, force=force)
    if as_json:
        print_json(result.to_json())
        return
    if result.version is None:
        out.print(
            f"removed {result.model} ({plural(result.versions, 'version')}, head {short(result.head)}); "
            "run mgit gc to free space"
        )
        return
    where = (
        f"{result.model} has no version left"
        if result.head is None
        else f"{result.model} is at {repo.info(result.head).ref}"
    )
    kept = (
        f"; kept stored while {', '.join(result.kept_by)} build on it"
        if result.kept_by
        else "; run mgit gc to free space"
    )
    out.print(f"removed {result.model}@{result.seq} ({short(result.version)}); {where}{kept}")
