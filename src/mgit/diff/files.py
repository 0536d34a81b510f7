"""The files of two sides compared: by digest, text files as unified diffs."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mgit.diff.results import FileDiff
from mgit.formats.pairing import paired_files

if TYPE_CHECKING:
    from mgit.diff.sides import FileRef

MAX_TEXT_BYTES = 1 << 20  # larger text files are compared by digest only
TENSOR_FILES = ("safetensors", "torch-zip", "gguf")  # files whose tensors are compared as tensors


def file_diffs(a: Mapping[str, FileRef], b: Mapping[str, FileRef]) -> list[FileDiff]:
    """Every file of either side by digest, paired by path or, when each side's weights are one
    file, those two whatever they are called (mgit.formats.pairing); changed text files as
    unified diffs."""
    out = []
    weights = [[p for p, f in side.items() if f.type in TENSOR_FILES] for side in (a, b)]
    for pa, pb in paired_files([list(a), list(b)], weights):
        fa, fb = a.get(pa or ""), b.get(pb or "")
        if fa is None or fb is None:
            f = fa or fb
            assert f is not None
            out.append(
                FileDiff(
                    f.path,
                    "only_b" if fa is None else "only_a",
                    f.type,
                    fa.size if fa else None,
                    fb.size if fb else None,
                )
            )
            continue
        path, other = fa.path, (fb.path if fb.path != fa.path else None)
        kind = next((t for t in (fa.type, fb.type) if t in TENSOR_FILES), "blob")
        if fa.type == fb.type and fa.digest() == fb.digest():
            out.append(FileDiff(path, "identical", kind, fa.size, fb.size, path_b=other))
            continue
        diff, note = None, None
        if kind in TENSOR_FILES:
            note = "tensors compared above"
        elif max(fa.size, fb.size) > MAX_TEXT_BYTES:
            note = f"larger than {MAX_TEXT_BYTES >> 20} MiB: compared by digest only"
        else:
            diff = text_diff(path, fa.content(), fb.content())
            note = None if diff is not None else "binary files differ"
        out.append(FileDiff(path, "changed", kind, fa.size, fb.size, diff, note, path_b=other))
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
