"""A repository: `Repo` (the facade every verb goes through, in `repository`), `location`
(finding, creating and opening one on disk), and the verbs' machinery below it: `add` (a
version in, parents and lossy gate included), `ingest` (model files -> objects + manifest),
`checkout` (objects -> files), `inspect` (what ls, log, show, du report), `remove` (rm), `gate`,
`fsck` (reachability, fsck) and `gc`.

`from mgit.repo import Repo` loads the facade on first use only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["Repo"]

if TYPE_CHECKING:
    from mgit.repo.repository import Repo


def __getattr__(name: str) -> Any:
    if name == "Repo":
        from mgit.repo.repository import Repo

        return Repo
    raise AttributeError(f"module 'mgit.repo' has no attribute {name!r}")
