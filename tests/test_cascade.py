"""Cascades with real torch models and recipes: a tiny MLP base trained with AdamW on
generated data, a fine-tune (a few optimizer steps), an int8 per-channel quantization and a
magnitude pruning, each a recipe in a file, re-run in child processes when the base gets a
new version. Tests are a numpy forward pass on held-out inputs (fast to start)."""

from __future__ import annotations

import json
import re
import shutil
import signal
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from conftest import copy_user_code, load_recipes, needs_torch, run_cli, run_mgit

from mgit import Repo
from mgit.bisect import bisect
from mgit.cascade import plan_cascade
from mgit.checks import Checks, Condition
from mgit.errors import RefConflictError

# name, parent, relation, recorded recipe (None: made by hand), its params, recipe that made the first version
Member = tuple[str, str, str, str | None, dict[str, Any], str]
FT: list[Member] = [
    ("ft", "base", "finetune", "finetune", {"seed": 1}, "finetune"),
    ("ft-int8", "ft", "quantize", "quantize_int8", {}, "quantize_int8"),
    ("ft-pruned", "ft", "prune", "prune", {"sparsity": 0.5}, "prune"),
]
PRUNED: list[Member] = [  # recipes without torch, whose child processes start fast
    ("pruned", "base", "prune", "prune", {"sparsity": 0.5}, "prune"),
    ("pruned-int8", "pruned", "quantize", "quantize_int8", {}, "quantize_int8"),
    ("pruned-more", "pruned", "prune", "prune", {"sparsity": 0.75}, "prune"),
]


def base_state(recipes: ModuleType, steps: int) -> dict[str, Any]:
    """The base MLP, trained `steps` AdamW steps (a new base version trains more)."""
    import torch

    torch.manual_seed(0)
    return recipes.train(recipes.mlp(), seed=0, steps=steps, lr=0.05).state_dict()


def build(root: Path, members: list[Member], *, tests: bool = True) -> Repo:
    """A repository in `root` holding the base and `members` (each made in-process by its
    recipe from its parent), tests attached to the base and inherited, and then a second
    base version that the members are not built on yet."""
    root.mkdir(parents=True, exist_ok=True)
    copy_user_code(root, "mlp")
    recipes = load_recipes(root)
    repo = Repo.init(root)
    folders = {"base": root / "made" / "base"}
    folders["base"].mkdir(parents=True)
    recipes.save(base_state(recipes, 20), folders["base"])
    repo.add(folders["base"], name="base", message="base v1")
    for name, parent, relation, recipe, params, made_by in members:
        folders[name] = root / "made" / name
        folders[name].mkdir()
        getattr(recipes, made_by)([folders[parent]], folders[name], **params)
        repo.add(
            folders[name],
            name=name,
            parent=parent,
            relation=relation,
            params=params,
            recipe=f"{root / 'recipes.py'}:{recipe}" if recipe else None,
        )
    if tests:
        Checks(repo).attach("base", "evals.py:quality", conditions=[Condition("finite", "min", 1.0)], inherit=True)
    shutil.rmtree(root / "made")
    v2 = root / "base-v2"
    v2.mkdir()
    recipes.save(base_state(recipes, 40), v2)
    repo.add(v2, name="base", message="base v2: trained longer")
    shutil.rmtree(v2)
    return repo


