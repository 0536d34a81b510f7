"""Lossy storage: the bound holds on every element, the stored object is the reconstruction,
the fidelity guard refuses changes that would round back to the parent, the gate runs user
code in a child process and falls back to lossless, and a lossy version says so everywhere."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_model, run_cli, sha256_tree
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file

from mgit import Repo
from mgit.codecs import CodecContext, QuantizedDeltaCodec
from mgit.codecs.quantized_delta import as_float64
from mgit.errors import InvalidOptionError
from mgit.repo.gate import compare, lower_is_better
from mgit.store.lossy import encode_lossy
from mgit.store.lossy_policy import LossyPolicy
from mgit.store.memory import MemoryStore

TORCH_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
SAME_SIZE_INT = {"F64": torch.int64, "F32": torch.int32, "F16": torch.int16, "BF16": torch.int16}


def raw(values: np.ndarray, dtype: str) -> np.ndarray:
    """float64 values as the bytes of `dtype` (torch does the casts, as a model would)."""
    t = torch.from_numpy(values).to(TORCH_DTYPES[dtype])
    return t.view(SAME_SIZE_INT[dtype]).numpy().view(np.uint8).reshape(-1)


def state(seed: int = 0, *, scale: float = 0.05, rows: int = 64) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {f"layer.{i}.weight": (rng.standard_normal((rows, 64)) * scale).astype(np.float32) for i in range(4)}
    out["position_ids"] = np.arange(16, dtype=np.int64)
    return out


def finetune(parent: dict[str, np.ndarray], delta: float, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        k: (v + rng.standard_normal(v.shape) * delta).astype(v.dtype) if v.dtype == np.float32 else v
        for k, v in parent.items()
    }


# --- the codec and the bound ------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["F64", "F32", "F16", "BF16"]),
    st.integers(1, 300),
    st.floats(1e-5, 1.0),
    st.floats(1e-4, 10.0),
    st.floats(0.0, 2.0),
    st.integers(0, 2**32 - 1),
)
def test_every_element_is_within_the_bound(
    dtype: str, n: int, eps: float, scale: float, change: float, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    parent_values = rng.standard_normal(n) * scale
    child_values = parent_values + rng.standard_normal(n) * change * eps * 20
    store = MemoryStore()
    parent = store.put_tensor(dtype, (n,), raw(parent_values, dtype))
    child = raw(child_values, dtype)
    outcome = encode_lossy(store, dtype, (n,), child, [parent.oid], LossyPolicy(eps, guard=1e9), 4)
    if outcome is None or outcome.chain is None:
        return  # identical to the parent, or stored losslessly: nothing to bound
    original, recon = as_float64(child, dtype), as_float64(outcome.data, dtype)
    assert (np.abs(recon - original) <= eps).all()
    assert outcome.max_error == pytest.approx(float(np.abs(recon - original).max()))
    # The stored object is the reconstruction, and it decodes to exactly those bytes.
    encoding = store.encode(
        "tensor", {"dtype": dtype, "shape": [n]}, outcome.data, bases=[parent.oid], extra=[outcome.chain]
    )
    stored = store.put_tensor(dtype, (n,), outcome.data, encoding=encoding)
    assert store.get(stored.oid)[1].tobytes() == outcome.data.tobytes()


def test_codec_roundtrips_a_reconstruction_exactly() -> None:
    rng = np.random.default_rng(0)
    base = rng.standard_normal(1000).astype(np.float32)
    codec = QuantizedDeltaCodec(base="ab" * 32, step=1e-3, dtype="F32", int_bytes=2)
    q = rng.integers(-2000, 2000, 1000)
    recon = (base.astype(np.float64) + q * 1e-3).astype(np.float32).view(np.uint8)
    ctx = CodecContext(recon.nbytes, lambda _: base.view(np.uint8))
    encoded = codec.encode(recon, ctx)
    assert np.asarray(encoded).nbytes == 2000
    assert bytes(np.asarray(codec.decode(encoded, ctx))) == recon.tobytes()
    assert QuantizedDeltaCodec(**codec.to_dict()["configuration"]) == codec


def test_nan_inf_and_integer_tensors_stay_exact() -> None:
    store = MemoryStore()
    parent = np.zeros(64, np.float32)
    child = parent + np.float32(0.5)
    child[3] = np.nan
    p = store.put_tensor("F32", (64,), parent.view(np.uint8))
    outcome = encode_lossy(store, "F32", (64,), child.view(np.uint8), [p.oid], LossyPolicy(0.1), 4)
    assert outcome is not None and outcome.chain is None
    ints = store.put_tensor("I64", (4,), np.arange(4).view(np.uint8))
    assert encode_lossy(store, "I64", (4,), (np.arange(4) + 1).view(np.uint8), [ints.oid], LossyPolicy(1.0), 4) is None


# --- adding lossily -----------------------------------------------------------------------------


@pytest.fixture
def base_and_tuned(repo: Repo, tmp_path: Path) -> tuple[Repo, Path]:
    """The repository with `base` added, and the folder holding base/ and tuned/ (a fine-tune)."""
    parent = state()
    make_model(tmp_path / "base", state=parent)
    make_model(tmp_path / "tuned", state=finetune(parent, 1e-2))
    repo.add(tmp_path / "base", name="base")
    return repo, tmp_path


def test_lossy_finetune_is_smaller_bounded_and_marked(base_and_tuned: tuple[Repo, Path]) -> None:
    repo, tmp = base_and_tuned
    lossy = repo.add(tmp / "tuned", name="tuned", parent="base", lossy=1e-3)
    lossless = repo.add(tmp / "tuned", name="exact", parent="base")
    assert lossless.lossy is None and lossy.lossless_reason is None
    assert lossy.lossy is not None and lossy.lossy["eps"] == 1e-3 and lossy.lossy["mode"] == "abs"
    assert lossy.lossy["tensors"] == 4 and lossy.lossy["guard"] == 0.1
    assert 0 < lossy.lossy["max_error"] <= 1e-3
    assert lossy.new_bytes < lossless.new_bytes / 3
    assert repo.version("tuned").lossy == lossy.lossy
    # The exact tensors are stored now: a lossy add of the same model stores nothing lossily.
    again = repo.add(tmp / "tuned", name="again", parent="base", lossy=1e-3)
    assert again.lossy is None and "every tensor is stored already" in (again.lossless_reason or "")
    original = load_file(str(tmp / "tuned" / "model.safetensors"))
    restored = repo.load_state_dict("tuned")
    for name, values in original.items():
        assert np.abs(restored[name].astype(np.float64) - values).max() <= 1e-3
    assert np.array_equal(restored["position_ids"], original["position_ids"])


def test_checkouts_are_the_stored_reconstruction_every_time(base_and_tuned: tuple[Repo, Path]) -> None:
    repo, tmp = base_and_tuned
    first = repo.add(tmp / "tuned", name="tuned", parent="base", lossy=1e-3)
    repo.checkout("tuned", tmp / "out1")
    repo.checkout("tuned", tmp / "out2")
    assert sha256_tree(tmp / "out1") == sha256_tree(tmp / "out2")
    assert sha256_tree(tmp / "out1") != sha256_tree(tmp / "tuned")
    assert (tmp / "out1" / "config.json").read_bytes() == (tmp / "tuned" / "config.json").read_bytes()
    # Deterministic: adding the same files lossily again gives the same objects.
    again = repo.add(tmp / "tuned", name="tuned2", parent="base", lossy=1e-3)
    assert repo.version(again.version).manifest == repo.version(first.version).manifest
    assert repo.fsck().ok


def test_lossless_stays_the_default(base_and_tuned: tuple[Repo, Path]) -> None:
    repo, tmp = base_and_tuned
    result = repo.add(tmp / "tuned", name="tuned", parent="base")
    assert result.lossy is None and result.lossless_reason is None
    repo.checkout("tuned", tmp / "out")
    assert sha256_tree(tmp / "out") == sha256_tree(tmp / "tuned")


def test_a_change_smaller_than_eps_is_refused_not_rounded_back(repo: Repo, tmp_path: Path) -> None:
    parent = state()
    child = {
        k: (v + np.float32(4e-4) * np.sign(np.random.default_rng(2).standard_normal(v.shape))).astype(v.dtype)
        if v.dtype == np.float32
        else v
        for k, v in parent.items()
    }
    assert max(np.abs(child[k] - parent[k]).max() for k in parent) < 1e-3
    make_model(tmp_path / "base", state=parent)
    make_model(tmp_path / "tiny", state=child)
    repo.add(tmp_path / "base", name="base")
    result = repo.add(tmp_path / "tiny", name="tiny", parent="base", lossy=1e-3)
    assert result.lossy is None and repo.version("tiny").lossy is None
    assert "fidelity guard" in (result.lossless_reason or "")
    repo.checkout("tiny", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "tiny")


def test_tensors_without_a_parent_make_no_lossy_version(repo: Repo, tmp_path: Path) -> None:
    result = repo.add(make_model(tmp_path / "m", state=state()), name="m", lossy=1e-3, lossy_rel=0.1)
    assert result.lossy is None and "no tensor" in (result.lossless_reason or "")


def test_a_relative_bound_keeps_small_changes(repo: Repo, tmp_path: Path) -> None:
    # Changes of ~4e-6, like a full fine-tune's: far below any useful absolute bound, so an
    # absolute bound is refused by the guard; a bound relative to the change compresses them
    # and keeps what the child changed.
    parent = state()
    child = finetune(parent, 4e-6)
    make_model(tmp_path / "base", state=parent)
    make_model(tmp_path / "ft", state=child)
    repo.add(tmp_path / "base", name="base")
    result = repo.add(tmp_path / "ft", name="ft", parent="base", lossy_rel=0.1)
    both = repo.add(tmp_path / "ft", name="ft-both", parent="base", lossy=1e-7, lossy_rel=0.1)
    refused = repo.add(tmp_path / "ft", name="ft-abs", parent="base", lossy=1e-4)
    assert refused.lossy is None and "fidelity guard" in (refused.lossless_reason or "")
    assert result.lossy and result.lossy["mode"] == "rel" and result.lossy["rel"] == 0.1 and result.lossy["eps"] is None
    assert result.new_bytes < refused.new_bytes / 2  # refused: stored exactly, first
    back = repo.load_state_dict("ft")
    for k, v in child.items():
        if v.dtype != np.float32:
            assert np.array_equal(back[k], v)
            continue
        change = v.astype(np.float64) - parent[k]
        error = back[k].astype(np.float64) - v
        assert np.abs(error).max() <= 0.1 * np.sqrt(np.mean(change**2))
        assert np.linalg.norm(error) <= 0.1 * np.linalg.norm(change)  # the guard
    code, out, _ = run_cli("log", "ft", cwd=repo.root)
    assert code == 0 and "|error| <= 0.1 x rms(change)" in out
    # Both bounds: each holds. A relative bound alone leaves a model without parent exact.
    assert both.lossy and both.lossy["mode"] == "abs+rel" and both.lossy["max_error"] <= 1e-7
    root = repo.add(make_model(tmp_path / "other", state=state(5)), name="root-rel", lossy_rel=0.1)
    assert root.lossy is None and "no tensor" in (root.lossless_reason or "")


# --- the gate -------------------------------------------------------------------------------


GATE = """
import numpy as np
from safetensors.numpy import load_file

