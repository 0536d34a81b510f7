"""Merging a PEFT adapter into its base: `mgit merge --adapter REF`, as a recorded, re-runnable
derivation.

The arithmetic is peft's `merge_and_unload`, operation for operation in torch (so that the
merged weights are peft's, bit for bit on the same machine): LoRA adds B A x scale to each
adapted weight (alpha / r, alpha / sqrt(r) with rsLoRA; A and B upcast to float32 when they are
half precision, as peft loads them; an embedding's product transposed); DoRA then rescales each
output row by its magnitude over the norm of the updated row; IA3 multiplies a weight's rows
(its columns for a feed-forward module) and the bias of a non-feed-forward module by its
vector. Tensors of modules the adapter saves whole (a task head) replace the base's. Other
adapter types are refused (they load with `mgit.load_pretrained`, through peft).

The merged version has two lineage parents, the base and the adapter, relation `merge`, and
this module's `merge` as its recipe (parents in that order), so `mgit cascade` merges the
adapter again into a new version of the base. A LoRA-merged matrix is stored as the base's
tensor plus scale x B A of the adapter's own stored factors (`lora_merge`, with an exact
residual: zeros where the merge is reproduced), so the merged model costs little beyond the
adapter; `mgit add` of a model merged by peft itself, with the base and the adapter as its
parents, is stored the same way: the add finds these chains from its parents
(mgit.repo.adapters.merged_chains), so a cascade's re-merge is stored so too.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mgit.errors import InputError, InvalidOptionError, MissingDependencyError
from mgit.formats.adapter import CONFIG, PREFIX, WEIGHTS, Adapter, fit
from mgit.repo.adapters import RELATION, folder_adapter, stored_adapter
from mgit.repo.repository import Repo
from mgit.reports import AddResult

RECIPE = "mgit.merging.adapters:merge"

__all__ = ["RECIPE", "adapter_base", "compare_adapters", "merge", "merge_adapter", "merged_state"]


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("torch", "Merging an adapter", "peft") from None
    return torch


def merged_state(
    adapter: Adapter, base: Mapping[str, Any], tensors: Mapping[str, Any], *, label: str = CONFIG
) -> dict[str, Any]:
    """The tensors of `base` (name -> torch tensor) that merging the adapter changes, by
    name, computed from the adapter's `tensors` (its file's names) as peft merges them."""
    torch = _torch()
    if not adapter.mergeable:
        raise InvalidOptionError(
            f"{label}: merging a {adapter.label} adapter is not supported (LoRA, DoRA and IA3 are)",
            hint="Load it onto its base with mgit.load_pretrained",
        )
    if not adapter.modules:
        raise InputError(label, f"the adapter has no module tensors to merge (in {WEIGHTS})")
    found = fit(adapter, {k: tuple(v.shape) for k, v in base.items()})
    if found.problems:
        raise InputError(label, f"does not fit its base ({', '.join(found.problems[:2])})")
    out: dict[str, Any] = {}
    fifo = adapter.fan_in_fan_out
    with torch.no_grad():
        for m in adapter.modules:
            name = found.weights[m.path]
            weight = base[name]
            part = {k: _upcast(torch, tensors[v]) for k, v in m.parts.items()}
            bias_name = name.removesuffix("weight") + "bias"
            if adapter.peft_type == "IA3":
                vector = part["ia3_l"].T if fifo else part["ia3_l"]
                out[name] = torch.mul(weight, vector).to(weight.dtype)
                if not m.feedforward and bias_name in base:
                    bias = base[bias_name]
                    out[bias_name] = torch.mul(bias, part["ia3_l"].reshape(bias.shape)).to(bias.dtype)
                continue
            scaling = adapter.scaling(m)
            if m.embedding:
                delta = (part["lora_embedding_B"] @ part["lora_embedding_A"]).T * scaling
            else:
                product = part["lora_B.weight"] @ part["lora_A.weight"]
                delta = (product.T if fifo else product) * scaling
            merged = weight.clone()
            if "lora_magnitude_vector" in part:
                lora = delta.T if fifo else delta
                rows = (weight.T if fifo else weight) + 1 * lora
                norm = torch.linalg.norm(rows, dim=1).to(rows.dtype)
                factor = part["lora_magnitude_vector"].reshape(-1) / norm
                factor = factor.view(-1, 1).T if fifo else factor.view(-1, 1)
                merged = (factor * (weight + delta)).to(weight.dtype)
            else:
                merged += delta
            out[name] = merged
            if "lora_B.bias" in part:
                if bias_name not in base:
                    raise InputError(label, f"module {m.path!r} has a LoRA bias and its base layer has none")
                bias = base[bias_name].clone()
                bias += part["lora_B.bias"] * scaling
                out[bias_name] = bias
    saved = _saved_names(adapter, base, label)
    for own, theirs in saved.items():
        out[theirs] = tensors[own].to(base[theirs].dtype)
    return out


def _upcast(torch: Any, t: Any) -> Any:
    """As peft loads an adapter (`autocast_adapter_dtype`): half-precision weights in float32."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


