"""`mgit graph`: the lineage graph, or a selection of it, as an interactive page, DOT or JSON."""

from __future__ import annotations

import json
from pathlib import Path

import click

from mgit.cli.output import out, plural
from mgit.errors import MgitError
from mgit.lineage import Lineage, LineageEdge, LineageGraph
from mgit.objects import RELATIONS
from mgit.repo import Repo
from mgit.web import VersionStorage, graph_json, render_dot, render_html

DEFAULT_HTML = "mgit-graph.html"


def select(lineage: Lineage, pattern: str | None, *, tag: str | None, relation: str | None,
           around: str | None, depth: int | None) -> list[str]:  # fmt: skip
    """The models the options name; every given criterion must hold."""
    names = lineage.select(pattern, tag=tag, relation=relation)
    if around is not None:
        centre = lineage.node(around).name
        near = {centre, *lineage.ancestors(centre, depth=depth), *lineage.descendants(centre, depth=depth)}
        names = [n for n in names if n in near]
    if not names:
        if not lineage.nodes:
            raise MgitError("no models yet", hint="Add one with: mgit add PATH --name NAME")
        asked = " ".join(f"{k} {v}" for k, v in (("name", pattern), ("--tag", tag), ("--relation", relation),
                                                  ("--around", around)) if v is not None)  # fmt: skip
        raise MgitError(f"no model matches {asked}", hint="See: mgit ls")
    return names


def storage(repo: Repo, graph: LineageGraph) -> dict[str, VersionStorage]:
    ids = [v.id for versions in graph.versions.values() for v in versions]
    return {vid: VersionStorage(stored, tensors) for vid, (stored, tensors) in repo.catalog.storage_by_version(ids).items()}


def outside(lineage: Lineage, graph: LineageGraph) -> list[LineageEdge]:
    """Edges between a model of the selection and one left out of it."""
    chosen = {n.name for n in graph.nodes}
    return [e for n in graph.nodes for e in [*lineage.parents(n.name), *lineage.children(n.name)]
            if (e.parent in chosen) != (e.child in chosen)]  # fmt: skip


@click.command()
@click.argument("pattern", required=False, metavar="[NAME_GLOB]")
@click.option("--tag", "-t", metavar="KEY[=VALUE]", help="Only models whose latest version has this tag.")
@click.option("--relation", "-r", type=click.Choice(RELATIONS), help="Only models derived by this relation.")
@click.option("--around", metavar="REF", help="Only this model, its ancestors and its descendants.")
@click.option("--depth", type=click.IntRange(min=0), help="With --around: how many generations each way.")
@click.option("--format", "-f", "fmt", type=click.Choice(["html", "dot", "json"]), default="html", show_default=True,
              help="An interactive page, Graphviz DOT, or JSON (compact, one line: pipe it to jq).")
@click.option("--output", "-o", type=click.Path(dir_okay=False), metavar="FILE",
              help=f"Where to write (default: {DEFAULT_HTML} for html, stdout for dot and json; '-' for stdout).")
@click.option("--json", "as_json", is_flag=True, help="Same as --format json.")
@click.pass_context
def graph(ctx: click.Context, pattern: str | None, tag: str | None, relation: str | None, around: str | None,
          depth: int | None, fmt: str, output: str | None, as_json: bool) -> None:  # fmt: skip
    """Draw the lineage graph (or a selection) as a page that works offline: pan, zoom, search,
    and click a model for its versions, sizes, parents, children and storage.

    \b
    Examples:
      mgit graph                                  # writes mgit-graph.html; open it in a browser
      mgit graph 'bert-*' --tag task -o bert.html
      mgit graph --around bert-base --depth 2 --format dot | dot -Tsvg > family.svg
      mgit graph --relation merge --json
    """
    if depth is not None and around is None:
        raise click.UsageError("--depth needs --around REF")
    fmt = "json" if as_json else fmt
    repo = ctx.obj.repo()
    lineage = repo.lineage
    around = repo.model_of(around) if around is not None else None  # NAME@N, a version id: its model
    chosen = lineage.subgraph(select(lineage, pattern, tag=tag, relation=relation, around=around, depth=depth))
    if fmt == "json":
        # Compact: the indented form takes the pure-Python encoder, 0.4 s for 5,000 versions.
        text = json.dumps(graph_json(chosen, storage=storage(repo, chosen)), separators=(",", ":")) + "\n"
    elif fmt == "dot":
        text = render_dot(chosen)
    else:
        scope = f" ({pattern})" if pattern else ""
        text = render_html(chosen, title=f"MGit lineage: {repo.root.name}{scope}", storage=storage(repo, chosen),
                           outside=outside(lineage, chosen))  # fmt: skip
        output = output or DEFAULT_HTML
    if output in (None, "-"):
        click.echo(text, nl=False)
        return
    Path(output).write_text(text, encoding="utf-8")
    edges = len(chosen.edges)
    out.print(f"{Path(output).resolve()}: {plural(len(chosen.nodes), 'model')}, {plural(edges, 'edge')}")


def register(group: click.Group) -> None:
    group.add_command(graph)
