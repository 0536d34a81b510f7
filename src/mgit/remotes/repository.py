"""A remote seen as a repository: the layout of docs/format.md ("Remotes") over a backend.

    config.json              {"format": 1, "bare": true, "created": ...}: what makes it a remote
    objects/ab/cdef...       object files, byte for byte as in a repository (immutable)
    refs/models/<name>       a version id and a newline; moved only by compare-and-swap, and
                             deleted by one (`push --delete`, through a tombstone)
    refs/heads.json          every model's head and its ref's token: a hint, checked against a
                             listing of the refs (mgit.remotes.heads)
    refs/tags/<id>           tags set later on a version (mgit.sync.tags); compare-and-swap too
    packs/<id>.mgpack        metadata packs: what a clone reads in one request (mgit.remotes.pack)
    signatures/<id>/<sha256>.sig  SSH signatures of a version (mgit.sync.signatures); written once
    signatures/bundles/<id>.json  the signatures one push sent, in one file (a clone reads it in one request)
    packs/<id>.objpack       data packs: small objects, many in one (mgit.remotes.datapack),
    packs/<id>.objidx        each with its index; written by pushes to a remote whose config
                             says "pack_threshold" (objects stored smaller travel in packs)
    checks/tests/<name>.json test registrations; checks/results/<id>.json recorded results

Everything read here is checked before it is used: ref names and values, the config's
format, and every size against a limit (the objects themselves are verified against their
ids by whoever keeps them).
"""

from __future__ import annotations

import bisect
import json
import tempfile
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from mgit.errors import (
    InvalidNameError,
    MissingKeyError,
    ModelNameConflictError,
    ReceivedError,
    RemoteConflictError,
    RemoteError,
    RemoteNotFoundError,
    RepoExistsError,
)
from mgit.index.refs import validate_model_name
from mgit.remotes import datapack, partial
from mgit.remotes import heads as heads_index
from mgit.remotes.base import Backend
from mgit.remotes.journal import TransferJournal
from mgit.store.objects import OID_RE, utc_now
from mgit.util.atomicfile import write_atomic
from mgit.util.faults import crash_point
from mgit.util.parallel import TransferProgress

REMOTE_FORMAT = 1
MAX_SMALL = 1 << 20  # a config, a ref, a registration: far smaller than this
REFS = "refs/models/"
TOMBSTONE = b"deleted\n"  # a ref between the two steps of `delete_head`
SIGNATURES = "signatures/"
WORKERS = 16  # requests in flight: S3 latency, not bandwidth, bounds small transfers
LIST_ABOVE = 64  # more loose objects to look for than this: one listing, not a HEAD each
READ_EACH = 4  # this many heads or fewer: read ref by ref, not a listing and the heads index
LIST_PAGE = 1000  # keys a listing request gives (S3's, GCS's and Azure's most)


def object_key(oid: str) -> str:
    if not OID_RE.match(oid):
        raise RemoteError(f"not an object id: {oid!r}")
    return f"objects/{oid[:2]}/{oid[2:]}"


def signature_key(vid: str, name: str) -> str:
    """`signatures/<version id>/<sha256>.sig`, or `signatures/bundles/<blake3>.json` (vid "bundles")."""
    if not ((OID_RE.match(vid) or vid == "bundles") and OID_RE.match(name)):
        raise RemoteError(f"not a signature of a version: {vid[:20]!r}/{name[:20]!r}")
    return f"{SIGNATURES}{vid}/{name}.{'json' if vid == 'bundles' else 'sig'}"


