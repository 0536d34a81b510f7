"""Checkpoints of a training run: what `Repo.commit_checkpoint` stores and `Repo.load_checkpoint`
gives back.

A checkpoint is a version of the run's model: its predecessor is the checkpoint before (so
its tensors are coded as deltas against that one's, the closest there is), its lineage parent
the model the run started from, and its record's `run` field holds the run's id, the step,
the logged metrics, the training arguments and an optimizer's scalars (mgit.store.run_record).
Tensors go straight from the training process's memory to the store, in up to three files:

- `model.safetensors`: the weights (or the files of a folder the trainer wrote, as they are);
- `optimizer.safetensors`: the optimizer's tensors (Adam's moments, its per-parameter step),
  named `optimizer.` plus where they sit in `optimizer.state_dict()` (`optimizer.state.0.exp_avg`);
- `master.safetensors`: fp32 master weights kept beside a bf16 model, named `master.` plus
  the weight's name.

The prefixes keep every tensor name of a version unique, so `load_state_dict` and
`mgit.load` read a checkpoint like any version, and each tensor finds its namesake in the
checkpoint before as its delta base.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mgit.errors import CorruptObjectError, InputError, InvalidOptionError
from mgit.formats.folder import ModelSource, from_tensors, scan_path, scan_state_dict
from mgit.formats.tensors import is_torch_tensor, raw_tensors
from mgit.index.catalog import Catalog
from mgit.store.base import ObjectStore
from mgit.store.lossy_policy import DEFAULT_GUARD, LossyPolicy
from mgit.store.objects import Manifest, Version
from mgit.store.reader import as_array, as_torch
from mgit.store.run_record import RunFieldError, checked_run, decode_state, encode_state, public_args

WEIGHTS, OPTIMIZER, MASTER = (
    "model.safetensors",
    "optimizer.safetensors",
    "master.safetensors",
)  # WEIGHTS: scan_state_dict's
OPTIMIZER_PREFIX, MASTER_PREFIX = "optimizer.", "master."


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint read back (`Repo.load_checkpoint`): the weights, the optimizer's state
    dict ready for `optimizer.load_state_dict` (None if none was stored), fp32 master
    weights (None if none), and the run's id, step and metrics."""

    version: str
    weights: dict[str, Any]
    optimizer: dict[str, Any] | None
    master: dict[str, Any] | None
    run: str
    step: int | None
    metrics: dict[str, float | None] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)


def new_run_id() -> str:
    """A run's id when the caller names none and the model's head is not a checkpoint."""
    return "run-" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")


RUN_BASES = ("skip", "key", "chain")  # how a checkpoint's delta base is chosen (`checkpoint_bases` setting)
RUN_MAX_DEPTH = 8  # the delta depth a run's skip deltas may reach (a checkpoint's weights start one deep)
KEY_EVERY = 4  # "key": every 4th checkpoint is a key, coded against the run's first


def run_history(store: ObjectStore, catalog: Catalog, head: str | None, run: str) -> list[str]:
    """The checkpoints of run `run` on `head`'s history, oldest first, back to the first
    version of another run (or none)."""
    found: list[str] = []
    vid = head
    while vid is not None:
        row = catalog.version(vid)
        record, predecessor = (row.run, row.predecessor) if row else _run_and_predecessor(store, vid)
        if not record or record.get("id") != run:
            break
        found.append(vid)
        vid = predecessor
    return found[::-1]


def _run_and_predecessor(store: ObjectStore, vid: str) -> tuple[dict[str, Any] | None, str | None]:
    version = store.get_version(vid)
    return version.run, version.predecessor


