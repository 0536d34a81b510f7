"""Checkpoints committed in the background (`Repo.commit_checkpoint(..., wait=False)`,
mgit.repo.background): what is stored is the state at the call, however the loop changes its
tensors after; commits keep their order and store what a synchronous commit stores; an error
of a background commit is raised by the next call (or by `wait_checkpoints`), once, and
writes nothing; a folder removed by the trainer right after the call is still committed whole;
and a trainer SIGKILLed while a background commit is in flight leaves every finished one bit
for bit and nothing of the one in flight."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import fsck_ok, sha256_tree
from safetensors.torch import load_file, save_file
from trainer_script import trainer_script

from mgit import Repo
from mgit.errors import InvalidOptionError
from mgit.repo.background import PendingCommit


def sha(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode() + state[name].reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def loop_step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    loss = model(torch.randn(8, 16, generator=g)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def optimizer_sha(state: dict) -> str:
    return sha({f"{k}.{n}": v for k, s in state["state"].items() for n, v in s.items() if isinstance(v, torch.Tensor)})


def test_a_background_commit_stores_the_state_at_the_call_as_a_synchronous_one_does(tmp_path: Path) -> None:
    repos = {wait: Repo.init(tmp_path / f"repo-{wait}") for wait in (True, False)}
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    taken, pending = [], []
    for step in range(1, 6):
        loss = loop_step(model, opt, step)
        kwargs = {"model": "ft", "step": step, "metrics": {"loss": torch.tensor(loss)}, "run": "r"}
        done = repos[True].commit_checkpoint(model.state_dict(), optimizer=opt.state_dict(), **kwargs)
        p = repos[False].commit_checkpoint(model.state_dict(), optimizer=opt.state_dict(), wait=False, **kwargs)
        assert isinstance(p, PendingCommit)
        taken.append((sha(model.state_dict()), optimizer_sha(opt.state_dict()), done))
        pending.append(p)
        # the loop goes on at once: its next step changes every tensor in place
    repos[False].wait_checkpoints()
    assert all(p.done() for p in pending)
    results = [p.result() for p in pending]
    assert [r.seq for r in results] == [1, 2, 3, 4, 5]  # in order, each after the one before
    background = repos[False]
    log = background.log("ft")
    assert [v.run["step"] for v in log] == [5, 4, 3, 2, 1]
    for (weights, moments, done), result in zip(taken, results, strict=True):
        ck = background.load_checkpoint(result.version)
        assert sha(ck.weights) == weights and optimizer_sha(ck.optimizer) == moments
        # the same manifest as the synchronous commit of the same state
        assert background.version(result.version).manifest == repos[True].version(done.version).manifest
    fsck_ok(background.root)


def test_the_copy_a_background_commit_takes_is_equal_and_apart() -> None:
    from mgit.repo.checkpoints import snapshot_state

    wide = torch.randn(6, 8)
    state = {
        "bf16": torch.randn(5, 7).to(torch.bfloat16),
        "scalar": torch.tensor(3.0),
        "ints": torch.arange(10),
        "mask": torch.rand(9) > 0.5,
        "empty": torch.zeros(0, 4),
        "strided": wide[:, ::2],
        "nested": {"groups": [{"lr": 0.1, "params": [0, 1]}], "betas": (0.9, 0.99)},
    }
    copy = snapshot_state(state)
    for name in ("bf16", "scalar", "ints", "mask", "empty", "strided"):
        a, b = state[name], copy[name]
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), name
        if a.numel():
            assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr(), name
    assert copy["nested"] == state["nested"] and copy["nested"]["groups"][0] is not state["nested"]["groups"][0]
    assert isinstance(copy["nested"]["betas"], tuple)
    state["scalar"].add_(1)  # the loop changes its tensors in place: the copy stays
    assert float(copy["scalar"]) == 3.0


def test_an_error_in_a_background_commit_is_raised_by_the_next_call_once_and_writes_nothing(repo: Repo) -> None:
    state = {"w": torch.ones(8, 8)}
    first = repo.commit_checkpoint(state, model="ft", step=1, run="r", wait=False)
    assert first.result().seq == 1
    bad = repo.commit_checkpoint(state, model="ft", step=-3, run="r", wait=False)  # checked in the thread
    with pytest.raises(InvalidOptionError, match="step -3 is not a count") as raised:
        repo.commit_checkpoint({"w": torch.zeros(8, 8)}, model="ft", step=3, run="r", wait=False)
    assert "background commit of step -3 of ft" in "".join(raised.value.__notes__)
    assert bad.done()
    repo.wait_checkpoints()  # raised once: nothing is left to raise
    assert [v.run["step"] for v in repo.log("ft")] == [1]  # neither the bad one nor the refused call
    # wait_checkpoints raises what the last one raised
    repo.commit_checkpoint(state, model="ft", step=-4, run="r", wait=False)
    with pytest.raises(InvalidOptionError, match="step -4"):
        repo.wait_checkpoints()
    again = repo.commit_checkpoint({"w": torch.full((8, 8), 2.0)}, model="ft", step=4, run="r", wait=False)
    assert again.result().seq == 2
    # a synchronous call waits for the background one before it, and raises its error
    repo.commit_checkpoint(state, model="ft", step=-5, run="r", wait=False)
    with pytest.raises(InvalidOptionError, match="step -5"):
        repo.commit_checkpoint(state, model="ft", step=6, run="r")
    assert [v.run["step"] for v in repo.log("ft")] == [4, 1]
    fsck_ok(repo.root)


def test_a_folder_the_trainer_removes_right_after_the_call_is_still_committed_whole(repo: Repo, tmp_path: Path) -> None:
    out = tmp_path / "out"
    folder = out / "checkpoint-2"
    folder.mkdir(parents=True)
    save_file({"w": torch.randn(64, 64), "b": torch.randn(64)}, str(folder / "model.safetensors"))
    torch.save({"state": {0: {"exp_avg": torch.randn(64)}}, "param_groups": []}, folder / "optimizer.pt")
    (folder / "trainer_state.json").write_text('{"global_step": 2}')
    (folder / "training_args.bin").write_bytes(b"secret")
    before = sha256_tree(folder)
    pending = repo.commit_checkpoint(folder, model="ft", step=2, leave_out=("training_args.bin",), wait=False)
    import shutil

    shutil.rmtree(folder)  # as save_total_limit does with an old checkpoint
    result = pending.result()
    repo.checkout(result.version, tmp_path / "back")
    before.pop("training_args.bin")
    assert sha256_tree(tmp_path / "back") == before
    assert list(out.iterdir()) == []  # the links the commit read are gone with it
    with pytest.raises(InvalidOptionError, match="bounds an optimizer state given in memory"):
        repo.commit_checkpoint(tmp_path / "back", model="ft", lossy_optimizer=0.1)


@pytest.mark.slow
def test_a_trainer_killed_while_a_background_commit_is_in_flight_leaves_the_finished_ones(tmp_path: Path) -> None:
    Repo.init(tmp_path / "r")
    script = tmp_path / "train.py"
    script.write_text(trainer_script(8, wait=False))
    stall = tmp_path / "stall"  # the 4th commit pauses between its objects and its records
    env = {**os.environ, "MGIT_STALL_AT": "after-objects:4", "MGIT_STALL_FILE": str(stall)}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "r")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while not Path(f"{stall}.reached").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "the trainer never reached the 4th commit"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)  # while the 4th commit is in flight (its objects written)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    submitted = [json.loads(line) for line in out.splitlines()]
    assert [d["step"] for d in submitted][:4] == [1, 2, 3, 4]  # the loop went on while 4 was committed

    repo = Repo(tmp_path / "r")
    fsck_ok(repo.root)
    steps = {v.run["step"]: v.id for v in repo.log("ft")}
    assert sorted(steps) == [1, 2, 3]  # the finished ones; nothing of the 4th shows
    for d in submitted[:3]:
        out_dir = tmp_path / f"out-{d['step']}"
        repo.checkout(steps[d["step"]], out_dir)
        assert sha(load_file(out_dir / "model.safetensors")) == d["sha"]
    # the run goes on from the last finished checkpoint
    again = repo.commit_checkpoint({"w": torch.ones(4)}, model="ft", step=4, run="killed")
    assert repo.version(again.version).predecessor == steps[3]
    fsck_ok(repo.root)