def cascade(root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    """`mgit cascade ARGS --json` in-process: exit code and report."""
    code, out, err = run_cli("cascade", *args, "--json", cwd=root)
    assert out, err
    return code, json.loads(out)


def by_model(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["model"]: r for r in report["results"]}


def weights(repo: Repo, ref: str) -> dict[str, str]:
    """Tensor name -> hash of its content."""
    return {t.name: t.object for t in repo.manifest(ref).tensors()}


def heads(repo: Repo) -> dict[str, str]:
    return dict(repo.refs.all())


# --- tests -------------------------------------------------------------------------------------
@needs_torch
def test_dry_run_plans_parents_first_and_runs_nothing(tmp_path: Path) -> None:
    members = [
        *FT,
        ("hand", "base", "finetune", None, {"seed": 2}, "finetune"),
        ("hand-int8", "hand", "quantize", "quantize_int8", {}, "quantize_int8"),
    ]
    repo = build(tmp_path / "w", members)
    before = heads(repo)
    plan = plan_cascade(repo, "base")
    assert plan.ref == "base@2"
    order = [s.model for s in plan.steps]
    assert order.index("ft") < order.index("ft-int8") and order.index("hand") < order.index("hand-int8")
    steps = {s.model: s for s in plan.steps}
    assert {m: s.action for m, s in steps.items()} == {
        "ft": "recipe",
        "ft-int8": "recipe",
        "ft-pruned": "recipe",
        "hand": "manual",
        "hand-int8": "blocked",
    }
    assert [(p.recorded_ref, p.ref) for p in steps["ft"].parents] == [("base@1", "base@2")]
    assert [p.ref for p in steps["ft-int8"].parents] == ["ft@next"] and steps["ft-int8"].waits_for == ["ft"]
    assert steps["ft"].recipe is not None and steps["ft"].recipe["params"] == {"seed": 1}
    assert steps["hand"].command == (
        "mgit checkout hand@1 -o hand-v1 && mgit add hand-v1 --name hand --parent base@1 "
        "--relation finetune --recipe FILE.py:FUNCTION --param KEY=VALUE"
    )
    assert steps["hand-int8"].reason == "below hand, which is manual"

    code, out, err = run_cli("cascade", "base", "--dry-run", cwd=repo.root)
    assert code == 1, err  # hand-int8 would be blocked
    assert "Cascade from base@2: 3 to rebuild, 1 to update by hand, 1 blocked" in out
    assert "mgit checkout hand@1 -o hand-v1 && mgit add hand-v1" in out and "Dry run: nothing was run." in out
    code, dry = cascade(repo.root, "base", "--dry-run")  # the report of a run, with no results
    assert code == 1 and dry["dry_run"] and not dry["ok"] and dry["results"] == []
    assert [s["model"] for s in dry["plan"]["steps"]] == order
    assert heads(repo) == before and Checks(repo).show("ft") == []  # no recipe and no test was run


@needs_torch
def test_cascade_rebuilds_descendants_on_the_new_base_and_tests_them(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", FT)
    old = {m: repo.resolve(m) for m in ("ft", "ft-int8", "ft-pruned")}
    old_weights = {m: weights(repo, m) for m in old}
    code, out, err = run_cli("cascade", "base", cwd=repo.root)
    assert code == 0, out + err
    assert "ft: re-running recipes.py:finetune on base@2" in err and "ft-int8: re-running" in err
    assert re.search(r"\nft +ft@1 -> ft@2 +updated +1/1 pass +1/1 pass", out) and "3 updated." in out
    lineage = repo.lineage
    for model, parent in (("ft", "base"), ("ft-int8", "ft"), ("ft-pruned", "ft")):
        version = repo.version(model)
        assert version.predecessor == old[model]
        assert [p.version for p in version.parents] == [repo.resolve(parent)]  # the new parent version
        assert version.parents[0].relation == repo.version(old[model]).parents[0].relation
        assert (
            version.message
            == f"cascade from base@2: recipes.py:{version.recipe['fn'].split(':')[1]} re-run on {parent}@2"
        )
        assert version.recipe["params"] == repo.version(old[model]).recipe["params"]
        assert not any(e.stale for e in lineage.parents(model))
        new_weights = weights(repo, model)
        assert new_weights.keys() == old_weights[model].keys()
        assert all(new_weights[k] != old_weights[model][k] for k in new_weights if k.endswith("weight"))
    int8 = repo.load_state_dict("ft-int8")
    assert str(int8["0.weight"].dtype) == "int8" and "0.weight_scale" in int8
    pruned = repo.load_state_dict("ft-pruned")
    assert (pruned["0.weight"] == 0).mean() == 0.5

    # Test results before (on the old versions) and after, per model.
    assert [t.status for t in Checks(repo).show("ft@1")] == ["pass"] and [
        t.status for t in Checks(repo).show("ft")
    ] == ["pass"]
    assert re.search(r"\nft-int8 +quality +pass \(finite 1, mean_abs_output [0-9.]+\) +pass", out)
    # Nothing is left to do: every model is up to date, and a second run changes nothing.
    code, report = cascade(repo.root, "base")
    assert code == 0 and {r["status"] for r in report["results"]} == {"up-to-date"}
    assert repo.resolve("ft") == repo.resolve("ft@2")


@needs_torch
def test_manual_model_gives_the_command_to_record_a_recipe(tmp_path: Path) -> None:
    members = [
        ("hand", "base", "finetune", None, {"seed": 2}, "finetune"),
        ("hand-int8", "hand", "quantize", "quantize_int8", {}, "quantize_int8"),
    ]
    repo = build(tmp_path / "w", members, tests=False)
    code, report = cascade(repo.root, "base")
    results = by_model(report)
    assert code == 1 and results["hand"]["status"] == "manual" and results["hand-int8"]["status"] == "blocked"
    assert repo.resolve("hand") == results["hand"]["old"]  # nothing was committed
    # The given command, with a real recipe, records one; the next cascade then uses it.
    command = (
        results["hand"]["command"].replace("FILE.py:FUNCTION", "recipes.py:finetune").replace("KEY=VALUE", "seed=2")
    )
    for part in command.split(" && "):
        args = part.split()[1:]
        code, _, err = run_cli(*args, cwd=repo.root)
        assert code == 0, err
    assert repo.version("hand").recipe["fn"] == "recipes.py:finetune"
    code, report = cascade(repo.root, "base")
    results = by_model(report)
    assert code == 0 and results["hand"]["status"] == "updated" and results["hand-int8"]["status"] == "updated"
    assert results["hand"]["new_ref"] == "hand@3" and results["hand"]["tests_after"] == []
    assert [p.version for p in repo.version("hand").parents] == [repo.resolve("base@2")]


@needs_torch
def test_a_failing_recipe_stops_only_its_subtree(tmp_path: Path) -> None:
    members = [
        *FT[:2],
        ("bad", "base", "finetune", "broken", {}, "finetune"),
        ("bad-pruned", "bad", "prune", "prune", {}, "prune"),
    ]
    repo = build(tmp_path / "w", members, tests=False)
    old_bad = repo.resolve("bad")
    code, out, _ = run_cli("cascade", "base", "--jobs", "2", cwd=repo.root)
    assert code == 1
    assert "bad: the recipe raised RuntimeError: this recipe is broken" in out
    assert "  | RuntimeError: this recipe is broken" in out
    code, report = cascade(repo.root, "base", "--jobs", "2")  # resumes: only the failed branch is left
    results = by_model(report)
    assert code == 1
    assert results["bad"]["status"] == "failed-recipe" and results["bad-pruned"]["status"] == "blocked"
    assert results["bad-pruned"]["reason"] == "below bad (failed-recipe)"
    assert results["ft"]["status"] == results["ft-int8"]["status"] == "up-to-date"
    assert repo.resolve("bad") == old_bad and len(repo.log("bad")) == 1  # nothing half-written committed
    assert repo.resolve("ft") == repo.resolve("ft@2") and repo.resolve("ft-int8") == repo.resolve("ft-int8@2")


@needs_torch
def test_nan_weights_fail_the_tests_and_block_the_subtree_until_fixed(tmp_path: Path) -> None:
    members = [
        ("ft", "base", "finetune", "poison", {"seed": 1}, "finetune"),
        ("ft-int8", "ft", "quantize", "quantize_int8", {}, "quantize_int8"),
        ("other", "base", "prune", "prune", {}, "prune"),
    ]
    repo = build(tmp_path / "w", members)
    code, report = cascade(repo.root, "base")
    results = by_model(report)
    assert code == 1 and results["ft"]["status"] == "failed-tests" and results["other"]["status"] == "updated"
    assert [t["status"] for t in results["ft"]["tests_before"]] == ["pass"]
    assert [t["status"] for t in results["ft"]["tests_after"]] == ["fail"]
    assert results["ft-int8"]["status"] == "blocked" and results["ft-int8"]["reason"] == "below ft (failed-tests)"
    assert repo.resolve("ft") == repo.resolve("ft@2")  # committed, but nothing was built on it
    # Bisect finds the edge the poisoned recipe introduced: ft@2, whose ancestors all pass.
    found = bisect(repo, "quality", "ft")
    assert (found.culprit, found.parent, found.edge) == ("ft@2", "ft@1", "history")
    assert found.also == ["finetune from base@2"] and found.reasons == ["finite 0 < 1"]
    # Run again: ft is up to date but fails its test, so ft-int8 stays blocked.
    code, report = cascade(repo.root, "base")
    results = by_model(report)
    assert (
        code == 1 and results["ft-int8"]["status"] == "blocked" and results["ft-int8"]["reason"] == "ft@2 fails quality"
    )
    # Nor does a cascade from ft itself build on it.
    plan = plan_cascade(repo, "ft")
    assert [(s.model, s.action, s.reason) for s in plan.steps] == [("ft-int8", "blocked", "ft@2 fails quality")]
    # A detached test no longer judges: its old failure does not block the plan.
    Checks(repo).detach("quality")
    assert [(s.model, s.action) for s in plan_cascade(repo, "ft").steps] == [("ft-int8", "recipe")]
    assert len(repo.log("ft-int8")) == 1


@needs_torch
def test_a_killed_cascade_resumes_without_redoing_finished_models(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", PRUNED)
    proc = run_mgit(
        "cascade", "base", cwd=repo.root, env={"MGIT_CRASH_AT": "cascade-after-commit", "TMPDIR": str(tmp_path)}
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    repo = Repo(repo.root)
    assert [len(repo.log(m)) for m in ("pruned", "pruned-int8", "pruned-more")] == [2, 1, 1]
    assert Checks(repo).show("pruned") == []  # killed before its tests ran
    code, report = cascade(repo.root, "base")
    results = by_model(report)
    assert code == 0
    assert results["pruned"]["status"] == "up-to-date"
    assert [t["status"] for t in results["pruned"]["tests_after"]] == ["pass"]  # run now, before its children
    assert results["pruned-int8"]["status"] == results["pruned-more"]["status"] == "updated"
    assert len(repo.log("pruned")) == 2
    assert [p.version for p in repo.version("pruned-int8").parents] == [repo.resolve("pruned@2")]
    code, out, err = run_cli("fsck", "--json", cwd=repo.root)
    assert code == 0 and json.loads(out)["ok"], err


@needs_torch
def test_only_restricts_the_cascade_and_the_rest_follows_later(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", PRUNED, tests=False)
    code, report = cascade(repo.root, "base", "--only", "pruned")
    results = by_model(report)
    assert code == 0 and results["pruned"]["status"] == "updated"
    assert results["pruned-int8"]["status"] == results["pruned-more"]["status"] == "skipped"
    plan = plan_cascade(repo, "base")
    assert [(s.model, s.action) for s in plan.steps] == [
        ("pruned", "up-to-date"),
        ("pruned-int8", "recipe"),
        ("pruned-more", "recipe"),
    ]
    assert [p.ref for p in plan.steps[1].parents] == ["pruned@2"]
    code, report = cascade(repo.root, "base", "--only", "*-int8")
    assert code == 0 and [r["status"] for r in report["results"]] == ["up-to-date", "updated", "skipped"]


@needs_torch
def test_parallel_jobs_give_the_same_versions(tmp_path: Path) -> None:
    members = [*FT[:2], ("other", "base", "prune", "prune", {"sparsity": 0.25}, "prune")]
    one = build(tmp_path / "one", members, tests=False)
    shutil.copytree(one.root, tmp_path / "two")
    two = Repo(tmp_path / "two")
    assert cascade(one.root, "base", "--jobs", "1")[0] == 0
    assert cascade(two.root, "base", "--jobs", "2")[0] == 0
    for model in ("ft", "ft-int8", "other"):
        assert one.version(model).manifest == two.version(model).manifest
        assert len(one.log(model)) == len(two.log(model)) == 2


@needs_torch
def test_recipes_run_only_in_a_cascade(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", PRUNED[:2], tests=False)
    marker = tmp_path / "imported.marker"
    env = {"CASCADE_MARKER": str(marker)}
    for args in (
        ["ls"],
        ["lineage"],
        ["log", "pruned"],
        ["show", "pruned"],
        ["checkout", "pruned", "-o", str(tmp_path / "out")],
        ["cascade", "base", "--dry-run"],
    ):
        code, _, err = run_cli(*args, cwd=repo.root, env=env)
        assert code == 0, err
        assert not marker.exists(), args
    assert Repo(repo.root) and not marker.exists()
    code, _, err = run_cli("cascade", "base", cwd=repo.root, env=env)
    assert code == 0, err
    assert marker.read_text() == "imported"


@needs_torch
def test_a_changed_recipe_file_is_reported_and_recorded(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", PRUNED[:1], tests=False)
    old_hash = repo.version("pruned").recipe["source_sha256"]
    recipes = repo.root / "recipes.py"
    recipes.write_text(recipes.read_text() + "\n# tuned\n")
    assert plan_cascade(repo, "base").steps[0].source_changed
    code, out, _ = run_cli("cascade", "base", cwd=repo.root)
    assert code == 0 and "note: the recipe file of pruned (recipes.py:prune) changed since pruned@1 was made" in out
    assert repo.version("pruned").recipe["source_sha256"] not in (old_hash, None)


def test_report_json_has_no_nan() -> None:
    from mgit.cascade import CascadePlan, CascadeReport, CheckLine, ModelResult

    line = CheckLine("t", "fail", {"loss": float("nan"), "acc": 0.5}, ["loss is not finite"])
    report = CascadeReport(
        CascadePlan("b", "0" * 64, "b@2", []),
        False,
        [ModelResult("m", "failed-tests", "1" * 64, "m@1", tests_after=[line])],
    )
    text = json.dumps(report.to_json(), allow_nan=False)
    assert json.loads(text)["results"][0]["tests_after"][0]["metrics"] == {"loss": None, "acc": 0.5}


@needs_torch
def test_errors_are_one_line(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", [], tests=False)
    code, _, err = run_cli("cascade", "nope", cwd=repo.root)
    assert code == 1 and err.startswith("Error: no model named 'nope'")
    code, out, _ = run_cli("cascade", "base", cwd=repo.root)
    assert code == 0 and "base@2 has no descendants: nothing to cascade." in out


@needs_torch
def test_a_cascade_keeps_tags_and_the_tests_attached_by_them(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", PRUNED, tests=False)
    head = repo.resolve("pruned")
    repo.add(repo.checkout("pruned", tmp_path / "p").out_dir, name="pruned", tags={"team": "edge"})  # tag the head
    assert repo.version("pruned").predecessor == head
    Checks(repo).attach("tag:team=edge", "evals.py:quality", conditions=[Condition("finite", "min", 1.0)])
    code, report = cascade(repo.root, "base")
    results = by_model(report)
    assert code == 0 and results["pruned"]["status"] == "updated"
    assert repo.version("pruned").tags == {"team": "edge"}
    assert [t["test"] for t in results["pruned"]["tests_after"]] == ["quality"]


@needs_torch
def test_an_add_with_an_expected_head_commits_nothing_if_the_model_moved(tmp_path: Path) -> None:
    repo = build(tmp_path / "w", PRUNED[:1], tests=False)
    old = repo.resolve("pruned")
    folder = repo.checkout("pruned", tmp_path / "p").out_dir
    repo.add(folder, name="pruned", message="someone else's version", tags={"k": "v"})
    with pytest.raises(RefConflictError, match="moved while updating it"):
        repo.add(folder, name="pruned", message="mine", expected_head=old)
    assert repo.log("pruned")[0].message == "someone else's version"