def _saved_names(adapter: Adapter, base: Mapping[str, Any], label: str) -> dict[str, str]:
    """The adapter's tensors of modules saved whole, each with the base tensor it replaces."""
    from mgit.formats.pairing import tensor_names

    if not adapter.saved:
        return {}
    plain = {n: n[len(PREFIX) :] if n.startswith(PREFIX) else n for n in adapter.saved}
    names = tensor_names(list(plain.values()), list(base))
    missing = [n for n, p in plain.items() if p not in names]
    if missing:
        raise InputError(label, f"its tensor {missing[0]!r} has no counterpart in the base to replace")
    return {n: names[p] for n, p in plain.items()}


def merge(parents: list[Path], out_dir: Path, **params: Any) -> None:
    """The recipe (`fn(parents, out_dir, **params)`): the base's folder and the adapter's in,
    the merged model's folder out (the base's files, each weight file with the merged tensors
    in place of the base's)."""
    if len(parents) != 2 or params:
        raise InvalidOptionError("an adapter merge takes two parents (the base, then the adapter) and no parameters")
    base_dir, adapter_dir = Path(parents[0]), Path(parents[1])
    adapter = folder_adapter(adapter_dir)
    if adapter is None:
        raise InputError(str(adapter_dir), f"has no {CONFIG}: it is not a PEFT adapter")
    from safetensors.torch import load_file, safe_open, save_file

    tensors = load_file(adapter_dir / WEIGHTS)
    files = sorted(p for p in base_dir.rglob("*") if p.is_file() and not p.is_symlink())
    weights = [p for p in files if p.suffix == ".safetensors"]
    if not weights:
        raise InputError(str(base_dir), "has no .safetensors file to merge the adapter into")
    base = {}
    for path in weights:
        base.update(load_file(path))
    merged = merged_state(adapter, base, tensors, label=str(adapter_dir / CONFIG))
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in files:
        target = out_dir / path.relative_to(base_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix != ".safetensors":
            shutil.copyfile(path, target)
            continue
        with safe_open(str(path), "pt") as fh:
            metadata, names = fh.metadata(), list(fh.keys())
        save_file({n: merged.get(n, base[n]).contiguous() for n in names}, str(target), metadata=metadata)


def adapter_base(repo: Repo, vid: str) -> str:
    """The base an adapter version is stored under: its parent of relation `adapter`."""
    bases = [p.version for p in repo.info(vid).parents if p.relation == RELATION]
    if not bases:
        ref = repo.info(vid).ref
        raise InvalidOptionError(
            f"{ref} has no parent of relation {RELATION}: its base is not known", hint="Name it with --base"
        )
    return bases[0]


def merge_adapter(
    repo: Repo,
    ref: str,
    *,
    name: str,
    base: str | None = None,
    message: str = "",
    progress: Callable[[int], Any] | None = None,
) -> AddResult:
    """Merge the adapter `ref` into its base (its parent of relation `adapter`, or `base`) and
    add the result as the next version of `name`, with the merge as its recipe."""
    from mgit.repo.add import AddOptions

    vid = repo.resolve(ref)
    info = repo.info(vid)
    adapter = stored_adapter(repo.store, repo.manifest(vid), label=f"{info.ref}:{CONFIG}")
    if adapter is None:
        raise InputError(info.ref, f"has no {CONFIG}: it is not a PEFT adapter", hint="Give an adapter's model")
    if not adapter.mergeable or not adapter.modules:  # said before anything is written
        merged_state(adapter, {}, {}, label=f"{info.ref}:{CONFIG}")
    base_vid = repo.resolve(base) if base is not None else adapter_base(repo, vid)
    with tempfile.TemporaryDirectory(prefix="mgit-adapter-merge-") as tmp:
        folders = [Path(tmp) / "base", Path(tmp) / "adapter"]
        repo.checkout(base_vid, folders[0])
        repo.checkout(vid, folders[1])
        merge(folders, Path(tmp) / "merged")
        record = repo.recipe_record(RECIPE, {})
        return repo.add_with(
            str(Path(tmp) / "merged"),
            AddOptions(
                name=name,
                parents=(base_vid, vid),
                relation="merge",
                model_card=False,
                recipe=record,
                message=message or f"{info.ref} merged into {repo.info(base_vid).ref}",
                progress=progress,
            ),
        )


def compare_adapters(repo: Repo, a: str, b: str) -> dict[str, Any] | None:
    """What `mgit diff` says of two adapters (None unless both refs are adapters): each one's
    type, rank and base, the modules each adapts, and for LoRA modules both adapt the size of
    each one's update (||scale B A||, Frobenius) and of their difference relative to A's."""
    import numpy as np

    from mgit.store.reader import as_array

    sides = []
    for ref in (a, b):
        vid = repo.resolve(ref)
        manifest = repo.manifest(vid)
        adapter = stored_adapter(repo.store, manifest, label=f"{ref}:{CONFIG}")
        if adapter is None:
            return None
        bases = [p.ref for p in repo.info(vid).parents if p.relation == RELATION]
        sides.append((adapter, {t.name: t for t in manifest.tensors()}, bases[0] if bases else None))

    def update(adapter: Adapter, entries: dict[str, Any], path: str) -> Any:
        m = next(m for m in adapter.modules if m.path == path)
        if adapter.peft_type != "LORA" or m.embedding:
            return None
        la = as_array(repo.store, entries[m.parts["lora_A.weight"]]).astype(np.float64)
        lb = as_array(repo.store, entries[m.parts["lora_B.weight"]]).astype(np.float64)
        return lb @ la * adapter.scaling(m)

    paths = [{m.path for m in s[0].modules} for s in sides]
    modules = []
    for path in sorted(paths[0] & paths[1]):
        ua, ub = (update(s[0], s[1], path) for s in sides)
        row: dict[str, Any] = {"module": path}
        row["rank"] = [next(m.rank for m in s[0].modules if m.path == path) for s in sides]
        if ua is not None and ub is not None and ua.shape == ub.shape:
            norm_a = float(np.linalg.norm(ua))
            row["update_norm"] = [norm_a, float(np.linalg.norm(ub))]
            row["rel_difference"] = float(np.linalg.norm(ub - ua)) / norm_a if norm_a else None
        modules.append(row)
    return {
        "a": {**sides[0][0].summary(), "base": sides[0][2]},
        "b": {**sides[1][0].summary(), "base": sides[1][2]},
        "same_base": sides[0][2] == sides[1][2],
        "only_in_a": sorted(paths[0] - paths[1]),
        "only_in_b": sorted(paths[1] - paths[0]),
        "modules": modules,
    }
