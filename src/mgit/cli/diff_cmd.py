"""`mgit diff`: a few lines over `Repo.diff` (or `mgit.diff.diff_paths` outside a repository)
and the printing of its result; `--json` prints the same result as data."""

from __future__ import annotations

import os
from typing import Any

import click

from mgit.cli.commands import jobs_option, json_option
from mgit.cli.output import err, out, plural, print_json, progress_bar, short, table
from mgit.diff import DiffResult, FileDiff, GroupDiff, TensorStats, diff_paths
from mgit.errors import RepoNotFoundError

WORDS = {
    "changed": "changed",
    "dtype": "dtype changed",
    "shape": "shape changed",
    "only_a": "only in A",
    "only_b": "only in B",
    "identical": "identical",
    "same": "same shape and dtype",
}
LISTED = 20  # structural differences shown without --tensors


@click.command()
@click.argument("a")
@click.argument("b")
@click.option(
    "--structural",
    is_flag=True,
    help="Compare only the module tree: names, shapes, dtypes, layer counts (no tensor data is read).",
)
@click.option("--tensors", "-v", "every_tensor", is_flag=True, help="List every tensor that differs.")
@jobs_option
@json_option
@click.pass_context
def diff(
    ctx: click.Context, a: str, b: str, structural: bool, every_tensor: bool, jobs: int | None, as_json: bool
) -> None:
    """Compare two models: tensors, layers, config and other text files.

    A and B are each a ref (NAME, NAME@N, NAME@HEXPREFIX) or the path of a model folder,
    .safetensors file or PyTorch checkpoint that need not be added. An argument that exists
    on disk is a path, anything else a ref: to compare a model whose name is also a folder
    here, name a version (NAME@N). Two paths can be compared outside a repository.

    Per layer: tensors only in A or B, shape or dtype changed, identical, changed, and for
    changed ones ||B-A||/||A||, max |B-A|, cosine similarity, the fraction of values that
    changed and, for matrices, the rank of B-A above what rounding to the dtype makes (a
    merged LoRA shows a low rank; "rounding" for a cast). The totals and each layer's row
    count every value both sides share, unchanged tensors included. --structural compares
    names, shapes and dtypes only: "same shape and dtype" says nothing of the values.

    \b
    Examples:
      mgit diff bert-base bert-sst2
      mgit diff bert-sst2@1 bert-sst2@2 --tensors
      mgit diff bert-sst2 ./bert-sst2-retrained --json
      mgit diff ./llama-7b ./llama-7b-pruned --structural
    """
    try:
        repo = ctx.obj.repo()
    except RepoNotFoundError:
        if not any(os.path.lexists(x) for x in (a, b)):
            raise
        repo = None
    with progress_bar("Comparing", enabled=not as_json) as bar:
        if repo is not None:
            result = repo.diff(a, b, structural=structural, jobs=jobs, progress=bar)
        else:
            result = diff_paths(a, b, structural=structural, jobs=jobs, progress=bar)
    adapters = _adapters(repo, a, b)
    if as_json:
        print_json({**result.to_json(), **({"adapters": adapters} if adapters else {})})
        return
    for note in result.notes:
        err.print(f"note: {note}")
    print_result(result, every_tensor=every_tensor)
    if adapters:
        print_adapters(adapters)


def _adapters(repo: Any, a: str, b: str) -> dict[str, Any] | None:
    """Two stored PEFT adapters compared as adapters (mgit.merging.adapters), else None."""
    if repo is None or any(os.path.lexists(x) for x in (a, b)):
        return None
    if not all(any(f.path == "adapter_config.json" for f in repo.manifest(x).files) for x in (a, b)):
        return None
    from mgit.merging.adapters import compare_adapters

    return compare_adapters(repo, a, b)


def print_adapters(c: dict[str, Any]) -> None:
    from mgit.cli.inspect_cmd import adapter_line

    out.print(f"Adapter A: {adapter_line(c['a'])}\nAdapter B: {adapter_line(c['b'])}")
    if not c["same_base"]:
        out.print("note: the adapters are stored on different bases")
    t = table("module", "rank A", "rank B", "||update A||", "||update B||", "||B-A|| / ||A||")
    for m in c["modules"]:
        norms = m.get("update_norm") or [None, None]
        ranks = [str(r) if r is not None else "-" for r in m["rank"]]
        t.add_row(m["module"], *ranks, _g(norms[0]), _g(norms[1]), _g(m.get("rel_difference")))
    out.print(t)
    out.print(
        f"Modules: {len(c['modules'])} in both, {len(c['only_in_a'])} only in A, {len(c['only_in_b'])} only in B"
        + "".join(
            f"\n  only in {s}: {', '.join(c[k][:5])}" for s, k in (("A", "only_in_a"), ("B", "only_in_b")) if c[k]
        )
    )


