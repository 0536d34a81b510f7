"""`mgit lineage suggest PATH`: which stored versions a model was most likely derived from,
judged from its weights (attached to the `lineage` group by cli/lineage_cmd.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from mgit.cli.output import out, print_json, short, table

if TYPE_CHECKING:  # (`mgit lineage` attaches this command: parent inference loads when it runs)
    from mgit.lineage.inference import ParentCandidate, ParentSuggestion


def _distance(c: ParentCandidate) -> str:
    return "-" if c.distance is None else f"{c.distance:.2g}"


def _direction(c: ParentCandidate) -> str:
    return {"candidate -> query": "it -> model", "query -> candidate": "model -> it"}.get(c.direction, "?")


def print_suggestion(result: ParentSuggestion) -> None:
    """The ranked candidates as a table, the evidence for the best one, and the verdict."""
    out.print(
        f"Parents of {result.query} ({result.tensors} tensors) among {result.compared} stored versions "
        f"({result.seconds:.2f} s):"
    )
    if result.stored_as:
        out.print(f"  already stored as {', '.join(result.stored_as)} (every tensor bit for bit)")
    if not result.candidates:
        out.print(f"  none: {result.verdict}")
        return
    t = table(
        "#",
        "candidate",
        "id",
        "score",
        "confidence",
        "relation",
        "direction",
        "identical",
        "structure",
        "distance",
        "exact",
    )
    for i, c in enumerate(result.candidates, 1):
        relation = c.relation + (" (with another)" if c.merge_with else "")
        t.add_row(
            str(i),
            c.ref,
            short(c.version),
            f"{c.score:.2f}",
            f"{c.confidence:.2f}",
            relation,
            _direction(c),
            f"{c.identical:.0%}",
            f"{c.structure:.0%}",
            _distance(c),
            f"{c.exact:.0%}",
        )
    out.print(t)
    best = result.candidates[0]
    if best.reasons:
        out.print(f"Evidence for {best.ref}: " + "; ".join(best.reasons))
    for note in result.notes:
        out.print(f"note: {note}")
    if result.stored_as:
        out.print(f"Stored already: {result.verdict}")
    elif result.parents:
        out.print(f"Most likely parent: {result.verdict}")
    else:
        out.print(f"No confident parent: {result.verdict}")


@click.command()
@click.argument("path", type=click.Path(exists=False))
@click.option(
    "--limit", "-n", type=click.IntRange(1, 100), default=5, show_default=True, help="How many candidates to show."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def suggest(ctx: click.Context, path: str, limit: int, as_json: bool) -> None:
    """Rank stored versions as the likely parents of a model folder or file, from its weights.

    Evidence per candidate: the share of bit-identical tensors, the structural match (tensor
    names and shapes), the distance of sampled values and the share the candidate reproduces
    exactly (once cast or quantized the model's way). The guessed relation says how the model
    would derive from it (quantize, prune, adapter, merge, distill, finetune), "direction" the
    direction. The last line says what `mgit add --auto-parent` would choose.

    \b
    Examples:
      mgit lineage suggest ./bert-sst2-int8
      mgit lineage suggest ./merged-model --limit 3 --json
    """
    result = ctx.obj.repo().suggest_parents(path, limit=limit)
    if as_json:
        print_json(result.to_json())
    else:
        print_suggestion(result)