def run_base(history: list[str], scheme: str) -> str | None:
    """The earlier checkpoint whose tensors the next checkpoint of a run (after `history`,
    oldest first) is coded against, so that delta chains stay short without a full checkpoint
    every few (a chain that reaches the depth bound must start again from a full copy):

    - `skip` (the default): checkpoint i against checkpoint i with its lowest set bit cleared
      (Subversion's skip deltas): i - 1 for odd i, i - 2, i - 4, ... otherwise, so that reading
      checkpoint i decodes popcount(i) <= log2(i) + 1 links and most deltas span one or two saves;
    - `key`: every KEY_EVERY-th checkpoint against the run's first, the others against the key
      before them (two links at most, but deltas across ever longer spans);
    - `chain`: against the checkpoint before (MGit before this choice: the chain starts again
      from a full copy whenever it reaches `delta_max_depth`)."""
    i = len(history)
    if i == 0:
        return None
    if scheme == "skip":
        return history[i & (i - 1)]
    if scheme == "key":
        return history[0] if i % KEY_EVERY == 0 else history[i // KEY_EVERY * KEY_EVERY]
    return history[-1]


def check_run_bases(scheme: str) -> None:
    if scheme not in RUN_BASES:
        raise InvalidOptionError(
            f"checkpoint bases {scheme!r} are not known", hint=f"Use one of: {', '.join(RUN_BASES)}"
        )


def checkpoint_base(
    store: ObjectStore,
    catalog: Catalog,
    head: str | None,
    run: Mapping[str, Any] | None,
    scheme: str,
    max_depth: int,
) -> tuple[str | None, int, bool]:
    """The version whose tensors a new version is coded against, the delta depth allowed, and
    whether that version alone is (not the lineage parents too): the model's head and
    `max_depth`, but for a checkpoint (its record's `run`) its run's base by `scheme`
    (`run_base`) and depths up to RUN_MAX_DEPTH, alone once the run has a checkpoint (an
    earlier checkpoint is always closer than the run's base model; trying both doubled the
    encodings a commit sampled)."""
    if run is None or scheme == "chain":
        return head, max_depth, False
    base = run_base(run_history(store, catalog, head, run["id"]), scheme)
    return base or head, max(max_depth, RUN_MAX_DEPTH), base is not None


def optimizer_policy(rel: float | None) -> LossyPolicy | None:
    """Bounded-lossy storage of a checkpoint's optimizer tensors only (`lossy_optimizer=R`):
    each within R x the rms of its change from the checkpoint before; weights stay exact."""
    if rel is None:
        return None
    return LossyPolicy(None, DEFAULT_GUARD, rel, scope=OPTIMIZER_PREFIX)


def snapshot_state(value: Any) -> Any:
    """A copy of a state dict (or an optimizer's) that training can no longer change: every
    tensor copied to the CPU (a tensor on the CPU too: the optimizer updates it in place), every
    dict and list made anew, other values (numbers, strings) kept. What a background commit
    stores, taken while the loop waits."""
    if is_torch_tensor(value):
        value = value.detach()
        if value.device.type != "cpu":
            return value.to("cpu")  # (a copy already)
        return _copied(value)
    if type(value).__module__ == "numpy" and hasattr(value, "copy"):
        return value.copy()
    if isinstance(value, Mapping):
        return {k: snapshot_state(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot_state(v) for v in value)
    return value


def _copied(tensor: Any) -> Any:
    """A copy of a CPU tensor in memory numpy allocates: numpy asks for huge pages, torch does
    not, and on a machine under load the page faults of torch's own copy (`clone`) made it 2-10x
    slower (0.4-2.6 s against 4.9-5.8 s for 430 MB, measured)."""
    import torch

    if tensor.numel() == 0:
        return tensor.clone()
    data = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().copy()
    return torch.from_numpy(data).view(tensor.dtype).reshape(tensor.shape)


def snapshot_folder(folder: Path, leave_out: Collection[str] = ()) -> Path:
    """A checkpoint folder's files hard-linked into a new hidden folder beside it (copied where
    links cannot be made), so that a trainer removing old checkpoints (`save_total_limit`) does
    not pull them away from a background commit; the caller removes it when the commit is done.
    The trainer writes a checkpoint's files once, so linking them is taking a copy."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(str(folder), "not a folder", hint="Give the checkpoint folder the trainer saved")
    copy = Path(tempfile.mkdtemp(prefix=f".mgit-{folder.name}-", dir=folder.parent))
    try:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            target = copy / rel
            if rel.as_posix() in leave_out:
                continue
            if path.is_symlink() or not (path.is_dir() or path.is_file()):
                raise InputError(str(path), "is not a plain file or folder", hint="Commit this folder with wait=True")
            if path.is_dir():
                target.mkdir()
                continue
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)
    except BaseException:
        shutil.rmtree(copy, ignore_errors=True)
        raise
    return copy


def checkpoint_source(
    weights: str | os.PathLike[str] | Mapping[str, Any],
    *,
    optimizer: Mapping[str, Any] | None = None,
    master: Mapping[str, Any] | None = None,
    leave_out: Collection[str] = (),
) -> tuple[ModelSource, Any]:
    """The files of a checkpoint, made in memory (nothing is written to a temporary folder),
    and the tagged encoding of the optimizer's scalars (None without an optimizer). A folder's
    files named in `leave_out` are not kept (a trainer's pickled arguments, which hold its
    credentials)."""
    if isinstance(weights, Mapping):
        src = scan_state_dict(weights)  # as `add` reads one: its tensors into WEIGHTS
    else:
        src = scan_path(Path(weights))
        src = ModelSource([f for f in src.files if f.path not in leave_out], src.notes)
    extra = []
    encoded = None
    if optimizer is not None:
        tensors: dict[str, Any] = {}

        def tensor(value: Any, path: str) -> str | None:
            if not (is_torch_tensor(value) or type(value).__module__ == "numpy" and hasattr(value, "dtype")):
                return None
            name = OPTIMIZER_PREFIX + path
            if name in tensors:  # (a path is unique in the tree; a dotted key could still meet another)
                raise InputError("optimizer state", f"two tensors would be named {name!r}")
            tensors[name] = value
            return name

        try:
            encoded = encode_state(dict(optimizer), tensor)
        except RunFieldError as exc:
            raise InputError(
                "optimizer state", f"holds {exc}", hint="Give optimizer.state_dict() (tensors and plain values)"
            ) from None
        if tensors:
            extra.append(from_tensors(raw_tensors(tensors, "optimizer state"), OPTIMIZER, converted_from=None))
    if master is not None:
        named = {MASTER_PREFIX + k: v for k, v in master.items()}
        extra.append(from_tensors(raw_tensors(named, "master weights"), MASTER, converted_from=None))
    taken = {f.path for f in src.files}
    for f in extra:
        if f.path in taken:
            raise InputError(f.path, "the checkpoint's folder holds a file of that name already")
    return ModelSource([*src.files, *extra], src.notes), encoded


def run_record(
    run: str,
    step: int | None,
    metrics: Mapping[str, Any] | None,
    args: Mapping[str, Any] | None,
    optimizer: Any,
) -> dict[str, Any]:
    """The record's `run` field, checked as a reader checks it. Metrics that are not finite
    (a diverged loss) are kept as null."""
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise InvalidOptionError(f"step {step!r} is not a count", hint="Give the training step, 0 or more")
    kept: dict[str, float | None] = {}
    for name, value in (metrics or {}).items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            try:
                value = float(value)  # a 0-dim tensor, a numpy scalar
            except (TypeError, ValueError):
                raise InvalidOptionError(f"metric {name!r} is not a number", hint="Give numbers only") from None
        kept[str(name)] = float(value) if value == value and abs(value) != float("inf") else None
    record: dict[str, Any] = {"id": run, "step": step, "metrics": kept}
    if args:
        record["args"] = public_args(args)
    if optimizer is not None:
        record["optimizer"] = optimizer
    try:
        return checked_run(record)
    except RunFieldError as exc:
        raise InvalidOptionError(
            str(exc), hint="Run ids and metric names are short text without control characters"
        ) from None


def read_checkpoint(store: ObjectStore, vid: str, version: Version, manifest: Manifest, framework: str) -> Checkpoint:
    """A checkpoint's weights, optimizer state and master weights as torch tensors
    (`framework="pt"`) or numpy arrays ("np"); the optimizer state only with torch, which
    `load_state_dict` needs."""
    if version.run is None:
        raise InvalidOptionError(
            f"version {vid[:12]} of {version.model} is not a checkpoint of a training run",
            hint="See: mgit log MODEL (checkpoints show their step)",
        )
    read = as_torch if framework in ("pt", "torch") else as_array
    files = {f.path: {t.name: read(store, t) for t in f.tensors} for f in manifest.files if f.tensors}
    run = version.run
    optimizer = None
    if "optimizer" in run:
        stored = files.get(OPTIMIZER, {})

        def tensor(name: str) -> Any:
            if name not in stored:
                raise CorruptObjectError(version.manifest, f"the optimizer's tensor {name!r} is not in {OPTIMIZER}")
            return stored[name]

        optimizer = decode_state(run["optimizer"], tensor)
    master = files.get(MASTER)
    return Checkpoint(
        version=vid,
        weights=files.get(WEIGHTS, {}),
        optimizer=optimizer,
        master={k.removeprefix(MASTER_PREFIX): v for k, v in master.items()} if master is not None else None,
        run=run["id"],
        step=run["step"],
        metrics=dict(run["metrics"]),
        args=dict(run.get("args", {})),
    )
