"""Checkpoints of a training run from a plain PyTorch loop (`Repo.commit_checkpoint`,
`Repo.load_checkpoint`): the history a run makes, an AdamW optimizer given back bit for bit
(its next step too), bf16 weights with fp32 master weights, refused inputs that write
nothing, forged run fields, and a trainer SIGKILLed mid-run that leaves every checkpoint it
completed."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import fsck_ok
from safetensors.torch import load_file
from trainer_script import trainer_script

from mgit import Repo
from mgit.errors import InputError, InvalidOptionError
from mgit.store.objects import RecordError, Version


def net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))


def train_step(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int) -> float:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return float(loss.detach())


def weights_sha(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode() + state[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def assert_same_optimizer(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k, state in a["state"].items():
        assert state.keys() == b["state"][k].keys()
        for name, value in state.items():
            other = b["state"][k][name]
            if isinstance(value, torch.Tensor):
                assert value.dtype == other.dtype and torch.equal(value, other), (k, name)
            else:
                assert value == other and type(value) is type(other), (k, name)


def run_loop(repo: Repo, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[str]:
    versions = []
    for step in steps:
        loss = train_step(model, opt, step)
        parent = "base" if step == steps[0] else None
        result = repo.commit_checkpoint(
            model.state_dict(),
            model="ft",
            parent=parent,
            step=step,
            metrics={"loss": loss, "eval_loss": torch.tensor(1.0 / step)},
            optimizer=opt.state_dict(),
            run="run-1",
            args={"lr": 1e-3, "hub_token": "hf_secret", "nested": {"api_key": "x", "batch": 16}},
        )
        assert result.created
        versions.append(result.version)
    return versions


def test_a_plain_loop_makes_a_run_whose_optimizer_comes_back_bit_for_bit(repo: Repo) -> None:
    model = net()
    base = repo.add({k: v.clone() for k, v in model.state_dict().items()}, name="base")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.01)
    versions = run_loop(repo, model, opt, range(1, 5))

    log = repo.log("ft")
    assert [v.id for v in log] == versions[::-1]
    assert [v.run["step"] for v in log] == [4, 3, 2, 1] and {v.run["id"] for v in log} == {"run-1"}
    assert log[0].run["metrics"]["eval_loss"] == pytest.approx(0.25)
    for v in log:  # every checkpoint's lineage parent is the base; its predecessor the one before
        assert [p.version for p in v.parents] == [base.version]
    assert [v.predecessor for v in log] == [*versions[::-1][1:], None]
    record = repo.version("ft").run
    assert record["args"] == {"lr": 1e-3, "nested": {"batch": 16}}  # credentials left out

    # coded as deltas against the checkpoint before (where that is smaller than on their own)
    before = repo.manifest(versions[-2]).object_ids()
    bases = [b for t in repo.manifest(versions[-1]).tensors() for b in repo.store.header(t.object).bases]
    assert len(bases) >= 3 and set(bases) <= before

    ck = repo.load_checkpoint("ft")
    assert (ck.step, ck.run, ck.version) == (4, "run-1", versions[-1])
    assert weights_sha(ck.weights) == weights_sha(model.state_dict())
    assert_same_optimizer(ck.optimizer, opt.state_dict())
    assert isinstance(ck.optimizer["param_groups"][0]["betas"], tuple)

    # restored into a fresh model and optimizer, the next step is the same step
    twin = net(seed=99)
    twin.load_state_dict(ck.weights)
    twin_opt = torch.optim.AdamW(twin.parameters(), lr=5.0)
    twin_opt.load_state_dict(ck.optimizer)
    assert_same_optimizer(twin_opt.state_dict(), opt.state_dict())
    assert train_step(twin, twin_opt, 5) == train_step(model, opt, 5)
    assert weights_sha(twin.state_dict()) == weights_sha(model.state_dict())
    assert_same_optimizer(twin_opt.state_dict(), opt.state_dict())

    # an earlier checkpoint by its number
    assert repo.load_checkpoint("ft@2").step == 2
    fsck_ok(repo.root)


def test_bf16_weights_with_fp32_master_weights(repo: Repo) -> None:
    model = net().to(torch.bfloat16)
    master = {k: v.float().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW([p for p in master.values()], lr=1e-2)
    for p in master.values():
        p.grad = torch.ones_like(p)
    opt.step()
    result = repo.commit_checkpoint(model.state_dict(), model="bf", step=1, master=master, optimizer=opt.state_dict())
    ck = repo.load_checkpoint(result.version)
    assert {v.dtype for v in ck.weights.values()} == {torch.bfloat16}
    assert ck.master is not None and weights_sha(ck.master) == weights_sha(master)
    assert weights_sha(ck.weights) == weights_sha(model.state_dict())
    assert_same_optimizer(ck.optimizer, opt.state_dict())
    # every tensor name of the version is its own: the version loads as any other does
    names = set(repo.load_state_dict(result.version))
    assert {f"master.{k}" for k in master} <= names and "optimizer.state.0.exp_avg_sq" in names
    assert ck.run.startswith("run-")  # a run id made when none was given


def test_the_run_goes_on_under_its_id_and_a_folder_is_taken_as_it_is(repo: Repo, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    first = repo.commit_checkpoint(net().state_dict(), model="m", step=10, run="r-7")
    folder = tmp_path / "checkpoint-20"
    folder.mkdir()
    save_file(net(1).state_dict(), folder / "model.safetensors")
    (folder / "trainer_state.json").write_text('{"global_step": 20}')
    second = repo.commit_checkpoint(folder, model="m", step=20)
    assert repo.version(second.version).run["id"] == "r-7"
    assert repo.version(second.version).predecessor == first.version
    out = tmp_path / "out"
    repo.checkout(second.version, out)
    assert (out / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert (out / "trainer_state.json").read_text() == '{"global_step": 20}'


@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"optimizer": {"state": {0: {"fn": print}}}}, InputError, "a value of type builtin_function_or_method"),
        ({"optimizer": {"state": {(1, 2): 3}}}, InputError, "a key of type tuple"),
        ({"metrics": {"loss": "low"}}, InvalidOptionError, "metric 'loss' is not a number"),
        ({"step": -1}, InvalidOptionError, "step -1 is not a count"),
        ({"run": "bad\x1b[2Jrun"}, InvalidOptionError, "id has a control character"),
        ({"metrics": {"": 1.0}}, InvalidOptionError, "metric name"),
    ],
)
def test_a_checkpoint_that_cannot_be_recorded_is_refused_before_anything_is_written(
    repo: Repo, kwargs: dict[str, Any], error: type[Exception], fragment: str
) -> None:
    before = sorted(p.name for p in (repo.dir / "objects").rglob("*") if p.is_file())
    with pytest.raises(error) as info:
        repo.commit_checkpoint(net().state_dict(), model="m", **{"step": 1, **kwargs})
    assert fragment in str(info.value) and "\n" not in str(info.value)
    assert sorted(p.name for p in (repo.dir / "objects").rglob("*") if p.is_file()) == before
    assert repo.refs.get("m") is None


def test_a_version_that_is_no_checkpoint_is_refused_by_load_checkpoint(repo: Repo) -> None:
    repo.add(net().state_dict(), name="plain")
    with pytest.raises(InvalidOptionError, match="is not a checkpoint of a training run"):
        repo.load_checkpoint("plain")


@pytest.mark.parametrize(
    ("run", "fragment"),
    [
        ({"id": "r", "step": 1}, "is not an object of"),
        ({"id": "r", "step": -2, "metrics": {}}, "step is not a count"),
        ({"id": "r", "step": 1, "metrics": {"x": "1"}}, "metric 'x' is not a finite number"),
        ({"id": "r", "step": 1, "metrics": {}, "optimizer": {"lr": 1}}, "not one of"),
        ({"id": "r", "step": 1, "metrics": {}, "optimizer": {"(float)": "pi"}}, "malformed (float)"),
        ({"id": "r", "step": 1, "metrics": {}, "args": {"k": "\x07"}}, "control character"),
        (
            {
                "id": "r",
                "step": 1,
                "metrics": {},
                "optimizer": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
            },
            "too deep",
        ),
        ({"id": "r", "step": 1, "metrics": {}, "extra": 1}, "is not an object of"),
    ],
)
def test_a_forged_run_field_is_refused_when_the_record_is_read(run: dict[str, Any], fragment: str) -> None:
    record = Version("m", "0" * 64, time="2026-01-01T00:00:00Z").to_json()
    with pytest.raises(RecordError, match="run ") as info:
        Version.from_json({**record, "run": run})
    assert fragment in str(info.value)
    good = {"id": "r", "step": None, "metrics": {"loss": None}}
    assert Version.from_json({**record, "run": good}).run == good


@pytest.mark.slow
@pytest.mark.parametrize("how", ["crash-point", "external"])
def test_a_killed_trainer_leaves_every_checkpoint_it_completed(tmp_path: Path, how: str) -> None:
    Repo.init(tmp_path / "r")
    script = tmp_path / "train.py"
    script.write_text(trainer_script(1000, wait=True))
    env = None
    if how == "crash-point":  # killed between its third checkpoint's objects and its ref
        import os

        env = {**os.environ, "MGIT_CRASH_AT": "before-ref:3"}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "r")], stdout=subprocess.PIPE, text=True, env=env
    )
    done = []
    assert proc.stdout is not None
    for line in proc.stdout:
        done.append(json.loads(line))
        if how == "external" and len(done) == 3:
            proc.send_signal(signal.SIGKILL)  # while it trains and commits the fourth
            break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    if how == "crash-point":
        assert [d["step"] for d in done] == [1, 2]

    repo = Repo(tmp_path / "r")
    fsck_ok(repo.root)
    steps = {v.run["step"]: v.id for v in repo.log("ft")}
    for d in done:  # every completed checkpoint is there, bit for bit
        assert steps[d["step"]] == d["version"]
        out = tmp_path / f"out-{d['step']}"
        repo.checkout(d["version"], out)
        assert weights_sha(load_file(out / "model.safetensors")) == d["sha"]
        assert weights_sha(repo.load_checkpoint(d["version"]).weights) == d["sha"]
    # nothing half-written shows: the head is the last completed checkpoint or the one being made
    assert max(steps) in (done[-1]["step"], done[-1]["step"] + 1)