class RemoteRepository:
    """`journal`: where a repository keeps its large transfers under way (its `transfers/`
    folder), so that a killed or cut-off push or fetch resumes inside an object."""

    def __init__(self, backend: Backend, *, journal: TransferJournal | None = None) -> None:
        self.backend = backend
        if journal is not None:
            backend.journal = journal
        self.url = backend.url
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="mgit-remote")
        self.pack_threshold = 0  # from the config (`check`): objects stored smaller go in data packs
        self._packed: dict[str, datapack.Location] = {}  # the data packs' indexes read so far
        self._indexes: dict[str, datapack.PackIndex] = {}
        self._listed = False
        self._index_lock = threading.Lock()

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def map(self, fn: Any, items: Iterable[Any]) -> list[Any]:
        """`fn` over `items`, WORKERS requests at a time, results in order."""
        return list(self._pool.map(fn, items))

    # --- the remote itself ----------------------------------------------------------------
    def init_bare(self, *, pack_threshold: int = datapack.PACK_THRESHOLD) -> None:
        """Lay out an empty remote: its config.json, written only if none is there."""
        self.backend.check()
        config = {"format": REMOTE_FORMAT, "bare": True, "created": utc_now()}
        if pack_threshold:
            config["pack_threshold"] = pack_threshold
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
        threshold = config.get("pack_threshold", 0)
        if not isinstance(threshold, int) or isinstance(threshold, bool) or not 0 <= threshold <= datapack.PACK_TARGET:
            raise RemoteError(f"{self.url}: config.json has a bad pack_threshold {str(threshold)[:20]!r}")
        self.pack_threshold = threshold
        return config

    # --- refs -------------------------------------------------------------------------------
    def model_names(self) -> list[str]:
        return self._names(self.backend.list(REFS))

    def _names(self, keys: Iterable[str]) -> list[str]:
        names = []
        for key in keys:
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

    def listed_refs(self) -> dict[str, tuple[str, str | None]]:
        """{model: (its ref's token, the MD5 of its bytes or None)}, from one listing of the refs."""
        listed = self.backend.list_tokens(REFS)
        return {n: listed[REFS + n] for n in self._names(sorted(listed))}

    def check_new_names(self, names: Iterable[str]) -> None:
        """Refuse to create models whose names are above or under a model on the remote (a
        request or two per name; for many names, one listing of the refs instead)."""
        names = [validate_model_name(n) for n in names]
        listed = sorted(k[len(REFS) :] for k in self.backend.list(REFS)) if len(names) > LIST_ABOVE else None
        for name in names:
            parts = name.split("/")
            for above in ("/".join(parts[:i]) for i in range(1, len(parts))):
                found = above in listed if listed is not None else self.backend.exists(REFS + above)
                if found:
                    raise ModelNameConflictError(name, above, where=self.url)
            if listed is not None:
                at = bisect.bisect_left(listed, f"{name}/")
                under = REFS + listed[at] if at < len(listed) and listed[at].startswith(f"{name}/") else None
            else:
                under = next(iter(self.backend.list(f"{REFS}{name}/")), None)
            if under is not None:
                raise ModelNameConflictError(name, under[len(REFS) :], where=self.url)

    def head(self, name: str) -> tuple[str | None, str | None]:
        """A model's head on the remote and the token a compare-and-swap needs (None, None
        when the model is not there)."""
        data, token = self.backend.read_versioned(REFS + validate_model_name(name), limit=MAX_SMALL)
        if data is None or data == TOMBSTONE:  # (a delete between its two steps: gone)
            return None, None
        value = data.decode("ascii", "replace").strip()
        if not OID_RE.match(value):
            raise RemoteError(f"the head of {name!r} on {self.url} is damaged ({value[:20]!r})")
        return value, token

    def heads(self, names: Iterable[str] | None = None, *, exact: bool = False) -> dict[str, tuple[str, str | None]]:
        """{model: (head, token)} for these models (default: every model on the remote). Many
        (or all) are taken from one listing of the refs and the heads index where its entries
        hold (mgit.remotes.heads), the rest read; a few named, or `exact` (a remote gc, which
        takes no hint), are read ref by ref, and so are fewer than the listing would take pages
        (some models of a remote of very many)."""
        chosen = None if names is None else list(names)
        index: heads_index.Heads = {}
        if not exact and not (chosen is not None and len(chosen) <= READ_EACH):
            index = heads_index.read_index(self.backend)[0]
        if exact or (chosen is not None and len(chosen) <= max(READ_EACH, len(index) // LIST_PAGE)):
            chosen = self.model_names() if chosen is None else chosen
            found = self.map(self.head, chosen)
            return {n: (vid, tok) for n, (vid, tok) in zip(chosen, found, strict=True) if vid is not None}
        listed = self.listed_refs()
        return dict(heads_index.resolve(listed, index, chosen or listed, lambda ns: self.map(self.head, ns)))

    def refresh_heads(self, known: Mapping[str, tuple[str, str | None]]) -> bool:
        """Rewrite the heads index after refs moved (`known`: heads with their tokens, read or
        written by this process); False if racing writers kept it from being written."""
        return heads_index.refresh(self.backend, self.listed_refs, known)

    def move_head(self, name: str, new: str, *, expected: str | None, token: str | None) -> str | None:
        """Compare-and-swap: move `name` to `new` only if it is still at `expected` (whose
        version token is `token`; None for a model new to the remote). The ref's new token,
        where the backend's answer gives it."""
        if not OID_RE.match(new):
            raise RemoteError(f"a ref must name a version id, not {new!r}")
        if (expected is None) != (token is None):
            raise RemoteConflictError(self.url, REFS + name)
        if expected is None:
            self.check_new_names([name])
        key = REFS + validate_model_name(name)
        try:
            return self.backend.write_if(key, f"{new}\n".encode(), token=token)
        except RemoteConflictError:
            if expected is not None or self.backend.read_versioned(key, limit=MAX_SMALL)[0] != TOMBSTONE:
                raise
            self.backend.delete(key)  # a delete killed between its steps: finish it (no one swaps from one)
            return self.backend.write_if(key, f"{new}\n".encode(), token=None)

    def delete_head(self, name: str, *, expected: str, token: str) -> None:
        """Compare-and-swap the ref of `name` away from `expected` (read with `token`):
        RemoteConflictError if a push moved it meanwhile. Backends have no conditional delete
        that all of them share, so the ref is first swapped to a tombstone (which no writer
        swaps from: a head that reads as one is absent, and creating a model over it
        conflicts), then deleted."""
        value, current = self.head(name)
        if value != expected or current != token:
            raise RemoteConflictError(self.url, REFS + name)
        self.backend.write_if(REFS + name, TOMBSTONE, token=token)
        crash_point("delete-after-tombstone")
        self.backend.delete(REFS + name)

    # --- objects ----------------------------------------------------------------------------
    def has_object(self, oid: str) -> bool:
        return oid in self.packed() or self.backend.exists(object_key(oid))

    def has_objects(self, sizes: Mapping[str, int | None]) -> set[str]:
        """Which of these objects ({id: its stored size, or None where not known}) the remote
        holds, as files of that size: in a data pack (the indexes, read afresh), or loose (a
        HEAD each, in parallel, after one listing when there are many to look for). An object
        a full disk cut short, or anything else under its name, is not there, and is sent again."""
        packed = self.packed(refresh=True)
        found = {o for o, n in sizes.items() if o in packed and (n is None or packed[o][2] == n)}
        wanted = sorted(set(sizes) - found)
        if len(wanted) > LIST_ABOVE:
            listed = set(self.backend.list("objects/"))
            wanted = [o for o in wanted if object_key(o) in listed]
        loose = self.map(lambda o: self.backend.size(object_key(o)), wanted)
        return found | {
            o
            for o, size in zip(wanted, loose, strict=True)
            if size is not None and (sizes[o] is None or size == sizes[o])
        }

    def read_object(self, oid: str, *, limit: int) -> bytes:
        where = self.packed().get(oid)
        if where is None:
            return self.backend.read(object_key(oid), limit=limit)
        span = datapack.spans({oid: where})[0]
        try:
            return bytes(next(datapack.slices(span, self._read_span(span, {oid: limit})))[1])
        except MissingKeyError:  # a repack since the indexes were read: looked for again
            if self.packed(refresh=True).get(oid) == where:
                raise
            return self.read_object(oid, limit=limit)

    def read_objects_into(
        self,
        wanted: Mapping[str, tuple[Path, int]],
        *,
        progress: TransferProgress | None = None,
        again: bool = True,
    ) -> dict[str, int | None]:
        """Download these objects ({id: (a new file, the most bytes it may take)}), those in
        data packs by ranged reads (neighbours in one range), the rest one by one (in ranges a
        re-run resumes, if it may be large), in parallel; {id: its size, or None if the remote
        has it neither loose nor packed}. An index that gives an object more bytes than its
        limit is refused before anything is asked for. Each file is renamed into place once
        whole (a killed fetch's quarantine is taken up by the next one). `progress` gets bytes
        as they arrive and each object as it is done."""
        packed = self.packed()
        inside = {o: packed[o] for o in wanted if o in packed}
        loose = sorted(set(wanted) - set(inside))
        sizes: dict[str, int | None] = {}
        gone: list[str] = []

        def one(oid: str) -> None:
            path, limit = wanted[oid]
            key = object_key(oid)
            try:
                if partial.ranged(self.backend, limit):
                    sizes[oid] = partial.download(self.backend, key, path, limit=limit, progress=progress)
                else:
                    sizes[oid] = partial.whole(self.backend, key, path, limit=limit, progress=progress)
            except MissingKeyError:
                sizes[oid] = None
                return
            if progress:
                progress(0, 1)

        def span(piece: datapack.Span) -> None:
            try:
                data = self._read_span(piece, {o: wanted[o][1] for o, _, _ in piece.entries})
            except MissingKeyError:  # a repack since the indexes were read: looked for again
                if not again:
                    raise
                gone.extend(o for o, _, _ in piece.entries)
                return
            for oid, view in datapack.slices(piece, data):
                write_atomic(wanted[oid][0], [view], fsync=False, sync_dir=False)
                sizes[oid] = len(view)
            if progress:
                progress(piece.end - piece.start, len(piece.entries))

        self.map(lambda job: job(), [lambda o=o: one(o) for o in loose])
        self.map(lambda job: job(), [lambda p=p: span(p) for p in datapack.spans(inside)])
        # A pack gone since the indexes were read (a repack), or an object not found loose that
        # a push since may have packed: the indexes are listed again, and those read once more.
        missing = [o for o in loose if sizes[o] is None]
        if again and (gone or missing):
            packed = self.packed(refresh=True)
            retry = gone + [o for o in missing if o in packed]
            if retry:
                sizes.update(self.read_objects_into({o: wanted[o] for o in retry}, progress=progress, again=False))
        return sizes

    def _read_span(self, span: datapack.Span, limits: Mapping[str, int]) -> bytes:
        """The bytes of one span of a pack: a ranged read, or the whole pack (then checked
        against its name). Each entry's length is checked against its object's limit first."""
        for oid, _, length in span.entries:
            if length > limits[oid]:
                raise ReceivedError(
                    f"the index of data pack {span.pid[:16]} on {self.url} gives {oid[:16]} {length} bytes, "
                    f"more than the {limits[oid]} it may take",
                    where=self.url,
                )
        index = self._indexes.get(span.pid)
        whole = index.size if index else -1
        if span.start == 0 and span.end == whole:
            data = self.backend.read(datapack.pack_key(span.pid), limit=whole)
            datapack.check_hash(span.pid, data, where=self.url)
            return data
        return self.backend.read_range(datapack.pack_key(span.pid), span.start, span.end - span.start)

    def packed(self, *, refresh: bool = False) -> dict[str, datapack.Location]:
        """{object id: (pack, offset, length)} from the data packs' indexes: listed and read on
        the first call, and with `refresh` listed again (indexes new since are read, those gone,
        removed by a repack, dropped)."""
        with self._index_lock:
            if self._listed and not refresh:
                return self._packed
            pids = {p for k in self.backend.list("packs/") if (p := datapack.pack_of_index(k))}
            new = sorted(pids - set(self._indexes))
            read = self.map(lambda p: self.backend.read(datapack.index_key(p), limit=datapack.MAX_INDEX), new)
            for pid, data in zip(new, read, strict=True):
                self._indexes[pid] = datapack.PackIndex.parse(pid, data, where=self.url)
            self._indexes = {p: i for p, i in self._indexes.items() if p in pids}
            self._packed = {
                oid: (pid, offset, length)
                for pid, index in sorted(self._indexes.items(), reverse=True)
                for oid, offset, length in index.entries
            }
            self._listed = True
            return self._packed

    def pack_indexes(self) -> dict[str, datapack.PackIndex]:
        """The data packs' indexes read so far, by pack id (what a repack reads)."""
        with self._index_lock:
            return dict(self._indexes)

    def abort_unfinished(self, oids: Iterable[str]) -> int:
        """Before sending these objects: abort their uploads that a killed push left."""
        return self.backend.abort_unfinished([object_key(o) for o in oids])

    def write_object(self, oid: str, data: bytes | Path, *, progress: TransferProgress | None = None) -> None:
        """Send an object; `progress` is called with bytes as they go (a file's, part by part
        where the backend sends parts, resuming with the journal what a killed push began)."""
        if isinstance(data, Path):
            self.backend.write_file(object_key(oid), data, progress=progress)
            return
        self.backend.write(object_key(oid), data)
        if progress:
            progress(len(data))

    def write_packed(self, files: list[tuple[str, Path, int]], *, progress: TransferProgress | None = None) -> int:
        """Send these object files ({id, its file, its stored size}) in data packs of about
        PACK_TARGET bytes, in parallel: each pack, then its index. How many packs."""
        if not files:
            return 0
        paths = {o: p for o, p, _ in files}
        with tempfile.TemporaryDirectory(prefix="mgit-packs-") as tmp:

            def send(group: list[str]) -> None:
                index, path = datapack.build([(o, paths[o]) for o in group], Path(tmp))
                try:
                    self.backend.write(datapack.pack_key(index.pid), path)
                    self.backend.write(datapack.index_key(index.pid), index.to_bytes())
                finally:
                    path.unlink(missing_ok=True)
                if progress:
                    progress(index.size, len(group))

            groups = datapack.groups((o, n) for o, _, n in files)
            self.map(send, groups)
        return len(groups)

    def object_ids(self) -> list[str]:
        """Every object on the remote, loose or packed (a listing: used by fsck, not by transfers)."""
        out = set(self.packed(refresh=True))
        for key in self.backend.list("objects/"):
            oid = key.replace("objects/", "", 1).replace("/", "")
            if OID_RE.match(oid) and key == object_key(oid):
                out.add(oid)
        return sorted(out)

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

    # --- signatures ----------------------------------------------------------------------------
    def signature_names(self) -> tuple[dict[str, set[str]], list[str]]:
        """({version id: names of its signatures}, the ids of the signature bundles), from one
        listing of signatures/; keys that read as neither `signatures/<id>/<sha256>.sig` nor
        `signatures/bundles/<id>.json` are not signatures and are left alone."""
        out: dict[str, set[str]] = {}
        bundles = []
        for key in self.backend.list(SIGNATURES):
            vid, _, name = key[len(SIGNATURES) :].partition("/")
            if OID_RE.match(vid) and name.endswith(".sig") and OID_RE.match(name[:-4]):
                out.setdefault(vid, set()).add(name[:-4])
            elif vid == "bundles" and name.endswith(".json") and OID_RE.match(name[:-5]):
                bundles.append(name[:-5])
        return out, sorted(bundles)

    def read_signature_bundle(self, bid: str, *, limit: int) -> bytes:
        return self.backend.read(signature_key("bundles", bid), limit=limit)

    def write_signature_bundle(self, bid: str, data: bytes) -> None:
        """Named by its content, as a signature: written plainly (see write_signature)."""
        self.backend.write(signature_key("bundles", bid), data)

    def read_signature(self, vid: str, name: str, *, limit: int) -> bytes:
        return self.backend.read(signature_key(vid, name), limit=limit)

    def write_signature(self, vid: str, name: str, data: bytes) -> None:
        """A plain write: a signature is named by its content, so two pushers write the same bytes
        and either may win (a conditional write would leave a lock file per signature in a folder
        remote, and costs the same request elsewhere); readers check the bytes against the name."""
        self.backend.write(signature_key(vid, name), data)

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
