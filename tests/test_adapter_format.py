"""adapter_config.json and an adapter's tensor names and shapes, fuzzed: whatever the bytes, the
parser gives an Adapter or an InputError naming the file, never another exception; what it
accepts holds together (every module a target, ranks the factors', shapes the base's)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mgit.errors import InputError
from mgit.formats.adapter import Adapter, fit, parse_adapter

MODULES = ["encoder.layer.0.attention.self.query", "encoder.layer.0.attention.self.value"]
LORA = {
    "peft_type": "LORA",
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["query", "value"],
    "base_model_name_or_path": "base",
    "use_dora": False,
}


def lora_tensors(rank: int = 4, width: int = 16) -> list[tuple[str, tuple[int, ...]]]:
    out = []
    for m in MODULES:
        out += [
            (f"base_model.model.{m}.lora_A.weight", (rank, width)),
            (f"base_model.model.{m}.lora_B.weight", (width, rank)),
        ]
    return out


def parsed_or_refused(config: bytes, tensors: list[tuple[str, tuple[int, ...]]]) -> Adapter | None:
    try:
        return parse_adapter(config, tensors, where="adapter_config.json")
    except InputError as exc:
        assert str(exc).startswith("adapter_config.json: ") and "\n" not in str(exc)
        return None


def test_a_peft_lora_config_is_read_and_fits_its_base() -> None:
    adapter = parse_adapter(json.dumps(LORA).encode(), lora_tensors())
    assert adapter.label == "LoRA" and adapter.rank == 4 and adapter.alpha == 8
    assert [m.path for m in adapter.modules] == MODULES and all(m.weight_shape == (16, 16) for m in adapter.modules)
    assert adapter.scaling(adapter.modules[0]) == 2.0
    base = {f"{m}.weight": (16, 16) for m in MODULES}
    assert not fit(adapter, base).problems
    assert fit(adapter, {**base, f"{MODULES[0]}.weight": (16, 8)}).problems == [f"{MODULES[0]}.weight is [16, 8]"]
    assert fit(adapter, {f"bert.{k}": v for k, v in base.items()}).weights[MODULES[0]] == f"bert.{MODULES[0]}.weight"


def test_every_truncation_of_a_config_is_refused_or_read() -> None:
    raw = json.dumps(LORA).encode()
    for cut in range(len(raw)):
        assert parsed_or_refused(raw[:cut], lora_tensors()) is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
KEYS = ["peft_type", "r", "lora_alpha", "target_modules", "base_model_name_or_path", "use_dora", "rank_pattern",
        "alpha_pattern", "fan_in_fan_out", "feedforward_modules", "use_rslora"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    changes=st.dictionaries(st.sampled_from(KEYS), json_values, max_size=4),
    peft_type=st.sampled_from(["LORA", "IA3", "LOHA", "NOPE"]),
    rank=st.integers(0, 6),
    drop=st.integers(0, 5),
)
def test_forged_configs_and_tensors_are_refused_or_read_consistently(
    changes: dict[str, object], peft_type: str, rank: int, drop: int
) -> None:
    config = {**LORA, "peft_type": peft_type, **changes}
    tensors = lora_tensors(max(rank, 1))
    tensors = tensors[:drop] + tensors[drop + 1 :] if drop < len(tensors) else tensors
    adapter = parsed_or_refused(json.dumps(config).encode(), tensors)
    if adapter is None or adapter.peft_type != "LORA":
        return
    for m in adapter.modules:  # what it accepts holds together
        assert m.rank is not None and m.weight_shape is not None
        a = adapter.shapes[m.parts["lora_A.weight"]]
        assert a[0] == m.rank and isinstance(adapter.scaling(m), float)
