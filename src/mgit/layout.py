"""A repository on disk: where it is (`.mgit` in a work folder, or a bare one), creating
one, reading its config.json, and opening its object store (a lazy clone's fetches from its
remote what it lacks)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mgit.atomicfile import write_atomic
from mgit.errors import FormatVersionError, RepoConfigError, RepoExistsError, RepoNotFoundError
from mgit.localstore import LocalStore
from mgit.objects import utc_now
from mgit.parallel import default_jobs
from mgit.remotes.config import remote_of

REPO_DIR = ".mgit"
REPO_FORMAT = 1


def is_bare(folder: Path) -> bool:
    try:
        return bool(json.loads((folder / "config.json").read_text()).get("bare"))
    except (OSError, ValueError, AttributeError):
        return False


def find_repo_dir(start: Path | None = None) -> Path:
    """The `.mgit` folder for `start`: `MGIT_DIR`, else `start` or the nearest parent holding one."""
    env = os.environ.get("MGIT_DIR")
    if start is None and env:
        p = Path(env)
        return p if p.name == REPO_DIR or (p / "config.json").exists() else p / REPO_DIR
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / REPO_DIR / "config.json").is_file():
            return d / REPO_DIR
    raise RepoNotFoundError(str(here))


def locate(start: Path | None) -> Path:
    """The repository folder a path names: a `.mgit` folder, a bare repository, or a work
    folder (or one below it) holding `.mgit`."""
    if start is not None and (start / "config.json").is_file() and (start.name == REPO_DIR or is_bare(start)):
        return start
    found = find_repo_dir(start)
    if not (found / "config.json").is_file():
        raise RepoNotFoundError(str(found))
    return found


def create(root: Path, *, bare: bool = False) -> Path:
    """Lay out an empty repository in `root/.mgit`, or with `bare` in `root` itself."""
    target = root if bare else root / REPO_DIR
    if (target / "config.json").exists():
        raise RepoExistsError(str(target))
    for sub in ("objects", "refs/models", "locks"):
        (target / sub).mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {"format": REPO_FORMAT, "fsync": True, "created": utc_now()}
    if bare:
        config["bare"] = True
    write_atomic(target / "config.json", [json.dumps(config, indent=2).encode() + b"\n"])
    return target


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise RepoConfigError(str(path), str(exc)) from None
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt != REPO_FORMAT:
        raise FormatVersionError(
            f"repository format {fmt!r} is not supported by this mgit (it reads format {REPO_FORMAT})",
            hint="Upgrade mgit",
        )
    return config


def open_store(folder: Path, config: dict[str, Any]) -> LocalStore:
    """The repository's objects; a lazy clone's store opens its remote on its first fetch."""
    fsync = bool(config.get("fsync", True))
    lock = folder / "locks" / "repo.lock"
    lazy = config.get("lazy")
    if lazy:
        from mgit.lazystore import LazyStore
        from mgit.remotes import open_backend
        from mgit.remotes.repository import RemoteRepository

        spec = remote_of(config, lazy)
        return LazyStore(folder / "objects", fsync=fsync, lock_path=lock, jobs=default_jobs(),
                         remote=lambda: RemoteRepository(open_backend(spec)))  # fmt: skip
    return LocalStore(folder / "objects", fsync=fsync, lock_path=lock)
