"""Remotes: where a repository is shared. A URL names one (`/path`, `file:///path`,
`s3://bucket/prefix`, `gs://bucket/prefix` or `az://container/prefix`); `open_backend` gives
the backend that reads and writes its keys.

Credentials never appear in a URL or in the repository: an S3 remote takes them from the
standard AWS chain (environment, shared config and credentials files, `--profile`), a GCS
remote from Google's Application Default Credentials, an Azure remote from Azure's
(AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT and _KEY, a service principal, a
managed identity), and a URL that holds any is refused.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from mgit.errors import InvalidOptionError
from mgit.remotes.base import Backend

S3_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")
GCS_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]\Z")
AZURE_CONTAINER_RE = re.compile(r"^[a-z0-9](?!.*--)[a-z0-9-]{1,61}[a-z0-9]\Z")
BUCKET_NAMES = {
    "s3": (S3_BUCKET_RE, "an S3 bucket"),
    "gs": (GCS_BUCKET_RE, "a GCS bucket"),
    "az": (AZURE_CONTAINER_RE, "an Azure container"),
}
OBJECT_STORE_SCHEMES = ("s3://", "gs://", "az://")  # remotes in a cloud bucket or container, not a folder


@dataclass(frozen=True)
class RemoteSpec:
    """A remote as recorded in config.json: where it is and how to reach it (no secrets)."""

    url: str
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None

    @property
    def kind(self) -> str:
        """One of "s3", "gcs", "azure" and "folder"."""
        kinds = {"s3://": "s3", "gs://": "gcs", "az://": "azure"}
        return next((kind for scheme, kind in kinds.items() if self.url.startswith(scheme)), "folder")


def normalize_url(url: str, *, cwd: Path | None = None) -> str:
    """`s3://bucket/prefix`, `gs://bucket/prefix` or `az://container/prefix` (no trailing
    slash), or an absolute folder path; a URL holding credentials, or of a scheme MGit does not
    speak, is refused."""
    parts = urlsplit(url)
    if parts.username or parts.password or "@" in parts.netloc:
        raise InvalidOptionError(
            f"refusing a remote URL that holds credentials ({parts.scheme}://…@{parts.hostname})",
            hint="Give credentials through your cloud's chain (AWS_ACCESS_KEY_ID, "
            "~/.aws/credentials, --profile; GOOGLE_APPLICATION_CREDENTIALS; AZURE_STORAGE_CONNECTION_STRING), "
            "never in the URL",
        )
    if parts.scheme in BUCKET_NAMES:
        pattern, what = BUCKET_NAMES[parts.scheme]
        if not pattern.match(parts.netloc or ""):
            raise InvalidOptionError(
                f"{url!r} does not name {what}",
                hint="Use s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX",
            )
        prefix = "/".join(p for p in parts.path.split("/") if p)
        if any(p in (".", "..") for p in prefix.split("/")):
            raise InvalidOptionError(f"{url!r} has '.' or '..' in its prefix")
        return f"{parts.scheme}://{parts.netloc}" + (f"/{prefix}" if prefix else "")
    if parts.scheme == "file":
        return str(Path(parts.path).resolve())
    if parts.scheme and len(parts.scheme) > 1:  # (a Windows drive letter is one letter)
        raise InvalidOptionError(
            f"remote URL scheme {parts.scheme!r} is not supported",
            hint="Use a folder path, file:///PATH, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or az://CONTAINER/PREFIX",
        )
    return str((cwd or Path.cwd()).joinpath(os.path.expanduser(url)).resolve())


def open_backend(spec: RemoteSpec) -> Backend:
    """The backend of a remote (each cloud's client is imported only for a remote there)."""
    if spec.kind == "gcs":
        from mgit.remotes.gcs import GCSBackend

        return GCSBackend(spec.url, endpoint_url=spec.endpoint_url)
    if spec.kind == "azure":
        from mgit.remotes.objectstore import ObjectStoreBackend

        return ObjectStoreBackend.azure(spec.url, endpoint_url=spec.endpoint_url)
    if spec.kind == "s3":
        from mgit.remotes.s3 import S3Backend

        return S3Backend(spec.url, endpoint_url=spec.endpoint_url, region=spec.region, profile=spec.profile)
    from mgit.remotes.folder import FolderBackend

    return FolderBackend(Path(spec.url), url=spec.url)
