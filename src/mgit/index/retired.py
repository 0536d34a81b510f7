"""What a model name had before its versions were removed or it was renamed:
`refs/retired/<name>` holds `{"last": N, "renamed_to": NEW or null}`.

A name's numbers are never given twice: `ft@3` names one version for the life of the
repository, like a git commit id, even after `mgit rm ft` and a new `mgit add --name ft`
(which goes on at `ft@N+1`, its record saying so: `Version.number`). `last` is the highest
number the name has had; `renamed_to` lets `ft` be refused with where its versions went.
Written atomically (temporary file, fsync, rename) by a writer that holds the model's ref
lock (`RefStore.lock`), so it moves together with the ref.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from mgit.errors import DamagedRefError
from mgit.index.refs import validate_model_name
from mgit.util.atomicfile import write_atomic


@dataclass(frozen=True)
class Retired:
    last: int  # the highest version number the name has had
    renamed_to: str | None = None


class RetiredNames:
    """`refs/retired/<name>` of a repository."""

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.dir = root / "refs" / "retired"
        self.fsync = fsync

    def get(self, name: str) -> Retired | None:
        try:
            data = json.loads((self.dir / validate_model_name(name)).read_text())
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except ValueError:
            raise DamagedRefError(f"retired/{name}", "not JSON") from None
        last, renamed = data.get("last") if isinstance(data, dict) else None, data.get("renamed_to")
        if not isinstance(last, int) or last < 0 or not (renamed is None or isinstance(renamed, str)):
            raise DamagedRefError(f"retired/{name}", json.dumps(data)[:20])
        return Retired(last, renamed)

    def last(self, name: str) -> int:
        """The highest number `name` has had before its current versions (0: none)."""
        found = self.get(name)
        return found.last if found else 0

    def retire_locked(self, name: str, last: int, *, renamed_to: str | None = None) -> None:
        """Record that `name` had versions up to `last` (kept if it had higher); the caller
        holds the model's ref lock."""
        last = max(last, self.last(name))
        path = self.dir / validate_model_name(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"last": last, "renamed_to": renamed_to}, sort_keys=True) + "\n"
        write_atomic(path, [body.encode()], fsync=self.fsync)
