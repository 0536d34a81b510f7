"""Hugging Face model-card lineage: `base_model` and `base_model_relation` in the YAML front
matter of a folder's README.md.

Reading gives the base models a card names and the relation in MGit's words; writing puts
a version's parents back into the card, changing nothing else in the file, so that a model
published from a checkout keeps its place in the hub's model tree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

CARD = "README.md"
# Hugging Face's model-tree relations and MGit's words for them (both ways where they exist).
FROM_HUB = {"adapter": "adapter", "merge": "merge", "quantized": "quantize", "finetune": "finetune"}
TO_HUB = {mgit: hub for hub, mgit in FROM_HUB.items()}
_FRONT = re.compile(r"\A---[ \t]*\r?\n(.*?\r?\n)?---[ \t]*(\r?\n|\Z)", re.S)
_KEYS = ("base_model", "base_model_relation")


@dataclass(frozen=True)
class CardLineage:
    base_models: list[str]
    relation: str | None  # MGit's word, or None when the card gives none (or one MGit lacks)
    hub_relation: str | None  # as written in the card


def read_lineage(text: str) -> CardLineage | None:
    """The lineage a card declares, or None when it declares none or its front matter is not
    valid YAML (a broken card never stops an add)."""
    m = _FRONT.match(text)
    if not m:
        return None
    try:
        meta = yaml.safe_load(m.group(1) or "")
    except yaml.YAMLError:
        return None
    if not isinstance(meta, dict):
        return None
    raw = meta.get("base_model")
    bases = [raw] if isinstance(raw, str) else raw if isinstance(raw, list) else []
    bases = [b.strip() for b in bases if isinstance(b, str) and b.strip()]
    if not bases:
        return None
    hub = meta.get("base_model_relation")
    hub = hub if isinstance(hub, str) else None
    return CardLineage(bases, FROM_HUB.get(hub) if hub else None, hub)


def write_lineage(text: str | None, base_models: list[str], relation: str) -> str:
    """`text` (a README, or None for none) with its front matter's `base_model` and
    `base_model_relation` set; other keys and the body stay as they were. A relation the hub
    has no word for (prune, distill, other) leaves `base_model_relation` out."""
    fields: dict[str, object] = {"base_model": base_models[0] if len(base_models) == 1 else base_models}
    if relation in TO_HUB:
        fields["base_model_relation"] = TO_HUB[relation]
    block = yaml.safe_dump(fields, sort_keys=False, allow_unicode=True, default_flow_style=False)
    text = text or ""
    m = _FRONT.match(text)
    if not m:
        return f"---\n{block}---\n" + (f"\n{text}" if text else "")
    kept = _without_keys((m.group(1) or "").splitlines(keepends=True))
    if kept and not kept[-1].endswith("\n"):
        kept[-1] += "\n"
    return "---\n" + "".join(kept) + block + "---\n" + text[m.end() :]


def _without_keys(lines: list[str]) -> list[str]:
    """Front-matter lines minus the top-level lineage keys and their continuation lines."""
    out, skipping = [], False
    for line in lines:
        top = line[:1] not in (" ", "\t", "-", "#", "\r", "\n") and ":" in line
        if top:
            skipping = line.split(":", 1)[0].strip() in _KEYS
        elif skipping and line[:1] not in (" ", "\t", "-"):
            skipping = False
        if not skipping:
            out.append(line)
    return out
