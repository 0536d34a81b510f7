"""Inspection commands: ls, log, show, du. They read and print; nothing here writes to the
repository (show --sha256 rebuilds files into a temporary folder and removes it).

Each is a few lines over one `Repo` call; `--json` prints the same result as data.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mgit.cli.output import (
    json_option,
    lossy_bound,
    out,
    parents_text,
    plural,
    print_json,
    run_text,
    short,
    signatures_text,
    size,
    sparkline,
    table,
)
from mgit.repo.repository import Repo
from mgit.reports import VersionInfo

if TYPE_CHECKING:
    from mgit.repo.tensors import TensorRow
from mgit.store.objects import RELATIONS


def _tensor_storage(counts: dict[str, int]) -> str:
    """'3 deduplicated, 100 delta, 0 derived, 3 standalone': how a user sees dedup happen."""
    kinds = ("deduplicated", "delta", "derived", "standalone")
    return ", ".join(f"{counts.get(k, 0)} {k}" for k in kinds)


def _lossy_mark(lossy: object) -> str:
    return " [lossy]" if lossy else ""


@click.command(name="ls")
@click.option("--tag", "tag", metavar="KEY[=VALUE]", default=None, help="Models whose latest version has this tag.")
@json_option
@click.pass_context
def ls(ctx: click.Context, tag: str | None, as_json: bool) -> None:
    """List models: latest version, parents and relation, size.

    \b
    Example:
      mgit ls --json
      mgit ls --tag stage=prod
    """
    models = ctx.obj.repo().ls(tag=tag)
    if as_json:
        print_json([m.to_json() for m in models])
        return
    if not models and tag is not None:
        out.print(f"No model's latest version has the tag {tag}. See: mgit log --tag {tag}")
        return
    if not models:
        out.print("No models yet. Add one with: mgit add PATH --name NAME")
        return
    t = table("model", "version", "id", "parents", "size", "updated")
    for m in models:
        t.add_row(
            m.name + _lossy_mark(m.lossy),
            f"@{m.seq}",
            short(m.head),
            parents_text(m.parents),
            size(m.logical_bytes),
            m.time[:19].replace("T", " "),
        )
    out.print(t)


def _version_line(v: VersionInfo) -> str:
    tags = " ".join(f"{k}={val}" for k, val in sorted(v.tags.items()))
    return "\n".join(
        line
        for line in [
            f"{v.ref} {v.id}{_lossy_mark(v.lossy)}{' [removed]' if v.removed else ''}",
            f"  date:    {v.time}",
            f"  author:  {v.author}",
            f"  parents: {parents_text(v.parents)}" if v.parents else "",
            f"  lossy:   {lossy_bound(v.lossy)}" if v.lossy else "",
            f"  tags:    {tags}" if tags else "",
            f"  step:    {run_text(v.run)}" if v.run else "",
            f"  size:    {size(v.logical_bytes)} in {plural(v.files, 'file')}, {plural(v.tensors, 'tensor')}; "
            f"{size(v.new_bytes)} new in storage",
            f"  {v.message}" if v.message else "",
        ]
        if line
    )


def adapter_line(a: dict[str, Any]) -> str:
    """A PEFT adapter in one line: type, rank, alpha, target modules, base."""
    if "error" in a:
        return f"unreadable ({a['error']})"
    targets = a["target_modules"]
    targets = ", ".join(targets) if isinstance(targets, list) else repr(targets)
    ranks = a.get("ranks") or []
    rank = f"rank {a['rank']}" if len(ranks) <= 1 and a.get("rank") else f"ranks {'/'.join(map(str, ranks))}"
    parts = [
        a["type"],
        rank if a.get("rank") or ranks else "",
        f"alpha {a['alpha']:g}" if a.get("alpha") is not None else "",
    ]
    parts += [f"{plural(a['modules'], 'module')} ({targets})", f"base {a['base'] or 'not stored'}"]
    named = a.get("base_model_name_or_path")
    return ", ".join(p for p in parts if p) + (f" (named {named!r})" if named and named != a.get("base") else "")


@click.command()
@click.argument("ref", required=False)
@click.option("--oneline", is_flag=True, help="One line per version: REF, id, date, the message's first line.")
@click.option("-n", "--max-count", "limit", type=click.IntRange(0), default=None, help="Show at most N versions.")
@click.option("--since", metavar="DATE", default=None, help="Versions made on or after DATE (2026-11-30, or a time).")
@click.option("--tag", "tag", metavar="KEY[=VALUE]", default=None, help="Versions tagged KEY (with VALUE).")
@click.option(
    "--relation", type=click.Choice(RELATIONS), default=None, help="Versions with a lineage parent of this relation."
)
@click.option(
    "--metric",
    metavar="NAME",
    default=None,
    help="A training run's metric at each checkpoint, oldest first: a table and a sparkline.",
)
@click.option(
    "--show-signature", is_flag=True, help="Who signed each version, and what does not verify (see: mgit verify)."
)
@json_option
@click.pass_context
def log(
    ctx: click.Context,
    ref: str | None,
    oneline: bool,
    limit: int | None,
    since: str | None,
    tag: str | None,
    relation: str | None,
    metric: str | None,
    show_signature: bool,
    as_json: bool,
) -> None:
    """Show the versions of a model, newest first; without a model, every version of every
    model, newest first.

    \b
    Examples:
      mgit log bert-sst2
      mgit log --oneline -n 10
      mgit log --since 2026-11-30 --tag task=sst2
      mgit log ft-sst2 --metric eval_loss
      mgit log bert-sst2 --show-signature
    """
    from mgit.store.objects import tag_matches

    repo = ctx.obj.repo()
    versions = repo.log(ref)
    if since is not None:
        versions = [v for v in versions if v.time >= since]
    if tag is not None:
        versions = [v for v in versions if tag_matches(tag, v.tags)]
    if relation is not None:
        versions = [v for v in versions if any(p.relation == relation for p in v.parents)]
    versions = versions[:limit] if limit is not None else versions
    if metric is not None:
        _metric(versions, metric, as_json)
        return
    signed = _signatures(repo, [v.id for v in versions]) if show_signature else {}
    if as_json:
        extra = lambda v: {"signatures": [c.to_dict() for c in signed[v.id]]} if show_signature else {}  # noqa: E731
        print_json([{**v.to_json(), **extra(v)} for v in versions])
        return
    if oneline:
        for v in versions:
            first = v.message.splitlines()[0] if v.message else ""
            step = f" [step {v.run['step']}]" if v.run and v.run["step"] is not None else ""
            line = f"{v.ref}{' [removed]' if v.removed else ''}{step} {short(v.id)} {v.time[:10]} {first}".rstrip()
            out.print(line + (f" [{signatures_text(signed[v.id])}]" if show_signature else ""))
        return
    sig_line = lambda v: f"\n  signatures: {signatures_text(signed[v.id])}" if show_signature else ""  # noqa: E731
    out.print("\n\n".join(_version_line(v) + sig_line(v) for v in versions))


def _signatures(repo: Repo, vids: list[str]) -> dict[str, list[Any]]:
    from mgit.signing.policy import signature_checks

    return signature_checks(repo.signatures, repo.config, vids)


def _metric(versions: list[VersionInfo], name: str, as_json: bool) -> None:
    """`log --metric NAME`: the checkpoints that logged it, oldest first."""
    from mgit.errors import InvalidOptionError

    points = [
        {"ref": v.ref, "id": v.id, "step": v.run["step"], "value": v.run["metrics"].get(name)}
        for v in reversed(versions)
        if v.run is not None and name in v.run["metrics"]
    ]
    if not points:
        raise InvalidOptionError(f"no checkpoint here logged metric {name!r}", hint="See: mgit log MODEL")
    if as_json:
        print_json(points)
        return
    t = table("version", "step", name)
    for p in points:
        t.add_row(p["ref"], "-" if p["step"] is None else p["step"], "-" if p["value"] is None else f"{p['value']:.6g}")
    out.print(t)
    known = [p for p in points if p["value"] is not None]
    if not known:  # a loss that diverged at every checkpoint is recorded as null
        out.print(f"{name}: no finite value at any checkpoint")
        return
    low, high = min(known, key=lambda p: p["value"]), max(known, key=lambda p: p["value"])
    out.print(
        f"{name}  {sparkline([p['value'] for p in points])}  "
        f"lowest {low['value']:.6g} at {low['ref']}, highest {high['value']:.6g} at {high['ref']}"
    )


@click.command()
@click.argument("ref")
@click.option(
    "--sha256",
    "with_sha256",
    is_flag=True,
    help="Also the sha256 of every file, as sha256sum prints it (the files are rebuilt to hash them).",
)
@click.option(
    "--tensors",
    "with_tensors",
    is_flag=True,
    help="Also every tensor: file, dtype, shape, codec chain, stored bytes, the other versions that share it.",
)
@json_option
@click.pass_context
def show(ctx: click.Context, ref: str, with_sha256: bool, with_tensors: bool, as_json: bool) -> None:
    """Show one version: files, tensors and parameters, dtypes, storage, parents. A file's
    blake3 is what MGit records; --sha256 rebuilds the files to print what sha256sum would.
    --tensors lists each tensor (in a lazy clone, those not fetched are said so, not fetched).

    \b
    Examples:
      mgit show bert-sst2@1
      mgit show bert-sst2 --sha256
      mgit show bert-sst2 --tensors --json
    """
    repo = ctx.obj.repo()
    result = repo.show(ref)
    sums = _sha256_of_files(repo, result.version.id) if with_sha256 else None
    vid = result.version.id
    rows = None
    if with_tensors:
        from mgit.repo.tensors import version_tensors  # (--tensors alone reads the tensors' table)

        rows = version_tensors(repo.store, repo.catalog, vid, repo.manifest(vid))
    checks = _signatures(repo, [vid])[vid]
    if as_json:
        extra = {"sha256": sums} if sums is not None else {}
        extra["signatures"] = [c.to_dict() for c in checks]
        print_json(
            {**result.to_json(), **extra, **({"tensors": [t.to_json() for t in rows]} if rows is not None else {})}
        )
        return
    v = result.version
    out.print(_version_line(v))
    out.print(f"  params:  {v.params:,} ({', '.join(f'{d} {n:,}' for d, n in sorted(result.dtypes.items()))})")
    out.print(
        f"  stored:  {size(v.stored_bytes)} for {size(v.logical_bytes)} "
        f"({result.shared_objects} objects shared with other versions)"
    )
    out.print(f"  tensors: {_tensor_storage(result.tensor_storage)}")
    out.print(f"  signatures: {signatures_text(checks)}")
    if result.quantization:
        out.print(f"  quantization: {result.quantization['label']}")
    if result.adapter:
        out.print(f"  adapter: {adapter_line(result.adapter)}")
    if result.training_args:
        trained = " ".join(
            f"{k}={json.dumps(val)}" for k, val in sorted(result.training_args.items()) if val is not None
        )
        out.print(f"  trained: {trained}")
    if v.recipe:
        params = " ".join(f"{k}={json.dumps(val)}" for k, val in sorted(v.recipe.get("params", {}).items()))
        out.print(f"  recipe:  {v.recipe.get('fn')} {params} (source {short(v.recipe.get('source_sha256'))})")
    out.print("")
    files = table("file", "type", "tensors", "size", "blake3")
    for f in result.files:
        kind = f.type + (f" (from {f.converted_from})" if f.converted_from else "")
        files.add_row(f.path, kind, str(f.tensors or ""), size(f.size), short(f.digest))
    out.print(files)
    storage = table("codec", "objects", "logical", "stored", "factor", title="storage")
    for s in result.storage:
        factor = f"{s.logical_bytes / s.stored_bytes:.2f}x" if s.stored_bytes else "-"
        storage.add_row(s.codec, str(s.objects), size(s.logical_bytes), size(s.stored_bytes), factor)
    out.print(storage)
    if rows is not None:
        _print_tensors(rows)
    if sums is not None:
        out.print("")
        for path, digest in sums.items():
            out.print(f"{digest}  {path}")  # as sha256sum prints it: `sha256sum -c` reads it back


def _print_tensors(rows: list[TensorRow]) -> None:
    t = table("file", "tensor", "dtype", "shape", "codec", "stored", "shared with", title="tensors")
    for r in rows:
        stored = size(r.stored_bytes) if r.stored_bytes is not None else "-"
        t.add_row(
            r.file,
            r.name,
            r.dtype,
            "x".join(map(str, r.shape)) or "scalar",
            r.codec or "-",
            stored if r.fetched else f"{stored} (not fetched)",
            ", ".join(r.shared_with) or "-",
        )
    out.print(t)


def _sha256_of_files(repo: Repo, version: str) -> dict[str, str]:
    """sha256 of each file of a version, from a verified checkout into a temporary folder
    inside the repository (the files are rebuilt, then hashed and removed)."""
    import hashlib
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sha256-", dir=repo.dir) as folder:
        done = repo.checkout(version, Path(folder) / "files")
        root = Path(done.out_dir)
        sums = {}
        for f in repo.manifest(version).files:
            with (root / f.path).open("rb") as fh:
                sums[f.path] = hashlib.file_digest(fh, "sha256").hexdigest()
        return sums


@click.command()
@json_option
@click.pass_context
def du(ctx: click.Context, as_json: bool) -> None:
    """Disk usage: logical bytes (every version as plain files) vs stored bytes.

    \b
    Example:
      mgit du
    """
    result = ctx.obj.repo().du()
    if as_json:
        print_json(result.to_json())
        return
    t = table("model", "versions", "logical", "stored", "factor", "tensors: dedup", "delta", "derived", "standalone")
    for m in result.models:
        t.add_row(
            m.name,
            str(m.versions),
            size(m.logical_bytes),
            size(m.stored_bytes),
            f"{m.reduction:.2f}x",
            *(str(m.tensor_storage.get(k, 0)) for k in ("deduplicated", "delta", "derived", "standalone")),
        )
    t.add_row(
        "repository",
        str(sum(m.versions for m in result.models)),
        size(result.logical_bytes),
        size(result.stored_bytes),
        f"{result.reduction:.2f}x",
    )
    out.print(t)
    out.print("(a model's stored bytes count every object it uses, shared ones included)")
    if result.local_bytes is not None:
        out.print(
            f"lazy clone: {size(result.local_bytes)} here, {size(result.remote_only_bytes)} on the remote only "
            "(fetched when read; mgit fetch --objects REF brings them now)"
        )
    if result.unreachable_bytes:
        out.print(f"{size(result.unreachable_bytes)} in objects no model uses; free them with: mgit gc")
