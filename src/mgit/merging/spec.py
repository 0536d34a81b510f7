"""What a merge is, as data: the method, its inputs (by position among the merged version's
parents) with their parameters, the base, the method's parameters, the output dtype, the
seed of a random method, and which tensors are taken unmerged from one input.

A `MergeSpec` is what a merged version records as its recipe's parameters, so it holds no
model names: a cascade re-runs it on the parents' new versions. `MergeConfig` is mergekit's
YAML config (`models` with per-model `parameters`, `merge_method`, `base_model`,
`parameters`, `dtype`), read with model names as written, which the porcelain resolves in
the repository. Everything is checked here: an unknown method or parameter is refused with
the accepted ones listed.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

from mgit.errors import InvalidOptionError
from mgit.merging.methods import METHODS

OUT_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}  # --dtype: its safetensors name
DTYPES = tuple(OUT_DTYPES)
MAX_INPUTS = 64


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, (list, dict)):
            raise InvalidOptionError(f"parameter {key!r}: gradients and per-tensor filters are not supported yet",
                                     hint="Give one number")  # fmt: skip
        raise InvalidOptionError(f"parameter {key!r} must be a number, not {value!r}")
    return float(value)


def _checked(method: str, given: dict[str, Any], accepted: dict[str, Any], where: str) -> dict[str, Any]:
    unknown = [k for k in given if k not in accepted]
    if unknown:
        raise InvalidOptionError(f"{method} takes no {where} parameter {unknown[0]!r}",
                                 hint=f"Its {where} parameters: {', '.join(accepted) or 'none'}")  # fmt: skip
    out = {}
    for key, default in accepted.items():
        value = given.get(key, default)
        if value is None:
            raise InvalidOptionError(f"{method} needs the {where} parameter {key!r}")
        out[key] = value if isinstance(default, bool) else _number(key, value)
        if isinstance(default, bool) and not isinstance(value, bool):
            raise InvalidOptionError(f"parameter {key!r} must be true or false, not {value!r}")
    if "density" in out and not 0 < out["density"] <= 1:
        raise InvalidOptionError(f"density must be in (0, 1], not {out['density']:g}")
    if method == "slerp" and not 0 <= out.get("t", 0) <= 1:
        raise InvalidOptionError(f"slerp's t must be in [0, 1], not {out['t']:g}")
    return out


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

    @classmethod
    def build(cls, method: str, count: int, *, base: int | None, inputs: list[dict[str, Any]] | None = None,
              parameters: dict[str, Any] | None = None, dtype: str | None = None, seed: int = 0,
              take: list[tuple[str, int]] | None = None,
              rename: list[tuple[str, int, str]] | None = None) -> MergeSpec:  # fmt: skip
        """A checked spec for `count` inputs (parameters not given take their defaults)."""
        if method not in METHODS:
            raise InvalidOptionError(f"unknown merge method {method!r}", hint=f"Use one of: {', '.join(METHODS)}")
        m = METHODS[method]
        if not 2 <= count <= MAX_INPUTS:
            raise InvalidOptionError(f"a merge takes 2 to {MAX_INPUTS} models, not {count}")
        if m.needs_base and base is None:
            raise InvalidOptionError(f"{method} needs a base model", hint="Add --base REF (or base_model in the config)")
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
            if not isinstance(glob, str) or not glob or not isinstance(position, int) or not 0 <= position < count \
                    or not isinstance(prefix, str) or not prefix:  # fmt: skip
                raise InvalidOptionError(f"rename rule {glob!r}={position!r}:{prefix!r} does not name a tensor glob, "
                                         "an input and a prefix")  # fmt: skip
        return cls(method, per_input, base, params, dtype, seed, [(g, p) for g, p in take or []],
                   [(g, p, x) for g, p, x in rename or []])  # fmt: skip

    def taken_from(self, tensor: str) -> int | None:
        """The input a tensor is taken from unmerged (the first matching rule), or None."""
        return next((p for g, p in self.take if fnmatch.fnmatchcase(tensor, g)), None)

    def renamed(self, tensor: str) -> bool:
        """Whether a rename rule keeps this tensor apart (it is then not merged)."""
        return any(fnmatch.fnmatchcase(tensor, g) for g, _, _ in self.rename)

    def to_params(self) -> dict[str, Any]:
        """As recipe parameters (JSON values)."""
        return {"method": self.method, "inputs": self.inputs, "base": self.base, "parameters": self.parameters,
                "dtype": self.dtype, "seed": self.seed, "take": [list(t) for t in self.take],
                "rename": [list(r) for r in self.rename]}  # fmt: skip

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> MergeSpec:
        """From recipe parameters, checked as when it was made."""
        try:
            take = [(str(g), int(p)) for g, p in params.get("take") or []]
            rename = [(str(g), int(p), str(x)) for g, p, x in params.get("rename") or []]
            return cls.build(params["method"], len(params["inputs"]), base=params.get("base"),
                             inputs=params["inputs"], parameters=params.get("parameters"), dtype=params.get("dtype"),
                             seed=params.get("seed", 0), take=take, rename=rename)  # fmt: skip
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

    @classmethod
    def parse(cls, text: str, *, where: str = "the config") -> MergeConfig:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise InvalidOptionError(f"{where} is not YAML ({str(exc).splitlines()[0]})") from None
        if not isinstance(data, dict):
            raise InvalidOptionError(f"{where} is not a mapping of merge settings")
        known = ("models", "merge_method", "base_model", "parameters", "dtype", "out_dtype", "take", "rename",
                 "tokenizer_source", "chat_template")  # fmt: skip
        unknown = [k for k in data if k not in known]
        if "slices" in data:
            raise InvalidOptionError(f"{where}: 'slices' (layer ranges) are not supported yet", hint="Use 'models'")
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
            if not isinstance(rule, dict) or not all(isinstance(rule.get(k), str) for k in ("tensors", "model", "prefix")):
                raise InvalidOptionError(f"{where}: each of 'rename' needs tensors (a glob), model and prefix")
            rename.append((rule["tensors"], rule["model"], rule["prefix"]))
        base = data.get("base_model")
        return cls(data["merge_method"], models, base if isinstance(base, str) else None, dict(parameters),
                   data.get("out_dtype") or data.get("dtype"), [(str(g), str(m)) for g, m in take.items()], rename)  # fmt: skip
