"""The maintenance verbs, part of `Repo`: rm, rename, fsck, gc. Each is a few lines over the
module that does its work (mgit.repo.remove, renaming, fsck, gc), imported when it runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mgit.util.parallel import StartProgress, default_jobs

if TYPE_CHECKING:  # (each result type is its verb's module's: loaded when the verb runs)
    from mgit.errors import UnknownRefError
    from mgit.index.catalog import Catalog
    from mgit.index.refs import RefStore
    from mgit.index.retired import RetiredNames
    from mgit.index.tags import TagStore
    from mgit.repo.fsck import FsckResult
    from mgit.repo.gc import GcResult
    from mgit.repo.remove import RemoveResult
    from mgit.repo.renaming import RenameResult
    from mgit.store.local import LocalStore


class Maintenance:
    """`Repo`'s maintenance verbs; the rest of `Repo` is mgit.repo.repository."""

    store: LocalStore
    refs: RefStore
    retired: RetiredNames
    catalog: Catalog
    tags: TagStore

    if TYPE_CHECKING:

        def resolve(self, ref: str) -> str: ...

        def model_of(self, ref: str) -> str: ...

        def chain(self, vid: str) -> list[str]: ...

        def _unknown_model(self, ref: str, name: str | None = None) -> UnknownRefError: ...

    def rm(self, ref: str, *, force: bool = False) -> RemoveResult:
        """Remove a model (`NAME`: its ref) or one version (`NAME@N`); objects go at the next gc
        unless other versions use them. What others were built on is removed only with
        `force` (RemoveRefusedError lists them); see mgit.repo.remove."""
        from mgit.repo.remove import remove_model, remove_version

        names = self.refs, self.retired, self.catalog
        if "@" not in ref:
            return remove_model(*names, ref, force=force, chain=self.chain, unknown=self._unknown_model)
        vid = self.resolve(ref)
        return remove_version(*names, self.model_of(vid), vid, force=force, chain=self.chain)

    def rename(self, old: str, new: str) -> RenameResult:
        """Give model `old` the name `new`, its versions and numbers kept; `old` is refused
        afterwards until a model is added under it (see mgit.repo.renaming)."""
        from mgit.repo.renaming import rename_model

        return rename_model(self.refs, self.retired, self.catalog, old, new, unknown=self._unknown_model)

    def fsck(self, *, jobs: int | None = None, progress: StartProgress | None = None) -> FsckResult:
        """Re-hash every object and check every reference; problems are listed, not raised."""
        from mgit.repo.fsck import fsck

        return fsck(
            self.store,
            self.refs,
            self.catalog,
            jobs=jobs or default_jobs(),
            progress=progress,
            signatures=self.signatures,
        )

    def gc(self, *, dry_run: bool = False) -> GcResult:
        """Delete objects that no ref reaches, and leftovers of interrupted writes."""
        from mgit.repo.gc import gc

        with self.store.lock(exclusive=True):
            return gc(self.store, self.refs, self.catalog, self.tags, dry_run=dry_run, signatures=self.signatures)