def print_result(r: DiffResult, *, every_tensor: bool) -> None:
    side = [f"{s.label} ({short(s.version)})" if s.version else s.label for s in (r.a, r.b)]
    out.print(f"A: {side[0]}\nB: {side[1]}")
    numbers = ("rel change", "max |B-A|", "min cosine", "max rank") if not r.structural else ()
    t = table("group", "tensors", "status", *numbers)
    for g in r.groups:
        cells = [_g(g.rel_change), _g(g.max_abs), _cos(g.min_cosine), _group_rank(g)] if numbers else []
        t.add_row(g.name, str(g.tensors), _statuses(g.counts), *cells)
    out.print(t)
    s = r.summary
    line = f"Total: {plural(s.tensors_a, 'tensor')} in A, {s.tensors_b} in B: {_statuses(s.counts)}"
    if s.compared_values:
        line += (
            f"; {s.changed_values:,} of {s.compared_values:,} shared values changed "
            f"({100 * s.changed_values / s.compared_values:.1f}%), rel change {_g(s.rel_change)} "
            f"(||B-A|| / ||A|| over all shared values), max |B-A| {_g(s.max_abs)}"
        )
    out.print(line)
    layers = [f"{k}: {n_a} -> {n_b}" for k, (n_a, n_b) in r.layers.items() if n_a != n_b]
    if layers:
        out.print("Layers: " + ", ".join(layers))
    _print_tensors(r, every_tensor)
    _print_files(r.files)


def _print_tensors(r: DiffResult, every_tensor: bool) -> None:
    differ = [t for t in r.tensors if t.status not in ("identical", "same")]
    shown = differ if every_tensor else [t for t in differ if t.stats is None][:LISTED]
    if not shown:
        return
    numbers = ("rel change", "max |B-A|", "cosine", "changed", "rank") if not r.structural else ()
    t = table("tensor", "status", "dtype", "shape", *numbers)
    for d in shown:
        dtype = d.dtype_a if d.dtype_a == d.dtype_b else f"{d.dtype_a or '-'} -> {d.dtype_b or '-'}"
        shape = _shape(d.shape_a) if d.shape_a == d.shape_b else f"{_shape(d.shape_a)} -> {_shape(d.shape_b)}"
        st = d.stats
        cells = (
            [_g(st.rel_change), _g(st.max_abs), _cos(st.cosine), f"{100 * st.changed_fraction:.1f}%", _rank(st)]
            if st
            else ["-"] * len(numbers)
        )
        t.add_row(d.name, WORDS[d.status], dtype, shape, *cells)
    out.print(t)
    hidden = len(differ) - len(shown)
    if hidden:
        out.print(
            f"... and {plural(hidden, 'more tensor')} that differ{'s' if hidden == 1 else ''} "
            "(list them with --tensors)"
        )


def _print_files(files: list[FileDiff]) -> None:
    if not files:
        return
    parts = [
        f"{f.path}{f' -> {f.path_b}' if f.path_b else ''} {WORDS[f.status]}" + (f" ({f.note})" if f.note else "")
        for f in files
    ]
    out.print("Files: " + ", ".join(parts))
    for f in files:
        if f.diff:
            out.print("\n".join(f.diff))


def _statuses(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {WORDS[s]}" for s, n in counts.items()) or "none"


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _cos(x: float | None) -> str:
    return "-" if x is None else f"{x:.6f}"


def _shape(shape: list[int] | None) -> str:
    return "-" if shape is None else "x".join(map(str, shape)) or "scalar"


def _rank(st: TensorStats) -> str:
    if st.rank == 0 and st.changed:  # B-A is what rounding to the dtype makes: a cast, not a low-rank change
        return "rounding"
    if st.rank is None:
        return "-"
    if st.rank == st.rank_of and not st.rank_capped:
        return f"full ({st.rank})"
    return f"{'>= ' if st.rank_capped else ''}{st.rank} of {st.rank_of}"


def _group_rank(g: GroupDiff) -> str:
    return "-" if g.max_rank is None else f"{'>= ' if g.rank_capped else ''}{g.max_rank}"
