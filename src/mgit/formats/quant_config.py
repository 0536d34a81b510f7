"""The quantization a model announces in its config.json (`quantization_config`): the scheme
and its bits, read without numpy so that `mgit show` can name it in milliseconds.

The schemes read are those the Hugging Face libraries write:

- GPTQ (`"quant_method": "gptq"`, AutoGPTQ / GPTQModel / optimum): `bits`, `group_size`
  (-1: one group per row), `desc_act`, `sym`, `checkpoint_format` (`gptq` or `gptq_v2`);
- AWQ (`"awq"`, AutoAWQ): `bits` (`w_bit`), `group_size` (`q_group_size`), `version` (`gemm`, `gemv`);
- compressed-tensors (`"compressed-tensors"`, llm-compressor): `format` (`float-quantized`,
  `naive-quantized`, `pack-quantized`) and `config_groups`, each with `weights` holding
  `num_bits`, `type` (`float`, `int`), `strategy` (`tensor`, `channel`, `group`, `block`) and `group_size`;
- FP8 (`"fp8"`: DeepSeek's and transformers' fine-grained FP8): `fmt`, `weight_block_size`.

A config is a user's file: any field may be missing or forged. Nothing here raises; what does
not make sense is said in `problem`, and the packed tensors themselves decide what can be
dequantized (`mgit.formats.packed_quant`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

PACKED_BITS = (2, 4, 8)  # widths that fill an int32 word exactly (GPTQ's 3-bit packing straddles words)


@dataclass(frozen=True)
class QuantScheme:
    """A model's announced quantization. `method` is the config's `quant_method` as written
    (lower case); `bits` and `group_size` are None where the config does not say (a group
    size of -1 means one group per row); `format` is compressed-tensors' format, AWQ's
    version or GPTQ's checkpoint format; `strategy` how compressed-tensors groups its scales."""

    method: str
    bits: int | None = None
    group_size: int | None = None
    format: str | None = None
    weight_type: str | None = None  # "int" or "float"
    strategy: str | None = None
    sym: bool | None = None
    desc_act: bool | None = None
    problem: str | None = None

    @property
    def label(self) -> str:
        """One line for a user: `gptq 4-bit, group size 32 (desc_act)`."""
        parts = [self.method]
        if self.format and self.method == "compressed-tensors":
            parts[0] += f" {self.format}"
        if self.bits is not None:
            parts.append(f"{self.bits}-bit" + (" float" if self.weight_type == "float" else ""))
        words = " ".join(parts)
        detail = []
        if self.strategy:
            detail.append(f"per {self.strategy}")
        if self.group_size is not None:
            detail.append("one group per row" if self.group_size == -1 else f"group size {self.group_size}")
        if self.desc_act:
            detail.append("desc_act")
        if self.sym is False:
            detail.append("asymmetric")
        text = words + (", " + ", ".join(detail) if detail else "")
        return text + (f" (invalid: {self.problem})" if self.problem else "")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bool(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    """A config's word, lower case, on one line and short (it is printed)."""
    return " ".join(value.lower().split())[:64] if isinstance(value, str) else None


def _problem(bits: int | None, group_size: int | None, packed: bool) -> str | None:
    if bits is not None and not 1 <= bits <= 32:
        return f"{bits} bits"
    if packed and bits is not None and bits not in PACKED_BITS:
        return f"{bits}-bit values do not pack evenly into int32 words"
    if group_size is not None and group_size != -1 and group_size < 1:
        return f"group size {group_size}"
    return None


def _compressed_tensors(qc: dict[str, Any]) -> QuantScheme:
    fmt = _str(qc.get("format"))
    groups = qc.get("config_groups")
    weights: dict[str, Any] = {}
    if isinstance(groups, dict):
        for group in groups.values():
            if isinstance(group, dict) and isinstance(group.get("weights"), dict):
                weights = group["weights"]
                break
    bits, group_size = _int(weights.get("num_bits")), _int(weights.get("group_size"))
    return QuantScheme(
        "compressed-tensors",
        bits=bits,
        group_size=group_size,
        format=fmt,
        weight_type=_str(weights.get("type")),
        strategy=_str(weights.get("strategy")),
        sym=_bool(weights.get("symmetric")),
        problem=_problem(bits, group_size, fmt == "pack-quantized"),
    )


def scheme_from_config(config: Any) -> QuantScheme | None:
    """The quantization a parsed config.json announces, or None when it announces none."""
    if not isinstance(config, dict) or not isinstance(config.get("quantization_config"), dict):
        return None
    qc = config["quantization_config"]
    method = _str(qc.get("quant_method")) or "unknown"
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    if method in ("gptq", "awq"):
        bits = _int(qc.get("bits", qc.get("w_bit")))
        group_size = _int(qc.get("group_size", qc.get("q_group_size")))
        fmt = _str(qc.get("version" if method == "awq" else "checkpoint_format"))
        return QuantScheme(
            method,
            bits=bits,
            group_size=group_size,
            format=fmt,
            weight_type="int",
            sym=_bool(qc.get("sym")),
            desc_act=_bool(qc.get("desc_act")),
            problem=_problem(bits, group_size, True),
        )
    if method in ("fp8", "fbgemm_fp8"):
        block = qc.get("weight_block_size")
        strategy = "block" if isinstance(block, list) else "channel" if method == "fbgemm_fp8" else None
        return QuantScheme(method, bits=8, format=_str(qc.get("fmt")), weight_type="float", strategy=strategy)
    return QuantScheme(method, bits=_int(qc.get("bits")))


def scheme_from_bytes(data: bytes) -> QuantScheme | None:
    """`scheme_from_config` of a config.json's bytes; None when they are not JSON."""
    try:
        return scheme_from_config(json.loads(data))
    except (ValueError, RecursionError):
        return None
