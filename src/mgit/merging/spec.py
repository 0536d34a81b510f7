"""What a merge is, as data: the method, its inputs (by position among the merged version's
parents) with their parameters, the base, the method's parameters, the output dtype, the
seed of a random method, which tensors are taken unmerged from one input, and the merged
file's name when the inputs are single files.

A `MergeSpec` is what a merged version records as its recipe's parameters, so it holds no
model names: a cascade re-runs it on the parents' new versions. `MergeConfig` is mergekit's
YAML config (`models` with per-model `parameters`, `merge_method`, `base_model`,
`parameters`, `dtype`), read with model names as written, which the porcelain resolves in
the repository. Everything is checked here: an unknown method or parameter is refused with
the accepted ones listed.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mgit.errors import InvalidOptionError
from mgit.formats.layers import layer_of, layer_span
from mgit.formats.paths import path_problem
from mgit.merging.methods import METHODS

OUT_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # --dtype: its safetensors name
DTYPES = tuple(OUT_DTYPES)
MAX_INPUTS = 64


def layer_positions(names: Iterable[str]) -> dict[str, float]:
    """Where each tensor sits along the layers, as mergekit's gradients read it: layer i of
    a span of n (`mgit.formats.layers.layer_span`) at i / (n - 1) (1 when there is one
    layer), tensors outside the layers (embeddings, final norm, head) at 0."""
    names = list(names)
    found = {n: layer[1] for n in names if (layer := layer_of(n))}
    span = layer_span(names)
    return {n: (found[n] / (span - 1) if span > 1 else 1.0) if n in found else 0.0 for n in names}


def _setting(key: str, value: Any) -> Any:
    """A parameter's setting as mergekit writes it, checked: a number or true/false; a
    gradient (a list of them, interpolated along the layers); or filters, a list of
    {filter: NAME PART, value: SETTING} where the first filter found in the tensor's name
    (or none, or "*") gives the value."""
    if isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value)):
        return value
    if isinstance(value, dict):
        value = [value]
    if isinstance(value, list) and value:
        if all(isinstance(e, (int, float)) for e in value):
            return [_setting(key, e) for e in value]
        if all(isinstance(e, dict) for e in value):
            out = []
            for cond in value:
                if (
                    set(cond) - {"filter", "value"}
                    or "value" not in cond
                    or not isinstance(cond.get("filter"), str | None)
                ):
                    raise InvalidOptionError(
                        f"parameter {key!r}: a filter is {{filter: NAME PART, value: SETTING}}, not {cond!r}"
                    )
                out.append({"filter": cond.get("filter"), "value": _setting(key, cond["value"])})
            return out
    raise InvalidOptionError(
        f"parameter {key!r} must be a number, a gradient (a list of numbers) or filters "
        f"(a list of {{filter, value}}), not {value!r}"
    )


def structured(setting: Any) -> bool:
    return isinstance(setting, list)


def evaluate(setting: Any, tensor: str, t: float) -> Any:
    """A setting's value for one tensor at position t along the layers (None: no filter
    matches), as mergekit evaluates it."""
    if not isinstance(setting, list):
        return setting
    if not setting:
        return None
    if isinstance(setting[0], dict):
        for cond in setting:
            if cond["filter"] in (None, "*") or cond["filter"] in tensor:
                return evaluate(cond["value"], tensor, t)
        return None
    if any(isinstance(e, bool) for e in setting):
        return setting[int(t * (len(setting) - 1))]
    scaled = t * (len(setting) - 1)
    i0 = int(scaled)
    i1 = min(len(setting) - 1, i0 + 1)
    frac = scaled - i0
    return (1 - frac) * setting[i0] + frac * setting[i1]


def combine(first: Any, then: Any) -> Any:
    """One setting that is `first` where it gives a value and `then` elsewhere (a model's
    own parameter over the config's default for every model)."""
    if first is None:
        return then
    if then is None or not structured(first) or not isinstance(first[0], dict):
        return first  # a number or a gradient always gives a value
    return [*first, *(then if structured(then) and isinstance(then[0], dict) else [{"filter": None, "value": then}])]


def _scalar(method: str, key: str, value: Any, default: Any, where: str) -> Any:
    """A parameter's value for one tensor, checked (bools stay bools, numbers become floats)."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise InvalidOptionError(f"parameter {key!r} must be true or false, not {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidOptionError(f"parameter {key!r} must be a number, not {value!r}")
    value = float(value)
    if key == "density" and not 0 < value <= 1:
        raise InvalidOptionError(f"density must be in (0, 1], not {value:g}{where}")
    if method == "slerp" and key == "t" and not 0 <= value <= 1:
        raise InvalidOptionError(f"slerp's t must be in [0, 1], not {value:g}{where}")
    return value


def _checked(method: str, given: dict[str, Any], accepted: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = [k for k in given if k not in accepted]
    if unknown:
        raise InvalidOptionError(
            f"{method} takes no {where} parameter {unknown[0]!r}",
            hint=f"Its {where} parameters: {', '.join(accepted) or 'none'}",
        )
    out = {}
    for key, default in accepted.items():
        value = given.get(key, default)
        if value is None:
            raise InvalidOptionError(f"{method} needs the {where} parameter {key!r}")
        setting = _setting(key, value)
        leaves = [_scalar(method, key, leaf, default, "") for leaf in _leaves(setting)]  # each of its type and range
        out[key] = setting if structured(setting) else leaves[0]
    return out


def _leaves(setting: Any) -> Iterator[Any]:
    if not structured(setting):
        yield setting
        return
    for e in setting:
        yield from _leaves(e["value"] if isinstance(e, dict) else e)


@dataclass(frozen=True)
class MergeSpec:
    method: str
    inputs: list[dict[str, Any]]  # per input (parent position): weight, density
    base: int | None
    parameters: dict[str, Any]
    dtype: str | None = None
    seed: int = 0
    take: list[tuple[str, int]] = field(default_factory=list)  # (tensor glob, input position)
    rename: list[tuple[str, int, str]] = field(default_factory=list)  # (glob, input, prefix): kept, renamed
    file: str | None = None  # the merged weight file's name, for inputs of one weight file each

    @classmethod
    def build(
        cls,
        method: str,
        count: int,
        *,
        base: int | None,
        inputs: list[dict[str, Any]] | None = None,
        parameters: dict[str, Any] | None = None,
        dtype: str | None = None,
        seed: int = 0,
        take: list[tuple[str, int]] | None = None,
        rename: list[tuple[str, int, str]] | None = None,
        file: str | None = None,
    ) -> MergeSpec:
        """A checked spec for `count` inputs (parameters not given take their defaults)."""
        if method not in METHODS:
            raise InvalidOptionError(f"unknown merge method {method!r}", hint=f"Use one of: {', '.join(METHODS)}")
        m = METHODS[method]
        if not 2 <= count <= MAX_INPUTS:
            raise InvalidOptionError(f"a merge takes 2 to {MAX_INPUTS} models, not {count}")
        if m.needs_base and base is None:
            raise InvalidOptionError(
                f"{method} needs a base model", hint="Add --base REF (or base_model in the config)"
            )
        if base is not None and not 0 <= base < count:
            raise InvalidOptionError(f"base position {base} is not one of the {count} inputs")
        if method == "slerp" and count != 2:
            raise InvalidOptionError(f"slerp merges exactly two models (the base and one other), not {count}")
        if dtype is not None and dtype not in DTYPES:
            raise InvalidOptionError(f"unknown dtype {dtype!r}", hint=f"Use one of: {', '.join(DTYPES)}")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise InvalidOptionError(f"the seed must be an integer from 0 to 2**32 - 1, not {seed!r}")
        given = inputs or [{} for _ in range(count)]
        if len(given) != count:
            raise InvalidOptionError(f"{len(given)} sets of model parameters for {count} models")
        per_input = [_checked(method, g, m.input_parameters, "model") for g in given]
        params = _checked(method, dict(parameters or {}), m.parameters, "merge")
        for glob, position in take or []:
            if not isinstance(glob, str) or not glob or not isinstance(position, int) or not 0 <= position < count:
                raise InvalidOptionError(f"take rule {glob!r}={position!r} does not name a tensor glob and an input")
        for glob, position, prefix in rename or []:
            if (
                not isinstance(glob, str)
                or not glob
                or not isinstance(position, int)
                or not 0 <= position < count
                or not isinstance(prefix, str)
                or not prefix
            ):
                raise InvalidOptionError(
                    f"rename rule {glob!r}={position!r}:{prefix!r} does not name a tensor glob, an input and a prefix"
                )
        if file is not None and (
            not isinstance(file, str)
            or not file.endswith(".safetensors")
            or file == ".safetensors"
            or "/" in file
            or path_problem(file) is not None
        ):
            raise InvalidOptionError(
                f"--file {file!r} is not the name of a .safetensors file", hint="Give a name such as merged.safetensors"
            )
        return cls(
            method,
            per_input,
            base,
            params,
            dtype,
            seed,
            [(g, p) for g, p in take or []],
            [(g, p, x) for g, p, x in rename or []],
            file,
        )

    def varies(self) -> bool:
        """Whether a parameter has a gradient or filters (its value depends on the tensor)."""
        return any(structured(v) for scope in (*self.inputs, self.parameters) for v in scope.values())

    def resolve(self, tensor: str, t: float) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The per-input and the method's parameters for one tensor at position t along the
        layers (`layer_positions`): gradients interpolated, filters applied, defaults where
        no filter matches."""
        if not self.varies():
            return self.inputs, self.parameters
        m = METHODS[self.method]

        def values(scope: dict[str, Any], accepted: dict[str, Any], where: str) -> dict[str, Any]:
            out = {}
            for key, setting in scope.items():
                value = evaluate(setting, tensor, t)
                if value is None:
                    value = accepted[key]
                    if value is None:
                        raise InvalidOptionError(
                            f"no {where} parameter {key!r} for tensor {tensor!r}: none of its filters matches",
                            hint="End the filters with one without a filter",
                        )
                out[key] = _scalar(self.method, key, value, accepted[key], f" (tensor {tensor!r})")
            return out

        return (
            [values(p, m.input_parameters, "model") for p in self.inputs],
            values(self.parameters, m.parameters, "merge"),
        )

    def taken_from(self, tensor: str) -> int | None:
        """The input a tensor is taken from unmerged (the first matching rule), or None."""
        return next((p for g, p in self.take if fnmatch.fnmatchcase(tensor, g)), None)

    def renamed(self, tensor: str) -> bool:
        """Whether a rename rule keeps this tensor apart (it is then not merged)."""
        return any(fnmatch.fnmatchcase(tensor, g) for g, _, _ in self.rename)

    def to_params(self) -> dict[str, Any]:
        """As recipe parameters (JSON values)."""
        return {
            "method": self.method,
            "inputs": self.inputs,
            "base": self.base,
            "parameters": self.parameters,
            "dtype": self.dtype,
            "seed": self.seed,
            "take": [list(t) for t in self.take],
            "rename": [list(r) for r in self.rename],
            **({"file": self.file} if self.file is not None else {}),  # (absent before merges had it)
        }

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MergeSpec:
        """From recipe parameters, checked as when it was made."""
        try:
            take = [(str(g), int(p)) for g, p in params.get("take") or []]
            rename = [(str(g), int(p), str(x)) for g, p, x in params.get("rename") or []]
            return cls.build(
                params["method"],
                len(params["inputs"]),
                base=params.get("base"),
                inputs=params["inputs"],
                parameters=params.get("parameters"),
                dtype=params.get("dtype"),
                seed=params.get("seed", 0),
                take=take,
                rename=rename,
                file=params.get("file"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidOptionError(f"malformed merge parameters ({exc})") from None


@dataclass(frozen=True)
class MergeConfig:
    """mergekit's YAML config, models named as written."""

    method: str
    models: list[tuple[str, dict[str, Any]]]
    base: str | None
    parameters: dict[str, Any]
    dtype: str | None
    take: list[tuple[str, str]]
    rename: list[tuple[str, str, str]] = field(default_factory=list)  # (glob, model, prefix)
    layer_range: tuple[int, int] | None = None  # a config of one slice: the layers every source gives

    @classmethod
    def parse(cls, text: str, *, where: str = "the config") -> MergeConfig:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidOptionError(f"{where} is not YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise InvalidOptionError(f"{where} is not a mapping of merge settings")
        known = (
            "models",
            "merge_method",
            "base_model",
            "parameters",
            "dtype",
            "out_dtype",
            "take",
            "rename",
            "tokenizer_source",
            "chat_template",
        )
        known += ("slices",)
        unknown = [k for k in data if k not in known]
        layer_range = None
        if "slices" in data:
            if "models" in data:
                raise InvalidOptionError(f"{where}: give 'models' or 'slices', not both")
            data = dict(data)
            data["models"], layer_range, slice_parameters = _one_slice(data.pop("slices"), where)
            data["parameters"] = {
                k: combine(slice_parameters.get(k), (data.get("parameters") or {}).get(k))
                for k in {*slice_parameters, *(data.get("parameters") or {})}
            }
        if unknown:
            raise InvalidOptionError(f"{where}: unknown setting {unknown[0]!r}", hint=f"Known: {', '.join(known[:6])}")
        models = []
        for entry in data.get("models") or []:
            if isinstance(entry, str):
                entry = {"model": entry}
            if not isinstance(entry, dict) or not isinstance(entry.get("model"), str):
                raise InvalidOptionError(f"{where}: each of 'models' needs a 'model' name, not {entry!r}")
            params = entry.get("parameters") or {}
            if not isinstance(params, dict):
                raise InvalidOptionError(f"{where}: parameters of {entry['model']} must be a mapping")
            models.append((entry["model"], dict(params)))
        if not isinstance(data.get("merge_method"), str):
            raise InvalidOptionError(f"{where} names no merge_method", hint=f"One of: {', '.join(METHODS)}")
        take = data.get("take") or {}
        if not isinstance(take, dict):
            raise InvalidOptionError(f"{where}: 'take' maps tensor globs to model names")
        parameters = data.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidOptionError(f"{where}: 'parameters' must be a mapping")
        rename = []
        for rule in data.get("rename") or []:
            if not isinstance(rule, dict) or not all(
                isinstance(rule.get(k), str) for k in ("tensors", "model", "prefix")
            ):
                raise InvalidOptionError(f"{where}: each of 'rename' needs tensors (a glob), model and prefix")
            rename.append((rule["tensors"], rule["model"], rule["prefix"]))
        base = data.get("base_model")
        return cls(
            data["merge_method"],
            models,
            base if isinstance(base, str) else None,
            dict(parameters),
            data.get("out_dtype") or data.get("dtype"),
            [(str(g), str(m)) for g, m in take.items()],
            rename,
            layer_range,
        )


def _one_slice(slices: Any, where: str) -> tuple[list[dict[str, Any]], tuple[int, int], dict[str, Any]]:
    """A `slices` config that merges the same layers of every model (mergekit's form of the
    classic SLERP config) as its models, that layer range, and the slice's parameters.
    Several slices, or sources of different ranges, stack layers into another architecture
    (a "frankenmerge"): refused."""
    if not isinstance(slices, list) or not slices:
        raise InvalidOptionError(f"{where}: 'slices' must be a list of slices")
    if len(slices) > 1:
        raise InvalidOptionError(
            f"{where}: {len(slices)} slices stack layers into another architecture, which mgit merge does not make",
            hint="Merge the same layers of every model: one slice",
        )
    only = slices[0]
    if not isinstance(only, dict) or not isinstance(only.get("sources"), list) or not only["sources"]:
        raise InvalidOptionError(f"{where}: a slice needs 'sources' (model and layer_range each)")
    unknown = [k for k in only if k not in ("sources", "parameters")]
    if unknown:
        raise InvalidOptionError(f"{where}: unknown slice setting {unknown[0]!r}", hint="Known: sources, parameters")
    models, ranges = [], set()
    for source in only["sources"]:
        span = source.get("layer_range") if isinstance(source, dict) else None
        if not (
            isinstance(span, list)
            and len(span) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            and 0 <= span[0] < span[1]
        ):
            raise InvalidOptionError(f"{where}: each slice source needs a model and a layer_range [FIRST, END]")
        ranges.add(tuple(span))
        models.append({k: v for k, v in source.items() if k != "layer_range"})
    if len(ranges) > 1:
        raise InvalidOptionError(
            f"{where}: the sources take different layer ranges ({', '.join(map(str, sorted(ranges)))}), "
            "which changes the architecture",
            hint="Give every source the same layer_range",
        )
    parameters = only.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidOptionError(f"{where}: a slice's 'parameters' must be a mapping")
    return models, ranges.pop(), dict(parameters)
