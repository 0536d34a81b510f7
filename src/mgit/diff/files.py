"""The files of two sides compared: by digest, text files as unified diffs."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mgit.diff.results import FileDiff

if TYPE_CHECKING:
    from mgit.diff.sides import FileRef

MAX_TEXT_BYTES = 1 << 20  # larger text files are compared by digest only


def file_diffs(a: Mapping[str, FileRef], b: Mapping[str, FileRef]) -> list[FileDiff]:
    """Every file of either side by digest; changed text files as unified diffs."""
    out = []
    for path in dict.fromkeys([*a, *b]):
        fa, fb = a.get(path), b.get(path)
        if fa is None or fb is None:
            f = fa or fb
            assert f is not None
            out.append(
                FileDiff(
                    path, "only_b" if fa is None else "only_a", f.type, fa.size if fa else None, fb.size if fb else None
                )
            )
            continue
        kind = "safetensors" if "safetensors" in (fa.type, fb.type) else "blob"
        if fa.type == fb.type and fa.digest() == fb.digest():
            out.append(FileDiff(path, "identical", kind, fa.size, fb.size))
            continue
        diff, note = None, None
        if kind == "safetensors":
            note = "tensors compared above"
        elif max(fa.size, fb.size) > MAX_TEXT_BYTES:
            note = f"larger than {MAX_TEXT_BYTES >> 20} MiB: compared by digest only"
        else:
            diff = text_diff(path, fa.content(), fb.content())
            note = None if diff is not None else "binary files differ"
        out.append(FileDiff(path, "changed", kind, fa.size, fb.size, diff, note))
    return out


def text_diff(path: str, a: bytes, b: bytes) -> list[str] | None:
    """A unified diff of two texts (lines without their line ends), or None for binary data."""
    try:
        if b"\x00" in a or b"\x00" in b:
            return None
        old, new = a.decode("utf-8").splitlines(), b.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None
    return list(difflib.unified_diff(old, new, f"a/{path}", f"b/{path}", lineterm=""))
