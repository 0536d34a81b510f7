"""Objects arriving from a remote, kept apart until each is verified against its id.

A fetch writes what it downloads into a quarantine folder inside the repository (as git's
receive quarantine does), reads it through `overlay` (the quarantine first, then the
repository, so a delta's base may be on either side), decodes and re-hashes every object,
and only then moves the files into `objects/`. A damaged or forged object therefore never
enters the repository, and a fetch that fails or is killed leaves only the quarantine
folder, which gc removes. A file appears in a quarantine only whole (downloads are renamed
into place), so the next fetch takes up the objects a killed one had received (`salvage`)
rather than download them again: they are verified like the rest. Records that arrived in
metadata packs stay in memory (a killed fetch reads its packs again) and are written
straight beside their place in `objects/` when kept: the cost of a clone of thousands of
versions is the files it creates.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType

from mgit.errors import (
    CorruptObjectError,
    MissingObjectError,
    ReceivedCorruptError,
    ReceivedError,
    ReceivedMissingError,
    RemoteTooLargeError,
)
from mgit.store.cache import CHECKOUT_BASES, DecodedCache
from mgit.store.local import LocalStore
from mgit.store.objectformat import Expected, ObjectHeader, base_expected, expected_by
from mgit.store.objects import Version, ancestors_first
from mgit.store.overlay import OverlayStore
from mgit.util.atomicfile import remove_files, sync_files, write_atomic
from mgit.util.faults import crash_point
from mgit.util.parallel import Progress

INCOMING = "incoming"


class Incoming:
    """`with Incoming(store) as inc:` a quarantine for one fetch, removed when it ends."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self.dir = store.root.parent / INCOMING / f"{os.getpid()}-{secrets.token_hex(6)}"
        self.quarantine = LocalStore(self.dir, fsync=False)
        self.overlay = OverlayStore(self.quarantine, store)
        self.arrived: list[str] = []
        self._dead: list[Path] | None = None
        self._folders: set[Path] = set()

    def path_for(self, oid: str) -> Path:
        """Where a download of `oid` goes (its folder created)."""
        path = self.quarantine.path_of(oid)
        if path.parent not in self._folders:  # (one mkdir per fan-out folder, not per object)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._folders.add(path.parent)
        self.arrived.append(oid)
        return path

    def hold(self, records: dict[str, bytes]) -> None:
        """Records that arrived in a metadata pack: kept in memory (within the overlay's
        bound, else written to the quarantine), to be read, verified and kept like any object
        that arrives."""
        for oid, raw in records.items():
            if self.overlay.hold(oid, raw):
                self.arrived.append(oid)
            else:
                write_atomic(self.path_for(oid), [raw], fsync=False, sync_dir=False)

    def has(self, oid: str) -> bool:
        """Whether `oid` arrived in this fetch (held in memory or in the quarantine)."""
        return self.overlay.arrived(oid)

    def salvage(self, oid: str, *, limit: int) -> int | None:
        """Take `oid` from the quarantine of a fetch that was killed (its process gone), if
        one holds it in at most `limit` bytes: moved here, to be verified with the rest. Its
        size, or None (then it is downloaded)."""
        if self._dead is None:
            self._dead = dead_quarantines(self.dir.parent, mine=self.dir)
        for folder in self._dead:
            source = folder / oid[:2] / oid[2:]
            try:
                info = source.lstat()
                if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
                    continue
                os.replace(source, self.path_for(oid))
            except FileNotFoundError:  # (another fetch took it first)
                continue
            return info.st_size
        return None

    @contextmanager
    def refusing(self, where: str) -> Iterator[None]:
        """Errors about what arrived from `where` name it and say that nothing was kept (an
        object of the repository's own that fails to read keeps its own error)."""
        try:
            yield
        except ReceivedError:
            raise
        except CorruptObjectError as exc:
            if not self.has(exc.oid):
                raise
            raise ReceivedCorruptError(exc.oid, exc.why, where=where) from None
        except MissingObjectError as exc:  # named by what arrived, and not sent
            raise ReceivedMissingError(exc.oid, where=where, used_by=exc.used_by) from None
        except RemoteTooLargeError as exc:
            raise ReceivedError(exc.message, where=where) from None

    def verify(
        self,
        oids: list[str],
        *,
        jobs: int,
        progress: Progress | None = None,
        expect: Mapping[str, Expected] | None = None,
    ) -> None:
        """Decode and re-hash each object (CorruptObjectError names the first that fails),
        its header first checked against what the record naming it expects: `expect`, or the
        manifest of a version that arrived with it (a base: its child, as it is decoded).
        Bases decoded on the way are kept for the objects that share them."""
        cache = DecodedCache(CHECKOUT_BASES)
        headers = {o: self.overlay.header(o) for o in oids}  # (read once: ten thousand records, ten thousand opens)
        expected = {**self.expectations(oids, headers), **(expect or {})}

        def check(oid: str) -> None:
            if oid not in self.overlay.decoded:  # decoded already as another's base: verified
                self.overlay.get(oid, reuse=cache, expect=expected.get(oid))
            if progress:
                progress(1)

        # The deepest first: decoding a delta decodes and re-hashes its bases (whole, or block
        # by block as they pass), so each object is decoded once, as a base or on its own.
        order = sorted(oids, key=lambda o: headers[o].depth, reverse=True)
        todo = [o for o in order if o not in self.overlay.decoded]  # (records: verified as they were parsed)
        if progress and len(todo) < len(order):
            progress(len(order) - len(todo))
        with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-verify") as pool:
            for _ in pool.map(check, todo):
                pass

    def expectations(self, oids: list[str], headers: Mapping[str, ObjectHeader]) -> dict[str, Expected]:
        """What the manifests of the versions among `oids` expect of the objects they name,
        and the deltas among them of their bases (a base may be verified before its child)."""
        out: dict[str, Expected] = {}
        bases: dict[str, Expected] = {}
        for oid in oids:
            header = headers[oid]
            if header.kind == "version":
                manifest = self.overlay.get_manifest(self.overlay.get_version(oid).manifest)
                for named, want in expected_by(manifest).items():  # (the first version's holds)
                    out.setdefault(named, want)
            for base in header.bases:
                bases.setdefault(base, base_expected(oid, header))
        return {**bases, **out}

    def promote(self) -> list[str]:
        """Move every verified object into the repository, durably; return their ids. Records
        held in memory are written beside their place in `objects/` and renamed in; the
        quarantine's files are renamed there; one sync of the data comes before any rename,
        and the folders are synced after. The renames go in an order a kill may stop
        anywhere in (`kept_order`): a version is kept only after all it links to."""
        arrived = list(dict.fromkeys(self.arrived))
        held = {o: raw for o in arrived if (raw := self.overlay.held(o)) is not None}
        files = {o for o in arrived if o not in held and self.quarantine.path_of(o).is_file()}
        staged = dict(zip(held, self.store.stage(held), strict=True))
        kept = self.kept_order([o for o in arrived if o in held or o in files])
        try:
            sync_files([*staged.values(), *(self.quarantine.path_of(o) for o in files)])  # data first, then the names
            crash_point("fetch-records-staged")
            for oid in kept:
                if oid in staged:
                    self.store.place(oid, staged.pop(oid))
                else:
                    self.store.adopt(oid, self.quarantine.path_of(oid))
                crash_point("fetch-object-kept")
        except BaseException:
            remove_files(staged.values())
            raise
        for oid in kept:
            record = self.overlay.parsed(oid)
            if record is not None:  # verified here: the repository's readers need not parse it again
                self.store.remember(oid, record)
        self.store.sync()
        return kept

    def kept_order(self, oids: list[str]) -> list[str]:
        """`oids` with every version among them last, each after the versions among them it
        links to: a fetch killed while keeping them leaves no version whose history or
        manifest is missing (the next fetch walks back from the heads only to versions it
        does not have)."""
        versions = {o for o in oids if isinstance(self.overlay.parsed(o), Version)}

        def linked(vid: str) -> list[str]:
            return [v for v in self.overlay.get_version(vid).linked_versions() if v in versions]

        return [o for o in oids if o not in versions] + ancestors_first(sorted(versions), linked)

    def discard(self) -> None:
        # The shared incoming/ folder stays: another fetch may be creating its quarantine.
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Incoming:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.discard()


def dead_quarantines(folder: Path, *, mine: Path | None = None) -> list[Path]:
    """The quarantines under `folder` (`<pid>-<random>`) whose fetch no longer runs."""
    dead = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        pid = path.name.partition("-")[0]
        if path == mine or not path.is_dir() or path.is_symlink() or not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            dead.append(path)
        except (PermissionError, OverflowError, ValueError):
            continue
    return dead
