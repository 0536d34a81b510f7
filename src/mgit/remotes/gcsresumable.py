"""A resumable upload to Google Cloud Storage that survives the death of its process: a push
killed (or cut off) in the middle of a large object sends, when run again, only the bytes the
bucket lacks.

GCS's resumable upload session is the state: google-cloud-storage opens it
(`Blob.create_resumable_upload_session`), and its URI goes into the transfer journal
(mgit.remotes.journal) before the first byte goes. The file then goes in parts of the
backend's part size (a multiple of 256 KiB, as GCS wants), each a PUT with its Content-Range
on the client's own authorized transport. A re-run finds the entry, asks the session how many
bytes it holds (a PUT of `Content-Range: bytes */SIZE`, GCS's status query), and sends the
rest from there; an entry whose file changed is dropped (its session cancelled), and one whose
session the server no longer knows (expired after a week, cancelled, unknown: 404 or 410)
or that refuses a part it said it lacked, too, and the object starts again. The finished
object is checked: its size, and its md5Hash against the file's MD5. The journal entry goes
last.

Why not google-resumable-media's ResumableUpload: it keeps the session URI, the stream and
the bytes sent in private fields, so it cannot take up a session another process opened
without reaching into them; the protocol itself is four requests and is spoken here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mgit.errors import RemoteError, RemoteUnavailableError
from mgit.remotes.journal import UPLOADS
from mgit.util.faults import crash_point

ATTEMPTS = 5  # a part whose request fails (a dropped connection, 429, 5xx) is retried from the status
DONE, GONE = (200, 201), (404, 410)
RANGE = re.compile(r"^bytes=0-(\d+)\Z")


class ResumableSession:
    """One file to one key of a GCSBackend through a journalled resumable upload session.
    `parts_sent` and `bytes_sent` count what this run sent (not what an earlier run did)."""

    def __init__(self, backend: Any, key: str) -> None:
        self.backend, self.key = backend, key
        self.url, self.journal = backend.url, backend.journal
        self.parts_sent = self.bytes_sent = 0

    def run(self, path: Path, *, progress: Callable[[int], None] | None = None) -> dict[str, Any]:
        """Send `path`, resuming the journal's session where it fits; the object's resource."""
        stat = path.stat()
        size = stat.st_size
        part_size = self.backend.part_size
        ident = {"size": size, "mtime_ns": stat.st_mtime_ns, "part_size": part_size, "file": str(path)}
        entry = self.journal.load(UPLOADS, self.url, self.key)
        session, offset, resource = None, 0, None
        resumed = entry is not None and all(entry.get(k) == v for k, v in ident.items())
        if resumed and entry is not None and self._ours(entry.get("session")):
            session = str(entry["session"])
            offset, resource = self._status(session, size)
            if offset is None and resource is None:  # the server no longer knows it
                session = None
        elif entry is not None and self._ours(entry.get("session")):  # the file changed: no use
            self.cancel(str(entry["session"]))
        if session is None:
            resumed = False
            self.journal.drop(UPLOADS, self.url, self.key)
            with self.backend._translated(self.key, bucket=True):
                session = self.backend._blob(self.key).create_resumable_upload_session(
                    size=size, timeout=self.backend.timeout, checksum=None
                )
            if not self._ours(session):
                raise RemoteError(f"{self.url}: the upload session of {self.key} is not on its endpoint")
            self.journal.save(UPLOADS, self.url, self.key, {**ident, "session": session})
            offset = 0
        if progress and offset:
            progress(offset)
        try:
            if resource is None:
                resource = self._send(session, path, offset or 0, size, progress)
        except RemoteUnavailableError:
            raise
        except RemoteError:
            if not resumed:
                raise
            # A session taken up that refuses what it said it lacked: never a push stuck on it
            # for the week it lives; the object starts again, once, in a new session.
            self.cancel(session)
            self.journal.drop(UPLOADS, self.url, self.key)
            return self.run(path, progress=progress)
        self._check(resource, path, size)
        self.journal.drop(UPLOADS, self.url, self.key)
        return resource

    def _send(
        self, session: str, path: Path, offset: int, size: int, progress: Callable[[int], None] | None
    ) -> dict[str, Any]:
        """Send the file from `offset` on, part after part; the object's resource."""
        part_size, failures, resource = self.backend.part_size, 0, None
        with open(path, "rb") as fh:
            while resource is None:
                length = min(part_size, size - offset)
                body = os.pread(fh.fileno(), length, offset)
                try:
                    got = self._put(session, body, {"Content-Range": _content_range(offset, length, size)})
                except RemoteUnavailableError:
                    failures += 1
                    if failures >= ATTEMPTS:
                        raise
                    time.sleep(min(8.0, 0.5 * 2**failures))
                    held, resource = self._status(session, size)
                    if held is None and resource is None:
                        raise RemoteError(f"{self.url}: the upload session of {self.key} ended mid-way") from None
                    offset = size if held is None else held
                    continue
                self.parts_sent += 1
                self.bytes_sent += length
                resource = self._resource(got) if got.status_code in DONE else None
                before, offset = offset, size if resource is not None else self._offset(got)
                if offset <= before:  # the part did not take: sent again, a bounded number of times
                    failures += 1
                    if failures >= ATTEMPTS:
                        raise RemoteError(f"{self.url}: the upload session of {self.key} took no bytes at {before}")
                elif progress:
                    progress(offset - before)
                crash_point("upload-part-sent")
        return resource

    def _ours(self, session: object) -> bool:
        """A session URI on the client's own endpoint (the credentials go wherever it points)."""
        if not isinstance(session, str):
            return False
        mine, its = urlsplit(self.backend.client.api_endpoint), urlsplit(session)
        return (its.scheme, its.netloc) == (mine.scheme, mine.netloc) and "upload_id=" in its.query

    def _put(self, session: str, body: bytes, headers: dict[str, str]) -> Any:
        """One PUT to the session; its answer if a status GCS gives a session (200, 201, 308,
        404, 410), else the error it means."""
        import requests.exceptions as http_errors

        try:
            got = self.backend.http.put(
                session, data=body, headers=headers, timeout=self.backend.timeout, allow_redirects=False
            )
        except (http_errors.ConnectionError, http_errors.Timeout, http_errors.ChunkedEncodingError) as exc:
            raise RemoteUnavailableError(self.url, f"sending {self.key}: {exc}") from exc
        if got.status_code in (*DONE, 308, *GONE):
            return got
        said = f"sending {self.key}: HTTP {got.status_code} from its upload session"
        if got.status_code == 429 or got.status_code >= 500:
            raise RemoteUnavailableError(self.url, said)
        raise RemoteError(f"{self.url}: {said}")

    def _status(self, session: str, size: int) -> tuple[int | None, dict[str, Any] | None]:
        """(bytes the session holds, None), (None, the object's resource) if it is complete,
        or (None, None) if the server no longer knows the session."""
        got = self._put(session, b"", {"Content-Range": f"bytes */{size}"})
        if got.status_code in GONE:
            return None, None
        if got.status_code in DONE:
            return None, self._resource(got)
        return self._offset(got), None

    def _offset(self, got: Any) -> int:
        """The bytes a 308 says the session holds (no Range: none yet)."""
        said = got.headers.get("Range")
        if said is None:
            return 0
        match = RANGE.match(said)
        if match is None:
            raise RemoteError(f"{self.url}: the upload session of {self.key} answered Range {said[:80]!r}")
        return int(match[1]) + 1

    def _resource(self, got: Any) -> dict[str, Any]:
        try:
            resource = json.loads(got.content[: 1 << 20])
        except ValueError:
            resource = None
        if not isinstance(resource, dict):
            raise RemoteError(f"{self.url}: the upload of {self.key} ended without the object's description")
        return resource

    def _check(self, resource: dict[str, Any], path: Path, size: int) -> None:
        """The object the session made: of the file's size, and with its MD5 where GCS gives one
        (a composite or encrypted object has none)."""
        md5 = hashlib.md5(usedforsecurity=False)
        with open(path, "rb") as fh:
            while chunk := fh.read(16 << 20):
                md5.update(chunk)
        said_size, said_md5 = str(resource.get("size")), resource.get("md5Hash")
        expected = base64.b64encode(md5.digest()).decode()
        if said_size != str(size) or (said_md5 is not None and said_md5 != expected):
            self.backend.delete(self.key)  # never left where a re-run would take it for whole
            raise RemoteError(
                f"{self.url}: {self.key} is not what was sent after its upload completed "
                f"({said_size} bytes, md5Hash {said_md5!r}; sent {size} bytes, MD5 {expected})",
                hint="Run the push again: the object is sent anew",
            )

    def cancel(self, session: str) -> None:
        """End a session the journal no longer needs (one already gone is fine)."""
        import requests.exceptions as http_errors

        if not self._ours(session):
            return
        # (One that cannot be reached expires by itself after a week, and is not billed.)
        with suppress(http_errors.ConnectionError, http_errors.Timeout):
            self.backend.http.delete(session, timeout=self.backend.timeout, allow_redirects=False)


def write_journalled(backend: Any, key: str, path: Path, progress: Callable[[int], None] | None) -> bool:
    """GCSBackend.write_file of a large file through the backend's journal, resuming a killed
    push's session; False when another process of this repository sends that key (the caller
    then sends it without the journal)."""
    with backend.journal.claim(UPLOADS, backend.url, key) as mine:
        if not mine:
            return False
        ResumableSession(backend, key).run(path, progress=progress)
    return True


def forget_unneeded(backend: Any, keys: set[str]) -> int:
    """GCSBackend.abort_unfinished: drop the journal's entries of sessions no push needs any
    more (stale, or of an object now whole on the remote), cancelling their sessions; how many."""
    if backend.journal is None:
        return 0
    sessions = {e["key"]: e.get("session") for e in backend.journal.uploads(backend.url)}
    _, unneeded = backend.journal.sort_uploads(backend.url, keys, backend.exists)
    for key in unneeded:
        if isinstance(sessions.get(key), str):
            ResumableSession(backend, key).cancel(str(sessions[key]))
    return len(unneeded)


def _content_range(start: int, length: int, size: int) -> str:
    return f"bytes {start}-{start + length - 1}/{size}" if length else f"bytes */{size}"
