"""`mgit merge`: the methods against mergekit's own output, the recorded recipe and the
cascade that re-merges, task heads, and bad input.

mergekit's outputs for the tiny Llama-shaped models of merge_models.py are kept in
tests/fixtures/merge/ (made by make_fixtures.py in an environment of mergekit's own)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from merge_models import BF16_MODELS, CONFIGS, MODELS, write_model
from safetensors.numpy import load_file, save_file

from mgit import Repo
from mgit.errors import InputError, InvalidOptionError, UnknownRefError
from mgit.merging import merge, merge_config
from mgit.merging.methods import METHODS

FIXTURES = Path(__file__).parent / "fixtures" / "merge"


@pytest.fixture(scope="module")
def merge_inputs(tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """Every model of merge_models.py (the inputs of the mergekit fixtures), fp32 and bf16."""
    root = tmp_path_factory.mktemp("merge")
    repo = Repo.init(root / "repo")
    for name, (_, parent) in MODELS.items():
        repo.add(write_model(root / name, name), name=name, parent=parent)
    for name in BF16_MODELS:
        repo.add(write_model(root / name, name), name=name, parent=None if name == "base-bf16" else "base-bf16")
    return repo


def floats_of(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor of a safetensors file as (dtype, float32 values), bfloat16 included."""
    from mgit.formats.safetensors import read_layout, to_float

    layout = read_layout(path)
    data = np.frombuffer(path.read_bytes()[layout.data_start :], np.uint8)
    return {t.name: (t.dtype, to_float(data[t.start : t.end], t.dtype, np.float32)) for t in layout.tensors}


def weights_of(repo: Repo, ref: str, tmp: Path) -> dict[str, np.ndarray]:
    repo.checkout(ref, tmp)
    return load_file(str(tmp / "model.safetensors"))


@pytest.mark.parametrize("method", sorted(m for m in CONFIGS if not m.endswith("_bf16")))
def test_the_same_bits_as_mergekit(merge_inputs: Repo, method: str, tmp_path: Path) -> None:
    """float32 models, float32 arithmetic in mergekit's order: the same bytes, every tensor
    (dare_ties at density 1, where no random mask is drawn); slerp within 1e-6 of each tensor's largest value."""
    config = tmp_path / f"{method}.yml"
    config.write_text(CONFIGS[method])
    result = merge_config(merge_inputs, config, name=f"m-{method}")
    ours = weights_of(merge_inputs, f"m-{method}", tmp_path / "out")
    theirs = load_file(str(FIXTURES / f"{method}.safetensors"))
    assert list(ours) == list(theirs)
    if method.startswith("slerp"):  # mergekit's norms and dot products are torch reductions: another summation order
        worst = max(float(np.max(np.abs(ours[k] - theirs[k])) / np.max(np.abs(theirs[k]))) for k in theirs)
        assert worst < 1e-6, worst
    else:
        differing = [k for k in theirs if ours[k].tobytes() != theirs[k].tobytes()]
        assert differing == [], f"{method}: {len(differing)} tensors differ, e.g. {differing[:3]}"
    version = merge_inputs.version(result.version)
    assert {p.relation for p in version.parents} == {"merge"}
    named = [merge_inputs.model_of(p.version) for p in version.parents]
    expected = [m.split(": ")[1] for m in CONFIGS[method].splitlines() if "model: " in m and "base_model" not in m]
    kind = method.removesuffix("_gradient")
    assert set(named) == set(expected) | ({"base"} if METHODS[kind].needs_base else set())
    assert version.recipe["fn"] == "mgit.merging.recipe:merge" and version.recipe["params"]["method"] == kind


