"""Training runs: `mgit prune-run`, which keeps some checkpoints of a run and removes the rest
(`mgit gc` then frees them). Checkpoints are made by the library (`Repo.commit_checkpoint`,
`mgit.integrations.transformers.MgitCallback`); `mgit log MODEL --metric NAME` reads a run.
"""

from __future__ import annotations

import click

from mgit.cli.output import json_option, out, plural, print_json, size, table


@click.command(name="prune-run")
@click.argument("model")
@click.option("--keep-last", type=click.IntRange(0), default=0, show_default=True, help="Keep the last N checkpoints.")
@click.option(
    "--keep-every", type=click.IntRange(1), default=None, help="Keep checkpoints whose step is a multiple of N."
)
@click.option("--keep-best", metavar="METRIC", default=None, help="Keep the checkpoint with the lowest METRIC.")
@click.option("--maximize", is_flag=True, help="With --keep-best: the highest METRIC is the best (an accuracy).")
@click.option("--dry-run", is_flag=True, help="List what would go and the bytes gc would free; change nothing.")
@json_option
@click.pass_context
def prune_run(
    ctx: click.Context,
    model: str,
    keep_last: int,
    keep_every: int | None,
    keep_best: str | None,
    maximize: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove the checkpoints of MODEL's run that no rule keeps. Always kept: the latest
    version, versions that are not checkpoints, tagged ones (`mgit tag MODEL@N release`), and
    any version another model derives from, with the history before it. The kept ones keep
    their numbers and stay one history; `mgit gc` then frees the removed ones' bytes.

    \b
    Examples:
      mgit prune-run ft-sst2 --keep-last 3 --keep-every 1000 --keep-best eval_loss --dry-run
      mgit prune-run ft-sst2 --keep-last 3 && mgit gc
    """
    result = ctx.obj.repo().prune_run(
        model, keep_last=keep_last, keep_every=keep_every, keep_best=keep_best, maximize=maximize, dry_run=dry_run
    )
    if as_json:
        print_json(result.to_json())
        return
    t = table("version", "step", "", "stored")
    for c in result.checkpoints:
        verdict = f"kept: {c.kept}" if c.kept else ("would remove" if dry_run else "removed")
        t.add_row(c.ref, "-" if c.step is None else c.step, verdict, size(c.stored_bytes) if c.kept is None else "")
    out.print(t)
    gone = plural(len(result.removed), "checkpoint")
    if dry_run:
        out.print(f"Would remove {gone} of {model}; gc would then free {size(result.freed_bytes)}.")
    elif result.removed:
        out.print(
            f"Removed {gone} of {model} ({plural(result.relinked, 'version')} linked again, "
            f"{plural(result.recoded, 'tensor')} coded again). Free {size(result.freed_bytes)} with: mgit gc"
        )
    else:
        out.print(f"Nothing to remove: every checkpoint of {model} is kept.")
