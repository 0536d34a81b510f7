"""Tags set on a version after it was added: `refs/tags/<version id>` holds
`{"key": "value", "gone": null}`, what `mgit tag` changed over the tags in the version's
record (`null`: a key of the record removed).

A version's record is immutable, its id the hash of its content, so tags that change later
live beside the refs, as git's tags do in `refs/tags`; the catalog indexes the version's tags
as the record's with these applied (`effective`), and stays rebuildable from objects and refs.
Every change is a compare-and-swap under the version's lock file (read, compare with what the
caller expects, write a temporary file, fsync, rename), so two writers never lose each
other's change and a killed writer leaves the old tags.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from mgit.errors import DamagedRefError, InvalidOptionError, TagConflictError
from mgit.store.objects import OID_RE, RecordError, check_version_fields
from mgit.util.atomicfile import TMP_PREFIX, write_atomic
from mgit.util.locks import FileLock

Overlay = dict[str, "str | None"]  # key -> value set later, or None: the record's key removed


def check_overlay(overlay: object) -> Overlay:
    """An overlay as a writer or a remote gave it, checked by the rules of a record's tags
    (keys 1-128 characters, values up to 1,024, no control characters); raises RecordError."""
    if not isinstance(overlay, dict) or not all(v is None or isinstance(v, str) for v in overlay.values()):
        raise RecordError("tags are not an object of text or null values")
    check_version_fields(model="m", message="", author="", tags={k: v or "" for k, v in overlay.items()}, parents=0)
    return dict(overlay)


def effective(record: Mapping[str, str], overlay: Mapping[str, str | None]) -> dict[str, str]:
    """A version's tags: its record's with the overlay applied."""
    out = dict(record)
    for key, value in overlay.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return dict(sorted(out.items()))


class TagStore:
    """`<repo>/refs/tags/<version id>`, locks under `<repo>/locks/refs/tags`. Another
    namespace holds another side's: `remote-tags/<remote>` what a remote had when last
    pulled from or pushed to (the base that tells whose change is newer)."""

    def __init__(self, root: Path, *, fsync: bool = True, namespace: str = "tags") -> None:
        self.dir = root / "refs" / namespace
        self.lock_dir = root / "locks" / "refs" / namespace
        self.fsync = fsync

    def _path(self, vid: str) -> Path:
        if not OID_RE.match(vid):
            raise InvalidOptionError(f"tags are set on a version id, not {vid!r}")
        return self.dir / vid

    def lock(self, vid: str) -> FileLock:
        return FileLock(self.lock_dir / f"{vid}.lock", what=f"the tags of {vid[:12]}")

    def get(self, vid: str) -> Overlay:
        """What was set on `vid` ({} when nothing was)."""
        try:
            text = self._path(vid).read_text()
        except (FileNotFoundError, NotADirectoryError):
            return {}
        try:
            return check_overlay(json.loads(text))
        except (ValueError, RecordError):
            raise DamagedRefError(f"tags/{vid[:12]}", text[:20]) from None

    def all(self) -> dict[str, Overlay]:
        """Every version with tags set later, and what was set."""
        if not self.dir.is_dir():
            return {}
        return {n: self.get(n) for n in sorted(os.listdir(self.dir)) if OID_RE.match(n)}

    def set_locked(self, vid: str, overlay: Mapping[str, str | None], *, expected: Mapping[str, str | None]) -> None:
        """Compare-and-swap; the caller holds `lock(vid)`. An empty overlay removes the file."""
        current = self.get(vid)
        if current != dict(expected):
            raise TagConflictError(vid[:12])
        path = self._path(vid)
        if not overlay:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps(check_overlay(dict(overlay)), sort_keys=True) + "\n"
        write_atomic(path, [body.encode()], fsync=self.fsync)

    def update(self, vid: str, overlay: Mapping[str, str | None], *, expected: Mapping[str, str | None]) -> None:
        with self.lock(vid):
            self.set_locked(vid, overlay, expected=expected)

    def put(self, vid: str, overlay: Mapping[str, str | None]) -> None:
        """Set whatever was there (a remote's tags as last seen: only this side writes them)."""
        with self.lock(vid):
            self.set_locked(vid, overlay, expected=self.get(vid))

    def temporary_files(self) -> list[Path]:
        return list(self.dir.glob(f"{TMP_PREFIX}*")) if self.dir.is_dir() else []
