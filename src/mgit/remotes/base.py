"""The contract every remote backend fulfils: keys (`/`-separated paths under the remote's
root) holding bytes, with one conditional write for the few keys that change.

A remote holds what a repository holds, in the same layout (docs/format.md, "Remotes"):
immutable objects under `objects/ab/cdef...`, a ref per model under `refs/models/<name>`,
and a few index files. Objects are written once and never change, so a plain `write` is
enough for them; a ref changes only by `write_if` (compare-and-swap on a version token: an
S3 ETag, or a folder file's hash under its lock), which is what makes two pushes of one
model at the same instant land one and refuse the other.

Every read takes a `limit`: nothing read from a remote is trusted, its size included.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from mgit.errors import RemoteError

if TYPE_CHECKING:
    from mgit.remotes.journal import TransferJournal

KEY_RE = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*\Z")


def check_key(key: str) -> str:
    """A key as backends accept it: relative, no empty part, none starting with `.` (a
    folder backend must never read or write outside its root, nor its temporary files), and
    nothing under `locks/` (a folder remote's lock files)."""
    if (
        not KEY_RE.match(key)
        or any(p in (".", "..") or p.startswith(".") for p in key.split("/"))
        or key.startswith("locks/")
    ):
        raise RemoteError(f"not a remote key: {key!r}")
    return key


def listed(key: str) -> bool:
    """A key a bucket's `list` shows: valid, with no hidden part (as a folder shows files)."""
    return bool(KEY_RE.match(key)) and not any(p.startswith(".") for p in key.split("/"))


class KeyInfo(NamedTuple):
    """A key as a listing shows it: its size and when it was last written (seconds since the
    epoch, by the remote's clock: what a remote gc's grace period is measured on)."""

    key: str
    size: int
    modified: float


class Backend:
    """Bytes under keys. Implementations: `FolderBackend` (a folder), `S3Backend` (a bucket
    and prefix). Safe to call from several threads at once."""

    url: str  # as the user wrote it (never with credentials)
    # Where large transfers keep what they have done (a repository's transfers/ folder), so
    # that a re-run resumes inside an object; None: no journal, a re-run sends objects whole.
    journal: TransferJournal | None = None
    # An object at least this large is fetched in ranges (`read_range`) that a re-run resumes;
    # None: the backend reads whole objects only.
    ranged_from: int | None = None

    def check(self) -> None:
        """Raise RemoteNotFoundError unless the remote's root exists (a folder, a bucket)."""
        raise NotImplementedError

    def read(self, key: str, *, limit: int) -> bytes:
        """The bytes of `key` (MissingKeyError if absent; RemoteTooLargeError past `limit`)."""
        raise NotImplementedError

    def read_into(self, key: str, path: Path, *, limit: int) -> int:
        """Stream `key` into a new file `path` (parallel ranges where the backend has them);
        return its size. Nothing past `limit` bytes is written."""
        raise NotImplementedError

    def read_range(self, key: str, start: int, length: int) -> bytes:
        """Exactly `length` bytes of `key` from `start` (one ranged GET, a seek in a folder): how
        a reader takes one object out of a data pack, and how a fetch takes a large object in
        chunks it can resume (`ranged_from`, mgit.remotes.partial). MissingKeyError if absent;
        a key that ends before the range does is a RemoteError, never a short answer."""
        raise NotImplementedError

    def write(self, key: str, data: bytes | Path) -> None:
        """Store bytes (or a file's bytes) under `key`, atomically: a reader sees the old
        value or the new one, never a part. Large files go in parallel parts."""
        raise NotImplementedError

    def write_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        """`write` of a file, calling `progress` with the bytes sent as they go (here: all of
        them at the end; a backend that sends parts reports each, and resumes with its journal)."""
        self.write(key, path)
        if progress:
            progress(path.stat().st_size)

    def exists(self, key: str) -> bool:
        return self.size(key) is not None

    def size(self, key: str) -> int | None:
        """The size of the file (or object) at `key`, or None if there is none: absent, or,
        in a folder, anything but a regular file (a folder, a link, a FIFO)."""
        raise NotImplementedError

    def abort_unfinished(self, keys: Iterable[str]) -> int:
        """Abort the uploads of these keys that a killed writer left unfinished (S3's multipart
        uploads, whose parts are kept and billed until aborted); how many. A folder has none:
        its writes are single files, renamed into place."""
        return 0

    def list(self, prefix: str) -> Iterator[str]:
        """Every key that starts with `prefix` (a folder prefix ends with `/`), sorted."""
        return (info.key for info in self.list_info(prefix))

    def list_info(self, prefix: str) -> Iterator[KeyInfo]:
        """`list` with each key's size and time of writing (from the same listing requests)."""
        raise NotImplementedError

    def delete(self, key: str) -> None:
        """Remove `key` if it is there (a remote gc's, and `push --delete`'s after the ref is
        swapped to a tombstone: never a ref a concurrent writer may be moving)."""
        raise NotImplementedError

    def read_versioned(self, key: str, *, limit: int) -> tuple[bytes | None, str | None]:
        """The bytes of `key` and a token naming this version of it, or (None, None). A
        token is opaque and follows the content (a folder's is its blake3, S3's its ETag):
        writing the same bytes again keeps it, which a compare-and-swap allows."""
        raise NotImplementedError

    def write_if(self, key: str, data: bytes, *, token: str | None) -> str | None:
        """Write `key` only if it is still at version `token` (from `read_versioned`), or,
        with `token=None`, only if it does not exist; else RemoteConflictError. Returns the
        token of what it wrote, where the answer gives it (else None)."""
        raise NotImplementedError

    def list_tokens(self, prefix: str) -> dict[str, tuple[str, str | None]]:
        """{key: (its token as `read_versioned` gives it, the MD5 hex of its bytes or None)}
        of every key under `prefix`: what the heads index is checked against
        (mgit.remotes.heads). Here by reading each key (a folder's are local files); a
        bucket's backend takes both from its listing."""
        import hashlib  # (OpenSSL's start-up: mgit lineage reads the remotes' settings, lists no key)

        out = {}
        for key in self.list(prefix):
            data, token = self.read_versioned(key, limit=1 << 20)
            if data is not None and token is not None:
                out[key] = (token, hashlib.md5(data, usedforsecurity=False).hexdigest())
        return out