def accuracy(folder):  # 1 on the original; each element's error costs at most that error
    w = load_file(folder + "/model.safetensors")["layer.0.weight"].astype(np.float64)
    return {"acc": 1.0 - abs(float(w.sum()) - TARGET)}

def loss_up(folder):
    return {"val_loss": 2.0 if "reconstruction" in folder else 1.0}

def crash(folder):
    raise RuntimeError("boom")

def hang(folder):
    import time
    time.sleep(60)
"""


@pytest.fixture
def gate_file(tmp_path: Path) -> Path:
    target = float(finetune(state(), 1e-2)["layer.0.weight"].astype(np.float64).sum())
    path = tmp_path / "gates.py"
    path.write_text(textwrap.dedent(GATE).replace("TARGET", repr(target)))
    return path


def test_gate_accepts_within_max_drop_and_refuses_beyond(base_and_tuned: tuple[Repo, Path], gate_file: Path) -> None:
    repo, tmp = base_and_tuned
    # 64 x 64 elements, each within 1e-3: the sum moves by at most 4.096.
    ok = repo.add(tmp / "tuned", name="a", parent="base", lossy=1e-3, gate=f"{gate_file}:accuracy", max_drop=4.1)
    assert ok.lossy is not None and ok.lossless_reason is None and ok.gate is not None
    assert ok.gate["original"]["acc"] == 1.0 and ok.gate["reconstruction"]["acc"] < 1.0
    refused = repo.add(tmp / "tuned", name="b", parent="base", lossy=1e-3, gate=f"{gate_file}:accuracy", max_drop=0)
    assert refused.lossy is None and "gate refused it: acc fell" in (refused.lossless_reason or "")
    repo.checkout("b", tmp / "out")
    assert sha256_tree(tmp / "out") == sha256_tree(tmp / "tuned")
    assert repo.fsck().ok


def test_gate_by_module_name_on_a_state_dict(
    repo: Repo, tmp_path: Path, gate_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # `gates:accuracy` is importable from the current folder
    repo.add(state(), name="base")
    result = repo.add(
        finetune(state(), 1e-2), name="tuned", parent="base", lossy=1e-3, gate="gates:accuracy", max_drop=4.1
    )
    assert result.lossy is not None, result.lossless_reason
    assert result.gate is not None and result.gate["original"]["acc"] == 1.0


def test_refused_lossy_objects_are_never_visible_and_gc_frees_them(
    base_and_tuned: tuple[Repo, Path], gate_file: Path
) -> None:
    repo, tmp = base_and_tuned
    result = repo.add(tmp / "tuned", name="b", parent="base", lossy=1e-3, gate=f"{gate_file}:loss_up")
    assert result.lossy is None
    assert all(not v.lossy for v in repo.log("b")) and repo.fsck().ok
    assert repo.gc().removed  # the lossy tensors written before the gate refused them
    repo.checkout("b", tmp / "out")
    assert sha256_tree(tmp / "out") == sha256_tree(tmp / "tuned")


def test_a_metric_that_must_not_rise(base_and_tuned: tuple[Repo, Path], gate_file: Path) -> None:
    repo, tmp = base_and_tuned
    result = repo.add(tmp / "tuned", name="b", parent="base", lossy=1e-3, gate=f"{gate_file}:loss_up", max_drop=0.5)
    assert result.lossy is None and "val_loss rose" in (result.lossless_reason or "")


def test_a_gate_without_a_lossy_bound_is_refused_before_anything_is_written(
    base_and_tuned: tuple[Repo, Path], gate_file: Path
) -> None:
    repo, tmp = base_and_tuned
    before = sorted(repo.store.ids())
    with pytest.raises(InvalidOptionError, match="a gate only checks lossy storage"):
        repo.add(tmp / "tuned", name="d", parent="base", gate=f"{gate_file}:accuracy")
    code, _, err = run_cli("add", str(tmp / "tuned"), "--name", "d", "--gate", f"{gate_file}:accuracy", cwd=repo.root)
    assert code == 1 and "a gate only checks lossy storage" in err and "--lossy" in err
    assert sorted(repo.store.ids()) == before and "d" not in repo.refs.all()


@pytest.mark.parametrize("function", ["crash", "hang"])
def test_a_crashing_or_hanging_gate_means_lossless(
    base_and_tuned: tuple[Repo, Path], gate_file: Path, function: str
) -> None:
    repo, tmp = base_and_tuned
    wait = 1 if function == "hang" else 3  # (a hang waits it out in full; a crash ends sooner)
    result = repo.add(
        tmp / "tuned", name="c", parent="base", lossy=1e-3, gate=f"{gate_file}:{function}", gate_timeout=wait
    )
    assert result.lossy is None
    assert ("boom" if function == "crash" else "did not finish") in (result.lossless_reason or "")
    assert repo.version("c").lossy is None


def test_metric_directions() -> None:
    assert lower_is_better("val_loss") and lower_is_better("eval-perplexity") and lower_is_better("WER")
    assert not lower_is_better("accuracy") and not lower_is_better("precision") and not lower_is_better("f1")
    assert compare({"acc": 0.9, "loss": 1.0}, {"acc": 0.89, "loss": 1.005}, 0.02) == []
    assert len(compare({"acc": 0.9, "loss": 1.0}, {"acc": 0.85, "loss": 1.05}, 0.02)) == 2
    assert compare({"acc": 0.9}, {}, 0.1) == ["acc is missing on the reconstruction"]


# --- the CLI marks it everywhere ------------------------------------------------------------------


def test_cli_marks_a_lossy_version(base_and_tuned: tuple[Repo, Path]) -> None:
    repo, tmp = base_and_tuned
    cwd = repo.root
    code, out, err = run_cli(
        "add", str(tmp / "tuned"), "--name", "tuned", "--parent", "base", "--lossy", "1e-3", cwd=cwd
    )
    assert code == 0, err
    assert "lossy: |error| <= 0.001" in out
    code, out, _ = run_cli("ls", cwd=cwd)
    assert "tuned [lossy]" in out and "base [lossy]" not in out
    code, out, _ = run_cli("ls", "--json", cwd=cwd)
    by_name = {m["name"]: m for m in json.loads(out)}
    assert by_name["tuned"]["lossy"]["eps"] == 1e-3 and by_name["base"]["lossy"] is None
    for command in ("log", "show"):
        code, out, _ = run_cli(command, "tuned", cwd=cwd)
        assert code == 0 and "[lossy]" in out and "|error| <= 0.001 (max " in out
    code, out, _ = run_cli("log", "tuned", "--json", cwd=cwd)
    assert 0 < json.loads(out)[0]["lossy"]["max_error"] <= 1e-3
    code, out, _ = run_cli("show", "tuned", "--json", cwd=cwd)
    assert json.loads(out)["version"]["lossy"]["tensors"] == 4
    code, _, err = run_cli("checkout", "tuned", "-o", str(tmp / "out"), cwd=cwd)
    assert code == 0 and "lossy reconstruction" in err and "0.001" in err
    code, _, err = run_cli("checkout", "base", "-o", str(tmp / "out2"), cwd=cwd)
    assert code == 0 and "lossy" not in err


def test_cli_says_why_it_stored_losslessly(base_and_tuned: tuple[Repo, Path]) -> None:
    repo, tmp = base_and_tuned
    code, out, err = run_cli("add", str(tmp / "base"), "--name", "copy", "--lossy", "1e-3", cwd=repo.root)
    assert code == 0 and "stored losslessly" in err and "[lossy]" not in out
    code, _, err = run_cli("add", str(tmp / "tuned"), "--name", "x", "--gate", "m:f", cwd=repo.root)
    assert code == 1 and "--lossy" in err


def test_lossy_never_stores_more_than_lossless(repo: Repo, tmp_path: Path) -> None:
    """A pruned child is a cheap exact patch of its parent; a quantized step would cost more,
    so lossy mode keeps it exact."""
    rng = np.random.default_rng(5)
    parent = {"w": (rng.standard_normal((256, 256)) * 0.05).astype(np.float32)}
    repo.add(make_model(tmp_path / "parent", state=parent), name="parent")
    w = parent["w"]
    pruned = {"w": np.where(np.abs(w) >= np.median(np.abs(w)), w, np.float32(0))}
    lossless = Repo.init(tmp_path / "other")
    lossless.add(make_model(tmp_path / "parent", state=parent), name="parent")
    lossless.add(make_model(tmp_path / "pruned", state=pruned), name="pruned", parent="parent")

    result = repo.add(tmp_path / "pruned", name="pruned", parent="parent", lossy=1e-3)

    assert result.lossy is None and "less than its exact form" in result.lossless_reason
    # The same tensor object, stored the same way (records differ: they carry the time).
    [tensor] = repo.manifest("pruned").tensors()
    assert tensor.object == lossless.manifest("pruned").tensors()[0].object
    assert repo.store.stored_size(tensor.object) == lossless.store.stored_size(tensor.object)
    repo.checkout("pruned", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "pruned")


def test_a_pruned_copy_of_a_lossy_parent_snaps_to_its_reconstruction(repo: Repo, tmp_path: Path) -> None:
    # base -> fine-tune (stored lossily, relative bound) -> 50% pruning of the fine-tune. The
    # pruning differs from the fine-tune's reconstruction everywhere by a little (the
    # fine-tune's rounding) and by a lot where it was pruned: snapped to the reconstruction
    # within the bound, it is an exact patch of it, and its zeros stay zeros.
    parent = state(rows=128)
    child = finetune(parent, 1e-5)
    pruned = {
        k: (np.where(np.abs(v) >= np.median(np.abs(v)), v, np.float32(0)) if v.dtype == np.float32 else v)
        for k, v in child.items()
    }
    for name, weights in (("base", parent), ("ft", child), ("pruned", pruned)):
        make_model(tmp_path / name, state=weights)
    repo.add(tmp_path / "base", name="base")
    assert repo.add(tmp_path / "ft", name="ft", parent="base", lossy_rel=0.1).lossy
    exact = Repo.init(tmp_path / "exact")
    exact.add(tmp_path / "base", name="base")
    exact.add(tmp_path / "ft", name="ft", parent="base", lossy_rel=0.1)
    refused = exact.add(tmp_path / "pruned", name="pruned", parent="ft", relation="prune")  # lossless
    result = repo.add(tmp_path / "pruned", name="pruned", parent="ft", relation="prune", lossy_rel=0.1)
    assert result.lossy and result.new_bytes < refused.new_bytes / 3
    back = repo.load_state_dict("pruned")
    ft_back = repo.load_state_dict("ft")
    for k, v in pruned.items():
        if v.dtype != np.float32:
            continue
        assert np.array_equal(back[k] == 0, v == 0)  # the mask, exactly
        kept = v != 0
        assert np.array_equal(back[k][kept], ft_back[k][kept])  # snapped to the parent's reconstruction
        change = v.astype(np.float64) - ft_back[k]
        assert np.abs(back[k].astype(np.float64) - v).max() <= 0.1 * np.sqrt(np.mean(change**2))
    floats = [t for t in repo.manifest("pruned").tensors() if t.dtype == "F32"]
    assert {repo.store.header(t.object).codecs[0]["name"] for t in floats} == {"patch"}


def test_a_relative_bound_whose_guard_fails_everywhere_is_stored_losslessly_with_its_reason(
    repo: Repo, tmp_path: Path
) -> None:
    # A guard of 0.01 is beyond what rel 0.1 can meet (rounding errs by ~step / sqrt(12)):
    # every step fails the guard, and the reason names the relative bound (no eps to format).
    parent = state()
    make_model(tmp_path / "base", state=parent)
    make_model(tmp_path / "ft", state=finetune(parent, 4e-6))
    assert run_cli("add", str(tmp_path / "base"), "--name", "base", cwd=repo.root)[0] == 0
    code, out, err = run_cli(
        "add",
        str(tmp_path / "ft"),
        "--name",
        "ft",
        "--parent",
        "base",
        "--lossy-rel",
        "0.1",
        "--guard",
        "0.01",
        cwd=repo.root,
    )
    assert code == 0, err
    assert "Traceback" not in err
    assert "stored losslessly: the fidelity guard failed on 100% of the changed parameters" in err
    assert "bound of 0.1 x rms(change)" in err
    assert repo.version("ft").lossy is None
    repo.checkout("ft", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(tmp_path / "ft")


def test_lossy_on_tensors_stored_already_says_deduplication_not_a_missing_parent(tmp_path: Path) -> None:
    repo = Repo.init(tmp_path)
    state = {"w": np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)}
    repo.add(state, name="base")
    again = repo.add(dict(state), name="copy", lossy=1e-3)
    assert again.lossy is None and again.tensors_new == 0
    assert again.lossless_reason is not None and again.lossless_reason.startswith("every tensor is stored already")
    assert "parent" not in again.lossless_reason
