"""A multipart upload to S3 that survives the death of its process: a push killed (or cut
off) in the middle of a large object sends, when run again, only the parts the bucket lacks.

The upload id and the file it sends are kept in the transfer journal (mgit.remotes.journal)
before the first part goes. A re-run finds the entry, asks the bucket which parts it holds
(ListParts), keeps those whose size and MD5 (a part's ETag) match the file's own bytes, and
sends the rest; an entry whose file changed, or whose upload the bucket no longer knows, is
dropped (its upload aborted) and the object starts again. After CompleteMultipartUpload the
object is checked: its size, and its ETag against the one S3 computes for these parts (the
MD5 of their MD5s) where the server gives MD5 ETags. The journal entry goes last.

S3Backend's journalled writes and its clean-up of unfinished uploads live here too
(`write_journalled`, `abort_unfinished`).

Why not s3transfer (which an upload without a journal still uses): it keeps its upload id to
itself and aborts the upload when it fails, so nothing of a part-done upload survives.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from mgit.errors import MissingKeyError, RemoteError
from mgit.remotes.journal import UPLOADS, TransferJournal

MD5_ETAG = re.compile(r'^"?([0-9a-f]{32})"?\Z')
MAX_PARTS = 10_000  # S3's limit per upload
MAX_LIST_PAGES = 20  # ListParts gives 1,000 parts a page
MAX_UPLOAD_PAGES = 100_000  # ListMultipartUploads: a listing that never ends comes from a broken server


class ResumableUpload:
    """One file to one key through a journalled multipart upload. `translated(key)` turns the
    client's errors into MGit's (S3Backend's); `progress` is called with each part's bytes."""

    def __init__(self, client: Any, bucket: str, full_key: str, *, url: str, key: str) -> None:
        self.client, self.bucket, self.full_key, self.url, self.key = client, bucket, full_key, url, key

    def configure(
        self,
        *,
        part_size: int,
        workers: int,
        journal: TransferJournal,
        translated: Callable[[str], AbstractContextManager[None]],
    ) -> None:
        self.part_size, self.workers, self.journal, self.translated = part_size, workers, journal, translated

    def run(self, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        stat = path.stat()
        size = stat.st_size
        part_size = max(self.part_size, -(-size // MAX_PARTS))
        count = max(1, -(-size // part_size))
        ident = {"size": size, "mtime_ns": stat.st_mtime_ns, "part_size": part_size, "file": str(path)}
        entry = self.journal.load(UPLOADS, self.url, self.key)
        done: dict[int, str] = {}
        if entry is not None and all(entry.get(k) == v for k, v in ident.items()):
            upload_id = str(entry.get("upload_id"))
            try:
                done = self._parts_kept(upload_id, path, size, part_size, count)
            except MissingKeyError:  # NoSuchUpload: aborted or completed meanwhile
                entry = None
        elif entry is not None:  # the file it was sending changed: its parts are of no use
            self.abort(str(entry.get("upload_id")))
            entry = None
        if entry is None:
            self.journal.drop(UPLOADS, self.url, self.key)
            with self.translated(self.key):
                upload_id = self.client.create_multipart_upload(Bucket=self.bucket, Key=self.full_key)["UploadId"]
            self.journal.save(UPLOADS, self.url, self.key, {**ident, "upload_id": upload_id})
        if progress and done:
            progress(sum(min(part_size, size - (n - 1) * part_size) for n in done))

        def send(number: int) -> tuple[int, str]:
            start = (number - 1) * part_size
            with open(path, "rb") as fh:
                body = os.pread(fh.fileno(), min(part_size, size - start), start)
            with self.translated(self.key):
                got = self.client.upload_part(
                    Bucket=self.bucket, Key=self.full_key, UploadId=upload_id, PartNumber=number, Body=body
                )
            if progress:
                progress(len(body))
            return number, str(got["ETag"])

        missing = [n for n in range(1, count + 1) if n not in done]
        with ThreadPoolExecutor(
            max_workers=max(1, min(self.workers, len(missing))), thread_name_prefix="mgit-part"
        ) as pool:
            done.update(pool.map(send, missing))
        parts = [{"PartNumber": n, "ETag": done[n]} for n in range(1, count + 1)]
        with self.translated(self.key):
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=self.full_key, UploadId=upload_id, MultipartUpload={"Parts": parts}
            )
        self._check_complete(size, [done[n] for n in range(1, count + 1)])
        self.journal.drop(UPLOADS, self.url, self.key)

    def _parts_kept(self, upload_id: str, path: Path, size: int, part_size: int, count: int) -> dict[int, str]:
        """{part number: ETag} of the parts the bucket holds for this upload that are the
        file's bytes (their size, and their MD5 where the ETag is one); the others go again."""
        listed: dict[int, tuple[int, str]] = {}
        marker = 0
        for _page in range(MAX_LIST_PAGES):
            with self.translated(self.key):
                got = self.client.list_parts(
                    Bucket=self.bucket, Key=self.full_key, UploadId=upload_id, PartNumberMarker=marker
                )
            for part in got.get("Parts", ()):
                number, psize, etag = part.get("PartNumber"), part.get("Size"), part.get("ETag")
                if isinstance(number, int) and 1 <= number <= count and isinstance(psize, int) and etag:
                    listed[number] = (psize, str(etag))
            if not got.get("IsTruncated"):
                break
            marker = int(got.get("NextPartNumberMarker") or 0)
        kept = {}
        with open(path, "rb") as fh:
            for number, (psize, etag) in sorted(listed.items()):
                start = (number - 1) * part_size
                if psize != min(part_size, size - start):
                    continue
                md5 = MD5_ETAG.match(etag)
                if (
                    md5
                    and hashlib.md5(os.pread(fh.fileno(), psize, start), usedforsecurity=False).hexdigest() != md5[1]
                ):
                    continue
                kept[number] = etag
        return kept

    def _check_complete(self, size: int, etags: list[str]) -> None:
        """The object the parts made: of the file's size, and with the ETag S3 gives such an
        object (the MD5 of the parts' MD5s, and their count) when the parts' ETags are MD5s."""
        with self.translated(self.key):
            head = self.client.head_object(Bucket=self.bucket, Key=self.full_key)
        digests = [MD5_ETAG.match(e) for e in etags]
        said = str(head.get("ETag", "")).strip('"')
        expected = None
        if all(digests) and said.endswith(f"-{len(etags)}"):
            joined = b"".join(bytes.fromhex(d[1]) for d in digests if d)
            expected = f"{hashlib.md5(joined, usedforsecurity=False).hexdigest()}-{len(etags)}"
        if head.get("ContentLength") != size or (expected is not None and said != expected):
            with self.translated(self.key):  # never left where a re-run would take it for whole
                self.client.delete_object(Bucket=self.bucket, Key=self.full_key)
            raise RemoteError(
                f"{self.url}: {self.key} is not what was sent after its upload completed "
                f"({head.get('ContentLength')} bytes, ETag {said!r}; sent {size} bytes)",
                hint="Run the push again: the object is sent anew",
            )

    def abort(self, upload_id: str) -> None:
        """Abort an upload the journal no longer needs (one already gone is fine)."""
        try:
            with self.translated(self.key):
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=self.full_key, UploadId=upload_id)
        except MissingKeyError:
            pass


