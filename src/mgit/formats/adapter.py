"""PEFT adapter folders: `adapter_config.json` beside `adapter_model.safetensors`, as peft's
`save_pretrained` writes them.

An adapter is read from its config and the names and shapes of its tensors (never from peft,
which stays an optional extra): its type (`peft_type`: LoRA, LoRA with DoRA, IA3 are
understood module by module; any other of peft's types is kept as its tensors), rank, alpha,
target modules, the base it names (`base_model_name_or_path`), and for each adapted module the
shape of the base weight it changes (what finds the base among stored models by its weights).

peft saves tensors under `base_model.model.` + the module's path in the base model, then the
adapter's part: `lora_A.weight` (rank x in), `lora_B.weight` (out x rank),
`lora_magnitude_vector` (DoRA, out), `lora_embedding_A` / `lora_embedding_B` (an embedding),
`ia3_l` (IA3: out x 1, or 1 x in for a feed-forward module). Anything else under the prefix is
a module the adapter saves whole (`modules_to_save`, a task head).

Everything read from the files is checked before it is used: a forged config (a rank that is
not one, an unknown type, target modules that match nothing, tensors that do not agree with
it) is an `InputError` naming the file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mgit.errors import InputError

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
PREFIX = "base_model.model."
MAX_CONFIG_BYTES = 1 << 20
MAX_RANK = 1 << 16
MAX_PATTERN = 1000  # characters of a target_modules regular expression
# peft's PeftType values (peft 0.21): an adapter of another type is refused as unknown.
PEFT_TYPES = frozenset(
    [
        "PROMPT_TUNING",
        "MULTITASK_PROMPT_TUNING",
        "P_TUNING",
        "PREFIX_TUNING",
        "LORA",
        "ADALORA",
        "ADAMSS",
        "BOFT",
        "ADAPTION_PROMPT",
        "IA3",
        "BEFT",
        "LILY",
        "LOHA",
        "LOKR",
        "OFT",
        "POLY",
        "LN_TUNING",
        "VERA",
        "FROD",
        "PVERA",
        "FOURIERFT",
        "GLORA",
        "XLORA",
        "HRA",
        "VBLORA",
        "UNILORA",
        "CPT",
        "MISS",
        "RANDLORA",
        "ROAD",
        "TRAINABLE_TOKENS",
        "HIRA",
        "SHIRA",
        "C3A",
        "WAVEFT",
        "OSF",
        "DELORA",
        "GRALORA",
        "CARTRIDGE",
        "TINYLORA",
        "PSOFT",
        "PEANUT",
        "SHADOW",
        "SUPERTUNING",
        "DEFT",
    ]
)
MERGEABLE = ("LORA", "IA3")  # the types MGit merges into their base (as peft's merge_and_unload does)
_LORA_PARTS = ("lora_A.weight", "lora_B.weight", "lora_B.bias", "lora_magnitude_vector", "lora_embedding_A",
               "lora_embedding_B")  # fmt: skip


@dataclass(frozen=True)
class AdaptedModule:
    """One module of the base an adapter changes: its path in the base model, the base
    weight's name and shape there (out x in as the base stores it), its rank (LoRA), and the
    adapter's tensors for it by part (`lora_A.weight`: the adapter file's tensor name)."""

    path: str
    weight_shape: tuple[int, ...] | None
    rank: int | None
    parts: Mapping[str, str]
    embedding: bool = False
    feedforward: bool = False  # IA3: scales the module's inputs, not its outputs

    @property
    def weight(self) -> str:
        return f"{self.path}.weight"


@dataclass(frozen=True)
class Adapter:
    """What an adapter folder holds, as its config and tensors say (see the module docstring)."""

    peft_type: str
    config: Mapping[str, Any]
    base: str | None
    target_modules: tuple[str, ...] | str
    modules: tuple[AdaptedModule, ...]
    saved: tuple[str, ...] = ()  # tensors of modules saved whole (names in the adapter file)
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # every tensor's, by name

    @property
    def use_dora(self) -> bool:
        return self.peft_type == "LORA" and bool(self.config.get("use_dora"))

    @property
    def label(self) -> str:
        """ "LoRA", "LoRA (DoRA)", "IA3", else peft's name of the type."""
        if self.peft_type == "LORA":
            return "LoRA (DoRA)" if self.use_dora else "LoRA"
        return self.peft_type

    @property
    def rank(self) -> int | None:
        r = self.config.get("r")
        return r if isinstance(r, int) and not isinstance(r, bool) else None

    @property
    def alpha(self) -> float | None:
        a = self.config.get("lora_alpha", self.config.get("alpha"))
        return a if isinstance(a, int | float) and not isinstance(a, bool) else None

    @property
    def fan_in_fan_out(self) -> bool:
        return bool(self.config.get("fan_in_fan_out"))

    @property
    def mergeable(self) -> bool:
        return self.peft_type in MERGEABLE

    def scaling(self, module: AdaptedModule) -> float:
        """LoRA's scale of B A for a module, as peft computes it: alpha / r (alpha / sqrt(r)
        with rsLoRA), alpha and r from `alpha_pattern` and `rank_pattern` where they match."""
        assert module.rank is not None
        alpha = _pattern_value(self.config.get("alpha_pattern") or {}, module.path, self.alpha)
        assert alpha is not None
        if self.config.get("use_rslora"):
            return alpha / math.sqrt(module.rank)
        return alpha / module.rank

    def summary(self) -> dict[str, Any]:
        """What `mgit show` says of it (and its JSON)."""
        ranks = sorted({m.rank for m in self.modules if m.rank is not None})
        return {
            "type": self.label,
            "peft_type": self.peft_type,
            "rank": self.rank,
            "ranks": ranks,
            "alpha": self.alpha,
            "target_modules": sorted(self.target_modules)  # peft saves a set: its order says nothing
            if isinstance(self.target_modules, tuple)
            else self.target_modules,
            "modules": len(self.modules),
            "saved_tensors": len(self.saved),
            "base_model_name_or_path": self.base,
        }


