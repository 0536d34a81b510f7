"""Reachability and `fsck` (`mgit.repo.gc` collects what is not reachable).

What is reachable: every ref's head, every version a reachable version points to (its
predecessor and its lineage parents, even in removed models, so lineage never dangles), and
every object their manifests name.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import CorruptObjectError, MgitError, MissingObjectError
from mgit.index.catalog import Catalog
from mgit.index.refs import RefStore
from mgit.reports import Report
from mgit.store.base import ObjectStore
from mgit.store.local import LocalStore
from mgit.store.objectformat import file_objects_expected
from mgit.store.objects import Manifest, Version
from mgit.util.parallel import Progress, StartProgress

if TYPE_CHECKING:
    from mgit.signing.store import SignatureStore


@dataclass(frozen=True)
class Problem(Report):
    """One thing fsck found wrong: the object (or ref), what kind of problem, the models using it."""

    object: str
    kind: str  # "corrupt", "missing", "ref", "catalog"
    message: str
    used_by: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FsckResult(Report):
    """What `fsck` checked and found: problems (none: `ok`), leftovers, unreferenced objects."""

    objects_checked: int
    bytes_checked: int
    refs_checked: int
    versions_checked: int
    problems: list[Problem]
    leftovers: int  # temporary files of interrupted writes (harmless; gc removes them)
    unreferenced: int = 0  # objects no ref reaches (an interrupted add's, a removed model's): gc removes them
    unreferenced_bytes: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "ok": self.ok}


@dataclass
class Reachable:
    versions: dict[str, Version] = field(default_factory=dict)
    manifests: dict[str, Manifest] = field(default_factory=dict)
    objects: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)


def root_heads(refs: RefStore) -> dict[str, str]:
    """What gc keeps: every model's head and every remote-tracking head (`origin/NAME`)."""
    heads = dict(refs.all())
    remotes = refs.root / "refs" / "remotes"
    for remote in sorted(remotes.iterdir()) if remotes.is_dir() else []:
        tracking = RefStore(refs.root, namespace=f"remotes/{remote.name}")
        heads.update({f"{remote.name}/{name}": vid for name, vid in tracking.all().items()})
    return heads


def walk(store: ObjectStore, heads: dict[str, str], *, pins: set[str] | frozenset[str] = frozenset()) -> Reachable:
    """Everything reachable from `heads` (and the pinned objects); unreadable records become
    problems, not exceptions."""
    seen = Reachable()
    seen.objects |= pins
    stack = [(vid, f"head of {name}") for name, vid in heads.items()]
    while stack:
        vid, via = stack.pop()
        if vid in seen.versions or vid in seen.objects:
            continue
        seen.objects.add(vid)
        try:
            version = store.get_version(vid, fresh=True)
        except (CorruptObjectError, MissingObjectError) as exc:
            seen.problems.append(_problem(vid, exc, [via]))
            continue
        seen.versions[vid] = version
        label = f"{version.model} version {vid[:12]}"
        stack.extend((v, label) for v in version.linked_versions())
        seen.objects |= version.linked_objects() - {version.manifest}  # a recipe's source
        if version.manifest in seen.manifests:
            continue
        seen.objects.add(version.manifest)
        try:
            manifest = store.get_manifest(version.manifest, fresh=True)
        except (CorruptObjectError, MissingObjectError) as exc:
            seen.problems.append(_problem(version.manifest, exc, [label]))
            continue
        seen.manifests[version.manifest] = manifest
        seen.objects |= manifest.object_ids()
        _add_delta_bases(store, [t.object for t in manifest.tensors()], seen, label)
    return seen


def _add_delta_bases(store: ObjectStore, oids: list[str], seen: Reachable, label: str) -> None:
    """Delta bases are reachable through the objects encoded against them, whatever model
    they came from (even one removed since)."""
    stack = list(oids)
    while stack:
        oid = stack.pop()
        promised = store.promised(oid)  # on the remote only: its bases as recorded, nothing fetched
        try:
            bases = promised if promised is not None else store.header(oid).bases
        except (CorruptObjectError, MissingObjectError):
            continue  # reported by the object checks, with the models that use it
        for base in bases:
            if base not in seen.objects:
                seen.objects.add(base)
                stack.append(base)
            if not store.has(base) and store.promised(base) is None:
                seen.problems.append(Problem(base, "missing", f"delta base of {oid[:16]} is missing", [label]))


def _problem(oid: str, exc: MgitError, used_by: list[str]) -> Problem:
    kind = "missing" if isinstance(exc, MissingObjectError) else "corrupt"
    return Problem(oid, kind, exc.message, used_by)


