"""transformers' Trainer saving into MGit: `MgitCallback` commits every checkpoint the Trainer
saves as the next version of a model, and `checkpoint_folder` checks one out as the folder
`trainer.train(resume_from_checkpoint=...)` reads.

    repo = mgit.Repo()
    trainer = Trainer(model, args, ..., callbacks=[MgitCallback(repo, model="ft-sst2", parent="minilm")])
    trainer.train()
    ...
    trainer.train(resume_from_checkpoint=checkpoint_folder(repo, "ft-sst2@3", "resume/ft-sst2-3"))

Each commit holds the folder the Trainer wrote (`checkpoint-STEP`: the weights, `optimizer.pt`,
`scheduler.pt`, `rng_state.pth`, `trainer_state.json`; its PyTorch files are stored as their
tensors, delta-coded against the checkpoint before, and rebuilt byte for byte), and in the
record the step, the metrics logged at that step and the `TrainingArguments` (`mgit show`
prints them). `training_args.bin` is not kept: it is a pickle of those arguments, hub token
included; a resume does not read it. The callback runs in the training process after the
Trainer's save; by default it hands the checkpoint to a background commit and returns (see
`MgitCallback`), with `wait=True` when the checkpoint is durable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from mgit.repo.background import PendingCommit
from mgit.repo.repository import Repo
from mgit.reports import AddResult

if TYPE_CHECKING:
    from mgit.repo.checkout import CheckoutResult

PREFIX = "checkpoint"  # transformers.trainer_utils.PREFIX_CHECKPOINT_DIR
LEFT_OUT = ("training_args.bin",)
OPTIMIZER = "optimizer.pt"  # the Trainer's optimizer state (transformers.trainer.OPTIMIZER_NAME)


class MgitCallback(TrainerCallback):
    """Commit each checkpoint a Trainer saves to `repo` as the next version of `model`; the
    first one's lineage parent is `parent` (the model the run starts from, a ref). `run` names
    the run (default: the run of the model's latest version, else a new id).

    By default (`wait=False`) a save's commit runs in the background
    (`Repo.commit_checkpoint(..., wait=False)`): `on_save` takes hard links to the folder's
    files and returns, training goes on, and the next save waits only for a commit still
    running; `on_train_end` waits for the last, and an error of a background commit is raised
    there or at the next save. A checkpoint is durable once its commit has finished.
    `wait=True` commits in `on_save` itself, durable when it returns. `lossy_optimizer=R`
    stores the optimizer's moments bounded-lossy (`Repo.commit_checkpoint`): they are taken
    from the Trainer's optimizer in memory instead of its `optimizer.pt`, which
    `checkpoint_folder` then writes from them (the rest of the folder stays byte for byte).
    `commits` lists what each save added (waiting for the commits still running)."""

    def __init__(
        self,
        repo: Repo,
        *,
        model: str,
        parent: str | None = None,
        run: str | None = None,
        wait: bool = False,
        lossy_optimizer: float | None = None,
    ) -> None:
        self.repo = repo
        self.model = model
        self.parent = parent
        self.run = run
        self.wait = wait
        self.lossy_optimizer = lossy_optimizer
        self.pending: list[PendingCommit[AddResult] | AddResult] = []

    @property
    def commits(self) -> list[AddResult]:
        return [p if isinstance(p, AddResult) else p.result() for p in self.pending]

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        folder = Path(args.output_dir) / f"{PREFIX}-{state.global_step}"
        first = not self.pending and self.repo.refs.get(self.model) is None
        lossy = self.lossy_optimizer is not None and kwargs.get("optimizer") is not None
        self.pending.append(
            self.repo.commit_checkpoint(
                folder,
                optimizer=kwargs["optimizer"].state_dict() if lossy else None,
                lossy_optimizer=self.lossy_optimizer if lossy else None,
                model=self.model,
                parent=self.parent if first else None,
                step=state.global_step,
                metrics=logged_metrics(state.log_history, state.global_step),
                run=self.run,  # None: the run of the model's latest checkpoint (of this callback's first save)
                args=args.to_dict(),
                leave_out=LEFT_OUT + (OPTIMIZER,) if lossy else LEFT_OUT,
                wait=self.wait,
            )
        )

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.repo.wait_checkpoints()


def logged_metrics(history: list[dict[str, Any]], step: int) -> dict[str, float]:
    """The numbers the Trainer logged at `step` (loss, eval_loss, learning_rate, epoch, ...),
    the latest where one was logged twice."""
    found: dict[str, float] = {}
    for entry in history:
        if entry.get("step") == step:
            found.update(
                {
                    k: float(v)
                    for k, v in entry.items()
                    if k != "step" and isinstance(v, int | float) and k.isprintable()
                }
            )
    return found


def checkpoint_folder(repo: Repo, ref: str, out_dir: str | os.PathLike[str], *, force: bool = False) -> str:
    """Check the checkpoint `ref` out into `out_dir` (empty, or with `force` holding nothing but
    an earlier checkout of it) and return the path to give `trainer.train(resume_from_checkpoint=...)`:
    weights, optimizer, scheduler and RNG state byte for byte as the Trainer saved them."""
    result: CheckoutResult = repo.checkout(ref, out_dir, force=force)
    out = Path(result.out_dir)
    if not (out / OPTIMIZER).exists() and "optimizer" in (repo.version(ref).run or {}):
        import torch  # (a lossy-moment checkpoint: its optimizer state as the Trainer reads it)

        torch.save(repo.load_checkpoint(ref).optimizer, out / OPTIMIZER)
    return result.out_dir
