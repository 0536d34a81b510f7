"""What a model name had before its versions were removed or it was renamed:
`refs/retired/<name>` holds `{"last": N, "renamed_to": NEW or null, "removed": [ids]}`
(`removed`: versions `mgit rm NAME@N --force` took out of the middle of its history, which
the later versions' records still name as predecessors).

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
from mgit.index.refs import is_model_name, validate_model_name
from mgit.store.objects import OID_RE
from mgit.util.atomicfile import write_atomic


@dataclass(frozen=True)
class Retired:
    """What a removed or renamed name had: its highest number, its new name, versions removed."""

    last: int  # the highest version number the name has had
    renamed_to: str | None = None
    removed: tuple[str, ...] = ()  # versions removed from inside its history


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
        if not isinstance(data, dict):
            raise DamagedRefError(f"retired/{name}", json.dumps(data)[:20])
        last, renamed, removed = data.get("last"), data.get("renamed_to"), data.get("removed", [])
        if (
            not isinstance(last, int)
            or last < 0
            or not (renamed is None or is_model_name(renamed))
            or not (isinstance(removed, list) and all(isinstance(v, str) and OID_RE.match(v) for v in removed))
        ):
            raise DamagedRefError(f"retired/{name}", json.dumps(data)[:20])
        return Retired(last, renamed, tuple(removed))

    def last(self, name: str) -> int:
        """The highest number `name` has had before its current versions (0: none)."""
        found = self.get(name)
        return found.last if found else 0

    def removed(self) -> set[str]:
        """Every version removed from inside a history, whatever its model."""
        return {v for r in self.all().values() for v in r.removed}

    def all(self) -> dict[str, Retired]:
        if not self.dir.is_dir():
            return {}
        names = sorted(p.relative_to(self.dir).as_posix() for p in self.dir.rglob("*") if p.is_file())
        return {n: r for n in names if is_model_name(n) and (r := self.get(n)) is not None}

    def retire_locked(
        self,
        name: str,
        last: int,
        *,
        renamed_to: str | None = None,
        removed: tuple[str, ...] = (),
        keep_rename: bool = False,
    ) -> None:
        """Record that `name` had versions up to `last` (kept if it had higher) and `removed`
        inside its history (added to those it had), and where it was renamed to (`keep_rename`:
        whatever it said); the caller holds the model's ref lock."""
        before = self.get(name)
        last = max(last, before.last if before else 0)
        if keep_rename:
            renamed_to = before.renamed_to if before else None
        marks = sorted({*(before.removed if before else ()), *removed})
        path = self.dir / validate_model_name(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"last": last, "renamed_to": renamed_to, "removed": marks}, sort_keys=True) + "\n"
        write_atomic(path, [body.encode()], fsync=self.fsync)