@pytest.mark.parametrize("method", ["linear_bf16", "task_arithmetic_bf16"])
def test_bfloat16_merges_agree_with_mergekit_within_bfloat16_rounding(
    merge_inputs: Repo, method: str, tmp_path: Path
) -> None:
    """bfloat16 models with dtype bfloat16: mergekit rounds every intermediate (task vectors,
    weighted sums) to bfloat16, MGit computes in float32 and rounds once. The stated
    tolerance: within 2**-7 (one bfloat16 step) of the summed magnitudes of the inputs and
    the result, element by element; most elements are the same bits."""
    config = tmp_path / f"{method}.yml"
    config.write_text(CONFIGS[method])
    result = merge_config(merge_inputs, config, name=f"m-{method}")
    merge_inputs.checkout(f"m-{method}", tmp_path / "out")
    ours, theirs = floats_of(tmp_path / "out" / "model.safetensors"), floats_of(FIXTURES / f"{method}.safetensors")
    assert list(ours) == list(theirs) and {d for d, _ in ours.values()} == {"BF16"}
    inputs = []
    for p in merge_inputs.version(result.version).parents:
        merge_inputs.checkout(p.version, tmp_path / p.version[:12])
        inputs.append(floats_of(tmp_path / p.version[:12] / "model.safetensors"))
    for name, (_, expected) in theirs.items():
        scale = np.abs(expected) + sum(np.abs(i[name][1]) for i in inputs)
        assert np.all(np.abs(ours[name][1] - expected) <= scale * np.float32(2**-7)), name
    same = np.mean(np.concatenate([ours[k][1] == theirs[k][1] for k in theirs]))
    assert same > 0.8, same


def test_dare_is_reproducible_from_its_seed_and_keeps_about_density(merge_inputs: Repo, tmp_path: Path) -> None:
    a = merge(merge_inputs, ["ft1", "ft2"], method="dare_linear", base="base", density=0.3, seed=7, name="dare-a")
    b = merge(merge_inputs, ["ft1", "ft2"], method="dare_linear", base="base", density=0.3, seed=7, name="dare-b")
    c = merge(merge_inputs, ["ft1", "ft2"], method="dare_linear", base="base", density=0.3, seed=8, name="dare-c")
    assert merge_inputs.version(a.version).manifest == merge_inputs.version(b.version).manifest
    assert merge_inputs.version(a.version).manifest != merge_inputs.version(c.version).manifest
    merged = weights_of(merge_inputs, "dare-a", tmp_path / "a")
    base = weights_of(merge_inputs, "base", tmp_path / "base")
    changed = np.mean([np.mean(merged[k] != base[k]) for k in base])
    assert 0.4 < changed < 0.6  # 1 - 0.7 * 0.7 of the elements have a kept delta from either input


