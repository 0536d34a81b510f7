"""Parent inference and delta pairing on a family of transformers 5 `save_pretrained` folders
(`hf_family.py`): a task model names its base's tensors under `bert.`, saves drop the
`position_ids` buffer the base holds, casts, a merged LoRA, shards and an exact copy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import needs_torch, run_cli

from mgit import Repo
from mgit.formats.pairing import tensor_names, wrapper_prefix

pytestmark = needs_torch

Family = dict[str, tuple[Path, str | None, str | None]]


@pytest.fixture(scope="module")
def family(tmp_path_factory: pytest.TempPathFactory) -> Family:
    pytest.importorskip("transformers")
    from hf_family import build_family

    return build_family(tmp_path_factory.mktemp("hf-family"))


@pytest.fixture(scope="module")
def stored(family: Family, tmp_path_factory: pytest.TempPathFactory) -> Repo:
    """Every member stored with its recorded parent and relation."""
    repo = Repo.init(tmp_path_factory.mktemp("hf-repo"))
    for name, (folder, parent, relation) in family.items():
        repo.add(folder, name=name, parent=parent, relation=relation)
    return repo


def _repo_with(tmp_path: Path, family: Family, *names: str) -> Path:
    root = tmp_path / "repo"
    Repo.init(root)
    for name in names:
        assert run_cli("add", str(family[name][0]), "--name", name, cwd=root)[0] == 0
    return root


def _json(root: Path, *args: str) -> dict:
    code, stdout, stderr = run_cli(*args, "--json", cwd=root)
    assert code == 0, stderr
    return json.loads(stdout)


def test_wrapper_prefix_is_read_from_the_names() -> None:
    base = ["embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight", "pooler.dense.bias"]
    task = [f"bert.{n}" for n in base] + ["classifier.weight", "classifier.bias"]
    assert wrapper_prefix(task, base) == ("bert.", "")
    assert tensor_names(task, base) == {f"bert.{n}": n for n in base}
    assert tensor_names(base, task) == {n: f"bert.{n}" for n in base}
    peft = [f"base_model.model.model.{n}" for n in base]
    assert tensor_names(peft, [f"model.{n}" for n in base]) == {
        f"base_model.model.model.{n}": f"model.{n}" for n in base
    }
    assert wrapper_prefix(base, base) == ("", "")
    assert tensor_names(base, ["other.weight"]) == {}


def test_every_member_gets_its_recorded_parent_and_relation_leaving_it_out(family: Family, stored: Repo) -> None:
    """Leave one out, as benchmarks/lineage_inference.py: each derived member is suggested
    against all the others (its children stay in)."""
    right, derived = [], [n for n, (_, parent, _) in family.items() if parent]
    for name in derived:
        folder, parent, relation = family[name]
        s = stored.suggest_parents(folder, exclude={name})
        chosen = [stored.model_of(p) for p in s.parents]
        if chosen == [parent] and s.relation == relation:
            right.append(name)
        else:
            print(name, chosen, s.relation, s.verdict)
    assert len(right) / len(derived) >= 0.95, sorted(set(derived) - set(right))
    assert right == derived  # 7 of 7 on this family


def test_a_task_model_is_suggested_its_base_across_the_bert_prefix(family: Family, tmp_path: Path) -> None:
    root = _repo_with(tmp_path, family, "base")
    s = _json(root, "lineage", "suggest", str(family["task"][0]))
    best = s["candidates"][0]
    assert (best["model"], best["relation"]) == ("base", "finetune")
    assert best["structure"] > 0.9 and best["distance"] < 0.01 and best["direction"] != "query -> candidate"
    assert s["parents"] == [best["version"]] and s["stored_as"] == []


def test_a_dropped_buffer_does_not_make_the_parent_a_child(family: Family, tmp_path: Path) -> None:
    """The base holds `embeddings.position_ids`; the merged LoRA, saved by transformers 5, does
    not. With a fine-tune stored too, the base is still chosen, as the adapter's parent."""
    root = _repo_with(tmp_path, family, "base", "ft")
    s = _json(root, "lineage", "suggest", str(family["lora-merged"][0]))
    best = s["candidates"][0]
    assert best["model"] == "base" and best["direction"] != "query -> candidate", s["verdict"]
    assert s["relation"] == "adapter" and s["parents"] == [best["version"]]
    add = _json(root, "add", str(family["lora-merged"][0]), "--name", "lora", "--auto-parent")
    assert [(p["model"], p["seq"], p["relation"]) for p in add["parents"]] == [("base", 1, "adapter")]


