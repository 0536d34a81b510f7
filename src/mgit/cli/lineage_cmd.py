"""`mgit lineage`: the lineage graph as a tree in the terminal (and its subcommands)."""

from __future__ import annotations

import click

from mgit.cli.output import out, print_json, size
from mgit.cli.suggest_cmd import suggest
from mgit.lineage.graph import LineageEdge, ModelNode, TreeNode


class LineageGroup(click.Group):
    """`mgit lineage [REF]` prints a tree; `mgit lineage suggest PATH` is a subcommand. Any
    first word that is not a subcommand goes to `tree`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            args = ["tree", *args]
        return super().parse_args(ctx, args)


@click.group(cls=LineageGroup)
def lineage() -> None:
    """The lineage graph: which model was derived from which.

    Without a subcommand, prints the tree (see `mgit lineage tree --help`).

    \b
    Examples:
      mgit lineage                 every model, from the roots down
      mgit lineage bert-base       bert-base and everything derived from it
      mgit lineage bert-sst2-int8 --up
      mgit lineage suggest ./unknown-model   which stored models it may come from
    """


def _label(node: ModelNode, edge: LineageEdge | None) -> str:
    """`bert-sst2@2  finetune  86.7 MiB  [lossy]  (stale: built on bert-base@1, latest @2)`:
    the edge is the one that led to this line (to a child going down, to a parent going up)."""
    parts = [f"{node.name}@{node.seq}"]
    if edge is not None:
        parts.append(edge.relation)
    parts.append(size(node.logical_bytes))
    if node.lossy:
        parts.append("[lossy]")
    if node.removed:
        parts.append("[removed]")
    if node.remote_only:
        parts.append("[remote-only]")
    if edge is not None and edge.stale:
        parts.append(f"(stale: {edge.child} built on {edge.parent_ref}, latest @{edge.latest_seq})")
    return "  ".join(parts)


def _lines(tree: TreeNode, prefix: str, last: bool, top: bool) -> list[str]:
    label = _label(tree.model, tree.edge)
    if tree.repeated:
        label = f"{tree.model.name}@{tree.model.seq}  {tree.edge.relation if tree.edge else ''}  (shown above)"
    lines = [label if top else f"{prefix}{'└── ' if last else '├── '}{label}"]
    inner = "" if top else prefix + ("    " if last else "│   ")
    for i, kid in enumerate(tree.children):
        lines += _lines(kid, inner, i == len(tree.children) - 1, False)
    return lines


@lineage.command()
@click.argument("ref", required=False)
@click.option("--up", "direction", flag_value="up", help="Show ancestors (what REF was derived from).")
@click.option("--down", "direction", flag_value="down", help="Show descendants (the default).")
@click.option("--depth", type=click.IntRange(1), default=None, help="Levels to show (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the tree as JSON.")
@click.pass_context
def tree(ctx: click.Context, ref: str | None, direction: str | None, depth: int | None, as_json: bool) -> None:
    """A lineage tree: relation, version, size, lossy mark and staleness of each model.

    REF is a model (NAME, NAME@N or a version id; the tree is that model's). A merge has
    several parents: it is printed once, and marked "(shown above)" the other times. A
    stale model was built on a version of its parent that is no longer the latest.

    \b
    Examples:
      mgit lineage tree bert-base --depth 2
      mgit lineage bert-sst2 --up --json
    """
    repo = ctx.obj.repo()
    name = repo.model_of(ref) if ref else None
    graph = repo.lineage
    up = direction == "up"
    trees = graph.tree(name, up=up, depth=depth)
    if as_json:
        print_json([t.to_json() for t in trees])
        return
    if not trees:
        out.print("No models yet. Add one with: mgit add PATH --name NAME")
        return
    for t in trees:
        for line in _lines(t, "", True, True):
            out.print(line)


lineage.add_command(suggest)
