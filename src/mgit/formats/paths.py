"""What a file path inside a model may be: the rules a manifest's paths follow (docs/format.md,
"Manifest record"), checked when `add` reads a folder and whenever a manifest is read.

A path that breaks them could not be checked out whole (a name too long for a file system, a
file that is also a folder) or would escape the output folder, or would write terminal escapes
when printed. Refusing it when the manifest is read means that nothing is written first.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

MAX_NAME_BYTES = 255  # one part of a path, in UTF-8: NAME_MAX of every common file system
MAX_PATH_BYTES = 1024  # a whole path, in UTF-8: room left under an output folder within PATH_MAX (4096)
# An OpenSSF model signature over a folder (model-signing's default name): evidence about its
# files, checked by `mgit add` (mgit.repo.model_signature) and never stored as one of them
SIGNATURE_FILE = "model.sig"
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")  # C0, DEL and C1: never in a path


def control_character(text: str) -> str | None:
    """The first control character (C0, DEL or C1) of `text`, escaped (`\\x1b`), or None."""
    found = CONTROL.search(text)
    return None if found is None else f"\\x{ord(found.group()):02x}"


def path_problem(rel: object) -> str | None:
    """Why `rel` cannot be a path of a manifest, or None when it can: relative, `/`-separated,
    no empty, `.` or `..` part, no backslash, no control character, each part at most 255
    bytes and the whole at most 4096 bytes in UTF-8."""
    if not isinstance(rel, str) or not rel:
        return "it is empty"
    parts = rel.split("/")
    if rel.startswith("/") or "\\" in rel or os.path.isabs(rel) or any(p in ("", ".", "..") for p in parts):
        return "it is absolute or climbs out of the output folder"
    if (char := control_character(rel)) is not None:
        return f"it has a control character ({char})"
    try:
        size = len(rel.encode("utf-8"))
    except UnicodeEncodeError:
        return "it is not valid UTF-8"
    if size > MAX_PATH_BYTES:
        return f"it is longer than {MAX_PATH_BYTES} bytes"
    if any(len(p.encode("utf-8")) > MAX_NAME_BYTES for p in parts):
        return f"a part of it is longer than {MAX_NAME_BYTES} bytes"
    return None


def folder_clash(paths: Iterable[str]) -> tuple[str, str] | None:
    """A path and a shorter one that it needs as a folder (`a/b` and `a`), if the files
    `paths` hold such a pair: a checkout could not write both."""
    listed = set(paths)
    for path in sorted(listed):
        parts = path.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in listed:
                return path, folder
    return None