def verify_objects(
    store: ObjectStore, oids: list[str], *, jobs: int, progress: Progress | None = None
) -> tuple[list[Problem], int]:
    """Decode and re-hash every object; return the problems and the bytes checked."""

    def check(oid: str) -> tuple[str, MgitError | None, int]:
        try:
            header, _ = store.get(oid)
            return oid, None, header.size
        except (CorruptObjectError, MissingObjectError) as exc:
            return oid, exc, 0

    problems, checked = [], 0
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="mgit-fsck") as pool:
        for oid, exc, size in pool.map(check, oids):
            checked += size
            if exc is not None:
                problems.append(_problem(oid, exc, []))
            if progress:
                progress(1)
    return problems, checked


def check_references(store: ObjectStore, seen: Reachable) -> list[Problem]:
    """Every object a reachable manifest names exists and is what its entry says: of its
    kind and size, and a tensor of its dtype and shape (the check a read makes)."""
    problems = []
    for moid, manifest in seen.manifests.items():
        users = [f"{v.model} version {vid[:12]}" for vid, v in seen.versions.items() if v.manifest == moid]
        for f in manifest.files:
            for oid, expected in file_objects_expected(f).items():
                if store.promised(oid) is not None:
                    continue  # a lazy clone's object that lives on the remote
                try:
                    header = store.header(oid)
                except (CorruptObjectError, MissingObjectError) as exc:
                    problems.append(_problem(oid, exc, users))
                    continue
                try:
                    expected.check(oid, header)
                except CorruptObjectError as exc:
                    problems.append(Problem(oid, "corrupt", f"is not what {f.path} expects: {exc.why}", users))
    return problems


def fsck(
    store: ObjectStore,
    refs: RefStore,
    catalog: Catalog,
    *,
    jobs: int,
    progress: StartProgress | None = None,
    signatures: SignatureStore | None = None,
) -> FsckResult:
    """Re-hash every object and check every reference (and that the signature bundles read);
    problems are listed, not raised."""
    heads = root_heads(refs)
    seen = walk(store, heads, pins=refs.pins())
    oids = list(store.ids())
    tick = progress(len(oids)) if progress else None
    problems, checked = verify_objects(store, oids, jobs=jobs, progress=tick)
    bad = {p.object for p in problems}
    problems += [p for p in seen.problems if p.object not in bad]
    problems += [p for p in check_references(store, seen) if p.object not in bad]
    problems = [
        p if p.used_by else type(p)(p.object, p.kind, p.message, catalog.object_users(p.object)) for p in problems
    ]
    if refs.all() != catalog.heads():
        problems.append(Problem("catalog", "catalog", "the catalog does not list the same heads as refs/"))
    stray = _stray_rows(store, catalog, seen)
    if stray is not None:
        problems.append(stray)
    for path in signatures.damaged_bundles() if signatures is not None else []:
        problems.append(
            Problem(path.stem, "corrupt", f"signature bundle {path.name} is damaged: its signatures are not read")
        )
    leftovers = len(store.temporary_files()) + len(refs.temporary_files())
    leftovers += len(list(quarantine_folders(store))) + len(signatures.temporary_files() if signatures else [])
    garbage = [o for o in oids if o not in seen.objects and o not in bad]
    return FsckResult(
        len(oids),
        checked,
        len(refs.all()),
        len(seen.versions),
        problems,
        leftovers,
        len(garbage),
        sum(store.stored_size(o) for o in garbage),
    )


def _stray_rows(store: ObjectStore, catalog: Catalog, seen: Reachable) -> Problem | None:
    """Catalog rows of versions and objects that are neither reachable nor here (gc removes
    them): what a fetch of an older mgit kept of a remote's packs."""
    sketches, oids = catalog.strays(seen.versions, seen.objects)
    vids = [v for v in sketches if not store.has(v)]
    oids = [o for o in oids if not store.has(o)]
    size = sum(sketches[v] for v in vids)
    if not vids and not oids:
        return None
    what = (
        f"{len(vids)} sketch{'es' if len(vids) != 1 else ''} and {len(oids)} object row{'s' if len(oids) != 1 else ''}"
    )
    return Problem(
        "catalog",
        "catalog",
        f"the catalog holds {what} of versions and objects that are not here "
        f"({size} bytes of sketches); mgit gc removes them",
    )


def quarantine_folders(store: ObjectStore) -> list[Path]:
    """Quarantine folders of fetches that were killed (mgit.store.quarantine), beside `objects/`."""
    if not isinstance(store, LocalStore):
        return []
    folder = store.root.parent / "incoming"
    return [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
