"""Repository commands: init, add, checkout (fsck, gc and rm are in upkeep_cmd, the inspection
commands in inspect_cmd).

Each is a few lines over one `Repo` call; `--json` prints the same result as data.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from mgit.cli.output import (
    err,
    json_option,
    lossy_bound,
    out,
    parents_text,
    plural,
    print_json,
    progress_bar,
    short,
    size,
)
from mgit.remotes import OBJECT_STORE_SCHEMES
from mgit.repo.repository import Repo
from mgit.store.lossy_policy import DEFAULT_GUARD, LossyPolicy
from mgit.store.objects import RELATIONS
from mgit.usercode import DEFAULT_TIMEOUT

jobs_option = click.option(
    "--jobs", "-j", type=click.IntRange(1, 64), default=None, help="Threads to use (default: one per core, at most 8)."
)


def _repo(ctx: click.Context) -> Repo:
    return ctx.obj.repo()


@click.command()
@click.argument("directory", default=".")
@click.option(
    "--bare",
    is_flag=True,
    help="A remote others push to: DIR itself (no .mgit), s3://BUCKET/PREFIX or az://CONTAINER/PREFIX.",
)
@click.option(
    "--endpoint-url",
    metavar="URL",
    help="With --bare s3://... or az://...: the endpoint (an S3-compatible server, an emulator).",
)
@click.option("--region", metavar="REGION", help="With --bare s3://...: the S3 region.")
@click.option("--profile", metavar="NAME", help="With --bare s3://...: a profile of the AWS shared config files.")
@click.option(
    "--packs/--no-packs",
    default=None,
    help="With --bare: send small objects in data packs (the default for s3://, gs://, az://; not for a folder).",
)
@json_option
def init(
    directory: str,
    bare: bool,
    endpoint_url: str | None,
    region: str | None,
    profile: str | None,
    packs: bool | None,
    as_json: bool,
) -> None:
    """Create an empty repository (DIR/.mgit), or with --bare an empty remote.

    \b
    Examples:
      mgit init models/
      mgit init --bare /mnt/shared/bert.mgit
      mgit init --bare s3://team-models/bert     (the bucket must exist)
      mgit init --bare --packs /mnt/shared/bert.mgit
    """
    if bare:
        from mgit.sync import init_bare

        info = init_bare(directory, endpoint_url=endpoint_url, region=region, profile=profile, packs=packs)
        path = info.url
    else:
        if directory.startswith(OBJECT_STORE_SCHEMES):
            raise click.UsageError(f"an {directory.split(':')[0]}:// location can only hold a bare remote: add --bare")
        path = str(Repo.init(directory).dir.absolute())  # as git says it: -C may have moved the start
    if as_json:
        print_json({"path": path, "bare": bare})
    else:
        out.print(f"Initialized empty mgit {'remote' if bare else 'repository'} in {path}")


def _parse_tags(tags: tuple[str, ...]) -> dict[str, str]:
    parsed = {}
    for t in tags:
        key, sep, value = t.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{t!r} is not key=value", param_hint="--tag")
        parsed[key] = value
    return parsed


def _parse_params(params: tuple[str, ...]) -> dict[str, object]:
    parsed: dict[str, object] = {}
    for p in params:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{p!r} is not key=value", param_hint="--param")
        try:
            parsed[key] = json.loads(value)
        except ValueError:
            parsed[key] = value
    return parsed


@click.command()
@click.argument("path", type=click.Path(exists=False))
@click.option(
    "--name",
    "-n",
    default=None,
    help="Model name (a new version if it exists). Default: the folder's name, or the file's without its suffix.",
)
@click.option(
    "--parent",
    "-p",
    "parents",
    multiple=True,
    metavar="REF",
    help="Lineage parent (repeat for merges). Default: the parents of the previous version.",
)
@click.option(
    "--relation",
    "-r",
    type=click.Choice(RELATIONS),
    default=None,
    help="How it was derived from its parents (default: finetune).",
)
@click.option("--message", "-m", default="", help="What changed.")
@click.option("--tag", "-t", "tags", multiple=True, metavar="KEY=VALUE", help="A tag (repeatable).")
@click.option(
    "--lossy",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="EPS",
    help="Store float tensors that changed from a parent tensor as a quantized change, every value within EPS "
    "(tensors without a parent tensor stay exact).",
)
@click.option(
    "--lossy-rel",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="R",
    help="Lossy bound relative to each tensor's change: |error| <= R x rms(new - parent).",
)
@click.option(
    "--guard",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_GUARD,
    show_default=True,
    help="Lossy fidelity guard: max ||recon - new|| / ||new - parent|| per tensor.",
)
@click.option(
    "--gate",
    default=None,
    metavar="MODULE:FUNCTION",
    help="Metric function (or FILE.py:FUNCTION) run on original and reconstruction; lossy only if it passes.",
)
@click.option(
    "--max-drop",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="How much a gate metric may get worse.",
)
@click.option(
    "--gate-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds the gate may take per run.",
)
@click.option(
    "--recipe",
    default=None,
    metavar="MODULE:FUNCTION",
    help="How this version was made from its parents: fn(parents, out_dir, **params) (recorded, not run).",
)
@click.option(
    "--param",
    "params",
    multiple=True,
    metavar="KEY=VALUE",
    help="A recipe parameter (repeatable; VALUE is JSON if it parses, else a string).",
)
@click.option(
    "--num-cpus",
    type=click.FloatRange(0, 1024),
    default=None,
    help="With --recipe: CPUs a run of it declares to a cluster (recorded).",
)
@click.option(
    "--num-gpus",
    type=click.FloatRange(0, 1024),
    default=None,
    help="With --recipe: GPUs a run of it declares to a cluster (recorded).",
)
@click.option(
    "--model-card/--no-model-card",
    default=True,
    show_default=True,
    help="Without --parent, take parents from base_model in the folder's README.md front matter"
    " (a .gguf file: from its general.base_model metadata).",
)
@click.option(
    "--auto-parent",
    is_flag=True,
    help="Without --parent, infer the parent and relation from the weights (see: mgit lineage suggest).",
)
@click.option("--sign", is_flag=True, help="Sign the version with signing.key (see: mgit sign).")
@jobs_option
@json_option
@click.pass_context
def add(
    ctx: click.Context,
    path: str,
    name: str | None,
    parents: tuple[str, ...],
    relation: str | None,
    message: str,
    tags: tuple[str, ...],
    lossy: float | None,
    lossy_rel: float | None,
    guard: float,
    gate: str | None,
    max_drop: float,
    gate_timeout: float,
    recipe: str | None,
    params: tuple[str, ...],
    num_cpus: float | None,
    num_gpus: float | None,
    model_card: bool,
    auto_parent: bool,
    sign: bool,
    jobs: int | None,
    as_json: bool,
) -> None:
    """Store a model folder, a .safetensors file or a PyTorch checkpoint as a new version.

    \b
    Examples:
      mgit add ./bert-base
      mgit add ./bert-sst2 --name bert-sst2 --parent bert-base -m "SST-2, 3 epochs"
      mgit add ckpt.pt --name tiny --tag stage=dev
      mgit add ./bert-sst2-int8 --name bert-sst2-int8 --auto-parent
      mgit add ./bert-sst2 --name bert-sst2 --lossy 1e-4 --gate evals.py:sst2 --max-drop 0.002
      mgit add ./bert-int8 --name bert-int8 --parent bert-sst2 --relation quantize \\
          --recipe recipes.py:quantize --param bits=8 --num-gpus 1
    """
    from mgit.repo.add import AddOptions
    from mgit.repo.gate import Gate

    if recipe is None and (num_cpus is not None or num_gpus is not None):
        raise click.UsageError("--num-cpus and --num-gpus are recorded with a recipe: add --recipe")
    repo = _repo(ctx)
    if name is None:
        name = default_model_name(Path(path))
        if not as_json:
            err.print(
                f"note: no --name: the model is named {name!r} "
                f"after {'its folder' if Path(path).is_dir() else 'its file'}"
            )
    with progress_bar(f"Adding {name}", enabled=not as_json) as bar:
        options = AddOptions(
            name=name,
            parents=parents,
            relation=relation,
            message=message,
            tags=_parse_tags(tags),
            jobs=jobs,
            progress=bar,
            lossy=LossyPolicy.from_options(lossy, lossy_rel, guard),
            gate=Gate(gate, max_drop, gate_timeout) if gate is not None else None,
            model_card=model_card,
            recipe=recipe,
            params=_parse_params(params),
            auto_parent=auto_parent,
            resources={"num_cpus": num_cpus, "num_gpus": num_gpus},
            sign=sign,
        )
        result = repo.add_with(path, options)
    if as_json:
        print_json(result.to_json())
        return
    for note in result.notes:
        err.print(f"note: {note}")
    if result.lossless_reason:
        err.print(f"note: stored losslessly: {result.lossless_reason}")
    if not result.created:
        out.print(f"{result.model}@{result.seq} {short(result.version)}: unchanged (same content as the head)")
        return
    dedup = result.tensors - result.tensors_new
    out.print(
        f"{result.model}@{result.seq} {short(result.version)}: {plural(result.files, 'file')}, "
        f"{plural(result.tensors, 'tensor')} ({dedup} already stored), {size(result.logical_bytes)} -> "
        f"{size(result.new_bytes)} new"
        + (
            f" ({size(result.reused_bytes)} of it found already written by an interrupted add, reused)"
            if result.reused_bytes
            else ""
        )
        + (f"; parents: {parents_text(result.parents)}" if result.parents else "")
        + (f"; lossy: {lossy_bound(result.lossy)}" if result.lossy else "")
        + (f"; signed by {result.signed_by}" if result.signed_by else "")
    )


@click.command()
@click.argument("ref")
@click.option(
    "--output",
    "-o",
    default=None,
    type=click.Path(),
    help="Folder to write the files into. Default: ./NAME (the model's name, its last part for ORG/NAME).",
)
@click.option(
    "--force",
    "-f",
    is_flag=True,
    help="Write into a folder that is not empty (refused if it holds files the version does not).",
)
@click.option(
    "--clean",
    is_flag=True,
    help="With or without --force: remove the folder's files the version does not hold, so that it holds "
    "exactly the version (each is named).",
)
@click.option(
    "--model-card",
    is_flag=True,
    help="Write the lineage parents into README.md's front matter (base_model, base_model_relation).",
)
@click.option(
    "--model-signature",
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help="Then sign the folder with signing.key (an ECDSA OpenSSH key) in OpenSSF model-signing's format; "
    "model_signing verify key checks it. Inside the folder, name it model.sig.",
)
@click.option("--no-verify", is_flag=True, help="Check out even a version verify.require refuses (said so).")
@jobs_option
@json_option
@click.pass_context
def checkout(
    ctx: click.Context,
    ref: str,
    output: str | None,
    force: bool,
    clean: bool,
    model_card: bool,
    model_signature: str | None,
    no_verify: bool,
    jobs: int | None,
    as_json: bool,
) -> None:
    """Rebuild the files of a version, byte for byte (each file is verified).

    \b
    Examples:
      mgit checkout bert-sst2
      mgit checkout bert-sst2@2 -o /tmp/old --force
      mgit checkout bert-sst2 -o ./publish --model-card
      mgit checkout bert-sst2 -o ./publish --model-signature ./publish/model.sig
    """
    repo = _repo(ctx)
    if output is None:
        output = repo.model_of(repo.resolve(ref)).rpartition("/")[2]
    if no_verify:
        err.print("note: --no-verify: the signature policy (verify.require) is not checked")
    with progress_bar(f"Checking out {ref}", enabled=not as_json) as bar:
        options = {"force": force, "clean": clean, "jobs": jobs, "model_card": model_card, "verify": not no_verify}
        result = repo.checkout(ref, output, progress=bar, model_signature=model_signature, **options)
    if as_json:
        print_json(result.to_json())
        return
    for note in result.notes:
        err.print(f"note: {note}")
    out.print(
        f"{result.model}@{result.seq} {short(result.version)}: {plural(len(result.files), 'file')}, "
        f"{size(result.bytes)} written to {result.out_dir} (verified)"
    )
    if result.model_signature is not None:
        out.print(f"signed by {result.signer}: {result.model_signature}")


def default_model_name(path: Path) -> str:
    """What `add PATH` names a model without --name: the folder's name (of `.`, the folder
    it is), or a file's name without its suffix."""
    resolved = path.resolve()
    return resolved.name if path.is_dir() else resolved.stem
