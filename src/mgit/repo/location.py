"""A repository on disk: where it is (`.mgit` in a work folder, or a bare one), creating
one, reading its config.json, opening its object store (a lazy clone's fetches from its
remote what it lacks), and the user code it trusts (`trusted-code`).

Trusted code is what may run without `--trust-remote-code`: a function reference with the
object id of its recorded source, for every recipe recorded and test attached here, and
for code from a remote once a run was told to trust it. Code that arrives by fetch, pull
or clone is never written here by the transfer itself."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import FormatVersionError, RepoConfigError, RepoExistsError, RepoNotFoundError
from mgit.store.objects import utc_now
from mgit.util.atomicfile import write_atomic
from mgit.util.locks import FileLock
from mgit.util.parallel import default_jobs

if TYPE_CHECKING:
    from mgit.store.lazy import ObjectIndex
    from mgit.store.local import LocalStore

REPO_DIR = ".mgit"
REPO_FORMAT = 1
TRUSTED_CODE = "trusted-code"  # JSON lines {"fn": ..., "source": OID or ""}
TRUST_SETTING = "trust-remote-code"  # in config.json: true runs code from remotes without asking


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


def open_store(folder: Path, config: dict[str, Any], *, index: ObjectIndex) -> LocalStore:
    """The repository's objects; a lazy clone's store opens its remote on its first fetch
    and learns what the objects it lacks are from `index` (the repository's catalog)."""
    from mgit.store.local import LocalStore  # (when the repository's objects are first read)

    fsync = bool(config.get("fsync", True))
    lock = folder / "locks" / "repo.lock"
    lazy = config.get("lazy")
    if lazy:
        from mgit.remotes import open_backend
        from mgit.remotes.config import remote_of
        from mgit.remotes.repository import RemoteRepository
        from mgit.store.lazy import LazyStore

        spec = remote_of(config, lazy)
        return LazyStore(
            folder / "objects",
            fsync=fsync,
            lock_path=lock,
            jobs=default_jobs(),
            index=index,
            remote=lambda: RemoteRepository(open_backend(spec)),
        )
    return LocalStore(folder / "objects", fsync=fsync, lock_path=lock)


def trusts_remote_code(config: dict[str, Any]) -> bool:
    """Whether the repository's config says to run code from remotes without asking."""
    return config.get(TRUST_SETTING) is True


def trusted_code(folder: Path) -> set[tuple[str, str]]:
    """The (function reference, source object id or "") pairs trusted here. A line that
    does not read as one is not trusted (this file is only ever added to by MGit)."""
    try:
        lines = (folder / TRUSTED_CODE).read_text(encoding="utf-8", errors="replace").splitlines()
    except FileNotFoundError:
        return set()
    found = set()
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("fn"), str) and isinstance(entry.get("source"), str):
            found.add((entry["fn"], entry["source"]))
    return found


def trust_code(
    folder: Path, entries: set[tuple[str, str | None]] | list[tuple[str, str | None]], *, fsync: bool = True
) -> None:
    """Add (function reference, source object id) pairs to the code trusted here (a None
    source is kept as "")."""
    wanted = {(fn, source or "") for fn, source in entries}
    if not wanted:
        return
    with FileLock(folder / "locks" / f"{TRUSTED_CODE}.lock", what="the trusted code list", timeout=60):
        have = trusted_code(folder)
        if wanted <= have:
            return
        lines = [
            json.dumps({"fn": fn, "source": source}, sort_keys=True) + "\n" for fn, source in sorted(have | wanted)
        ]
        write_atomic(folder / TRUSTED_CODE, [line.encode() for line in lines], fsync=fsync)


def trust_recipe(folder: Path, record: dict[str, Any]) -> dict[str, Any]:
    """A recipe record made here (its function and source object) trusted; the record."""
    trust_code(folder, [(str(record["fn"]), record.get("source"))])
    return record
