"""The local journal of large transfers under way, so that a push or a fetch that was killed
or cut off sends or fetches, when run again, only what it had not done yet, inside an object
too (docs/format.md, "The transfer journal"):

    .mgit/transfers/uploads/<name>.json     an upload in progress: the remote's URL, the key,
                                            what names it on the server (S3's upload id, a GCS
                                            session's URI, the nonce of Azure's block ids), the
                                            part size, and the size and mtime of the local file
                                            being sent
    .mgit/transfers/downloads/<name>.part   an object's bytes arrived so far, at their offsets
    .mgit/transfers/downloads/<name>.json   the remote's URL, the key, its size, the chunk size,
                                            and the chunks written so far
    .mgit/transfers/<kind>/<name>.lock      held by the one process working on that transfer

`<name>` is a hash of the URL and the key. An entry is a hint and nothing more: a resumed
upload checks what the server holds against the file's own bytes (S3's part MD5s, Azure's
block ids, which carry theirs) or takes the server's own count (a GCS session's), and checks
the object it completes; a resumed download makes an object that is verified against its id
like any other (one that fails is refused, and fetched from its first byte by the next run);
an entry that does not fit is dropped and its transfer starts again. Entries are small JSON
files written atomically, without fsync: a machine that crashes may lose one, which costs a
re-send, never a wrong byte.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import blake3

from mgit.errors import InvalidOptionError, LockTimeoutError
from mgit.util.atomicfile import write_atomic
from mgit.util.locks import FileLock

UPLOADS, DOWNLOADS = "uploads", "downloads"
MAX_ENTRY = 1 << 20  # an entry is a few kilobytes: 64 chunks per GiB at 16 MiB chunks
STALE_DAYS = 7.0  # an upload not resumed for this long is aborted (its parts are billed until then)
GRANULE = 256 << 10  # the part size of gs:// and az:// is a multiple of this (GCS wants it so)


def part_size_from_env(default: int) -> int:
    """The part size of a gs:// or az:// remote's large transfers: MGIT_REMOTE_PART_SIZE in
    bytes (a multiple of 256 KiB up to 4000 MiB, Azure's largest block), or `default`. What a
    killed push or fetch resumes from is a whole part."""
    raw = os.environ.get("MGIT_REMOTE_PART_SIZE")
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 12) or not (
        0 < int(raw) <= 4000 << 20 and int(raw) % GRANULE == 0
    ):
        raise InvalidOptionError(
            f"MGIT_REMOTE_PART_SIZE={raw!r} is not a part size", hint="Use a multiple of 262144 (256 KiB)"
        )
    return int(raw)


def entry_name(url: str, key: str) -> str:
    return blake3.blake3(f"{url}\n{key}".encode()).hexdigest()[:32]


class TransferJournal:
    """Entries under `root` (a repository's `transfers/` folder), one per remote key."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, kind: str, url: str, key: str, suffix: str) -> Path:
        return self.root / kind / f"{entry_name(url, key)}{suffix}"

    @contextmanager
    def claim(self, kind: str, url: str, key: str) -> Iterator[bool]:
        """`with journal.claim(...) as mine:` True while this process alone works on this
        transfer; False when another one does (then it goes without the journal)."""
        lock = FileLock(self.path(kind, url, key, ".lock"), what=f"the transfer of {key}", timeout=0)
        try:
            lock.acquire()
        except LockTimeoutError:
            yield False
            return
        try:
            yield True
        finally:
            # A finished transfer leaves nothing, its lock file included. (Another process
            # could take the lock of the unlinked file while a third takes a new one: both
            # would then fetch or send the same bytes to the same offsets, as objects are
            # content-addressed, and every part and chunk is checked after.)
            if not self.path(kind, url, key, ".json").exists():
                self.path(kind, url, key, ".lock").unlink(missing_ok=True)
            lock.release()

    def load(self, kind: str, url: str, key: str) -> dict[str, Any] | None:
        """The entry of this transfer, if there is a readable one naming it."""
        path = self.path(kind, url, key, ".json")
        try:
            with open(path, "rb") as fh:
                entry = json.loads(fh.read(MAX_ENTRY + 1))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("url") != url or entry.get("key") != key:
            return None
        return entry

    def save(self, kind: str, url: str, key: str, entry: dict[str, Any]) -> None:
        path = self.path(kind, url, key, ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({**entry, "url": url, "key": key, "updated": time.time()}, sort_keys=True).encode()
        write_atomic(path, [data], fsync=False)

    def drop(self, kind: str, url: str, key: str) -> None:
        """Forget a transfer: its entry and, for a download, the bytes that had arrived."""
        for suffix in (".json", ".part"):
            self.path(kind, url, key, suffix).unlink(missing_ok=True)

    def uploads(self, url: str) -> list[dict[str, Any]]:
        """The upload entries of the remote at `url`."""
        out = []
        for path in sorted((self.root / UPLOADS).glob("*.json")):
            with suppress(OSError, ValueError):
                entry = json.loads(path.read_bytes()[:MAX_ENTRY])
                if isinstance(entry, dict) and entry.get("url") == url and isinstance(entry.get("key"), str):
                    out.append(entry)
        return out

    def sort_uploads(self, url: str, keys: set[str], exists: Callable[[str], bool]) -> tuple[set[str], list[str]]:
        """Before a push of `keys` to `url`: (the upload ids it resumes, so not to be aborted;
        the keys of uploads no longer needed: stale, or of an object now whole on the remote,
        whose entries are dropped here and whose uploads the caller aborts)."""
        resumed, unneeded = set(), []
        for entry in self.uploads(url):
            if entry["key"] in keys and not self.stale(entry):
                resumed.add(str(entry.get("upload_id")))
            elif self.stale(entry) or exists(entry["key"]):
                unneeded.append(entry["key"])
                self.drop(UPLOADS, url, entry["key"])
        return resumed, unneeded

    @staticmethod
    def stale(entry: dict[str, Any], *, days: float = STALE_DAYS) -> bool:
        updated = entry.get("updated")
        return not isinstance(updated, (int, float)) or time.time() - updated > days * 86400
