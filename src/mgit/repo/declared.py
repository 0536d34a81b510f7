"""The parents a model names itself, recorded when `add` is given none: a folder's model card
(`base_model` and `base_model_relation` in README.md's front matter) or a GGUF file's
`general.base_model.*` metadata (relation `quantize`: the Hugging Face model tree's word for
a GGUF of a model). Only names that are models of this repository count; the others are
said in a note."""

from __future__ import annotations

from pathlib import Path

from mgit.errors import InputError
from mgit.formats.gguf import declared_bases, read_gguf
from mgit.formats.model_card import CARD, read_lineage
from mgit.index.refs import RefStore, is_model_name

MAX_CARD_BYTES = 1 << 20  # a model card larger than this is not read for lineage


def declared_parents(refs: RefStore, path: Path) -> tuple[list[str], str | None, list[str]]:
    """Parents named by a folder's model card or a GGUF's metadata that exist here (their
    heads), their relation, and notes."""
    if path.suffix == ".gguf" and path.is_file():
        return _gguf_parents(refs, path)
    card = path / CARD
    if not path.is_dir() or not card.is_file() or card.stat().st_size > MAX_CARD_BYTES:
        return [], None, []
    found = read_lineage(card.read_text(encoding="utf-8", errors="replace"))
    if found is None:
        return [], None, []
    heads = {b: refs.get(b) for b in found.base_models if is_model_name(b)}
    known = [b for b, head in heads.items() if head is not None]
    missing = [b for b in found.base_models if b not in known]
    notes = (
        [f"{CARD} names base_model {', '.join(map(repr, missing))}, not in this repository: not recorded as a parent"]
        if missing
        else []
    )
    if not known:
        return [], None, notes
    relation = found.relation or ("merge" if len(known) > 1 else None)
    notes.append(
        f"parent{'s' if len(known) > 1 else ''} {', '.join(known)} "
        f"({relation or 'finetune'}) from the base_model of {CARD}"
    )
    return [heads[b] for b in known], relation, notes  # type: ignore[misc]


def _gguf_parents(refs: RefStore, path: Path) -> tuple[list[str], str | None, list[str]]:
    try:
        bases = declared_bases(read_gguf(path).metadata)
    except InputError:
        return [], None, []  # (the scan that follows says what is wrong with the file)
    known, missing = [], []
    for names in bases:
        found = next((n for n in names if is_model_name(n) and refs.get(n) is not None), None)
        (known if found else missing).append(found or names[0])
    notes = (
        [f"{path.name} names base model {', '.join(map(repr, missing))}, not in this repository: not recorded"]
        if missing
        else []
    )
    known = list(dict.fromkeys(known))
    if not known:
        return [], None, notes
    relation = "merge" if len(known) > 1 else "quantize"
    notes.append(f"parent{'s' if len(known) > 1 else ''} {', '.join(known)} ({relation}) from general.base_model")
    return [refs.get(b) for b in known], relation, notes  # type: ignore[misc]
