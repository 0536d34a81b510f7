"""`mgit import-hf` and `mgit export-hf`: the Hugging Face cache, into the repository and back."""

from __future__ import annotations

import click

from mgit.cli.output import err, out, plural, print_json, progress_bar, short, size


@click.command(name="import-hf")
@click.argument("cache_dir", required=False, type=click.Path(file_okay=True, dir_okay=True))
@click.option("--dry-run", "-n", is_flag=True, help="Show what would be imported, import nothing.")
@click.option(
    "--auto-parent",
    is_flag=True,
    help="For models whose card names no base_model here, infer the parent from the weights.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def import_hf(ctx: click.Context, cache_dir: str | None, dry_run: bool, auto_parent: bool, as_json: bool) -> None:
    """Import the Hugging Face cache: each cached model repository becomes a model (named by
    its hub id), each cached revision a version (refs/main the latest), lineage from the model
    cards' base_model. Datasets, spaces and interrupted downloads are skipped with a warning.
    Running it again imports only revisions that appeared since. CACHE_DIR defaults to the
    cache huggingface_hub uses ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub).

    \b
    Examples:
      mgit import-hf --dry-run
      mgit import-hf ~/.cache/huggingface/hub --auto-parent
    """
    from mgit.hf import import_cache

    repo = ctx.obj.repo()
    with progress_bar("Importing", enabled=not as_json and not dry_run) as bar:
        result = import_cache(repo, cache_dir, dry_run=dry_run, auto_parent=auto_parent, progress=bar)
    if as_json:
        print_json({**result.to_json(), "models": result.models})
        return
    for r in result.imported:
        refs = f" ({', '.join(r.refs)})" if r.refs else ""
        parents = f"; parents: {', '.join(r.parents)} ({r.relation})" if r.parents else ""
        stored = f" -> {size(r.new_bytes)} new" if not dry_run else ""
        out.print(
            f"{'would import ' if dry_run else ''}{r.ref} {short(r.version) if r.version else ''}".rstrip()
            + f": {r.repo_id} revision {r.commit[:12]}{refs}, {size(r.logical_bytes)}{stored}{parents}"
        )
    for note in result.notes:
        err.print(f"note: {note}")
    for warning in result.skipped:
        err.print(f"warning: skipped {warning}")
    verb = "would import" if dry_run else "imported"
    out.print(
        f"{verb} {plural(len(result.imported), 'revision')} of {plural(len(result.models), 'model')} "
        f"({result.already_imported} imported before, {len(result.skipped)} skipped); "
        f"cache {size(result.cache_bytes)} on disk, repository {size(result.repository_bytes)} stored"
    )


@click.command(name="export-hf")
@click.argument("ref")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="The cache to write into (default: the one huggingface_hub uses).",
)
@click.option(
    "--repo-id",
    default=None,
    metavar="ORG/NAME",
    help="The hub id to write it as (default: the id it was imported from, else the model name).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def export_hf(ctx: click.Context, ref: str, cache_dir: str | None, repo_id: str | None, as_json: bool) -> None:
    """Write a version into the Hugging Face cache layout (blobs, snapshots, refs/main), so
    that transformers loads it offline: AutoModel.from_pretrained("ORG/NAME", local_files_only=True).

    \b
    Examples:
      mgit export-hf acme/bert-sst2
      mgit export-hf bert-sst2@2 --repo-id acme/bert-sst2 --cache-dir ./hf-cache
    """
    from mgit.hf import export_to_cache

    repo = ctx.obj.repo()
    with progress_bar(f"Exporting {ref}", enabled=not as_json) as bar:
        result = export_to_cache(repo, ref, cache_dir=cache_dir, repo_id=repo_id, progress=bar)
    if as_json:
        print_json(result.to_json())
        return
    for note in result.notes:
        err.print(f"note: {note}")
    out.print(
        f"{result.ref} {short(result.version)}: {result.repo_id} at commit {result.commit[:12]} (refs/main), "
        f"{plural(result.files, 'file')}, {plural(result.blobs_written, 'new blob')} "
        f"({size(result.bytes_written)}) in {result.cache_dir}"
    )
    where = "" if cache_dir is None else f", cache_dir={result.cache_dir!r}"
    out.print(f"load it with: AutoModel.from_pretrained({result.repo_id!r}{where}, local_files_only=True)")