def write_journalled(backend: Any, key: str, path: Path, progress: Callable[[int], None] | None) -> bool:
    """S3Backend.write_file of a large file through the backend's journal, resuming a killed
    push's upload; False when another process of this repository sends that key (the caller
    then sends it whole, not through the journal)."""
    journal = backend.journal
    with journal.claim(UPLOADS, backend.url, key) as mine:
        if not mine:
            return False
        upload = ResumableUpload(backend.client, backend.bucket, backend._key(key), url=backend.url, key=key)
        workers = backend.transfer.max_request_concurrency
        part_size = backend.transfer.multipart_chunksize
        upload.configure(part_size=part_size, workers=workers, journal=journal, translated=backend._translated)
        try:
            upload.run(path, progress=progress)
        except MissingKeyError:  # NoSuchUpload: another push took it for a killed one's and aborted it
            journal.drop(UPLOADS, backend.url, key)
            upload.run(path, progress=progress)
    return True


def abort_unfinished(backend: Any, keys: set[str]) -> int:
    """S3Backend.abort_unfinished: abort the multipart uploads left for `keys` (billed until
    aborted) but those the backend's journal resumes, and those the journal no longer needs."""
    journal, url = backend.journal, backend.url
    resumed, unneeded = journal.sort_uploads(url, keys, backend.exists) if journal else (set(), [])
    wanted = {backend._key(k) for k in keys | set(unneeded)}
    if not wanted:
        return 0
    found = []
    pages = backend.client.get_paginator("list_multipart_uploads").paginate(
        Bucket=backend.bucket, Prefix=os.path.commonprefix(sorted(wanted))
    )
    with backend._translated():
        for number, page in enumerate(pages):
            if number >= MAX_UPLOAD_PAGES:
                raise RemoteError(f"{url}: listing its uploads did not end after {number} pages")
            found += [
                (u["Key"], u["UploadId"])
                for u in page.get("Uploads", ())
                if u.get("Key") in wanted and u.get("UploadId") not in resumed
            ]
    for full, upload in found:
        try:
            with backend._translated(full):
                backend.client.abort_multipart_upload(Bucket=backend.bucket, Key=full, UploadId=upload)
        except MissingKeyError:  # NoSuchUpload: completed or aborted meanwhile
            pass
    return len(found)
