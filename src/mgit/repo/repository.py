"""`Repo`: the core verbs over a repository (init, add, checkout, load, open, resolve, ls,
log, show, du, diff, tag, rename, rm, fsck, gc); their bodies live in the modules beside it.

Write order of `add`, which makes a crash at any point harmless: objects (fsynced), the
manifest, the version record, then the ref moves under the model's lock. Until the ref moves
nothing is visible; afterwards the catalog is brought up to date, and if that step is lost
the next `Repo()` notices the ref it does not know and indexes it.

The verbs built from these (tests, bisect, cascades, remotes) are porcelain above this
module: `mgit.checks`, `mgit.bisect`, `mgit.cascade`, `mgit.sync`.

Modules that load numpy and the codecs, the signing stack and the object store itself are
imported (and the store opened) by the verbs that use them: `mgit ls`, `log`, `show` and
`lineage` start in milliseconds. Training runs (commit_checkpoint, load_checkpoint,
prune_run) and maintenance (rm, rename, fsck, gc) are `Repo`'s verbs too, written beside it
in mgit.repo.runs and mgit.repo.maintenance.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import UnknownRefError
from mgit.index.catalog import Catalog, VersionRow
from mgit.index.refs import RefStore
from mgit.index.retired import RetiredNames
from mgit.index.tags import TagStore
from mgit.repo.inspect import disk_usage, every_version, list_models, show_version, version_info, version_storage
from mgit.repo.location import create, locate, open_store, read_config
from mgit.repo.maintenance import Maintenance
from mgit.repo.references import resolve_ref, unknown_model
from mgit.repo.runs import TrainingRuns
from mgit.reports import AddResult, DuResult, ModelSummary, ShowResult, VersionInfo, VersionStorage
from mgit.signing import policy
from mgit.signing.store import SignatureStore
from mgit.store.cache import CHECKOUT_BASES, SESSION_CACHE_BYTES, DecodedCache
from mgit.store.lossy_policy import DEFAULT_GUARD, LossyPolicy
from mgit.store.objects import Manifest, Version, walk_history
from mgit.usercode import DEFAULT_TIMEOUT
from mgit.util.parallel import StartProgress, default_jobs

if TYPE_CHECKING:
    from mgit.diff import DiffResult
    from mgit.formats.folder import ModelSource
    from mgit.lineage.graph import Lineage
    from mgit.lineage.inference import ParentSuggestion
    from mgit.repo.add import AddOptions
    from mgit.repo.checkout import CheckoutResult
    from mgit.repo.signatures import SignResult
    from mgit.repo.tagging import TagsResult
    from mgit.signing.keys import Signer
    from mgit.store.local import LocalStore
    from mgit.store.reader import ModelReader


class Repo(TrainingRuns, Maintenance):
    """A repository. `Repo()` finds one from the current folder upwards; `Repo.init(path)`
    creates one."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.dir = locate(Path(path) if path is not None else None)
        self.config = read_config(self.dir)
        self.config = policy.anchored(self.config, self.root)  # path settings as every reader takes them
        fsync = bool(self.config.get("fsync", True))
        self.retired = RetiredNames(self.dir, fsync=fsync)
        self.catalog = Catalog(self.dir / "catalog.sqlite", removed=self.retired.removed, remote=self._held)
        self._store: LocalStore | None = None  # (opened on first use: ls, log and lineage read no object)
        self._opening = threading.Lock()  # (one store per Repo: it tracks what its writes left to sync)
        self.refs = RefStore(self.dir, fsync=fsync)
        self.tags = TagStore(self.dir, fsync=fsync)
        self.signatures = SignatureStore(self.dir, fsync=fsync)
        self._session: DecodedCache | None = None
        self._signers: dict[str | None, Signer] = {}  # key path (None: signing.key) -> loaded once
        self.sync_catalog()

    @classmethod
    def init(cls, path: str | os.PathLike[str] = ".", *, bare: bool = False) -> Repo:
        """Create a repository in `path/.mgit`, or with `bare` in `path` itself: a folder
        remote that others push to and clone from (docs/format.md, "Remotes")."""
        return cls(create(Path(path), bare=bare))

    @property
    def store(self) -> LocalStore:
        """The repository's objects (a lazy clone's fetch what they lack from its remote)."""
        if self._store is None:
            with self._opening:
                if self._store is None:
                    self._store = open_store(self.dir, self.config, index=self.catalog)
        return self._store

    @property
    def root(self) -> Path:
        """The work folder (the one holding `.mgit`; a bare repository's own folder)."""
        return self.dir if self.bare else self.dir.parent

    @property
    def bare(self) -> bool:
        """A repository that is a remote (`mgit init --bare`): no work folder around it."""
        return bool(self.config.get("bare"))

    @property
    def lazy(self) -> bool:
        """A lazy clone: objects it lacks are fetched from its remote when first read."""
        return self.store.lazy

    @property
    def max_depth(self) -> int:
        from mgit.store.objectformat import DEFAULT_MAX_DEPTH

        return int(self.config.get("delta_max_depth", DEFAULT_MAX_DEPTH))

    # --- catalog upkeep -----------------------------------------------------------------
    def sync_catalog(self) -> None:
        """Index any head the catalog does not know (a writer killed after moving its ref),
        and tags set since (`mgit tag`, a pull)."""
        self.catalog.sync(lambda: self.store, self.refs)
        self.catalog.sync_tags(lambda: self.store, self.tags)

    def rebuild_catalog(self) -> None:
        """Drop and rebuild the catalog from objects and refs."""
        self.catalog.close()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{self.dir / 'catalog.sqlite'}{suffix}").unlink(missing_ok=True)
        self.catalog = Catalog(self.dir / "catalog.sqlite", removed=self.retired.removed, remote=self._held)
        self._store = None  # (opened again on first use: a lazy clone's reads the new catalog)
        self.sync_catalog()

    @contextmanager
    def caching(self, max_bytes: int = SESSION_CACHE_BYTES) -> Iterator[DecodedCache]:
        """Keep decoded tensors (up to `max_bytes`, least recently used out first) for every
        operation inside: checking out or adding the members of a family in turn decodes a
        shared parent once instead of once per member. Nested calls share the outer cache.

        Example:
            with repo.caching():
                for ref in refs:
                    repo.checkout(ref, out / ref)
        """
        if self._session is not None:
            yield self._session
            return
        self._session = DecodedCache(max_bytes, keep_all=True)
        try:
            yield self._session
        finally:
            self._session = None

    def _reuse(self) -> DecodedCache:
        """The decoded-object cache of one operation: the session's, or one for its bases."""
        return self._session if self._session is not None else DecodedCache(CHECKOUT_BASES, planned=True)

    # --- references -----------------------------------------------------------------------
    def resolve(self, ref: str) -> str:
        """A version id from `NAME`, `NAME@N`, `NAME@HEXPREFIX` or a unique id prefix.

        `NAME@1234` is the 1,234th version if the model has one, else a version whose id
        starts with 1234; when both exist, the error names both."""
        return resolve_ref(ref, self.refs, self.retired, self.catalog, self.chain, self._row, self._remote_head)

    def _held(self) -> Callable[[str], bool]:
        """Whether a remote holds a model that has no ref here (remote-only, not removed)."""
        from mgit.remotes.config import held_by_remotes  # (asked only when the catalog marks histories)

        return held_by_remotes(self.dir, self.config)

    def _remote_head(self, name: str) -> str | None:
        """The head of a model a remote holds and this repository knows by its versions'
        records only (a clone of some models brings its ancestors so)."""
        node = self.lineage.nodes.get(name)
        return node.head if node is not None and node.remote_only else None

    def _unknown_model(self, ref: str, name: str | None = None) -> UnknownRefError:
        return unknown_model(ref, ref if name is None else name, self.refs, self.retired)

    def chain(self, vid: str) -> list[str]:
        """A version and its predecessors, newest first."""

        def predecessor(v: str) -> str | None:
            row = self.catalog.version(v)
            return row.predecessor if row else self.store.get_version(v).predecessor

        return list(walk_history(vid, predecessor))

    def model_of(self, ref: str) -> str:
        """The model name that a reference's version belongs to."""
        return self._row(self.resolve(ref)).model

    def info(self, ref: str) -> VersionInfo:
        """One version as `log` lists it: model, sequence number, parents, tags, recipe, sizes."""
        return self._info(self._row(self.resolve(ref)))

    @property
    def lineage(self) -> Lineage:
        """The lineage graph as it is now (a snapshot: read it again after a change)."""
        from mgit.lineage.graph import Lineage  # (ls, log and show do without it)

        return Lineage.load(self.catalog, remote=self._held())

    def version(self, ref: str) -> Version:
        with self.catalog.explained():
            return self.store.get_version(self.resolve(ref))

    def manifest(self, ref: str) -> Manifest:
        with self.catalog.explained():
            return self.store.get_manifest(self.version(ref).manifest)

    # --- add ----------------------------------------------------------------------------
    def add(
        self,
        source: str | os.PathLike[str] | Mapping[str, Any] | ModelSource,
        *,
        name: str,
        parent: str | list[str] | None = None,
        relation: str | None = None,
        message: str = "",
        tags: Mapping[str, str] | None = None,
        author: str | None = None,
        jobs: int | None = None,
        progress: StartProgress | None = None,
        lossy: float | None = None,
        lossy_rel: float | None = None,
        guard: float = DEFAULT_GUARD,
        gate: str | None = None,
        max_drop: float = 0.0,
        gate_timeout: float = DEFAULT_TIMEOUT,
        model_card: bool = True,
        recipe: str | Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        resources: Mapping[str, float] | None = None,
        auto_parent: bool = False,
        expected_head: str | None = None,
    ) -> AddResult:
        """Store a model folder, a file or a state dict as the next version of `name`.

        `parent` names lineage parents (refs); when omitted, a new version keeps the parents
        of the version before it, and likewise its tags and recipe. Adding the same content,
        parents, tags and recipe as the head changes nothing.
        `progress(total_bytes)` may return a callback that receives bytes as they are done.

        `lossy=EPS` stores float tensors that changed from a parent tensor as a quantized
        change, every value within EPS of the original; `lossy_rel=R` bounds the error by R
        times the rms of each tensor's change instead (or as well: each bound holds) (see
        `mgit.store.lossy`; `guard` is the fidelity threshold). Tensors without a parent tensor are
        stored exactly. `gate="module:function"` (or `file.py:function`) then runs that
        metric function on the original and the reconstruction in child processes and keeps
        the lossy version only if no metric gets worse by more than `max_drop`. Whenever lossy
        storage is refused, the version is stored losslessly and the result says why.

        Without `parent`, a folder's README.md front matter (`base_model`, and
        `base_model_relation` unless `relation` is given) names the parents when those models
        exist here (`model_card=False` ignores it); the result's notes say what was taken.

        `recipe="module:function"` (or `file.py:function`) with `params` records how the
        version was made from its parents: `fn(parents, out_dir, **params)` wrote it. The
        function is located, its source file hashed and stored as an object (so a teammate
        without the file can run it), never run here; `mgit cascade` runs it again when a
        parent gets a new version. `resources` (`num_cpus`, `num_gpus`) are recorded with it:
        what a run of it declares to a cluster's scheduler. A recipe record as versions hold
        it (see `recipe_record`) is taken as it is.

        `auto_parent=True`, when no parent is given or named by the model card, infers the
        parent from the weights (see `suggest_parents`) and takes the best candidate if it is
        confident enough, with its guessed relation unless `relation` is given; the result's
        `auto_parent` and notes say what was chosen, or why nothing was.

        `expected_head` makes the add a compare-and-swap: if the model's latest version is not
        that one when the ref is locked, nothing is committed (RefConflictError).

        `source` may also be a `mgit.formats.folder.ModelSource` whose files are made as they
        are read (a merge's, in one pass, nothing written to a temporary folder).
        """
        from mgit.repo.add import AddOptions
        from mgit.repo.gate import Gate

        options = AddOptions(
            name=name,
            parents=(parent,) if isinstance(parent, str) else tuple(parent or ()),
            relation=relation,
            message=message,
            tags=dict(tags or {}),
            author=author,
            jobs=jobs,
            progress=progress,
            lossy=LossyPolicy.from_options(lossy, lossy_rel, guard),
            gate=Gate(gate, max_drop, gate_timeout) if gate is not None else None,
            model_card=model_card,
            recipe=recipe,
            params=params,
            resources=resources,
            auto_parent=auto_parent,
            expected_head=expected_head,
        )
        return self.add_with(source, options)

    def add_with(
        self, source: str | os.PathLike[str] | Mapping[str, Any] | ModelSource, options: AddOptions
    ) -> AddResult:
        """`add` with its options in one record (`mgit.repo.add.AddOptions`), as the command
        line, merges and recipe runs make them."""
        from mgit.repo.add import add_version
        from mgit.repo.model_signature import verify_folder

        if isinstance(source, str | os.PathLike):  # a model.sig in the folder: checked, its signer recorded
            options = replace(options, signer=verify_folder(Path(source), self.config))
        parents = [self.resolve(p) for p in options.parents]
        recipe = None
        if options.recipe is not None:
            recipe = self.recipe_record(options.recipe, options.params, resources=options.resources)
        result = add_version(
            self.store,
            self.refs,
            self.retired,
            self.catalog,
            source,
            options,
            parents=parents,
            recipe=recipe,
            max_depth=self.max_depth,
            reuse=self._session,
        )
        signed = options.sign or policy.signs_always(self.config)
        return replace(result, signed_by=self.sign(result.version).fingerprint) if signed else result

    def recipe_record(
        self,
        recipe: str | Mapping[str, Any],
        params: Mapping[str, Any] | None = None,
        *,
        resources: Mapping[str, float] | None = None,
        recorded: bool = False,
    ) -> dict[str, Any]:
        """What a version records of a recipe (see mgit.repo.add.recipe_record)."""
        from mgit.repo.add import recipe_record

        return recipe_record(self.store, self.dir, self.root, recipe, params, resources=resources, recorded=recorded)

    # --- parent inference ---------------------------------------------------------------------
    def suggest_parents(
        self,
        source: str | os.PathLike[str] | Mapping[str, Any],
        *,
        limit: int = 5,
        min_confidence: float | None = None,
        exclude: Collection[str] = (),
    ) -> ParentSuggestion:
        """Stored versions ranked as the likely parents of a model folder, file or state dict,
        from its weights alone, with the evidence, a guessed relation and the choice that
        `add(..., auto_parent=True)` would make (see mgit.lineage.inference). `exclude` leaves out
        versions, by id or by model name."""
        from mgit.repo.add import suggest_parents_of

        return suggest_parents_of(
            self.store, self.catalog, source, limit=limit, min_confidence=min_confidence, exclude=exclude
        )

    # --- signatures (mgit.repo.signatures) -----------------------------------------------------
    def sign(self, ref: str, *, key: str | None = None) -> SignResult:
        """Sign a version with `key` (a path) or the `signing.key` setting; several may sign one."""
        from mgit.repo.signatures import sign_version  # (the verbs that sign or verify load the signing stack)

        return sign_version(self.signatures, self.catalog, self.signer(key), self._row(self.resolve(ref)).id)

    def signer(self, key: str | None = None) -> Signer:
        """The key `key` (a path) or `signing.key` names, read once for this Repo: a cascade,
        a pull's replays and signing.always sign many versions with one load of the key."""
        if key not in self._signers:
            self._signers[key] = policy.configured_signer(self.config, key)
        return self._signers[key]

    def verify(self, ref: str, *, lineage: bool = False, level: str | None = None, objects: bool = False) -> Any:
        """Content against id, signatures against allowed signers (`lineage`: every ancestor)."""
        from mgit.repo.signatures import verify_lineage

        vid, cat = self.resolve(ref), self.catalog
        return verify_lineage(self.store, self.signatures, cat, self.config, vid, level, lineage, objects)

    # --- checkout and reading ---------------------------------------------------------------
    def checkout(
        self,
        ref: str,
        out_dir: str | os.PathLike[str],
        *,
        force: bool = False,
        clean: bool = False,
        jobs: int | None = None,
        progress: StartProgress | None = None,
        model_card: bool = False,
        model_signature: str | os.PathLike[str] | None = None,
        verify: bool = True,
    ) -> CheckoutResult:
        """Rebuild the files of a version in `out_dir`, byte for byte, verifying each file.
        `force` writes into a folder that is not empty, refusing one that holds files the version
        does not (StrayFilesError) unless `clean`, which removes them after the version is written.

        `model_card=True` then writes the version's lineage parents into README.md's front
        matter (`base_model`, `base_model_relation`), the one file that then differs from
        what was added. `model_signature=FILE` then signs the folder with `signing.key` in
        model-signing's format (`mgit.repo.model_signature`), the key checked before anything is
        written. `verify=False` skips the policy of `verify.require` (--no-verify)."""
        from mgit.repo.checkout import checkout_version
        from mgit.repo.model_signature import model_signer, sign_folder

        vid = self.resolve(ref)
        if verify and (level := policy.required(self.config)):
            self.verify(vid, level=level).raise_if_refused()
        key = model_signer(self.signer()) if model_signature is not None else None
        with self.catalog.explained():
            row = self._row(vid)
            result = checkout_version(
                self.store,
                vid,
                row.model,
                row.seq,
                Path(out_dir),
                force=force,
                clean=clean,
                jobs=jobs or default_jobs(),
                reuse=self._reuse(),
                progress=progress,
                model_card=model_card,
                model_of=lambda v: self._row(v).model,
            )
        if model_signature is None:
            return result
        signer = sign_folder(Path(out_dir), Path(model_signature), key, jobs=jobs or default_jobs())
        return replace(result, model_signature=str(model_signature), signer=signer.key)

    def open(self, ref: str) -> ModelReader:
        """Tensors of a version, decoded one at a time on access."""
        from mgit.store.reader import ModelReader

        vid = self.resolve(ref)
        return ModelReader(self.store, self.manifest(vid), vid, explained=self.catalog.explained, reuse=self._session)

    def load_state_dict(self, ref: str, *, framework: str = "np", jobs: int | None = None) -> dict[str, Any]:
        """Every tensor of a version: numpy arrays (`framework="np"`) or torch tensors ("pt");
        `mgit.load` adds devices and dtypes, `mgit.load_many` versions sharing tensors."""
        from mgit.store.reader import state_dicts

        vid = self.resolve(ref)
        with self.catalog.explained():
            return state_dicts(
                self.store, [(vid, self.manifest(vid))], framework=framework, jobs=jobs, reuse=self._session
            )[0]

    def diff(
        self,
        a: str | os.PathLike[str],
        b: str | os.PathLike[str],
        *,
        structural: bool = False,
        jobs: int | None = None,
        progress: StartProgress | None = None,
    ) -> DiffResult:
        """Compare two models, each a ref or the path of a model folder or file not yet added
        (an existing path is a path, anything else a ref; see `mgit.diff`)."""
        from mgit.diff import diff_models, open_side

        def resolve(ref: str) -> tuple[str, str, Manifest]:
            vid = self.resolve(ref)
            row = self._row(vid)
            return f"{row.model}@{row.seq}", vid, self.manifest(vid)

        with self.catalog.explained():
            sides = [open_side(x, store=self.store, resolve=resolve) for x in (a, b)]
            return diff_models(*sides, structural=structural, jobs=jobs, progress=progress, reuse=self._session)

    # --- queries ------------------------------------------------------------------------
    def _info(self, row: VersionRow) -> VersionInfo:
        return version_info(self.catalog, row)

    def _row(self, vid: str) -> VersionRow:
        row = self.catalog.version(vid)
        if row is None:
            with self.catalog.explained():
                self.catalog.index(self.store, vid)
            row = self.catalog.version(vid)
        assert row is not None
        return row

    def ls(self, *, tag: str | None = None) -> list[ModelSummary]:
        """Every model with its latest version; with `tag` (`KEY` or `KEY=VALUE`), only those
        whose latest version has that tag."""
        return list_models(self.catalog, self._row, tag=tag)

    def tag(self, ref: str, put: Mapping[str, str] | None = None, *, delete: Collection[str] = ()) -> TagsResult:
        """Set tags on a version (`{key: value}`) and remove others; without either, its tags.
        They are kept beside the refs, travel with push and pull, and show in log, ls --tag."""
        from mgit.repo.tagging import change_tags, tags_of

        vid = self.resolve(ref)
        row = self._row(vid)
        if not put and not delete:
            return tags_of(self.store, self.tags, vid, row.model, row.seq)
        return change_tags(self.store, self.tags, self.catalog, vid, row.model, row.seq, put=put or {}, delete=delete)

    def log(self, ref: str | None = None) -> list[VersionInfo]:
        """Versions of a model (or from a given version back), newest first; without a ref,
        every version of every model, newest first."""
        if ref is not None:
            return [self._info(self._row(v)) for v in self.chain(self.resolve(ref))]
        return every_version(self.catalog, self.refs.all(), self.chain, self._row)

    def show(self, ref: str) -> ShowResult:
        vid = self.resolve(ref)
        return show_version(self.catalog, self._row(vid), self.manifest(vid), self.store)

    def storage(self, vids: list[str]) -> dict[str, VersionStorage]:
        """How each of these versions is stored: the bytes of the objects it uses and its
        tensors by kind (deduplicated, delta, derived, standalone), in one query."""
        return version_storage(self.catalog, vids)

    def du(self) -> DuResult:
        return disk_usage(self.catalog, self.store, self.lineage, self.chain)
