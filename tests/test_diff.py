"""`mgit diff` / `Repo.diff`: classification, statistics against numpy, rank estimates, stored
refs against folders, structural mode, text files, bad input through the CLI."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_cli, tensors

from mgit import Repo
from mgit.diff import STATUSES, DiffResult, TensorDiff, diff_paths, layer_counts, module_group
from mgit.errors import CorruptObjectError, InputError, UnknownRefError
from mgit.formats.safetensors import build_header, to_float
from mgit.tensorstats import OVERSAMPLE, RANK_CAP, SMALL_MATRIX


def by_name(result: DiffResult) -> dict[str, TensorDiff]:
    return {t.name: t for t in result.tensors}


def lora(shape: tuple[int, int], rank: int, seed: int, *, scale: float = 0.05) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((shape[0], rank)) * scale) @ (rng.standard_normal((rank, shape[1])) * scale)


def write_raw_safetensors(path: Path, entries: dict[str, tuple[str, tuple[int, ...], bytes]]) -> Path:
    """A safetensors file with any dtype (bf16, fp8) from raw little-endian bytes."""
    header, _ = build_header([(name, dtype, shape) for name, (dtype, shape, _) in entries.items()], None)
    path.write_bytes(header + b"".join(data for _, _, data in entries.values()))
    return path


@pytest.fixture
def derived_pair(tmp_path: Path) -> tuple[Path, Path, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A base folder and a derived one with one of each kind of difference."""
    base = tensors(1, layers=3)
    base["head.weight"] = np.random.default_rng(9).standard_normal((8, 16)).astype(np.float32)
    ft = {k: v.copy() for k, v in base.items()}
    ft["layer.0.weight"] = (base["layer.0.weight"] + lora((16, 16), 2, seed=3)).astype(np.float32)
    ft["layer.1.weight"][3, :5] += 0.25  # a few values
    ft["embed.weight"] = np.concatenate([base["embed.weight"], np.ones((4, 16), np.float32)])  # shape
    ft["head.weight"] = base["head.weight"].astype(np.float16)  # dtype
    del ft["layer.2.bias"]  # only in A
    ft["layer.3.weight"] = np.eye(16, dtype=np.float32)  # only in B
    ft["position_ids"] = base["position_ids"] * 2  # an integer tensor that changed
    return make_model(tmp_path / "base", state=base), make_model(tmp_path / "ft", seed=2, state=ft), base, ft


# --- classification and statistics -----------------------------------------------------------


def test_every_kind_of_difference_is_classified(derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    result = diff_paths(base_dir, ft_dir)
    status = {t.name: t.status for t in result.tensors}
    assert status == {
        "embed.weight": "shape",
        "layer.0.weight": "changed",
        "layer.0.bias": "identical",
        "layer.1.weight": "changed",
        "layer.1.bias": "identical",
        "layer.2.weight": "identical",
        "layer.2.bias": "only_a",
        "position_ids": "changed",
        "head.weight": "dtype",
        "layer.3.weight": "only_b",
    }
    assert result.summary.counts == {"changed": 3, "dtype": 1, "shape": 1, "only_a": 1, "only_b": 1, "identical": 3}
    assert by_name(result)["embed.weight"].shape_b == [36, 16] and by_name(result)["embed.weight"].stats is None
    assert result.layers == {"layer": [3, 4]}
    assert not result.identical


def test_statistics_match_numpy(derived_pair) -> None:
    base_dir, ft_dir, base, ft = derived_pair
    result = by_name(diff_paths(base_dir, ft_dir))
    for name in ("layer.0.weight", "layer.1.weight", "position_ids", "head.weight"):
        a, b = base[name].astype(np.float64), ft[name].astype(np.float64)
        d = b - a
        s = result[name].stats
        assert s is not None, name
        assert s.rel_change == pytest.approx(np.linalg.norm(d) / np.linalg.norm(a), rel=1e-9)
        assert s.max_abs == pytest.approx(np.abs(d).max(), rel=1e-12)
        assert s.cosine == pytest.approx(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)), rel=1e-12)
        assert s.changed == np.count_nonzero(a != b) and s.values == a.size
        assert s.changed_fraction == pytest.approx(np.count_nonzero(a != b) / a.size)
    assert result["layer.1.weight"].stats.changed == 5
    assert result["position_ids"].stats.rank is None  # a vector has no rank