def test_a_stored_version_is_never_its_own_candidate(family: Family, tmp_path: Path) -> None:
    root = _repo_with(tmp_path, family, "base", "ft")
    s = _json(root, "lineage", "suggest", str(family["base"][0]))
    assert s["stored_as"] == ["base@1"] and all(c["model"] != "base" for c in s["candidates"])
    assert "already stored as base@1" in s["verdict"]
    code, stdout, _ = run_cli("lineage", "suggest", str(family["base"][0]), cwd=root)
    assert code == 0 and "already stored as base@1" in stdout
    # Added again under its own name: nothing new, no parent.
    again = _json(root, "add", str(family["base"][0]), "--name", "base", "--auto-parent")
    assert again["created"] is False and again["parents"] == []
    # A bit-identical copy added under another name is a copy of base.
    copy = _json(root, "add", str(family["base-copy"][0]), "--name", "copy", "--auto-parent")
    assert [(p["model"], p["seq"], p["relation"]) for p in copy["parents"]] == [("base", 1, "other")]


def test_a_task_model_costs_what_the_same_fine_tune_costs_without_the_prefix(family: Family, tmp_path: Path) -> None:
    """Stored bytes (`mgit du --json`) of the task model added with --parent base, against its
    `bert` part saved alone (the same fine-tune, no prefix and no head) in another repository."""
    costs = {}
    for name in ("task", "task-body"):
        root = _repo_with(tmp_path / name, family, "base")
        folder = family["task"][0].parent / name
        assert run_cli("add", str(folder), "--name", name, "--parent", "base", cwd=root)[0] == 0
        du = {m["name"]: m for m in _json(root, "du")["models"]}
        costs[name] = du[name]["stored_bytes"], du[name]["logical_bytes"]
    (task, task_size), (body, _) = costs["task"], costs["task-body"]
    head = 3 * 64 * 4 + 3 * 4 + 2048  # the classifier, standalone, and its file's header
    assert task <= body + head, costs
    assert task / task_size < 0.7  # before the pairing: 0.92 (every tensor coded alone)


def test_a_prefixed_student_with_fewer_layers_is_matched_by_layer_pattern(family: Family, tmp_path: Path) -> None:
    """A student keeping the base's layers 0 and 2 as its 0 and 1, under `bert.`, slightly
    trained: its layer 1 is compared with the teacher's layer 2 across the prefix."""
    import re

    import numpy as np
    from safetensors.numpy import load_file

    repo = Repo.init(tmp_path / "repo")
    repo.add(family["base"][0], name="base")
    repo.add(family["ft"][0], name="ft", parent="base")
    rng = np.random.default_rng(0)
    student = {}
    for name, value in load_file(family["base"][0] / "model.safetensors").items():
        layer = re.search(r"layer\.(\d+)\.", name)
        if layer and layer.group(1) == "1":
            continue
        if value.dtype == np.float32:
            value = value + rng.standard_normal(value.shape).astype(np.float32) * 0.01 * np.sqrt((value**2).mean())
        student["bert." + name.replace("layer.2.", "layer.1.")] = value
    s = repo.suggest_parents(student)
    best = s.candidates[0]
    assert (best.model, best.relation) == ("base", "distill")
    assert best.distance is not None and best.distance < 0.05  # unrelated: ~1.4; by name alone: ~0.5
    assert s.parents == [best.version]


def test_diff_pairs_a_task_model_with_its_base_across_the_bert_prefix(family: Family, stored: Repo) -> None:
    """The task model's tensors are its body's under `bert.`: diff compares them with the base's
    as it compares the same body saved without the prefix, and only the head is B's alone."""
    task = stored.diff("base", "task")
    body = stored.diff("base", family["task"][0].parent / "task-body")
    assert task.summary.compared_values == body.summary.compared_values > 0
    assert task.summary.changed_values == body.summary.changed_values > 0
    assert task.summary.rel_change == pytest.approx(body.summary.rel_change, rel=1e-9)
    only_b = sorted(t.name for t in task.tensors if t.status == "only_b")
    assert only_b and all(name.startswith("classifier.") for name in only_b)
    assert any("across a wrapper prefix (bert." in note for note in task.notes)
