"""Named remotes, kept in the repository's config.json under "remotes" (URL, endpoint,
region, profile: never a secret). A change is a read-modify-write under the config's lock,
written atomically."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mgit.errors import InvalidOptionError, RemoteNotFoundError
from mgit.index.refs import RefStore
from mgit.remotes import RemoteSpec
from mgit.util.atomicfile import write_atomic
from mgit.util.locks import FileLock

REMOTE_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def validate_remote_name(name: str) -> str:
    if not REMOTE_NAME_RE.match(name or "") or name.endswith((".lock", ".")):
        raise InvalidOptionError(
            f"invalid remote name {name!r}", hint="Use letters, digits, '.', '_' and '-' (like origin)"
        )
    return name


def remotes_of(config: dict[str, Any]) -> dict[str, RemoteSpec]:
    found = config.get("remotes") or {}
    fields = ("url", "endpoint_url", "region", "profile")
    return {
        name: RemoteSpec(**{k: spec.get(k) for k in fields})
        for name, spec in sorted(found.items())
        if isinstance(spec, dict) and isinstance(spec.get("url"), str)
    }


def tracked_models(repo_dir: Path, config: dict[str, Any]) -> dict[str, dict[str, str]]:
    """{remote: {model: the remote's head at the last fetch}}: the remote-tracking refs."""
    return {name: RefStore(repo_dir, namespace=f"remotes/{name}").all() for name in remotes_of(config)}


def held_by_remotes(repo_dir: Path, config: dict[str, Any]) -> Callable[[str], bool]:
    """Whether a remote holds a model that has no ref here: any, in a clone of some models
    (`partial`: the others are on its remote), else those a remote-tracking ref names (read
    when first asked: the lineage graph asks only of models that have no ref here)."""
    if config.get("partial"):
        return lambda _name: True
    tracked: set[str] | None = None

    def held(name: str) -> bool:
        nonlocal tracked
        if tracked is None:
            tracked = {m for heads in tracked_models(repo_dir, config).values() for m in heads}
        return name in tracked

    return held


def remote_of(config: dict[str, Any], name: str) -> RemoteSpec:
    spec = remotes_of(config).get(name)
    if spec is None:
        raise RemoteNotFoundError(
            f"no remote named {name!r}", hint="See: mgit remote ls; add one with: mgit remote add"
        )
    return spec


def update_config(repo_dir: Path, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply `change` to config.json under its lock; return the new config."""
    path = repo_dir / "config.json"
    with FileLock(repo_dir / "locks" / "config.lock", what="the repository's config"):
        config = json.loads(path.read_text())
        change(config)
        write_atomic(path, [json.dumps(config, indent=2).encode() + b"\n"])
    return config