def parse_adapter(config: bytes, tensors: Iterable[tuple[str, Sequence[int]]], *, where: str = CONFIG) -> Adapter:
    """The adapter a config (the bytes of adapter_config.json) and its tensors (name, shape)
    describe, checked against each other; `where` names the config in errors."""
    data = _config(config, where)
    peft_type = data.get("peft_type")
    if not isinstance(peft_type, str) or peft_type not in PEFT_TYPES:
        raise InputError(where, f"unknown adapter type {peft_type!r}", hint="peft_type must be one of peft's PeftType")
    base = data.get("base_model_name_or_path")
    if base is not None and (not isinstance(base, str) or len(base) > 1000):
        raise InputError(where, "base_model_name_or_path is not a name")
    targets = _targets(data.get("target_modules"), where)
    shapes = {name: tuple(int(d) for d in shape) for name, shape in tensors}
    if peft_type == "LORA":
        modules, saved = _lora_modules(data, shapes, where)
    elif peft_type == "IA3":
        modules, saved = _ia3_modules(data, shapes, where)
    else:
        modules, saved = _other_modules(shapes), ()
    adapter = Adapter(peft_type, data, base or None, targets, modules, saved, shapes)
    if modules and targets and adapter.mergeable:  # another type's module paths are a guess
        _check_targets(adapter, where)
    return adapter


