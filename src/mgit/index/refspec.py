"""References to versions as people type them: `NAME`, `NAME@N`, `NAME@HEXPREFIX`, or a
unique prefix of a version id; `pick_version` reads the part after the `@`."""

from __future__ import annotations

import re

from mgit.errors import UnknownRefError

REF_RE = re.compile(r"^(?P<name>[^@]+)(?:@(?P<sel>[^@]+))?\Z")
MIN_PREFIX = 4  # hex digits of a version id prefix given alone or as digits only


def pick_version(ref: str, name: str, chain: list[tuple[str, int]], sel: str) -> str:
    """The version of a model's history (`chain`: (id, number), newest first) that `sel`
    names: the version with that number if there is one, else an id prefix (all digits only
    from MIN_PREFIX digits on, so that `NAME@1` never means an id); both at once is an error.
    Numbers are those of the records (a re-used name's go on from its removed versions'),
    so they need not start at 1."""
    by_seq = None
    digits = sel.isascii() and sel.isdigit()  # str.isdigit() alone takes "²", which int() refuses
    if digits and len(sel) <= 18:  # no int() of thousands of digits
        by_seq = next((v for v, seq in chain if seq == int(sel)), None)
    vids = [v for v, _ in chain]
    by_id = [v for v in vids if v.startswith(sel.lower())] if not digits or len(sel) >= MIN_PREFIX else []
    if by_seq is not None and by_id and by_id != [by_seq]:
        listed = ", ".join([f"version {int(sel)} ({by_seq[:12]})", *(f"id {v[:12]}" for v in by_id)])
        raise UnknownRefError(
            ref,
            f"ambiguous ({listed}): no single version",
            hint=f"Give more hex digits of the id. See: mgit log {name}",
        )
    if by_seq is not None:
        return by_seq
    if len(by_id) == 1:
        return by_id[0]
    if digits and not by_id:
        count = f"{len(chain)} version" + ("s" if len(chain) != 1 else "")
        low, high = (chain[-1][1], chain[0][1]) if chain else (1, 1)
        span = "" if low == 1 else f" (@{low})" if low == high else f" (@{low} to @{high})"
        raise UnknownRefError(ref, f"model {name!r} has {count}{span}; no version", hint=f"See: mgit log {name}")
    raise UnknownRefError(ref, "ambiguous version prefix" if by_id else "no version", hint=f"See: mgit log {name}")
