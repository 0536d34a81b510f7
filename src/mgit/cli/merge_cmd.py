"""`mgit merge`: merge models of the repository into a new version, recorded as a recipe."""

from __future__ import annotations

import click

from mgit.cli.output import out, print_json, progress_bar


def _pairs(values: tuple[str, ...], option: str, cast: type = float) -> dict[str, object]:
    pairs: dict[str, object] = {}
    for value in values:
        key, sep, number = value.rpartition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not REF=VALUE", param_hint=option)
        try:
            pairs[key] = cast(number)
        except ValueError:
            raise click.BadParameter(f"{number!r} in {value!r} is not a {cast.__name__}", param_hint=option) from None
    return pairs


@click.command()
@click.argument("refs", nargs=-1)
@click.option(
    "--method",
    default=None,
    metavar="METHOD",
    help="linear, slerp, task_arithmetic, ties, dare_linear or dare_ties (mergekit's semantics).",
)
@click.option(
    "--config",
    "config",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="A mergekit YAML config (models, merge_method, base_model, parameters, dtype); names resolved here.",
)
@click.option("--base", default=None, metavar="REF", help="The base model (task-vector methods and slerp).")
@click.option("--weight", "weights", multiple=True, metavar="REF=W", help="An input's weight (repeatable; default 1).")
@click.option(
    "--density",
    "densities",
    multiple=True,
    metavar="[REF=]D",
    help="Fraction of a task vector kept (ties, dare): for every input, or REF=D for one.",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A method parameter: t (slerp), normalize, lambda, rescale, int8_mask.",
)
@click.option(
    "--dtype",
    default=None,
    type=click.Choice(["float32", "float16", "bfloat16"]),
    help="Output dtype of float tensors (default: the base's).",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**32 - 1),
    default=0,
    show_default=True,
    help="Seed of the DARE masks (recorded: a re-run gives the same bytes).",
)
@click.option(
    "--take",
    "takes",
    multiple=True,
    metavar="GLOB=REF",
    help="Tensors matching GLOB come unmerged from REF (a task head); repeatable.",
)
@click.option(
    "--rename",
    "renames",
    multiple=True,
    metavar="GLOB=REF:PREFIX",
    help="REF's tensors matching GLOB kept unmerged as PREFIX + name (both task heads); repeatable.",
)
@click.option(
    "--file",
    "file",
    default=None,
    metavar="NAME",
    help="The merged weight file's name, for inputs of one file each (default: the first input's).",
)
@click.option(
    "--adapter",
    default=None,
    metavar="REF",
    help="A PEFT adapter (LoRA, DoRA, IA3) to merge into its base (its parent, or --base), as peft does.",
)
@click.option("--name", required=True, help="The model the merge is added to.")
@click.option("-m", "--message", default="", help="The version's message.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.pass_context
def merge(
    ctx: click.Context,
    refs: tuple[str, ...],
    method: str | None,
    config: str | None,
    base: str | None,
    weights: tuple[str, ...],
    densities: tuple[str, ...],
    params: tuple[str, ...],
    dtype: str | None,
    seed: int,
    takes: tuple[str, ...],
    renames: tuple[str, ...],
    file: str | None,
    adapter: str | None,
    name: str,
    message: str,
    as_json: bool,
) -> None:
    """Merge models into a new version of NAME: relation merge, every input a parent, the merge
    its recipe (so `mgit cascade` merges again when an input gets a new version).

    \b
    Examples:
      mgit merge ft-sst2 ft-mnli --method task_arithmetic --base bert-base --weight ft-sst2=0.6 \\
          --weight ft-mnli=0.4 --take 'classifier.*=ft-sst2' --name bert-multi
      mgit merge ft-sst2 ft-mnli --method task_arithmetic --base bert-base \\
          --rename 'classifier.*=ft-sst2:sst2.' --rename 'classifier.*=ft-mnli:mnli.' --name bert-two-heads
      mgit merge ft-a ft-b --method ties --base base --density 0.5 --name merged
      mgit merge base ft --method slerp --base base --param t=0.3 --name halfway
      mgit merge --config merge.yml --name merged
      mgit merge ft_a ft_b --method task_arithmetic --base base --file merged.safetensors --name merged
      mgit merge --adapter llama-lora --name llama-lora-merged
    """
    from mgit.merging import merge as merge_refs
    from mgit.merging import merge_config

    repo = ctx.obj.repo()
    if adapter is not None:
        if refs or method or config or weights or densities or params or dtype or takes or renames or file:
            raise click.UsageError(
                "--adapter merges one adapter into its base; give it alone (with --base, --name, -m)"
            )
        from mgit.merging.adapters import merge_adapter

        result = merge_adapter(repo, adapter, name=name, base=base, message=message)
    elif config is not None:
        if refs or method or base or weights or densities or params or dtype or takes or renames:
            raise click.UsageError(
                "--config says everything the merge needs; give it alone (with --name, -m, --seed, --file)"
            )
        with progress_bar(f"Merging into {name}", enabled=not as_json) as bar:
            result = merge_config(repo, config, name=name, message=message, seed=seed, file=file, progress=bar)
    else:
        if method is None or len(refs) + (base is not None and base not in refs) < 2:
            raise click.UsageError("give two or more REFs and --method (or --config FILE)")
        density: dict[str, object] | float | None = None
        if densities:
            plain = [d for d in densities if "=" not in d]
            if plain and len(densities) > 1:
                raise click.BadParameter("give one --density D, or REF=D for each input", param_hint="--density")
            density = float(plain[0]) if plain else _pairs(densities, "--density")
        parameters = {k: _value(v) for k, v in _pairs(params, "--param", str).items()}
        with progress_bar(f"Merging into {name}", enabled=not as_json) as bar:
            result = merge_refs(
                repo,
                list(refs),
                method=method,
                name=name,
                base=base,
                weights=_pairs(weights, "--weight"),
                density=density,
                parameters=parameters,  # type: ignore[arg-type]
                dtype=dtype,
                seed=seed,
                take={g: str(r) for g, r in _pairs(takes, "--take", str).items()},
                rename=[_rename(r) for r in renames],
                file=file,
                message=message,
                progress=bar,
            )
    if as_json:
        print_json(result.to_json())
        return
    parents = ", ".join(f"{p.ref}" for p in result.parents) if result.parents else "-"
    out.print(
        f"{result.model}@{result.seq} {result.version[:12]}: merge of {parents}"
        + ("" if result.created else " (unchanged: same as the latest version)")
    )


def _rename(rule: str) -> tuple[str, str, str]:
    glob, sep, target = rule.partition("=")
    ref, colon, prefix = target.rpartition(":")
    if not sep or not colon or not glob or not ref or not prefix:
        raise click.BadParameter(f"{rule!r} is not GLOB=REF:PREFIX", param_hint="--rename")
    return glob, ref, prefix


def _value(text: object) -> object:
    """A --param value: true/false, a number, else the text."""
    s = str(text)
    if s.lower() in ("true", "false"):
        return s.lower() == "true"
    try:
        return float(s)
    except ValueError:
        return s