def _config(raw: bytes, where: str) -> dict[str, Any]:
    if len(raw) > MAX_CONFIG_BYTES:
        raise InputError(where, f"is larger than {MAX_CONFIG_BYTES} bytes: not an adapter config")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(where, f"is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InputError(where, "is not a JSON object")
    return data


# A quantified group that holds a quantifier ("(a+)+", "(.*)*"): what makes a regular
# expression backtrack for ever on a short name. A config's patterns have no need of one.
_NESTED = re.compile(r"\((?:[^()\\]|\\.)*[*+}](?:[^()\\]|\\.)*\)[*+{?]")


def _pattern(raw: str, where: str, what: str) -> str:
    """A regular expression read from a config: short, compiled, without nested quantifiers."""
    if len(raw) > MAX_PATTERN:
        raise InputError(where, f"{what} is longer than {MAX_PATTERN} characters")
    if _NESTED.search(raw):
        raise InputError(where, f"{what} repeats a repeated group, which could match for ever: {raw[:60]!r}")
    try:
        re.compile(raw)
    except re.error as exc:
        raise InputError(where, f"{what} is not a regular expression ({exc})") from None
    return raw


def _targets(raw: Any, where: str) -> tuple[str, ...] | str:
    if isinstance(raw, str):
        return _pattern(raw, where, "target_modules")
    if isinstance(raw, list) and all(isinstance(t, str) and t for t in raw):
        return tuple(raw)
    if raw is None:
        return ()
    raise InputError(where, "target_modules is neither a list of module names nor a regular expression")


def targeted(targets: tuple[str, ...] | str, path: str) -> bool:
    """Whether a module path is among target modules, by peft's rule: a regular expression
    matches the whole path; a name matches the path or its last components."""
    if isinstance(targets, str):
        return targets == "all-linear" or re.fullmatch(targets, path) is not None
    return any(path == t or path.endswith("." + t) for t in targets)


def _check_targets(adapter: Adapter, where: str) -> None:
    """Every adapted module is a target, and every target adapts a module."""
    targets = adapter.target_modules
    for m in adapter.modules:
        if not targeted(targets, m.path):
            raise InputError(where, f"the adapter's module {m.path!r} is not among its target_modules")
    names = [targets] if isinstance(targets, str) else list(targets)
    for t in names:
        if t != "all-linear" and not any(
            targeted(t if isinstance(targets, str) else (t,), m.path) for m in adapter.modules
        ):
            raise InputError(
                where, f"target module {t!r} matches no tensor of the adapter", hint="Check target_modules"
            )


def _positive_rank(value: Any, where: str, what: str = "r") -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_RANK:
        raise InputError(where, f"{what} is not a rank (an integer from 1 to {MAX_RANK}): {value!r}")
    return value


def _pattern_value(pattern: Mapping[str, Any], path: str, default: Any) -> Any:
    """peft's `get_pattern_key`: the first key that matches the end of the module's path."""
    for key, value in pattern.items():
        if re.match(rf"(.*\.)?({key})$", path):
            return value
    return default


def _split(name: str, parts: Sequence[str]) -> tuple[str, str] | None:
    """(module path, part) of an adapter tensor's name, or None for a tensor of no part."""
    if not name.startswith(PREFIX):
        return None
    rest = name[len(PREFIX) :]
    for part in parts:
        if rest.endswith("." + part):
            return rest[: -len(part) - 1], part
    return None


def _lora_modules(
    data: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], where: str
) -> tuple[tuple[AdaptedModule, ...], tuple[str, ...]]:
    r = _positive_rank(data.get("r"), where)
    alpha = data.get("lora_alpha")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or not math.isfinite(alpha):
        raise InputError(where, f"lora_alpha is not a number: {alpha!r}")
    for key in ("rank_pattern", "alpha_pattern"):
        pattern = data.get(key) or {}
        if not isinstance(pattern, dict) or not all(isinstance(k, str) and len(k) <= MAX_PATTERN for k in pattern):
            raise InputError(where, f"{key} is not a map of module names to numbers")
        for k, v in pattern.items():
            _pattern(k, where, f"{key} key")
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise InputError(where, f"{key} gives {k!r} {v!r}, which is not a number")
    fan_in_fan_out = bool(data.get("fan_in_fan_out"))
    grouped: dict[str, dict[str, str]] = {}
    saved = []
    for name in shapes:
        split = _split(name, _LORA_PARTS)
        if split is None:
            saved.append(name)
        else:
            grouped.setdefault(split[0], {})[split[1]] = name
    modules = []
    for path, parts in grouped.items():
        modules.append(_lora_module(path, parts, shapes, data, r, fan_in_fan_out, where))
    return tuple(modules), tuple(saved)


