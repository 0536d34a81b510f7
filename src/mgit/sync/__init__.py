"""Sharing repositories: remotes (a folder or an S3 prefix), push, fetch, pull, clone and
lazy clone. Porcelain over `Repo` and the transfer layer (mgit.store.transfer, mgit.remotes);
docs/format.md ("Remotes") specifies what a remote holds."""

from mgit.sync.connection import DEFAULT_REMOTE, add_remote, list_remotes, remove_remote
from mgit.sync.delete import delete_remote_models
from mgit.sync.fetch import clone, fetch
from mgit.sync.pull import pull
from mgit.sync.push import push
from mgit.sync.remote_gc import gc_remote, parse_expire
from mgit.sync.status import fsck_remote, init_bare, prefetch, remote_show

__all__ = [
    "DEFAULT_REMOTE",
    "add_remote",
    "clone",
    "delete_remote_models",
    "fetch",
    "fsck_remote",
    "gc_remote",
    "init_bare",
    "list_remotes",
    "parse_expire",
    "prefetch",
    "pull",
    "push",
    "remote_show",
    "remove_remote",
]
