"""A remote seen as a repository: the layout of docs/format.md ("Remotes") over a backend.

    config.json              {"format": 1, "bare": true, "created": ...}: what makes it a remote
    objects/ab/cdef...       object files, byte for byte as in a repository (immutable)
    refs/models/<name>       a version id and a newline; moved only by compare-and-swap
    refs/tags/<id>           tags set later on a version (mgit.sync.tags); compare-and-swap too
    packs/<id>.mgpack        metadata packs: what a clone reads in one request (mgit.remotes.pack)
    checks/tests/<name>.json test registrations; checks/results/<id>.json recorded results

Everything read here is checked before it is used: ref names and values, the config's
format, and every size against a limit (the objects themselves are verified against their
ids by whoever keeps them).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mgit.errors import (
    InvalidNameError,
    MissingKeyError,
    ModelNameConflictError,
    RemoteConflictError,
    RemoteError,
    RemoteNotFoundError,
    RepoExistsError,
)
from mgit.index.refs import validate_model_name
from mgit.remotes import partial
from mgit.remotes.base import Backend
from mgit.remotes.journal import TransferJournal
from mgit.store.objects import OID_RE, utc_now

REMOTE_FORMAT = 1
MAX_SMALL = 1 << 20  # a config, a ref, a registration: far smaller than this
REFS = "refs/models/"
WORKERS = 16  # requests in flight: S3 latency, not bandwidth, bounds small transfers


def object_key(oid: str) -> str:
    if not OID_RE.match(oid):
        raise RemoteError(f"not an object id: {oid!r}")
    return f"objects/{oid[:2]}/{oid[2:]}"


class RemoteRepository:
    """`journal`: where a repository keeps its large transfers under way (its `transfers/`
    folder), so that a killed or cut-off push or fetch resumes inside an object."""

    def __init__(self, backend: Backend, *, journal: TransferJournal | None = None) -> None:
        self.backend = backend
        if journal is not None:
            backend.journal = journal
        self.url = backend.url
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="mgit-remote")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def map(self, fn: Any, items: Iterable[Any]) -> list[Any]:
        """`fn` over `items`, WORKERS requests at a time, results in order."""
        return list(self._pool.map(fn, items))

    # --- the remote itself ----------------------------------------------------------------
    def init_bare(self) -> None:
        """Lay out an empty remote: its config.json, written only if none is there."""
        self.backend.check()
        config = {"format": REMOTE_FORMAT, "bare": True, "created": utc_now()}
        try:
            self.backend.write_if("config.json", json.dumps(config, indent=2).encode() + b"\n", token=None)
        except RemoteConflictError:
            raise RepoExistsError(self.url) from None

    def check(self) -> dict[str, Any]:
        """The remote's config, if it is an mgit remote of a format this mgit reads."""
        self.backend.check()
        try:
            raw = self.backend.read("config.json", limit=MAX_SMALL)
        except MissingKeyError:
            raise RemoteNotFoundError(
                f"{self.url} is not an mgit remote (no config.json)",
                hint=f"Lay one out with: mgit init --bare {self.url}",
            ) from None
        try:
            config = json.loads(raw)
            fmt = config.get("format")
        except (ValueError, AttributeError):
            raise RemoteError(f"{self.url}: config.json is not readable") from None
        if fmt != REMOTE_FORMAT:
            raise RemoteError(
                f"{self.url} has format {fmt!r}; this mgit reads format {REMOTE_FORMAT}", hint="Upgrade mgit"
            )
        return config

    # --- refs -------------------------------------------------------------------------------
    def model_names(self) -> list[str]:
        names = []
        for key in self.backend.list(REFS):
            name = key[len(REFS) :]
            try:
                names.append(validate_model_name(name))
            except InvalidNameError:
                raise RemoteError(f"{self.url} has a ref with an invalid model name {name!r}") from None
        found = set(names)
        for name in names:  # x and x/y (S3 has no folders to forbid it): refused, as a local add does
            parts = name.split("/")
            for above in ("/".join(parts[:i]) for i in range(1, len(parts))):
                if above in found:
                    raise ModelNameConflictError(name, above, where=self.url)
        return names

    def check_new_names(self, names: Iterable[str]) -> None:
        """Refuse to create models whose names are above or under a model on the remote."""
        for name in names:
            parts = validate_model_name(name).split("/")
            for above in ("/".join(parts[:i]) for i in range(1, len(parts))):
                if self.backend.exists(REFS + above):
                    raise ModelNameConflictError(name, above, where=self.url)
            under = next(iter(self.backend.list(f"{REFS}{name}/")), None)
            if under is not None:
                raise ModelNameConflictError(name, under[len(REFS) :], where=self.url)

    def head(self, name: str) -> tuple[str | None, str | None]:
        """A model's head on the remote and the token a compare-and-swap needs (None, None
        when the model is not there)."""
        data, token = self.backend.read_versioned(REFS + validate_model_name(name), limit=MAX_SMALL)
        if data is None:
            return None, None
        value = data.decode("ascii", "replace").strip()
        if not OID_RE.match(value):
            raise RemoteError(f"the head of {name!r} on {self.url} is damaged ({value[:20]!r})")
        return value, token

    def heads(self, names: Iterable[str] | None = None) -> dict[str, tuple[str, str | None]]:
        """{model: (head, token)} for these models (default: every model on the remote)."""
        chosen = self.model_names() if names is None else list(names)
        found = self.map(self.head, chosen)
        return {n: (vid, tok) for n, (vid, tok) in zip(chosen, found, strict=True) if vid is not None}

    def move_head(self, name: str, new: str, *, expected: str | None, token: str | None) -> None:
        """Compare-and-swap: move `name` to `new` only if it is still at `expected` (whose
        version token is `token`; None for a model new to the remote)."""
        if not OID_RE.match(new):
            raise RemoteError(f"a ref must name a version id, not {new!r}")
        if (expected is None) != (token is None):
            raise RemoteConflictError(self.url, REFS + name)
        if expected is None:
            self.check_new_names([name])
        self.backend.write_if(REFS + validate_model_name(name), f"{new}\n".encode(), token=token)

    # --- objects ----------------------------------------------------------------------------
    def has_object(self, oid: str) -> bool:
        return self.backend.exists(object_key(oid))

    def has_objects(self, sizes: Mapping[str, int | None]) -> set[str]:
        """Which of these objects ({id: its stored size, or None where not known}) the remote
        holds, as files of that size (one request each, in parallel): an object a full disk
        cut short, or anything else under its name, is not there, and is sent again."""
        wanted = sorted(sizes)
        found = self.map(lambda o: self.backend.size(object_key(o)), wanted)
        return {
            o
            for o, size in zip(wanted, found, strict=True)
            if size is not None and (sizes[o] is None or size == sizes[o])
        }

    def read_object(self, oid: str, *, limit: int) -> bytes:
        return self.backend.read(object_key(oid), limit=limit)

    def read_object_into(self, oid: str, path: Path, *, limit: int, progress: Any = None) -> int:
        """Download an object into the new file `path` (in ranges a re-run resumes, if it may
        be large); `progress` is called with bytes as they arrive."""
        if partial.ranged(self.backend, limit):
            return partial.download(self.backend, object_key(oid), path, limit=limit, progress=progress)
        return partial.whole(self.backend, object_key(oid), path, limit=limit, progress=progress)

    def abort_unfinished(self, oids: Iterable[str]) -> int:
        """Before sending these objects: abort their uploads that a killed push left."""
        return self.backend.abort_unfinished([object_key(o) for o in oids])

    def write_object(self, oid: str, data: bytes | Path, *, progress: Any = None) -> None:
        """Send an object; `progress` is called with bytes as they go (a file's, part by part
        where the backend sends parts, resuming with the journal what a killed push began)."""
        if isinstance(data, Path):
            self.backend.write_file(object_key(oid), data, progress=progress)
            return
        self.backend.write(object_key(oid), data)
        if progress:
            progress(len(data))

    def object_ids(self) -> list[str]:
        """Every object on the remote (a listing: used by fsck, not by transfers)."""
        out = []
        for key in self.backend.list("objects/"):
            oid = key.replace("objects/", "", 1).replace("/", "")
            if OID_RE.match(oid) and key == object_key(oid):
                out.append(oid)
        return out

    # --- metadata packs -----------------------------------------------------------------------
    def pack_ids(self) -> list[str]:
        ids = []
        for key in self.backend.list("packs/"):
            name = key.removeprefix("packs/")
            if name.endswith(".mgpack") and OID_RE.match(name.removesuffix(".mgpack")):
                ids.append(name.removesuffix(".mgpack"))
        return ids

    def read_pack_into(self, pid: str, path: Path, *, limit: int) -> int:
        return self.backend.read_into(f"packs/{pid}.mgpack", path, limit=limit)

    def write_pack(self, pid: str, data: bytes) -> None:
        self.backend.write(f"packs/{pid}.mgpack", data)

    # --- checks -------------------------------------------------------------------------------
    def read_json(self, key: str) -> tuple[Any, str | None]:
        """A small JSON file and its version token, or (None, None)."""
        data, token = self.backend.read_versioned(key, limit=MAX_SMALL)
        if data is None:
            return None, None
        try:
            return json.loads(data), token
        except ValueError:
            raise RemoteError(f"{key} on {self.url} is not JSON") from None

    def list_keys(self, prefix: str) -> list[str]:
        return list(self.backend.list(prefix))

    def write_json(self, key: str, value: Any, *, token: str | None, create_only: bool = False) -> None:
        data = json.dumps(value, sort_keys=True, separators=(",", ":")).encode()
        if create_only or token is not None:
            self.backend.write_if(key, data, token=token)
        else:
            self.backend.write(key, data)
