"""`mgit merge`: model merging as a recorded, re-runnable derivation.

`merge(repo, ["ft-a", "ft-b"], method="ties", base="base", name="merged")` merges versions
of the repository (linear, slerp, task_arithmetic, ties, dare_linear, dare_ties, with
mergekit's semantics: mgit.merging.methods) and adds the result as a version with relation
`merge`, every input (the base included) as a lineage parent, and the merge itself as its
recipe (`mgit.merging.recipe:merge` with a MergeSpec as parameters): `mgit show` says how it
was made, and `mgit cascade` merges again when an input gets a new version (importing this
package registers with mgit.execution how a re-merge is stored: `derived_for_recipe`).
`merge_config(repo, "merge.yml", name=...)` takes mergekit's YAML config, its model names
resolved in the repository before any work is done.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from mgit.errors import InputError, InvalidOptionError
from mgit.execution import register_derived_chains
from mgit.formats.layers import layer_span
from mgit.merging.methods import METHODS
from mgit.merging.spec import (
    OUT_DTYPES,
    MergeConfig,
    MergeSpec,
    combine,
    layer_positions,
)
from mgit.repo.repository import Repo
from mgit.reports import AddResult
from mgit.util.parallel import StartProgress

RECIPE = "mgit.merging.recipe:merge"

__all__ = ["METHODS", "RECIPE", "MergeConfig", "MergeSpec", "derived_for_recipe", "merge", "merge_config"]


def merge(
    repo: Repo,
    refs: list[str],
    *,
    method: str,
    name: str,
    base: str | None = None,
    weights: dict[str, float] | None = None,
    density: dict[str, float] | float | None = None,
    parameters: dict[str, Any] | None = None,
    dtype: str | None = None,
    seed: int = 0,
    take: dict[str, str] | None = None,
    rename: list[tuple[str, str, str]] | None = None,
    file: str | None = None,
    message: str = "",
    progress: StartProgress | None = None,
) -> AddResult:
    """Merge these versions (refs, in order; `base` among them or added first) and add the
    result as the next version of `name`. `weights` and a per-input `density` are keyed by
    the refs as given (or their model names); a single `density` applies to every input.
    `take` maps tensor globs to the ref whose tensor is used unmerged (a task head);
    `rename` rules (glob, ref, prefix) keep that ref's matching tensors unmerged under
    prefix + name (both task heads of two task models). `file` names the merged weight file
    when the inputs are single files (by default the first input's name). `progress(total_bytes)` may
    return a callback that receives bytes as the merge, then the add, does them."""
    refs = list(refs)
    if base is not None and base not in refs:
        refs.insert(0, base)
    vids = [repo.resolve(r) for r in refs]
    if len(set(vids)) != len(vids):
        raise InvalidOptionError("a model is given twice", hint="Name each input once")
    position = _input_index(repo, refs, vids)
    inputs: list[dict[str, Any]] = [{} for _ in refs]
    for ref, w in (weights or {}).items():
        inputs[position(ref, "--weight")]["weight"] = w
    if isinstance(density, dict):
        for ref, d in density.items():
            inputs[position(ref, "--density")]["density"] = d
    elif density is not None:
        for i in range(len(inputs)):
            if "density" in METHODS.get(method, METHODS["linear"]).input_parameters:
                inputs[i]["density"] = density
    spec = MergeSpec.build(
        method,
        len(refs),
        base=None if base is None else refs.index(base),
        inputs=inputs,
        parameters=parameters,
        dtype=dtype,
        seed=seed,
        take=[(glob, position(ref, "--take")) for glob, ref in (take or {}).items()],
        rename=[(g, position(ref, "--rename"), x) for g, ref, x in rename or []],
        file=file,
    )
    return _run(repo, spec, vids, name=name, message=message, progress=progress)


def merge_config(
    repo: Repo,
    config: str | Path,
    *,
    name: str,
    message: str = "",
    seed: int = 0,
    file: str | None = None,
    progress: StartProgress | None = None,
) -> AddResult:
    """Merge as the mergekit YAML config at `config` says; `seed` for the DARE methods' masks,
    `file` as for `merge`."""
    path = Path(config)
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidOptionError(f"cannot read {path} ({exc.strerror or exc})") from None
    cfg = MergeConfig.parse(text, where=str(path))
    method = METHODS.get(cfg.method)
    if method is None:
        raise InvalidOptionError(f"unknown merge method {cfg.method!r}", hint=f"Use one of: {', '.join(METHODS)}")
    refs = [m for m, _ in cfg.models]
    for ref in [*refs, *([cfg.base] if cfg.base else [])]:
        repo.resolve(ref)  # every model named exists, before any work
    if cfg.layer_range is not None:
        layers = layer_span(t.name for t in repo.manifest(refs[0]).tensors())
        if cfg.layer_range != (0, layers):
            raise InvalidOptionError(
                f"{path}: layer_range {list(cfg.layer_range)} of models with {layers} layers: "
                "merging part of the layers changes the architecture",
                hint=f"Use layer_range: [0, {layers}]",
            )
    defaults = {k: v for k, v in cfg.parameters.items() if k in method.input_parameters}
    global_params = {k: v for k, v in cfg.parameters.items() if k not in method.input_parameters}
    per_model = {m: {k: combine(p.get(k), defaults.get(k)) for k in {*p, *defaults}} for m, p in cfg.models}
    base = cfg.base if method.needs_base or cfg.base in refs else None
    if base is not None and base not in refs:
        refs.insert(0, base)
        per_model[base] = {}
    vids = [repo.resolve(r) for r in refs]
    position = _input_index(repo, refs, vids)
    spec = MergeSpec.build(
        cfg.method,
        len(refs),
        base=None if base is None else refs.index(base),
        inputs=[per_model[r] if r != base or cfg.method == "linear" else {} for r in refs],
        parameters=global_params,
        dtype=cfg.dtype,
        seed=seed,
        take=[(glob, position(ref, "take")) for glob, ref in cfg.take],
        rename=[(g, position(ref, "rename"), x) for g, ref, x in cfg.rename],
        file=file,
    )
    try:
        return _run(repo, spec, vids, name=name, message=message, progress=progress)
    except InputError as exc:
        from mgit.merging.recipe import take_hint

        if exc.hint == take_hint(exc.path):  # --take is refused beside --config: point to the YAML
            exc.hint = take_hint(exc.path, config=True)
        raise


def _input_index(repo: Repo, refs: list[str], vids: list[str]) -> Any:
    """position(ref, option): the index among the merged inputs of a ref, or of a model name."""
    models = [repo.model_of(v) for v in vids]

    def position(ref: str, option: str) -> int:
        if ref in refs:
            return refs.index(ref)
        if ref in models:
            return models.index(ref)
        raise InvalidOptionError(
            f"{option} names {ref!r}, which is not one of the merged models", hint=f"Use one of: {', '.join(refs)}"
        )

    return position


def _run(
    repo: Repo, spec: MergeSpec, vids: list[str], *, name: str, message: str, progress: StartProgress | None = None
) -> AddResult:
    """Merge straight from the store into the add, tensor by tensor (each input read from
    its store, no checkout, nothing written to a temporary folder but the small files)."""
    from mgit.codecs.buffers import large_buffers
    from mgit.merging.recipe import StoreInput, streamed_source
    from mgit.repo.add import AddOptions

    record = repo.recipe_record(RECIPE, spec.to_params())
    derived = _derived(repo, spec, vids)
    with tempfile.TemporaryDirectory(prefix="mgit-merge-") as tmp, repo.caching() as cache, large_buffers():
        if repo.store.lazy:  # a lazy clone: what the merge reads, fetched at once
            repo.store.fetch({o for v in vids for o in repo.manifest(v).object_ids()})
        inputs = [StoreInput(repo.store, repo.manifest(v), cache, label=repo.model_of(v)) for v in vids]
        with streamed_source(inputs, Path(tmp), spec, exact={n: chain[0] for n, chain in derived.items()}) as source:
            return repo.add_with(
                source,
                AddOptions(
                    name=name,
                    parents=tuple(vids),
                    relation="merge",
                    model_card=False,
                    recipe=record,
                    message=message or f"{spec.method} merge of {len(vids)} models",
                    progress=progress,
                    exact=derived,
                ),
            )


def derived_for_recipe(repo: Repo, job: Any) -> dict[str, list[Any]]:
    """For a recipe job that re-runs a merge (a cascade's), the chains that store its output
    as weighted sums of its parents; nothing for any other recipe."""
    recipe = getattr(job, "recipe", None) or {}
    if recipe.get("fn") != RECIPE:
        return {}
    try:
        spec = MergeSpec.from_params(dict(recipe.get("params") or {}))
    except InvalidOptionError:
        return {}  # (the recipe itself refuses it)
    return _derived(repo, spec, list(job.parents)) if len(job.parents) == len(spec.inputs) else {}


def _derived(repo: Repo, spec: MergeSpec, vids: list[str]) -> dict[str, list[Any]]:
    """For a linear or task-arithmetic merge, the chain that stores each merged tensor as
    the weighted sum of its inputs' tensors (plus the XOR residual, zstd): tensors merged,
    of one float dtype in every input and the output."""
    from mgit.codecs import WeightedSumCodec, ZstdCodec
    from mgit.codecs.merged import DTYPES

    if spec.method not in ("linear", "task_arithmetic"):
        return {}
    out_dtype = OUT_DTYPES.get(spec.dtype or "")
    entries = [{t.name: t for t in repo.manifest(v).tensors()} for v in vids]
    anchor = spec.base if spec.method == "task_arithmetic" else None
    positions = layer_positions(entries[spec.base if spec.base is not None else 0])
    derived: dict[str, list[Any]] = {}
    for name, first in entries[0].items():
        found = [e.get(name) for e in entries]
        if any(t is None for t in found) or spec.taken_from(name) is not None or spec.renamed(name):
            continue
        dtypes = {t.dtype for t in found if t is not None}
        if len(dtypes) != 1 or first.dtype not in DTYPES or (out_dtype or first.dtype) != first.dtype:
            continue
        if len({t.shape for t in found if t is not None}) != 1:
            continue
        inputs, params = spec.resolve(name, positions.get(name, 0.0))
        weights = [float(p["weight"]) for i, p in enumerate(inputs) if i != anchor]
        codec = WeightedSumCodec(
            bases=[t.object for t in found if t is not None],
            weights=weights,
            anchor=-1 if anchor is None else anchor,
            normalize=bool(params["normalize"]),
            scale=float(params.get("lambda", 1.0)),
            dtype=first.dtype,
        )
        derived[name] = [codec, ZstdCodec(level=3)]
    return derived


register_derived_chains(RECIPE, derived_for_recipe)