def test_groups_summarise_their_tensors(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    base = {f"blocks.{i}.{p}": rng.standard_normal((12, 10)).astype(np.float32) for i in range(2) for p in "qkv"}
    ft = {k: v.copy() for k, v in base.items()}
    ft["blocks.0.q"] += lora((12, 10), 2, seed=4).astype(np.float32)
    ft["blocks.0.k"] += rng.standard_normal((12, 10)).astype(np.float32) * 0.01
    ft["blocks.1.v"] = ft["blocks.1.v"].astype(np.float16)
    result = diff_paths(make_model(tmp_path / "a", state=base), make_model(tmp_path / "b", state=ft))
    groups = {g.name: g for g in result.groups}
    assert set(groups) == {"blocks.0", "blocks.1"}
    g0, g1 = groups["blocks.0"], groups["blocks.1"]
    assert g0.tensors == 3 and g0.counts == {"changed": 2, "identical": 1} and g1.counts == {"dtype": 1, "identical": 2}
    changed, group = ["blocks.0.q", "blocks.0.k"], ["blocks.0.q", "blocks.0.k", "blocks.0.v"]
    d2 = sum(np.sum((ft[n].astype(np.float64) - base[n]) ** 2) for n in changed)
    a2 = sum(np.sum(base[n].astype(np.float64) ** 2) for n in group)  # every shared value, blocks.0.v's too
    assert g0.rel_change == pytest.approx(np.sqrt(d2 / a2), rel=1e-9)
    everything = [n for n in base if base[n].shape == ft[n].shape]
    total_d2 = d2 + np.sum((ft["blocks.1.v"].astype(np.float64) - base["blocks.1.v"]) ** 2)
    total_a2 = sum(np.sum(base[n].astype(np.float64) ** 2) for n in everything)
    assert result.summary.rel_change == pytest.approx(np.sqrt(total_d2 / total_a2), rel=1e-9)
    assert result.summary.compared_values == sum(base[n].size for n in everything)
    assert g0.changed_values == 2 * 120 and result.summary.changed_values == sum(
        int(np.count_nonzero(ft[n].astype(np.float64) != base[n])) for n in everything
    )
    assert g0.max_abs == pytest.approx(max(np.abs(ft[n].astype(np.float64) - base[n]).max() for n in changed))
    assert g0.changed_values == 2 * 120 and g0.max_rank == 10 and g0.params == 360
    stats = {t.name: t.stats for t in result.tensors}
    assert g0.min_cosine == min(stats["blocks.0.q"].cosine, stats["blocks.0.k"].cosine)
    assert stats["blocks.0.q"].rank == 2
    assert g1.max_rank == 0  # a cast: the difference is rounding only


def test_nan_and_inf_are_counted_not_fatal(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = a.copy()
    b[0, 0], b[1, 1], b[2, 2] = np.nan, np.inf, b[2, 2] + 1
    a[2, 3] = np.nan
    b[2, 3] = np.nan  # NaN on both sides is not a change
    result = by_name(diff_paths(make_model(tmp_path / "a", state={"w": a}), make_model(tmp_path / "b", state={"w": b})))
    s = result["w"].stats
    assert (s.nonfinite_a, s.nonfinite_b) == (1, 3)
    assert s.changed == 3
    assert s.max_abs == 1.0 and s.rank == 1  # from the finite values only
    assert s.rel_change is not None and np.isfinite(s.rel_change)


def test_bfloat16_and_fp8_are_decoded_as_numbers() -> None:
    bf16 = np.array([0x3FC0, 0xC000, 0x0000], np.uint16)  # 1.5, -2.0, 0.0
    assert to_float(bf16.view(np.uint8), "BF16").tolist() == [1.5, -2.0, 0.0]
    e4m3 = np.array([0x38, 0x7E, 0x01, 0xB8], np.uint8)  # 1.0, 448, 2**-9, -1.0
    assert to_float(e4m3, "F8_E4M3").tolist() == [1.0, 448.0, 2.0**-9, -1.0]
    assert np.isnan(to_float(np.array([0x7F], np.uint8), "F8_E4M3")[0])
    assert to_float(np.array([0x3C, 0x7B], np.uint8), "F8_E5M2").tolist() == [1.0, 57344.0]
    assert to_float(np.array([True, False], np.bool_).view(np.uint8), "BOOL").tolist() == [1.0, 0.0]


def test_bfloat16_models_are_compared_by_value(tmp_path: Path) -> None:
    w = np.random.default_rng(0).standard_normal((32, 24)).astype(np.float32)
    bits_a = (w.view(np.uint32) >> 16).astype(np.uint16)
    bits_b = bits_a.copy()
    bits_b[0, 0] ^= 0x0001  # the lowest mantissa bit of one value
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_raw_safetensors(tmp_path / "a" / "model.safetensors", {"w": ("BF16", (32, 24), bits_a.tobytes())})
    write_raw_safetensors(tmp_path / "b" / "model.safetensors", {"w": ("BF16", (32, 24), bits_b.tobytes())})
    s = by_name(diff_paths(tmp_path / "a", tmp_path / "b"))["w"].stats
    a = (bits_a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    b = (bits_b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert s.changed == 1 and s.max_abs == pytest.approx(abs(b[0, 0] - a[0, 0]), rel=1e-12)
    assert s.rank == 0  # one bf16 ulp: below what rounding to bf16 can do


# --- rank ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [(64, 48), (48, 64), (200, 150), (640, 512), (80, 4000)],
    ids=["gram-tall", "gram-wide", "sketch-float64", "sketch-float32", "sketch-wide-float32"],
)
def test_merged_lora_shows_its_rank(tmp_path: Path, shape: tuple[int, int]) -> None:
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    merged = (w + lora(shape, 4, seed=2)).astype(np.float32)
    full = (w + np.random.default_rng(3).standard_normal(shape) * 1e-3).astype(np.float32)
    a = make_model(tmp_path / "a", state={"w": w, "v": w})
    b = make_model(tmp_path / "b", state={"w": merged, "v": full})
    result = by_name(diff_paths(a, b))
    assert (result["w"].stats.rank, result["w"].stats.rank_capped) == (4, False)
    v = result["v"].stats
    assert v.rank_of == min(shape)
    if min(shape) <= RANK_CAP + OVERSAMPLE:  # the Gram matrix of D itself: exact
        assert (v.rank, v.rank_capped) == (min(shape), False)
    else:
        assert (v.rank, v.rank_capped) == (RANK_CAP, True)


def change_of_rank(shape: tuple[int, int], rank: int, seed: int) -> np.ndarray:
    """A float64 matrix of exactly this rank, its nonzero singular values between 1 and 2."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((shape[0], rank)))
    v, _ = np.linalg.qr(rng.standard_normal((shape[1], rank)))
    return (u * np.linspace(1.0, 2.0, rank)) @ v.T


GRAM = RANK_CAP + OVERSAMPLE  # up to this many columns, the rank comes from D's own Gram matrix


@pytest.mark.parametrize(
    ("cols", "rank", "found", "printed"),
    [
        (GRAM, GRAM, (GRAM, False), f"full ({GRAM})"),
        (GRAM + 1, RANK_CAP - 1, (RANK_CAP - 1, False), f"{RANK_CAP - 1} of {GRAM + 1}"),
        (GRAM + 1, RANK_CAP, (RANK_CAP, True), f">= {RANK_CAP} of {GRAM + 1}"),
        (GRAM + 1, GRAM + 1, (RANK_CAP, True), f">= {RANK_CAP} of {GRAM + 1}"),
    ],
    ids=["gram-exact-above-the-cap", "sketch-just-below-the-cap", "sketch-at-the-cap", "sketch-full-rank"],
)
def test_a_rank_below_the_cap_is_exact_and_from_the_cap_on_a_lower_bound(
    tmp_path: Path, cols: int, rank: int, found: tuple[int, bool], printed: str
) -> None:
    w = np.random.default_rng(0).standard_normal((100, cols))
    a = make_model(tmp_path / "a", state={"w": w})
    b = make_model(tmp_path / "b", state={"w": w + change_of_rank((100, cols), rank, seed=1)})

    s = by_name(diff_paths(a, b))["w"].stats

    assert (s.rank, s.rank_capped, s.rank_of) == (*found, cols)
    code, out, err = run_cli("diff", str(a), str(b), "--tensors", cwd=tmp_path)
    assert code == 0, err
    [row] = re.findall(r"^w +changed +F64 .*$", out, re.M)  # the tensor's row, not its group's
    assert row.endswith(f" {printed}")


@pytest.mark.parametrize("extra", [0, 1], ids=["float64-up-to-the-limit", "float32-above-it"])
def test_a_merged_lora_shows_its_rank_on_both_sides_of_the_float32_switch(tmp_path: Path, extra: int) -> None:
    rows = math.isqrt(SMALL_MATRIX)
    shape = (rows, SMALL_MATRIX // rows + extra)  # SMALL_MATRIX values at most, or just more
    w = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    merged = (w + lora(shape, 4, seed=2)).astype(np.float32)

    s = by_name(
        diff_paths(make_model(tmp_path / "a", state={"w": w}), make_model(tmp_path / "b", state={"w": merged}))
    )["w"].stats

    assert (s.rank, s.rank_capped, s.rank_of) == (4, False, min(shape))


def test_a_low_rank_change_with_decaying_spectrum(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    u, _ = np.linalg.qr(rng.standard_normal((300, 12)))
    v, _ = np.linalg.qr(rng.standard_normal((200, 12)))
    sigma = np.array([10.0 ** -(i / 4) for i in range(12)])  # 1 down to 1.8e-3
    w = rng.standard_normal((300, 200))
    s = by_name(
        diff_paths(
            make_model(tmp_path / "a", state={"w": w}), make_model(tmp_path / "b", state={"w": w + (u * sigma) @ v.T})
        )
    )["w"].stats
    assert s.rank == 12  # float64 values: every direction above 1e-4 of the largest counts


def test_lora_merged_into_float16_is_not_hidden_by_rounding(tmp_path: Path) -> None:
    w = np.random.default_rng(4).standard_normal((96, 80)).astype(np.float16)
    merged = (w.astype(np.float64) + lora((96, 80), 3, seed=5, scale=0.15)).astype(np.float16)
    s = by_name(
        diff_paths(make_model(tmp_path / "a", state={"w": w}), make_model(tmp_path / "b", state={"w": merged}))
    )["w"].stats
    assert (s.rank, s.rank_capped) == (3, False)
    d = merged.astype(np.float64) - w
    assert np.linalg.matrix_rank(d) == 80  # rounding made it full rank; the estimate sees through it


def test_a_cast_differs_only_by_rounding(tmp_path: Path) -> None:
    w = np.random.default_rng(6).standard_normal((40, 30)).astype(np.float32)
    result = by_name(
        diff_paths(
            make_model(tmp_path / "a", state={"w": w}), make_model(tmp_path / "b", state={"w": w.astype(np.float16)})
        )
    )
    s = result["w"].stats
    assert result["w"].status == "dtype"
    assert 0 < s.rel_change < 2.0**-11 and s.rank == 0


# --- stored versions ---------------------------------------------------------------------------


def test_refs_and_folders_give_the_same_answer(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    stored = repo.diff("base", "ft")
    mixed = repo.diff("base", ft_dir)
    folders = repo.diff(base_dir, ft_dir)
    assert stored.a.label == "base@1" and stored.a.kind == "ref" and stored.a.version == repo.resolve("base")
    assert mixed.b.kind == "path" and mixed.b.version is None
    for other in (mixed, folders):
        assert [t.to_json() for t in other.tensors] == [t.to_json() for t in stored.tensors]
        assert other.summary.counts == stored.summary.counts


def test_identical_objects_are_never_compared_and_read_once_for_their_norm(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    identical = [t.name for t in repo.diff("base", "ft").tensors if t.status == "identical"]
    assert identical and all(by_name(repo.diff("base", "ft"))[n].stats is None for n in identical)
    # Damage an identical tensor's object: read for its share of ||A||, it is verified like any read.
    oid = next(t.object for t in repo.manifest("ft").tensors() if t.name == "layer.2.weight")
    path = repo.dir / "objects" / oid[:2] / oid[2:]
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-4] + b"XXXX")
    with pytest.raises(CorruptObjectError, match=oid[:16]):
        repo.diff("base", "ft")


def test_a_delta_base_is_decoded_once(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    base_objects = {t.name: t.object for t in repo.manifest("base").tensors()}
    deltas = [
        t.name
        for t in repo.manifest("ft").tensors()
        if t.name != "embed.weight"  # its shape changed
        and t.object != base_objects.get(t.name)
        and base_objects.get(t.name) in repo.store.header(t.object).bases
    ]
    assert len(deltas) >= 2, deltas  # the fine-tune's changed tensors are stored against the base's
    result = repo.diff("base", "ft")
    summary = result.summary
    compared = 4  # three changed tensors and one dtype change, two objects each
    identical = sum(t.status == "identical" for t in result.tensors)  # one object each, for its norm
    assert summary.decoded == 2 * compared + identical  # every object once ...
    assert summary.reused == len(deltas)  # ... where a delta's base would otherwise be decoded twice
    folder = repo.diff("base", ft_dir).summary  # the folder side is read, not decoded
    assert folder.decoded == compared + sum(t.status == "identical" for t in repo.diff("base", ft_dir).tensors)


def test_corrupt_changed_tensor_is_a_one_line_error(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    oid = next(t.object for t in repo.manifest("ft").tensors() if t.name == "layer.1.weight")
    path = repo.dir / "objects" / oid[:2] / oid[2:]
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-4] + b"XXXX")
    code, out, err = run_cli("-C", str(repo.root), "diff", "base", "ft")
    assert code == 1 and err.startswith("Error: object") and "corrupt" in err and "ft@1" in err
    assert err.count("\n") == 1


def test_structural_mode_reads_no_data(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    for oid in {t.object for t in repo.manifest("ft").tensors()} | {t.object for t in repo.manifest("base").tensors()}:
        path = repo.dir / "objects" / oid[:2] / oid[2:]
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:-2] + b"XX")
    result = repo.diff("base", "ft", structural=True)
    status = {t.name: t.status for t in result.tensors}
    assert status["layer.0.weight"] == "same" and status["position_ids"] == "same"
    assert (status["embed.weight"], status["head.weight"]) == ("shape", "dtype")
    assert (status["layer.2.bias"], status["layer.3.weight"]) == ("only_a", "only_b")
    assert result.layers == {"layer": [3, 4]} and result.files == []
    assert all(t.stats is None for t in result.tensors) and result.summary.decoded == 0


# --- statuses --------------------------------------------------------------------------------


def test_every_status_is_counted_and_named(tmp_path: Path, derived_pair) -> None:
    # A full and a structural diff of the family give every status between them; each
    # tensor is counted once in the summary and in its group, and the CLI names each status.
    base_dir, ft_dir, _, _ = derived_pair
    full, structural = diff_paths(base_dir, ft_dir), diff_paths(base_dir, ft_dir, structural=True)
    assert {t.status for t in full.tensors} | {t.status for t in structural.tensors} == set(STATUSES)
    for result in (full, structural):
        assert sum(result.summary.counts.values()) == len(result.tensors) == 10
        assert all(sum(g.counts.values()) == g.tensors for g in result.groups)

    code, out, err = run_cli("diff", str(base_dir), str(ft_dir), "--tensors", cwd=tmp_path)
    assert code == 0, err
    assert (
        "Total: 9 tensors in A, 9 in B: 3 changed, 1 dtype changed, 1 shape changed, 1 only in A, 1 only in B, "
        "3 identical;"
    ) in out
    rows = {
        "position_ids": "changed",
        "layer.0.weight": "changed",
        "head.weight": "dtype changed",
        "embed.weight": "shape changed",
        "layer.2.bias": "only in A",
        "layer.3.weight": "only in B",
    }
    for name, word in rows.items():
        assert re.search(rf"^{re.escape(name)} +{word}  ", out, re.M), (name, word)
    code, out, err = run_cli("diff", str(base_dir), str(ft_dir), "--structural", cwd=tmp_path)
    assert code == 0, err
    assert (
        "Total: 9 tensors in A, 9 in B: 1 dtype changed, 1 shape changed, 1 only in A, 1 only in B, "
        "6 same shape and dtype\n"
    ) in out
    assert re.search(r"^layer\.2 +2 +1 only in A, 1 same shape and dtype$", out, re.M)


# --- files ---------------------------------------------------------------------------------


def test_text_files_as_unified_diffs(tmp_path: Path) -> None:
    a, b = make_model(tmp_path / "a", seed=1), make_model(tmp_path / "b", seed=1)
    (b / "config.json").write_text(json.dumps({"model_type": "toy", "hidden_size": 32, "seed": 1}))
    (a / "weights.bin").write_bytes(b"\x00\x01\x02")
    (b / "weights.bin").write_bytes(b"\x00\x01\x03")
    (b / "README.md").write_text("new\n")
    files = {f.path: f for f in diff_paths(a, b).files}
    config = files["config.json"]
    assert config.status == "changed" and config.diff[:2] == ["--- a/config.json", "+++ b/config.json"]
    assert any(line.startswith("+") and '"hidden_size": 32' in line for line in config.diff)
    assert any(line.startswith("-") and '"hidden_size": 16' in line for line in config.diff)
    assert files["weights.bin"].status == "changed" and files["weights.bin"].diff is None
    assert files["weights.bin"].note == "binary files differ"
    assert files["tokenizer/vocab.txt"].status == "identical" and files["model.safetensors"].status == "identical"
    assert files["README.md"].status == "only_b"


def test_identical_models(tmp_path: Path) -> None:
    a, b = make_model(tmp_path / "a", seed=3), make_model(tmp_path / "b", seed=3)
    result = diff_paths(a, b)
    assert result.identical and result.summary.counts == {"identical": 6}


# --- grouping ------------------------------------------------------------------------------


def test_module_groups_and_layer_counts() -> None:
    assert module_group("model.layers.3.mlp.up_proj.weight") == "model.layers.3"
    assert module_group("encoder.layer.10.attention.self.query.bias") == "encoder.layer.10"
    assert module_group("model.embed_tokens.weight") == "model.embed_tokens"
    assert module_group("lm_head.weight") == "lm_head" and module_group("position_ids") == "position_ids"
    names = [f"model.layers.{i}.{p}" for i in range(4) for p in ("q.weight", "k.weight")] + ["model.norm.weight"]
    assert layer_counts(names) == {"model.layers": 4}


# --- paths, refs and bad input -------------------------------------------------------------


def test_a_path_that_is_also_a_model_name_is_a_path_with_a_note(repo: Repo, tmp_path: Path) -> None:
    make_model(repo.root / "m", seed=1)
    make_model(tmp_path / "other", seed=2)
    repo.add(tmp_path / "other", name="m")
    code, out, err = run_cli("-C", str(repo.root), "diff", "m", "m@1", "--json", cwd=repo.root)
    assert code == 0, err
    data = json.loads(out)
    assert data["a"]["kind"] == "path" and data["b"] == {"label": "m@1", "kind": "ref", "version": repo.resolve("m")}
    assert "also a model" in data["notes"][0] and "m@1" in data["notes"][0]
    assert data["summary"]["counts"]["changed"] == 3


def test_cli_json_is_the_library_result(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    code, out, err = run_cli("-C", str(repo.root), "diff", "base", str(ft_dir), "--json")
    assert code == 0, err
    assert json.loads(out) == json.loads(json.dumps(repo.diff("base", ft_dir).to_json()))


def test_cli_human_output(repo: Repo, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    code, out, err = run_cli("-C", str(repo.root), "diff", "base", "ft")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("A: base@1 (") and lines[1].startswith("B: ft@1 (")
    group = next(line for line in lines if line.startswith("layer.0 "))
    assert "1 changed, 1 identical" in group and group.split()[-1] == "2"  # max rank of the merged rank-2 change
    assert any(line.startswith("Total: 9 tensors in A, 9 in B: 3 changed, 1 dtype changed") for line in lines)
    assert "layer.2.bias" in out and "layer.0.weight" not in out  # changed tensors only with --tensors
    assert "+++ b/config.json" in out
    code, verbose, _ = run_cli("-C", str(repo.root), "diff", "base", "ft", "--tensors")
    row = next(line for line in verbose.splitlines() if line.startswith("layer.0.weight"))
    assert "changed" in row and "2 of 16" in row
    code, structural, _ = run_cli("-C", str(repo.root), "diff", "base", "ft", "--structural")
    assert code == 0 and "Layers: layer: 3 -> 4" in structural and "rel change" not in structural


def test_two_folders_outside_a_repository(tmp_path: Path, derived_pair) -> None:
    base_dir, ft_dir, _, _ = derived_pair
    code, out, err = run_cli("diff", str(base_dir), str(ft_dir), "--json", cwd=tmp_path)
    assert code == 0, err
    assert json.loads(out)["summary"]["counts"]["changed"] == 3
    code, _, err = run_cli("diff", str(base_dir), "base@1", cwd=tmp_path)
    assert code == 1 and "no such file or folder" in err and "mgit init" in err


def assert_error(result: tuple[int, str, str], *fragments: str) -> None:
    code, out, err = result
    assert code == 1 and out == "", (code, out, err)
    assert err.startswith("Error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


def test_bad_input_is_one_line_with_a_hint(repo: Repo, tmp_path: Path) -> None:
    model = make_model(tmp_path / "model", seed=1)
    repo.add(model, name="base")
    work = repo.root  # -C is git's: relative paths are found from DIR
    (work / "notes.txt").write_text("not a model")
    (work / "texts").mkdir()
    (work / "texts" / "a.txt").write_text("hello")
    (work / "pickles").mkdir()
    (work / "pickles" / "pytorch_model.bin").write_bytes(b"PK")

    def diff(*args: str) -> tuple[int, str, str]:
        return run_cli("-C", str(repo.root), "diff", *args, cwd=tmp_path)

    assert_error(diff("base", "nope"), "no model named 'nope'", "mgit ls")
    assert_error(diff("base", "bsae"), "Did you mean 'base'?")
    assert_error(diff("base@2", "base"), "model 'base' has 1 version", "mgit log base")
    assert_error(
        diff("base", "./missing"), "./missing: no such file or folder, and no model has that name", "refs are NAME"
    )
    assert_error(diff("base", "notes.txt"), "notes.txt: not a model", "mgit diff compares")
    assert_error(diff("texts", "base"), "texts: holds no tensors", "Compare model folders")
    assert_error(diff("base", "pickles"), "holds no tensors", "give the file itself (pytorch_model.bin)")
    code, _, err = diff("base")
    assert code == 2 and "Usage" in err


def test_dangling_link_is_a_one_line_error(tmp_path: Path) -> None:
    a = make_model(tmp_path / "a", seed=1)
    (tmp_path / "b").symlink_to(tmp_path / "gone")
    assert_error(run_cli("diff", str(a), str(tmp_path / "b"), cwd=tmp_path), "no such file or folder")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_a_one_line_error(tmp_path: Path) -> None:
    a, b = make_model(tmp_path / "a", seed=1), make_model(tmp_path / "b", seed=2)
    (b / "model.safetensors").chmod(0)
    try:
        assert_error(run_cli("diff", str(a), str(b), cwd=tmp_path), "model.safetensors", "cannot read")
    finally:
        (b / "model.safetensors").chmod(0o644)


def test_library_errors_are_typed(repo: Repo, tmp_path: Path) -> None:
    make_model(tmp_path / "a", seed=1)
    with pytest.raises(UnknownRefError):
        repo.diff(tmp_path / "a", "nope")
    with pytest.raises(InputError):
        repo.diff(tmp_path / "a", tmp_path / "nope")  # a Path is always a path
    shutil.rmtree(tmp_path / "a")
    with pytest.raises(InputError):
        diff_paths(tmp_path / "a", tmp_path / "a")


def test_help_says_how_a_path_is_told_from_a_ref() -> None:
    code, out, _ = run_cli("diff", "--help")
    assert code == 0 and "exists" in out and "on disk is a path, anything else a ref" in " ".join(out.split())


def test_a_cast_is_named_rounding_and_the_total_counts_every_shared_value(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    base = {f"layers.{i}.w": rng.standard_normal((16, 12)).astype(np.float32) for i in range(3)}
    ft = dict(base)
    ft["layers.0.w"] = base["layers.0.w"].astype(np.float16)  # a cast: B-A is rounding only
    code, out, err = run_cli(
        "diff",
        str(make_model(tmp_path / "a", state=base)),
        str(make_model(tmp_path / "b", state=ft)),
        "--tensors",
        cwd=tmp_path,
    )
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("layers.0.w"))
    assert row.rstrip().endswith("rounding") and " 0 of " not in row
    changed = int(np.count_nonzero(ft["layers.0.w"].astype(np.float32) != base["layers.0.w"]))
    assert f"; {changed:,} of {3 * 16 * 12:,} shared values changed" in out
    assert "(||B-A|| / ||A|| over all shared values)" in out
