"""What a request may ask for: query parameters read with bounds (a page number, a choice
among known words, a short text), and long lists cut into pages.

Nothing a request says reaches the filesystem: parameters are compared with names the
library already knows (models, versions, tests), never joined into a path.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from mgit.errors import BadParameterError

T = TypeVar("T")
MAX_TEXT = 300  # longer than any name, ref or search a page makes
PER_PAGE = 50
MAX_PER_PAGE = 500
DIGITS = re.compile(r"[0-9]+")  # ASCII only: str.isdigit() also takes "²" (int() refuses it) and "١"


def text(query: Mapping[str, str], name: str, default: str = "") -> str:
    value = query.get(name, default)
    if len(value) > MAX_TEXT:
        raise BadParameterError(name, f"longer than {MAX_TEXT} characters")
    return value


def choice(query: Mapping[str, str], name: str, choices: Sequence[str], default: str) -> str:
    value = query.get(name) or default
    if value not in choices:
        raise BadParameterError(name, f"one of {', '.join(choices)}")
    return value


def number(query: Mapping[str, str], name: str, default: int, *, lo: int = 1, hi: int = 1 << 31) -> int:
    """A whole number written in ASCII digits, no more of them than `hi` has (int() is never
    given thousands of digits), from `lo` to `hi`."""
    raw = query.get(name)
    if raw is None or raw == "":
        return default
    if len(raw) > len(str(hi)) or not DIGITS.fullmatch(raw) or not lo <= int(raw) <= hi:
        raise BadParameterError(name, f"a whole number from {lo} to {hi}")
    return int(raw)


@dataclass(frozen=True)
class Paged:
    """One page of a longer list: its items and where it is in the whole."""

    items: list[Any]
    page: int
    per_page: int
    total: int

    @property
    def pages(self) -> int:
        return max(1, -(-self.total // self.per_page))

    def meta(self) -> dict[str, int]:
        return {"page": self.page, "per_page": self.per_page, "total": self.total, "pages": self.pages}


def paginate(items: Sequence[T], query: Mapping[str, str], *, prefix: str = "", per_page: int = PER_PAGE) -> Paged:
    """The page of `items` that `?{prefix}page=N&{prefix}per_page=M` asks for (a page past
    the end is the last one)."""
    size = number(query, f"{prefix}per_page", per_page, hi=MAX_PER_PAGE)
    pages = max(1, -(-len(items) // size))
    page = min(number(query, f"{prefix}page", 1), pages)
    return Paged(list(items[(page - 1) * size : page * size]), page, size, len(items))
