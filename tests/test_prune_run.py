"""`prune-run`: the checkpoints no rule keeps go, the kept ones stay bit for bit, still one
chain under their old numbers, and gc frees what only the removed ones used; a checkpoint
another model derives from stays with the history before it, a tagged one stays, a dry run
changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import fsck_ok, history, one_line_error, run_cli, sha256_tree

from mgit import Repo
from mgit.errors import InvalidOptionError, UnknownRefError

STEPS = range(100, 1100, 100)  # ft@1 .. ft@10
LOSS = {300: 0.1}  # the best eval_loss is at step 300


def weights(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64)).astype(np.float32)
    drift = np.random.default_rng(step).standard_normal((64, 64)).astype(np.float32) * 1e-3
    return {"w": w + drift * step / 100, "b": np.full(64, step, np.float32)}


def optimizer(step: int) -> dict:
    m = np.random.default_rng(step + 1).standard_normal((64, 64)).astype(np.float32)
    return {"state": {0: {"step": float(step), "exp_avg": m}}, "param_groups": [{"lr": 0.1, "params": [0]}]}


@pytest.fixture
def run(repo: Repo) -> Repo:
    return make_run(repo)


@pytest.fixture
def chained_run(repo: Repo) -> Repo:
    """The run with each checkpoint coded against the one before (`checkpoint_bases: chain`),
    so that keeping the last two codes their tensors again."""
    from mgit.remotes.config import update_config

    update_config(repo.dir, lambda config: config.update(checkpoint_bases="chain"))
    return make_run(Repo(repo.dir))


def make_run(repo: Repo) -> Repo:
    repo.add(weights(0), name="base")
    for step in STEPS:
        repo.commit_checkpoint(
            weights(step),
            model="ft",
            parent="base" if step == 100 else None,
            step=step,
            metrics={"eval_loss": LOSS.get(step, 1.0 + step / 1000)},
            optimizer=optimizer(step),
            run="r",
        )
    repo.tag("ft@5", {"release": "yes"})
    repo.add({"w": weights(200)["w"].astype(np.float16)}, name="ft-fp16", parent="ft@2", relation="quantize")
    return repo


def trees(repo: Repo, tmp_path: Path, refs: list[str], label: str) -> dict[str, dict[str, str]]:
    out = {}
    for ref in refs:
        folder = tmp_path / label / ref.replace("@", "-")
        repo.checkout(ref, folder)
        out[ref] = sha256_tree(folder)
    return out


def test_prune_keeps_what_the_rules_say_and_gc_frees_the_rest(run: Repo, tmp_path: Path) -> None:
    repo = run
    kept = [f"ft@{n}" for n in (1, 2, 3, 4, 5, 8, 9, 10)]
    before = trees(repo, tmp_path, kept, "before")
    heads = dict(repo.refs.all())
    objects = sorted(p.name for p in (repo.dir / "objects").rglob("*") if p.is_file())

    dry = repo.prune_run("ft", keep_last=2, keep_every=400, keep_best="eval_loss", dry_run=True)
    assert [c.ref for c in dry.removed] == ["ft@6", "ft@7"]
    why = {c.ref: c.kept for c in dry.checkpoints}
    assert why["ft@3"].startswith("best eval_loss") and why["ft@4"] == why["ft@8"] == "step a multiple of 400"
    assert why["ft@5"] == "tagged release=yes" and why["ft@2"].startswith("a parent of ft-fp16@1")
    assert why["ft@1"] == "history of a version others derive from" and why["ft@10"] == "one of the last 2"
    assert dry.freed_bytes > 0 and dry.freed_bytes == sum(c.stored_bytes for c in dry.removed)
    assert dict(repo.refs.all()) == heads  # a dry run changes nothing
    assert sorted(p.name for p in (repo.dir / "objects").rglob("*") if p.is_file()) == objects

    result = repo.prune_run("ft", keep_last=2, keep_every=400, keep_best="eval_loss")
    assert [c.ref for c in result.removed] == ["ft@6", "ft@7"] and result.relinked == 3
    log = history(repo.root, "ft")  # one chain, numbers kept
    assert [v["seq"] for v in log] == [10, 9, 8, 5, 4, 3, 2, 1]
    assert all(v["run"]["id"] == "r" for v in log)
    assert repo.info("ft@8").predecessor == repo.resolve("ft@5")
    assert repo.info("ft@5").tags["release"] == "yes"
    with pytest.raises(UnknownRefError):
        repo.resolve("ft@6")

    gc = repo.gc()
    assert gc.removed_bytes >= result.freed_bytes > 0
    fsck_ok(repo.root)
    after = trees(repo, tmp_path, kept, "after")
    assert after == before  # every kept checkpoint bit for bit
    assert repo.load_checkpoint("ft@9").optimizer["state"][0]["step"] == 900.0
    assert trees(repo, tmp_path, ["ft-fp16"], "child")  # the child still checks out

    # the run goes on after its last kept checkpoint
    nxt = repo.commit_checkpoint(weights(1100), model="ft", step=1100, optimizer=optimizer(1100))
    assert nxt.seq == 11 and repo.info("ft").predecessor == result.head


def test_prune_run_on_the_command_line(run: Repo) -> None:
    code, out, err = run_cli("prune-run", "ft", "--keep-last", "3", "--dry-run", cwd=run.root)
    assert code == 0, err
    assert "ft@4" in out and "would remove" in out and "ft@3" in out
    code, out, err = run_cli("prune-run", "ft", "--keep-last", "3", "--json", cwd=run.root)
    assert code == 0, err
    report = json.loads(out)
    assert [c["ref"] for c in report["checkpoints"] if c["kept"] is None] == ["ft@3", "ft@4", "ft@6", "ft@7"]
    assert [v["seq"] for v in history(run.root, "ft")] == [10, 9, 8, 5, 2, 1]
    one_line_error(run_cli("prune-run", "ft", "--keep-best", "accuracy", cwd=run.root), "no checkpoint logged metric")
    one_line_error(run_cli("prune-run", "nope", "--keep-last", "1", cwd=run.root), "nope")


def test_a_policy_that_makes_no_sense_is_refused(repo: Repo) -> None:
    with pytest.raises(InvalidOptionError):
        repo.prune_run("ft", keep_every=0)


def test_log_shows_each_checkpoints_step_and_draws_a_metric(run: Repo) -> None:
    code, out, err = run_cli("log", "ft", "-n", "1", cwd=run.root)
    assert code == 0, err
    assert "step:    1000  eval_loss 2  (run r)" in out
    code, out, err = run_cli("log", "ft", "--oneline", "-n", "2", cwd=run.root)
    assert [line.split()[:3] for line in out.splitlines()] == [["ft@10", "[step", "1000]"], ["ft@9", "[step", "900]"]]
    code, out, err = run_cli("log", "ft", "--metric", "eval_loss", cwd=run.root)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["version", "step", "eval_loss"]
    assert lines[1].split() == ["ft@1", "100", "1.1"] and lines[3].split() == ["ft@3", "300", "0.1"]
    assert lines[-1] == "eval_loss  ▅▅▁▆▆▇▇▇██  lowest 0.1 at ft@3, highest 2 at ft@10"
    code, out, err = run_cli("log", "ft", "--metric", "eval_loss", "--json", cwd=run.root)
    points = json.loads(out)
    assert [(p["ref"], p["step"], p["value"]) for p in points][:3] == [
        ("ft@1", 100, 1.1),
        ("ft@2", 200, 1.2),
        ("ft@3", 300, 0.1),
    ]
    one_line_error(run_cli("log", "ft", "--metric", "accuracy", cwd=run.root), "no checkpoint here logged metric")


def test_a_metric_that_diverged_at_every_checkpoint_is_listed_not_drawn(repo: Repo) -> None:
    for step in (1, 2):
        repo.commit_checkpoint(weights(step), model="div", step=step, metrics={"loss": float("nan"), "lr": 0.1})
    code, out, err = run_cli("log", "div", "--metric", "loss", cwd=repo.root)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[1].split() == ["div@1", "1", "-"] and lines[2].split() == ["div@2", "2", "-"]
    assert lines[-1] == "loss: no finite value at any checkpoint"


@pytest.mark.slow
@pytest.mark.parametrize("point", ["object-written:2", "object-written:5"])
def test_a_prune_killed_midway_leaves_every_version_readable_and_can_run_again(
    chained_run: Repo, tmp_path: Path, point: str
) -> None:
    import signal

    from conftest import run_mgit

    everything = [f"ft@{n}" for n in range(1, 11)]
    before = trees(chained_run, tmp_path, everything, "before")
    killed = run_mgit("prune-run", "ft", "--keep-last", "2", cwd=chained_run.root, env={"MGIT_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    repo = Repo(chained_run.root)
    fsck_ok(repo.root)
    assert trees(repo, tmp_path, everything, "after-kill") == before  # the history as it was, every byte
    result = repo.prune_run("ft", keep_last=2)
    assert [c.ref for c in result.removed] == ["ft@3", "ft@4", "ft@6", "ft@7", "ft@8"]
    repo.gc()
    fsck_ok(repo.root)
    kept = ["ft@1", "ft@2", "ft@5", "ft@9", "ft@10"]
    assert trees(repo, tmp_path, kept, "after") == {ref: before[ref] for ref in kept}
