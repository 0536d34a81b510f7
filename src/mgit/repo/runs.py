"""The verbs of training runs, part of `Repo`: commit a checkpoint, load one back, prune a
run's history. Each is a few lines over the module that does its work (mgit.repo.checkpoints,
mgit.repo.retention), which are imported when a verb runs: they load numpy, and `Repo` must not
make `mgit ls` wait for it.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mgit.errors import InvalidOptionError
from mgit.reports import AddResult

if TYPE_CHECKING:
    from mgit.formats.folder import ModelSource
    from mgit.index.catalog import Catalog
    from mgit.index.refs import RefStore
    from mgit.index.tags import TagStore
    from mgit.repo.add import AddOptions
    from mgit.repo.background import BackgroundCommits
    from mgit.repo.checkpoints import Checkpoint
    from mgit.repo.retention import PruneResult
    from mgit.store.local import LocalStore


class TrainingRuns:
    """`Repo`'s verbs over training runs; the rest of `Repo` is mgit.repo.repository."""

    store: LocalStore
    config: dict[str, Any]
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
        lossy_optimizer: float | None = None,
        wait: bool = True,
    ) -> Any:
        """Store a checkpoint of a training run as the next version of `model`, from a state
        dict in memory (or the folder a trainer saved); see mgit.repo.checkpoints. `optimizer`
        is an `optimizer.state_dict()` (its tensors stored as tensors, its scalars in the
        record), `master` fp32 master weights of a bf16 model, `args` the training arguments
        (credentials left out). `parent` is the run's base, needed on the first checkpoint
        only; `run` defaults to the run of the model's latest version; `leave_out` names files
        of a folder not to keep. `lossy_optimizer=R` stores the optimizer's float tensors within
        R x the rms of their change from the checkpoint before (mgit.store.lossy; the weights
        and master weights stay exact); the version records the bound.

        With `wait=True` (the default) the checkpoint is durable when this returns, and the
        `AddResult` is returned. With `wait=False` it takes a copy of the tensors (or hard links
        to the folder's files) and returns a `PendingCommit` at once, while one background
        thread commits it (mgit.repo.background): the checkpoint is durable once that commit
        has finished (`PendingCommit.result()`, `wait_checkpoints()`); the next call waits only
        for the commit before, and an error of a background commit is raised by the next call
        or by `wait_checkpoints()`."""
        from mgit.repo.checkpoints import snapshot_folder, snapshot_state

        options = {
            "model": model,
            "parent": parent,
            "step": step,
            "metrics": metrics,
            "run": run,
            "args": args,
            "message": message,
            "recipe": recipe,
            "params": params,
            "leave_out": leave_out,
            "jobs": jobs,
            "lossy_optimizer": lossy_optimizer,
        }
        if wait:
            self.wait_checkpoints()  # (commits keep their order)
            return self._commit_checkpoint(weights, optimizer=optimizer, master=master, **options)
        background = self._background_commits()
        runs: dict[str, str] = self.__dict__.setdefault("_background_runs", {})
        options["run"] = runs[model] = run or runs.get(model) or self._run_of_head(model)
        copied = None if isinstance(weights, Mapping) else snapshot_folder(Path(weights), leave_out)
        snapshot = snapshot_state({"weights": weights if copied is None else {}, "optimizer": optimizer})
        options["metrics"], options["args"] = snapshot_state(metrics), snapshot_state(args)
        taken = snapshot_state(master)

        def commit() -> AddResult:
            try:
                return self._commit_checkpoint(
                    copied or snapshot["weights"], optimizer=snapshot["optimizer"], master=taken, **options
                )
            finally:
                if copied is not None:
                    import shutil  # (with zlib, bz2 and lzma: not for every command that makes a Repo)

                    shutil.rmtree(copied, ignore_errors=True)

        return background.submit(f"step {step} of {model}", commit)

    def wait_checkpoints(self) -> None:
        """Wait until every checkpoint committed with `wait=False` is durable; raise the error
        of one that failed (mgit.repo.background)."""
        background = self.__dict__.get("_background")
        if background is not None:
            background.wait()

    def _background_commits(self) -> BackgroundCommits:
        from mgit.repo.background import BackgroundCommits

        background = self.__dict__.get("_background")
        if background is None:
            background = self.__dict__["_background"] = BackgroundCommits()
        return background

    def _run_of_head(self, model: str) -> str:
        """The run a checkpoint of `model` goes on when none is named: the latest version's
        (if it is a checkpoint), else a new one."""
        from mgit.repo.checkpoints import new_run_id

        head = self.refs.get(model)
        previous = (self.store.get_version(head).run or {}) if head else {}
        return previous.get("id") or new_run_id()

    def _commit_checkpoint(
        self,
        weights: str | os.PathLike[str] | Mapping[str, Any],
        *,
        model: str,
        parent: str | None,
        step: int | None,
        metrics: Mapping[str, Any] | None,
        optimizer: Mapping[str, Any] | None,
        master: Mapping[str, Any] | None,
        run: str | None,
        args: Mapping[str, Any] | None,
        message: str | None,
        recipe: str | Mapping[str, Any] | None,
        params: Mapping[str, Any] | None,
        leave_out: Collection[str],
        jobs: int | None,
        lossy_optimizer: float | None,
    ) -> AddResult:
        from mgit.repo.add import AddOptions
        from mgit.repo.checkpoints import checkpoint_source, optimizer_policy, run_record

        if lossy_optimizer is not None and optimizer is None:
            raise InvalidOptionError(
                "lossy_optimizer bounds an optimizer state given in memory, and none is given",
                hint="Give optimizer=optimizer.state_dict(), or leave lossy_optimizer out",
            )
        source, state = checkpoint_source(weights, optimizer=optimizer, master=master, leave_out=leave_out)
        options = AddOptions(
            name=model,
            parents=(parent,) if parent else (),
            message=f"step {step}" if message is None else message,
            jobs=jobs,
            model_card=False,
            recipe=recipe,
            params=params,
            run=run_record(run or self._run_of_head(model), step, metrics, args, state),
            lossy=optimizer_policy(lossy_optimizer),
            run_bases=str(self.config.get("checkpoint_bases", "skip")),
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