def test_a_cascade_merges_again_when_an_input_changes(merge_inputs: Repo, tmp_path: Path) -> None:
    # An input of its own (the other tests' ft1 and ft2 stay as mergekit saw them).
    first = weights_of(merge_inputs, "ft2", tmp_path / "ft3-v1")
    merge_inputs.add(tmp_path / "ft3-v1", name="ft3", parent="base")
    merge(
        merge_inputs,
        ["ft1", "ft3"],
        method="task_arithmetic",
        base="base",
        weights={"ft1": 0.5, "ft3": 0.5},
        name="casc",
    )
    folder = tmp_path / "ft3-v2"
    folder.mkdir()
    save_file(
        {k: v + np.float32(0.01) for k, v in first.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )
    (folder / "config.json").write_bytes((tmp_path / "ft3-v1" / "config.json").read_bytes())
    merge_inputs.add(folder, name="ft3")
    code, out, err = run_cli("cascade", "ft3", "--json", cwd=merge_inputs.root)
    assert code == 0, err
    (result,) = [r for r in json.loads(out)["results"] if r["model"] == "casc"]
    assert result["status"] == "updated"
    # Merged again, it is stored again as weighted sums of its (new) inputs.
    assert merge_inputs.show("casc").tensor_storage == {"derived": len(merge_inputs.manifest("casc").tensors())}
    again = weights_of(merge_inputs, "casc", tmp_path / "again")
    base, ft1, ft3 = (weights_of(merge_inputs, m, tmp_path / m) for m in ("base", "ft1", "ft3"))
    key = "model.layers.0.mlp.up_proj.weight"
    expected = base[key] + (np.float32(0.5) * (ft1[key] - base[key]) + np.float32(0.5) * (ft3[key] - base[key]))
    assert again[key].tobytes() == expected.astype(np.float32).tobytes()


def test_a_cascade_through_the_library_stores_its_re_merge_as_weighted_sums(tmp_path: Path) -> None:
    """mgit.cascade.cascade with no executor given stores a re-merge as the CLI's does: the
    storage of a recipe of MGit's own is found by the recipe run, not by whoever made the
    executor."""
    from mgit.cascade import cascade

    repo = Repo.init(tmp_path / "repo")
    for name, (_, parent) in MODELS.items():
        repo.add(write_model(tmp_path / name, name), name=name, parent=parent)
    merge(repo, ["ft1", "ft2"], method="linear", name="lib")
    repo.add({k: v + np.float32(0.01) for k, v in weights_of(repo, "ft2", tmp_path / "ft2-v1").items()}, name="ft2")
    report = cascade(repo, "ft2")
    assert [(r.model, r.status) for r in report.results] == [("lib", "updated")]
    assert repo.show("lib").tensor_storage == {"derived": len(repo.manifest("lib").tensors())}


def test_task_heads_are_refused_then_taken_from_one_input(merge_inputs: Repo, tmp_path: Path) -> None:
    for name, classes in (("head2", 2), ("head4", 4)):
        src = weights_of(merge_inputs, "ft1", tmp_path / f"src-{name}")
        src["classifier.weight"] = np.full((classes, 32), float(classes), np.float32)
        folder = tmp_path / name
        folder.mkdir()
        save_file(src, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text("{}")
        merge_inputs.add(folder, name=name, parent="base")
    with pytest.raises(Exception, match=r"classifier\.weight: is only in some inputs.*--take"):
        merge(merge_inputs, ["head2", "head4"], method="task_arithmetic", base="base", name="heads")
    config = tmp_path / "heads.yml"  # --take is refused beside --config: the hint points to the YAML's take:
    config.write_text("models: [head2, head4]\nmerge_method: task_arithmetic\nbase_model: base\n")
    with pytest.raises(InputError, match=r"classifier\.weight: is only in some inputs") as caught:
        merge_config(merge_inputs, config, name="heads")
    assert caught.value.hint == "Say which model it comes from in the config: take: {'classifier.weight': MODEL}"
    with pytest.raises(Exception, match=r"classifier\.weight: has shapes \(2, 32\) and \(4, 32\) in the inputs"):
        merge(merge_inputs, ["head2", "head4"], method="linear", name="heads")
    code, out, err = run_cli(
        "merge",
        "head2",
        "head4",
        "--method",
        "task_arithmetic",
        "--base",
        "base",
        "--take",
        "classifier.*=head4",
        "--name",
        "heads",
        "--json",
        cwd=merge_inputs.root,
    )
    assert code == 0, err
    merged = weights_of(merge_inputs, "heads", tmp_path / "heads")
    assert merged["classifier.weight"].shape == (4, 32) and float(merged["classifier.weight"][0, 0]) == 4.0


def test_bad_input_is_refused_before_any_work(merge_inputs: Repo, tmp_path: Path) -> None:
    before = merge_inputs.refs.all()
    with pytest.raises(InvalidOptionError, match="unknown merge method 'average'.*") as exc:
        merge(merge_inputs, ["ft1", "ft2"], method="average", name="bad")
    assert "linear, slerp, task_arithmetic, ties, dare_linear, dare_ties" in str(exc.value.hint)
    with pytest.raises(InvalidOptionError, match="ties takes no merge parameter 'temperature'"):
        merge(merge_inputs, ["ft1", "ft2"], method="ties", base="base", parameters={"temperature": 2}, name="bad")
    with pytest.raises(InvalidOptionError, match="needs a base model"):
        merge(merge_inputs, ["ft1", "ft2"], method="ties", name="bad")
    with pytest.raises(InvalidOptionError, match="density must be in"):
        merge(merge_inputs, ["ft1", "ft2"], method="ties", base="base", density=1.5, name="bad")
    config = tmp_path / "bad.yml"
    config.write_text("models:\n  - model: ft1\n  - model: nosuch\nmerge_method: linear\n")
    with pytest.raises(UnknownRefError, match="nosuch"):
        merge_config(merge_inputs, config, name="bad")
    config.write_text("models:\n  - model: ft1\n  - model: ft2\nmerge_method: linear\nparameters: {t: [0, 1]}\n")
    with pytest.raises(InvalidOptionError, match="takes no merge parameter 't'"):
        merge_config(merge_inputs, config, name="bad")
    code, _, err = run_cli(
        "merge", "ft1", "ft2", "--method", "slerp", "--base", "base", "--name", "bad", cwd=merge_inputs.root
    )
    assert code == 1 and "slerp merges exactly two models" in err
    slices = (
        "slices:\n  - sources:\n      - {{model: base, layer_range: {a}}}\n      - {{model: ft1, layer_range: {b}}}\n"
    )
    for body, refused in (
        (
            slices.format(a="[0, 4]", b="[0, 4]") * 1 + "  - sources:\n      - {model: base, layer_range: [0, 2]}\n",
            "2 slices stack layers into another architecture",
        ),
        (slices.format(a="[0, 4]", b="[0, 2]"), "the sources take different layer ranges"),
        (slices.format(a="[0, 2]", b="[0, 2]"), r"layer_range \[0, 2\] of models with 4 layers"),
        (
            "models: [ft1, ft2]\nparameters: {weight: [{filter: mlp, value: 1, extra: 2}]}\n",
            "a filter is {filter: NAME PART, value: SETTING}",
        ),
        ("models: [ft1, ft2]\nparameters: {weight: [0.5, true]}\n", "parameter 'weight' must be a number, not True"),
        ("models: [ft1, ft2]\nparameters: {normalize: [true, 0.5]}\n", "must be true or false, not 0.5"),
    ):
        method = "slerp\nbase_model: base\nparameters: {t: 0.5}" if "slices" in body else "linear"
        config.write_text(f"{body}merge_method: {method}\n")
        with pytest.raises(InvalidOptionError, match=refused):
            merge_config(merge_inputs, config, name="bad")
    config.write_text(
        "models: [base, ft1]\nmerge_method: slerp\nbase_model: base\nparameters: {t: [{filter: mlp, value: 0.5}]}\n"
    )
    with pytest.raises(
        InvalidOptionError, match="no merge parameter 't' for tensor 'lm_head.weight': none of its filters"
    ):
        merge_config(merge_inputs, config, name="bad")
    other = tmp_path / "other"
    other.mkdir()
    save_file(
        {"model.norm.weight": np.ones(32, np.float32), "extra.weight": np.ones(3, np.float32)},
        str(other / "model.safetensors"),
    )
    merge_inputs.add(other, name="other")
    with pytest.raises(Exception, match="has no tensor 'lm_head.weight'|is only in some inputs"):
        merge(merge_inputs, ["ft1", "other"], method="linear", name="bad")
    assert merge_inputs.refs.all() == {**before, "other": merge_inputs.refs.get("other")}


def test_two_task_models_keep_both_heads_under_their_own_names(merge_inputs: Repo, tmp_path: Path) -> None:
    if "head2" not in merge_inputs.refs.all():
        test_task_heads_are_refused_then_taken_from_one_input(merge_inputs, tmp_path / "setup")
    code, out, err = run_cli(
        "merge",
        "head2",
        "head4",
        "--method",
        "task_arithmetic",
        "--base",
        "base",
        "--rename",
        "classifier.*=head2:sentiment.",
        "--rename",
        "classifier.*=head4:topic.",
        "--name",
        "two-heads",
        cwd=merge_inputs.root,
    )
    assert code == 0, err
    merged = weights_of(merge_inputs, "two-heads", tmp_path / "two")
    assert merged["sentiment.classifier.weight"].shape == (2, 32) and merged["topic.classifier.weight"].shape == (4, 32)
    assert "classifier.weight" not in merged
    recipe = merge_inputs.version("two-heads").recipe["params"]
    assert recipe["rename"] == [["classifier.*", 1, "sentiment."], ["classifier.*", 2, "topic."]]
    code, _, err = run_cli(
        "merge",
        "head2",
        "head4",
        "--method",
        "task_arithmetic",
        "--base",
        "base",
        "--rename",
        "classifier.*=head2:x.",
        "--rename",
        "classifier.*=head4:x.",
        "--name",
        "clash",
        cwd=merge_inputs.root,
    )
    assert code == 1 and "x.classifier.weight: would be written twice" in err


@pytest.mark.parametrize("method", ["linear", "task_arithmetic", "ties"])
def test_chunked_merges_give_the_same_bits(
    merge_inputs: Repo, method: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large tensors merge a chunk at a time (TIES after choosing what it keeps over the
    whole tensor): with chunks of 1,000 elements, still mergekit's bytes."""
    from mgit.merging import methods, recipe

    monkeypatch.setattr(recipe, "CHUNK", 1000)
    monkeypatch.setattr(methods, "SCAN", 777)  # and TIES's selection scans in pieces
    config = tmp_path / f"{method}.yml"
    config.write_text(CONFIGS[method])
    merge_config(merge_inputs, config, name=f"chunked-{method}")
    ours = weights_of(merge_inputs, f"chunked-{method}", tmp_path / "out")
    theirs = load_file(str(FIXTURES / f"{method}.safetensors"))
    assert [k for k in theirs if ours[k].tobytes() != theirs[k].tobytes()] == []


@pytest.mark.parametrize("scan", [1 << 22, 3])
def test_ties_keeps_equal_magnitudes_by_position(scan: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from mgit.merging import methods
    from mgit.merging.methods import _selected, ties_selection

    monkeypatch.setattr(methods, "SCAN", scan)
    delta = np.array([3, -1, 2, -2, 2, 0, -3, 1], np.float32)
    threshold, last = ties_selection(delta, 0.5, "t")  # keeps 4: both 3s, then the first two 2s
    mask = _selected(delta, threshold, last, 0)
    assert mask.tolist() == [1, 0, 1, 1, 0, 0, 1, 0]
    halves = np.concatenate([_selected(delta[:3], threshold, last, 0), _selected(delta[3:], threshold, last, 3)])
    assert halves.tolist() == mask.tolist()


@pytest.mark.parametrize("scan", [1 << 22, 999])
def test_the_kth_largest_magnitude_by_bit_patterns(scan: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from mgit.merging import methods
    from mgit.merging.methods import _kth_largest

    monkeypatch.setattr(methods, "SCAN", scan)
    rng = np.random.default_rng(0)
    cases = [
        np.abs(rng.standard_normal(10_001)).astype(np.float32),
        np.abs(np.round(rng.standard_normal(5_000), 1)).astype(np.float32),  # many equal values
        np.zeros(10, np.float32),
        np.array([np.inf, 1, 0], np.float32),
    ]
    for values in cases:
        ordered = np.sort(values)[::-1]
        for k in (1, 2, values.size // 2, values.size):
            assert _kth_largest(values, k) == ordered[k - 1]


# 20,000 values: a sample is taken only when SAMPLED < 20,000 / 4, so the largest sample
# tried is 4,999 (every 4th value); the default, 1 << 14, would skip the bracket altogether.
@pytest.mark.parametrize("sampled", [16, 4_999])
def test_the_sampled_bracket_finds_the_exact_kth_largest(sampled: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sample only brackets the k-th largest: whatever the order of the values (sorted
    either way, NaNs among them, most of them equal as in a bfloat16 task vector), the
    threshold and the count above it are the exact ones, with or without a pool."""
    from concurrent.futures import ThreadPoolExecutor

    from mgit.merging import methods
    from mgit.merging.methods import _kth_largest_and_above

    monkeypatch.setattr(methods, "SAMPLED", sampled)
    monkeypatch.setattr(methods, "SCAN", 1000)
    rng = np.random.default_rng(7)
    normal = np.abs(rng.standard_normal(20_000)).astype(np.float32)
    bf16 = np.where(rng.random(20_000) < 0.2, np.float32(2.0**-9), np.float32(0)).astype(np.float32)
    bf16[::97] = np.float32(2.0**-8)
    nans = normal.copy()
    nans[::50] = np.nan
    misleading = normal.copy()
    misleading[:: 20_000 // sampled] = 1e9  # the sampled positions: the bracket misses, the histograms decide
    assert 4 * sampled < 20_000 and misleading[:: 20_000 // sampled].min() == 1e9 > np.nanmax(normal)
    cases = [
        normal,
        np.sort(normal),
        np.sort(normal)[::-1].copy(),
        bf16,
        nans,
        misleading,
        np.zeros(20_000, np.float32),
    ]
    with ThreadPoolExecutor(2) as pool:
        for values in cases:
            ordered = np.sort(values.view(np.uint32))[::-1].view(np.float32)  # NaNs first, as their bits rank
            for k in (1, 17, values.size // 5, values.size // 2, values.size - 3, values.size):
                for pmap in (map, pool.map):
                    threshold, above = _kth_largest_and_above(values, k, pmap)
                    assert threshold.tobytes() == ordered[k - 1].tobytes()
                    assert above == int(np.count_nonzero(values > ordered[k - 1]))


def test_a_sharded_merge_rewrites_its_index(tmp_path: Path) -> None:
    """Two shards and their index: the merged index maps every tensor written (renamed heads
    too) to its shard, with their total size in the output dtype."""
    repo = Repo.init(tmp_path / "repo")
    for name, (_, parent) in MODELS.items():
        weights = load_file(str(write_model(tmp_path / f"flat-{name}", name) / "model.safetensors"))
        weights["classifier.weight"] = np.full((2, 32), float(MODELS[name][0]), np.float32)
        folder = tmp_path / name
        folder.mkdir()
        keys = sorted(weights)
        shards = {
            "model-00001-of-00002.safetensors": keys[: len(keys) // 2],
            "model-00002-of-00002.safetensors": keys[len(keys) // 2 :],
        }
        for file, names in shards.items():
            save_file({k: weights[k] for k in names}, str(folder / file), metadata={"format": "pt"})
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 1}, "weight_map": {k: f for f, ns in shards.items() for k in ns}})
        )
        (folder / "config.json").write_text("{}")
        repo.add(folder, name=name, parent=parent)
    merge(
        repo,
        ["ft1", "ft2"],
        method="task_arithmetic",
        base="base",
        dtype="float16",
        name="sharded",
        rename=[("classifier.*", "ft1", "one."), ("classifier.*", "ft2", "two.")],
    )
    repo.checkout("sharded", tmp_path / "out")
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    on_disk = {k: f for f in index["weight_map"].values() for k in floats_of(tmp_path / "out" / f)}
    assert index["weight_map"] == on_disk
    assert {"one.classifier.weight", "two.classifier.weight"} <= set(on_disk) and "classifier.weight" not in on_disk
    sizes = sum((tmp_path / "out" / f).stat().st_size for f in set(on_disk.values()))
    headers = sum(8 + int.from_bytes((tmp_path / "out" / f).read_bytes()[:8], "little") for f in set(on_disk.values()))
    assert index["metadata"]["total_size"] == sizes - headers
    assert {d for f in set(on_disk.values()) for d, _ in floats_of(tmp_path / "out" / f).values()} == {"F16"}
    # `mgit merge` streams the merge into its add; the recipe (what a cascade runs) writes a
    # folder first: both store the same files, byte for byte.
    from mgit.merging.recipe import merge as recipe_merge

    inputs = [tmp_path / "in" / m for m in ("base", "ft1", "ft2")]
    for ref, folder in zip(("base", "ft1", "ft2"), inputs, strict=True):
        repo.checkout(ref, folder)
    recipe_merge(inputs, tmp_path / "by-recipe", **repo.version("sharded").recipe["params"])
    added = repo.add(tmp_path / "by-recipe", name="by-recipe", parent="base")
    assert repo.version(added.version).manifest == repo.version("sharded").manifest


def test_the_merge_reports_progress_in_bytes(merge_inputs: Repo) -> None:
    seen: list[tuple[int, int]] = []

    def factory(total: int):  # type: ignore[no-untyped-def]
        done = [0]
        seen.append((total, 0))

        def advance(n: int) -> None:
            done[0] += n
            seen[-1] = (total, done[0])

        return advance

    merge(merge_inputs, ["ft1", "ft2"], method="linear", name="with-progress", progress=factory)
    total = sum(f.size for f in merge_inputs.manifest("with-progress").files)
    assert seen == [(total, total)]  # one bar: the merge streams into the add, file bytes all counted


def test_a_linear_or_task_arithmetic_merge_is_stored_as_a_weighted_sum_of_its_inputs(tmp_path: Path) -> None:
    """Its tensors are derived from the inputs' (weighted_sum + an XOR residual of zeros):
    far less than a fine-tune's delta; it survives push, clone, lazy clone, rm and gc."""
    from mgit import sync

    repo = Repo.init(tmp_path / "repo")
    for name, (_, parent) in MODELS.items():
        repo.add(write_model(tmp_path / name, name), name=name, parent=parent)
    merged = merge(
        repo, ["ft1", "ft2"], method="task_arithmetic", base="base", weights={"ft1": 0.6, "ft2": 0.3}, name="merged"
    )
    shown = repo.show("merged")
    assert shown.tensor_storage == {"derived": len(repo.manifest("merged").tensors())}
    assert merged.new_bytes < repo.info("ft2").new_bytes / 3
    expected = weights_of(repo, "merged", tmp_path / "expected")
    sync.init_bare(str(tmp_path / "team.mgit"))
    sync.add_remote(repo, "origin", str(tmp_path / "team.mgit"))
    sync.push(repo, "origin", ["merged"])  # its inputs travel with it: they are its bases
    for lazy in (False, True):
        clone = Repo(sync.clone(str(tmp_path / "team.mgit"), tmp_path / f"clone-{lazy}", lazy=lazy).path)
        got = weights_of(clone, "merged", tmp_path / f"got-{lazy}")
        assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in expected.items()}
        assert clone.fsck().ok
    repo.rm("ft2", force=True)
    repo.gc()
    assert repo.fsck().ok  # ft2's tensors are kept: the merge is coded against them
    again = weights_of(repo, "merged", tmp_path / "again")
    assert {k: v.tobytes() for k, v in again.items()} == {k: v.tobytes() for k, v in expected.items()}


def test_the_weighted_sum_codec_decodes_any_content_and_refuses_bad_configuration() -> None:
    from mgit.codecs import CodecContext, WeightedSumCodec, decode_chain, encode_chain

    rng = np.random.default_rng(3)
    bases = {f"{i:064x}": rng.standard_normal(1000).astype(np.float32).tobytes() for i in (1, 2, 3)}
    codec = WeightedSumCodec(bases=list(bases), weights=[0.5, 0.25], anchor=0, normalize=False, scale=1.0, dtype="F32")
    for content in (rng.standard_normal(1000).astype(np.float32), np.zeros(1000, np.float32)):  # not what it predicts
        ctx = CodecContext(content.nbytes, lambda oid: bases[oid])
        stored = encode_chain([codec], content.tobytes(), ctx)
        assert bytes(decode_chain([codec], stored, ctx)) == content.tobytes()
    for bad in (
        dict(weights=[0.5]),
        dict(anchor=5),
        dict(dtype="I8"),
        dict(bases=["nothex", f"{1:064x}"]),
        dict(weights=[0.5, float("nan")]),
        dict(normalize="yes"),
    ):
        config = dict(bases=list(bases), weights=[0.5, 0.25], anchor=0, normalize=False, scale=1.0, dtype="F32") | bad
        with pytest.raises((ValueError, TypeError)):
            WeightedSumCodec(**config)  # type: ignore[arg-type]


def test_a_task_arithmetic_merge_with_gradients_is_stored_as_weighted_sums(tmp_path: Path) -> None:
    """Weights that change along the layers and by tensor: each tensor's weighted sum is
    recorded with its own weights (and decodes to mergekit's bytes: the test above)."""
    merge_inputs = Repo.init(tmp_path / "repo")
    for name, (_, parent) in MODELS.items():
        merge_inputs.add(write_model(tmp_path / name, name), name=name, parent=parent)
    config = tmp_path / "gradient.yml"
    config.write_text(CONFIGS["task_arithmetic_gradient"])
    merge_config(merge_inputs, config, name="gradient-stored")
    stored = len(merge_inputs.manifest("gradient-stored").tensors())
    assert merge_inputs.show("gradient-stored").tensor_storage == {"derived": stored}
    headers = {t.name: merge_inputs.store.header(t.object) for t in merge_inputs.manifest("gradient-stored").tensors()}
    weights = {n: h.codecs[0]["configuration"]["weights"] for n, h in headers.items()}
    assert weights["model.layers.0.mlp.up_proj.weight"] == [0.0, 0.25]
    assert weights["model.layers.3.self_attn.q_proj.weight"] == [1.0, 0.75]
    assert weights["model.layers.1.self_attn.q_proj.weight"] == pytest.approx([1 / 3, 0.75])
    assert merge_inputs.fsck().ok


def test_a_streamed_merge_is_written_as_its_prediction_only_when_its_bases_allow(tmp_path: Path) -> None:
    """`mgit merge` makes a weighted-sum tensor as the codec predicts it and writes it as
    that chain without predicting it again: only over bases a delta may use. It stores no
    parent-inference sketch (its source is read once); one is made when inference needs it."""
    from mgit.codecs import WeightedSumCodec, XorDeltaCodec, ZstdCodec
    from mgit.store.codec_policy import exact_encoding
    from mgit.store.objects import tensor_meta

    repo = Repo.init(tmp_path / "repo")
    for name, (_, parent) in MODELS.items():
        repo.add(write_model(tmp_path / name, name), name=name, parent=parent)
    t1, t2 = (next(t for t in repo.manifest(m).tensors() if t.dtype == "F32") for m in ("ft1", "ft2"))
    meta = tensor_meta(t1.dtype, t1.shape)
    chain = [
        WeightedSumCodec(
            bases=[t1.object, t2.object], weights=[0.5, 0.5], anchor=-1, normalize=False, scale=1.0, dtype="F32"
        ),
        ZstdCodec(level=3),
    ]
    depth = max(repo.store.header(t1.object).depth, repo.store.header(t2.object).depth)
    found = exact_encoding("tensor", meta, t1.nbytes, chain, max_depth=depth, header=repo.store.header)
    assert found is not None and found.depth == depth + 1 and found.codecs == chain
    assert exact_encoding("tensor", meta, t1.nbytes, chain, max_depth=depth - 1, header=repo.store.header) is None
    with pytest.raises(InvalidOptionError, match="does not store a residual of its prediction"):
        exact_encoding(
            "tensor",
            meta,
            t1.nbytes,
            [XorDeltaCodec(base=t1.object), ZstdCodec(level=1)],
            max_depth=3,
            header=repo.store.header,
        )
    merged = merge(repo, ["ft1", "ft2"], method="linear", name="merged")
    assert repo.fsck().ok
    assert repo.show("merged").tensor_storage == {"derived": len(repo.manifest("merged").tensors())}
    assert repo.catalog.sketches()[1] == [merged.version]
    repo.checkout("merged", tmp_path / "out")
    suggestion = repo.suggest_parents(tmp_path / "out")
    assert suggestion.stored_as == ["merged@1"]  # found by its sketch, and never its own candidate
    assert suggestion.candidates and not any(c.ref.startswith("merged") for c in suggestion.candidates)
    assert repo.catalog.sketches()[1] == []  # made from the stored tensors, and kept
