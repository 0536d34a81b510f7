"""The verbs of training runs, part of `Repo`: commit a checkpoint, load one back, prune a
run's history. Each is a few lines over the module that does its work (mgit.repo.checkpoints,
mgit.repo.retention), which are imported when a verb runs: they load numpy, and `Repo` must not
make `mgit ls` wait for it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from mgit.reports import AddResult, PruneResult

if TYPE_CHECKING:
    from mgit.formats.folder import ModelSource
    from mgit.index.catalog import Catalog
    from mgit.index.refs import RefStore
    from mgit.index.tags import TagStore
    from mgit.repo.add import AddOptions
    from mgit.repo.checkpoints import Checkpoint
    from mgit.store.local import LocalStore


class TrainingRuns:
    """`Repo`'s verbs over training runs; the rest of `Repo` is mgit.repo.repository."""

    store: LocalStore
    refs: RefStore
    catalog: Catalog
    tags: TagStore

    if TYPE_CHECKING:

        def resolve(self, ref: str) -> str: ...

        def add_with(
            self, source: str | os.PathLike[str] | Mapping[str, Any] | ModelSource, options: AddOptions
        ) -> AddResult: ...

    def commit_checkpoint(
        self,
        weights: str | os.PathLike[str] | Mapping[str, Any],
        *,
        model: str,
        parent: str | None = None,
        step: int | None = None,
        metrics: Mapping[str, Any] | None = None,
        optimizer: Mapping[str, Any] | None = None,
        master: Mapping[str, Any] | None = None,
        run: str | None = None,
        args: Mapping[str, Any] | None = None,
        message: str | None = None,
        recipe: str | Mapping[str, Any] | None = None,
        params: Mapping[str, Any] | None = None,
        leave_out: Collection[str] = (),
        jobs: int | None = None,
    ) -> AddResult:
        """Store a checkpoint of a training run as the next version of `model`, from a state
        dict in memory (or the folder a trainer saved), durable when this returns; see
        mgit.repo.checkpoints. `optimizer` is an `optimizer.state_dict()` (its tensors stored
        as tensors, its scalars in the record), `master` fp32 master weights of a bf16 model,
        `args` the training arguments (credentials left out). `parent` is the run's base, needed
        on the first checkpoint only; `run` defaults to the run of the model's latest version;
        `leave_out` names files of a folder not to keep."""
        from mgit.repo.add import AddOptions
        from mgit.repo.checkpoints import checkpoint_source, new_run_id, run_record

        head = self.refs.get(model)
        previous = (self.store.get_version(head).run or {}) if head else {}
        source, state = checkpoint_source(weights, optimizer=optimizer, master=master, leave_out=leave_out)
        options = AddOptions(
            name=model,
            parents=(parent,) if parent else (),
            message=f"step {step}" if message is None else message,
            jobs=jobs,
            model_card=False,
            recipe=recipe,
            params=params,
            run=run_record(run or previous.get("id") or new_run_id(), step, metrics, args, state),
        )
        return self.add_with(source, options)

    def load_checkpoint(self, ref: str, *, framework: str = "pt") -> Checkpoint:
        """A checkpoint's weights, optimizer state dict (for `optimizer.load_state_dict`),
        master weights, step and metrics (mgit.repo.checkpoints.Checkpoint)."""
        from mgit.repo.checkpoints import read_checkpoint

        vid = self.resolve(ref)
        with self.catalog.explained():
            version = self.store.get_version(vid)
            return read_checkpoint(self.store, vid, version, self.store.get_manifest(version.manifest), framework)

    def prune_run(
        self,
        model: str,
        *,
        keep_last: int = 0,
        keep_every: int | None = None,
        keep_best: str | None = None,
        maximize: bool = False,
        dry_run: bool = False,
    ) -> PruneResult:
        """Remove the checkpoints of `model`'s history that no rule keeps; `gc` then frees
        their objects (see mgit.repo.retention for what is always kept and how the kept
        versions are linked again)."""
        from mgit.repo.retention import RetentionPolicy, prune_run

        policy = RetentionPolicy(keep_last, keep_every, keep_best, maximize)
        with self.store.lock():
            return prune_run(self.store, self.refs, self.catalog, self.tags, model, policy, dry_run=dry_run)
