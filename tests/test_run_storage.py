"""How a training run is stored: each checkpoint coded against the one its skip delta names
(checkpoint i against i with its lowest set bit cleared), so that delta chains stay
log2-short without a full checkpoint every few; and bounded-lossy optimizer moments
(`lossy_optimizer=R`): the bound recorded on the version, every moment within it, the weights
exact, and a run resumed from a lossy-moment checkpoint reaching the losses of one resumed
from the lossless checkpoint within 1%."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import fsck_ok

from mgit import Repo
from mgit.errors import InvalidOptionError
from mgit.remotes.config import update_config
from mgit.repo.checkpoints import RUN_MAX_DEPTH, run_base
from mgit.store.objects import RecordError, Version

REL = 0.05  # the lossy bound of these tests: 5% of the rms of each moment's change


def mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.Tanh(), torch.nn.Linear(96, 8))


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, 32, generator=g)
    return x, torch.sin(x[:, :8] * 2)


def train(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: range) -> float:
    loss = torch.tensor(0.0)
    for step in steps:
        x, y = data(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return float(loss.detach())


def object_ids(repo: Repo, vid: str, prefix: str = "") -> set[str]:
    return {t.object for t in repo.manifest(vid).tensors() if t.name.startswith(prefix)}


def test_the_skip_rule() -> None:
    history = [f"v{i}" for i in range(12)]
    assert [run_base(history[:i], "skip") for i in range(1, 12)] == [
        "v0", "v0", "v2", "v0", "v4", "v4", "v6", "v0", "v8", "v8", "v10"
    ]  # fmt: skip
    assert [run_base(history[:i], "key") for i in range(1, 10)] == [
        "v0", "v0", "v0", "v0", "v4", "v4", "v4", "v0", "v8"
    ]  # fmt: skip
    assert run_base(history[:5], "chain") == "v4" and run_base([], "skip") is None
    with pytest.raises(InvalidOptionError, match="checkpoint bases 'tree' are not known"):
        from mgit.repo.add import AddOptions

        AddOptions(name="ft", run_bases="tree")


def test_a_run_codes_each_checkpoint_against_its_skip_base_without_restarting(repo: Repo) -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    base = repo.add({k: v.clone() for k, v in model.state_dict().items()}, name="base")
    versions = []
    for i in range(10):
        train(model, opt, range(i * 2, i * 2 + 2))
        r = repo.commit_checkpoint(
            model.state_dict(), model="ft", parent="base" if i == 0 else None, step=i, optimizer=opt.state_dict()
        )
        versions.append(r.version)
    deepest = 0
    for i, vid in enumerate(versions):
        allowed = object_ids(repo, versions[i & (i - 1)]) if i else object_ids(repo, base.version)
        for t in repo.manifest(vid).tensors():
            header = repo.store.header(t.object)
            assert set(header.bases) <= allowed | {t.object}, (i, t.name)  # its skip base's tensors only
            assert header.depth <= bin(i).count("1") + 1 <= RUN_MAX_DEPTH
            deepest = max(deepest, header.depth)
        if i:  # every checkpoint's weights are deltas, none a fresh full copy
            weights = [t for t in repo.manifest(vid).tensors() if not t.name.startswith("optimizer.")]
            assert all(repo.store.header(t.object).bases for t in weights if t.params > 8), i
    assert deepest >= 3  # deeper than delta_max_depth (2), which would have started the chain again
    for vid in versions:  # and each reads back bit for bit
        ck = repo.load_checkpoint(vid)
        assert ck.weights.keys() == model.state_dict().keys()
    last = repo.load_checkpoint(versions[-1])
    for name, t in model.state_dict().items():
        assert torch.equal(last.weights[name], t)
    fsck_ok(repo.root)


def moments(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {f"{k}.{n}": v for k, s in state["state"].items() for n, v in s.items() if n.startswith("exp_avg")}


def test_lossy_moments_stay_within_their_recorded_bound_and_resume_to_the_same_loss(tmp_path: Path) -> None:
    exact, lossy = Repo.init(tmp_path / "exact"), Repo.init(tmp_path / "lossy")
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    stored = {"exact": [], "lossy": []}
    states = []
    for i in range(4):
        train(model, opt, range(i * 5, i * 5 + 5))
        state, optimizer = model.state_dict(), opt.state_dict()
        kwargs = {"model": "ft", "step": (i + 1) * 5, "optimizer": optimizer, "run": "r"}
        a = exact.commit_checkpoint(state, **kwargs)
        b = lossy.commit_checkpoint(state, lossy_optimizer=REL, **kwargs)
        stored["exact"].append(a.new_bytes)
        stored["lossy"].append(b.new_bytes)
        states.append(({k: v.clone() for k, v in state.items()}, {k: v.clone() for k, v in moments(optimizer).items()}))
        if i == 0:
            assert b.lossy is None  # no checkpoint before: the moments have no base, stored exactly
            continue
        record = lossy.version(b.version).lossy
        assert record["scope"] == "optimizer." and record["rel"] == REL and record["mode"] == "rel"
        assert record["tensors"] == len(moments(optimizer))  # the moments only
        ck = lossy.load_checkpoint(b.version)
        for name, t in state.items():  # the weights exact
            assert torch.equal(ck.weights[name], t), name
        for k, s in optimizer["state"].items():  # and the step counts, which bias correction reads
            assert torch.equal(ck.optimizer["state"][k]["step"], s["step"]), k
        for t in lossy.manifest(b.version).tensors():
            quantized = "quantized_delta" in lossy.store.header(t.object).codec_names
            assert not quantized or t.name.startswith("optimizer.") and t.name.endswith(("exp_avg", "exp_avg_sq"))
        base_index = i & (i - 1)
        base = moments(lossy.load_checkpoint(lossy.log("ft")[-1 - base_index].id).optimizer)
        for name, t in moments(optimizer).items():
            got = moments(ck.optimizer)[name]
            change = (t.double() - base[name].double()).pow(2).mean().sqrt()
            error = (got.double() - t.double()).abs().max()
            assert 0 < error <= REL * change * (1 + 1e-6), name  # lossy, and within the bound
            assert error <= record["max_error"] * (1 + 1e-6)
    assert sum(stored["lossy"][1:]) < 0.8 * sum(stored["exact"][1:])
    code = exact.version("ft").lossy
    assert code is None

    # resumed from either checkpoint, 30 more steps: the losses agree within 1%
    finals = {}
    for label, repo in (("exact", exact), ("lossy", lossy)):
        ck = repo.load_checkpoint("ft")
        twin = mlp(seed=7)
        twin.load_state_dict(ck.weights)
        twin_opt = torch.optim.AdamW(twin.parameters(), lr=3e-3)
        twin_opt.load_state_dict(ck.optimizer)
        finals[label] = train(twin, twin_opt, range(20, 50))
    assert finals["lossy"] == pytest.approx(finals["exact"], rel=0.01)
    fsck_ok(lossy.root)


def test_a_lossy_scope_is_checked_when_the_record_is_read(repo: Repo) -> None:
    repo.commit_checkpoint({"w": torch.ones(4)}, model="ft", step=1)
    record = repo.store.get_record(repo.refs.get("ft"), "version")
    lossy = {"eps": None, "mode": "rel", "rel": 0.1, "max_error": 1e-3, "tensors": 2, "guard": 0.1}
    assert Version.from_json({**record, "lossy": {**lossy, "scope": "optimizer."}}).lossy["scope"] == "optimizer."
    assert Version.from_json({**record, "lossy": lossy}).lossy == lossy  # as older versions record it
    for forged in ("", "a\nb", 3):
        with pytest.raises(RecordError, match="lossy scope"):
            Version.from_json({**record, "lossy": {**lossy, "scope": forged}})
    with pytest.raises(RecordError, match="lossy is not an object of"):
        Version.from_json({**record, "lossy": {**lossy, "only": "optimizer."}})


def test_a_run_can_keep_the_old_chain_of_checkpoints(repo: Repo) -> None:
    update_config(repo.dir, lambda config: config.update(checkpoint_bases="chain"))
    repo = Repo(repo.dir)
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(5):
        train(model, opt, range(i, i + 1))
        repo.commit_checkpoint(model.state_dict(), model="ft", step=i, optimizer=opt.state_dict())
    depths = {repo.store.header(t.object).depth for v in repo.log("ft") for t in repo.manifest(v.id).tensors()}
    assert max(depths) <= 2  # chains start again at delta_max_depth