def _lora_module(
    path: str,
    parts: dict[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    data: Mapping[str, Any],
    r: int,
    fan_in_fan_out: bool,
    where: str,
) -> AdaptedModule:
    embedding = "lora_embedding_A" in parts or "lora_embedding_B" in parts
    a_key, b_key = ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A.weight", "lora_B.weight")
    if a_key not in parts or b_key not in parts:
        raise InputError(where, f"module {path!r} has no {a_key if a_key not in parts else b_key} tensor")
    a, b = shapes[parts[a_key]], shapes[parts[b_key]]
    if len(a) != 2 or len(b) != 2 or a[0] != b[1]:
        raise InputError(where, f"module {path!r}: lora A {list(a)} and B {list(b)} are not factors of one rank")
    rank = a[0]
    expected = _positive_rank(_pattern_value(data.get("rank_pattern") or {}, path, r), where, "rank_pattern")
    if rank != expected:
        raise InputError(where, f"module {path!r} has rank {rank} where the config says r = {expected}")
    if embedding:
        weight: tuple[int, ...] = (a[1], b[0])  # num_embeddings x dim
    else:
        weight = (a[1], b[0]) if fan_in_fan_out else (b[0], a[1])
    if "lora_magnitude_vector" in parts and shapes[parts["lora_magnitude_vector"]] not in ((b[0],), (1, b[0])):
        raise InputError(where, f"module {path!r}: its DoRA magnitude is not one value per output")
    if "lora_magnitude_vector" in parts and not data.get("use_dora"):
        raise InputError(where, f"module {path!r} has a DoRA magnitude but use_dora is not set")
    if data.get("use_dora") and "lora_magnitude_vector" not in parts and not embedding:
        raise InputError(where, f"module {path!r} has no DoRA magnitude though use_dora is set")
    return AdaptedModule(path, weight, rank, dict(parts), embedding)


def _ia3_modules(
    data: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], where: str
) -> tuple[tuple[AdaptedModule, ...], tuple[str, ...]]:
    feedforward = _targets(data.get("feedforward_modules"), where)
    modules, saved = [], []
    for name, shape in shapes.items():
        split = _split(name, ("ia3_l",))
        if split is None:
            saved.append(name)
            continue
        path = split[0]
        ff = targeted(feedforward, path) if feedforward else False
        if len(shape) != 2 or (shape[0] != 1 if ff else shape[1] != 1):
            scaled = "inputs" if ff else "outputs"
            raise InputError(where, f"module {path!r}: IA3 vector of shape {list(shape)} does not scale its {scaled}")
        modules.append(AdaptedModule(path, None, None, {"ia3_l": name}, feedforward=ff))
    return tuple(modules), tuple(saved)


def _other_modules(shapes: Mapping[str, tuple[int, ...]]) -> tuple[AdaptedModule, ...]:
    """Modules of an adapter type MGit keeps as its tensors: a tensor's path less its last part."""
    grouped: dict[str, dict[str, str]] = {}
    for name in shapes:
        if name.startswith(PREFIX):
            rest = name[len(PREFIX) :].removesuffix(".weight")
            path, _, part = rest.rpartition(".")
            if path:
                grouped.setdefault(path, {})[part] = name
    return tuple(AdaptedModule(p, None, None, parts) for p, parts in grouped.items())


@dataclass
class AdapterFit:
    """How a stored model's tensors fit an adapter: each adapted module's base weight by name
    (across a wrapper prefix), and what does not fit (empty: it fits)."""

    weights: dict[str, str] = field(default_factory=dict)  # module path -> the base's tensor name
    problems: list[str] = field(default_factory=list)


def fit(adapter: Adapter, base: Mapping[str, tuple[int, ...]]) -> AdapterFit:
    """Whether a model of these tensors (name -> shape) is a base the adapter fits: every
    adapted module's weight is there, of the shape the adapter's tensors imply."""
    from mgit.formats.pairing import tensor_names

    out = AdapterFit()
    wanted = [m.weight for m in adapter.modules]
    names = tensor_names(wanted, list(base))
    for m in adapter.modules:
        found = names.get(m.weight)
        if found is None:
            out.problems.append(f"no tensor {m.weight}")
            continue
        shape = base[found]
        ok = shape == m.weight_shape if m.weight_shape is not None else _ia3_fits(adapter, m, shape)
        if not ok:
            out.problems.append(f"{found} is {list(shape)}")
        else:
            out.weights[m.path] = found
    return out


def _ia3_fits(adapter: Adapter, module: AdaptedModule, shape: tuple[int, ...]) -> bool:
    if "ia3_l" not in module.parts or len(shape) != 2:
        return len(shape) >= 1  # another type's module: the weight being there is what can be told
    vector = adapter.shapes.get(module.parts["ia3_l"])
    if vector is None:
        return False
    rows, cols = (shape[1], shape[0]) if adapter.fan_in_fan_out else shape
    return vector == ((1, cols) if module.feedforward else (rows, 1))
