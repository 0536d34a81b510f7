"""Tests over the lineage graph (attach, run isolated, record, reuse) and bisect, on real
small models trained with torch on generated data."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_user_code, needs_torch, run_cli, run_mgit

from mgit import Repo
from mgit.bisect import bisect
from mgit.checks import Checks, Condition, ResultTable
from mgit.errors import MgitError


def train(state: dict[str, np.ndarray] | None, steps: int, *, seed: int, flip: bool = False) -> dict[str, np.ndarray]:
    """A few real AdamW steps of a linear classifier on the generated task (labels flipped
    on request: a planted bug)."""
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 2)
    if state is not None:
        model.load_state_dict({k.split(".", 1)[1]: torch.from_numpy(v.copy()) for k, v in state.items()})
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 8)).astype(np.float32)
    y = (x @ np.arange(1, 9, dtype=np.float32) > 0).astype(np.int64)
    if flip:
        y = 1 - y
    opt = torch.optim.AdamW(model.parameters(), lr=0.05)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xt), yt).backward()
        opt.step()
    return {f"linear.{k}": v.detach().numpy().copy() for k, v in model.state_dict().items()}


@pytest.fixture
def work(repo: Repo) -> Repo:
    copy_user_code(repo.root, "classifier")
    return repo


def calls(repo: Repo) -> int:
    log = repo.root / "calls.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@needs_torch
def test_attach_by_name_glob_tag_and_inherit(work: Repo) -> None:
    base = train(None, 30, seed=0)
    work.add(base, name="base")
    work.add(train(base, 5, seed=1), name="base-ft", parent="base")
    work.add(train(base, 5, seed=2), name="other", tags={"task": "x"})
    checks = Checks(work)
    checks.attach("base", "evals.py:accuracy", name="inherited", inherit=True)
    checks.attach("base-*", "evals.py:accuracy", name="glob")
    checks.attach("tag:task=x", "evals.py:accuracy", name="tagged")
    names = lambda m: sorted(t.name for t in checks.applicable(m))  # noqa: E731
    assert names("base") == ["inherited"]
    assert names("base-ft") == ["glob", "inherited"]
    assert names("other") == ["tagged"]
    # Inherited by descendants added later, too.
    work.add(train(base, 5, seed=3), name="grandchild", parent="base-ft", relation="quantize")
    assert names("grandchild") == ["inherited"]

    with pytest.raises(MgitError, match="a test named 'glob' exists"):
        checks.attach("base", "evals.py:accuracy", name="glob")
    with pytest.raises(MgitError, match="no model named 'nope'"):
        checks.attach("nope", "evals.py:accuracy")
    with pytest.raises(MgitError, match="no file missing.py"):
        checks.attach("base", "missing.py:accuracy")
    with pytest.raises(MgitError, match="no module nomodule"):
        checks.attach("base", "nomodule:accuracy")
    assert not (work.root / "imported.marker").exists()  # attaching never imports user code


@needs_torch
def test_run_records_reuses_and_reruns_on_source_change(work: Repo) -> None:
    work.add(train(None, 30, seed=0), name="base")
    Checks(work).attach("base", "evals.py:accuracy", conditions=[])
    code, out, err = run_cli("test", "run", "base", cwd=work.root)
    assert code == 0, err
    assert "PASS" in out and "acc=" in out and calls(work) == 1
    code, out, _ = run_cli("test", "run", "--all", cwd=work.root)
    assert code == 0 and "PASS (recorded)" in out and calls(work) == 1
    code, out, _ = run_cli("test", "run", "base", "--force", cwd=work.root)
    assert code == 0 and calls(work) == 2
    with open(work.root / "evals.py", "a") as evals:
        evals.write("\n# edited\n")  # a new source: results are stale
    run_cli("test", "run", "base", cwd=work.root)
    assert calls(work) == 3
    code, out, _ = run_cli("test", "show", "base", "--json", cwd=work.root)
    [shown] = json.loads(out)
    assert shown["status"] == "pass" and 0.5 < shown["metrics"]["acc"] <= 1.0


@needs_torch
def test_conditions_and_change_against_the_parent(work: Repo) -> None:
    base = train(None, 40, seed=0)
    work.add(base, name="base")
    work.add(train(base, 40, seed=1, flip=True), name="flipped", parent="base")
    Checks(work).attach("base", "evals.py:accuracy", name="acc", conditions=[], inherit=True)
    code, out, _ = run_cli(
        "test",
        "add",
        "base",
        "--fn",
        "evals.py:accuracy",
        "--name",
        "strict",
        "--metric",
        "acc",
        "--min",
        "0.9",
        "--inherit",
        cwd=work.root,
    )
    assert code == 0 and "passes if acc >= 0.9" in out
    code, out, _ = run_cli(
        "test",
        "add",
        "base",
        "--fn",
        "evals.py:accuracy",
        "--name",
        "two",
        "--min",
        "acc=0.5",
        "--max",
        "loss=2",
        cwd=work.root,
    )
    assert code == 0 and "passes if acc >= 0.5, loss <= 2" in out
    code, _, err = run_cli("test", "add", "base", "--fn", "evals.py:accuracy", "--min", "0.9", cwd=work.root)
    assert code == 2 and "say which metric" in err
    code, _, err = run_cli("test", "add", "base", "--fn", "evals.py:accuracy", "--min", "acc=high", cwd=work.root)
    assert code == 2 and "'high' is not a number" in err
    run_cli("test", "rm", "two", cwd=work.root)
    result = Checks(work).run(["base"], descendants=True)
    by = {(o.model, o.test): o for o in result.outcomes}
    assert by[("base", "strict")].passed and not by[("flipped", "strict")].passed
    assert by[("flipped", "strict")].reasons[0].startswith("acc ") and "< 0.9" in by[("flipped", "strict")].reasons[0]
    flipped = by[("flipped", "acc")]
    assert flipped.parent == "base@1" and flipped.parent_status == "pass"
    assert flipped.metrics["acc"] < 0.5 < flipped.parent_metrics["acc"]
    code, out, _ = run_cli("test", "run", "flipped", cwd=work.root)
    assert code == 1 and "FAIL" in out and "acc -0." in out and "(base@1: pass)" in out


@needs_torch
def test_each_test_runs_isolated(work: Repo) -> None:
    work.add(train(None, 30, seed=0), name="m")
    for fn in ("accuracy", "crash", "hang", "exits", "nan", "verdict"):
        Checks(work).attach("m", f"evals.py:{fn}", timeout=2 if fn == "hang" else None)
    result = Checks(work).run(["m"])
    by = {o.test: o for o in result.outcomes}
    assert by["accuracy"].status == "pass"
    assert by["crash"].status == "error" and "RuntimeError: boom in the test" in by["crash"].reasons[0]
    assert by["hang"].status == "error" and "did not finish within 2 s" in by["hang"].reasons[0]
    assert by["exits"].status == "error" and "exit code 3" in by["exits"].reasons[0]
    assert by["nan"].status == "fail" and by["nan"].reasons == ["metric acc is not finite"]
    assert by["verdict"].status == "fail" and by["verdict"].reasons == ["the test returned passed: false"]
    assert "evaluated" in by["accuracy"].output
    code, out, _ = run_cli("test", "show", "m", "--output", cwd=work.root)
    assert code == 0 and "--- output of crash on m@1 ---" in out and "boom in the test" in out


@needs_torch
def test_bisect_finds_the_planted_bug_with_few_runs(work: Repo) -> None:
    state = train(None, 30, seed=0)
    for i in range(1, 9):  # base@1..@8: continued training; @5 plants a bias that later steps keep
        if i > 1:
            state = train(state, 2, seed=i)
        if i == 5:
            state["linear.bias"][1] += 1000.0
        work.add(state, name="base", message=f"step {i}")
    Checks(work).attach("base", "evals.py:accuracy", name="acc", conditions=[Condition("acc", "min", 0.8)])
    result = bisect(work, "acc", "base")
    assert (result.culprit, result.parent, result.edge) == ("base@5", "base@4", "history")
    assert result.reasons[0].startswith("acc 0.") and result.reasons[0].endswith("< 0.8")
    assert result.tests_run <= 6 < 8  # galloping and binary search, not a walk over all eight versions
    assert result.diff and result.diff["summary"]["counts"].get("changed", 0) >= 1
    again = bisect(work, "acc", "base@8")
    assert again.culprit == "base@5" and again.tests_run == 0  # every result was recorded


@needs_torch
def test_bisect_follows_lineage_to_the_ancestor_that_broke(work: Repo) -> None:
    # base@1 -> ft@1 -> q@1 pass; base@2 trained on flipped labels; ft@2 and q@2 are rebuilt
    # on it (as a cascade would) and fail. The failure came from base@1 -> base@2.
    base = train(None, 40, seed=0)
    work.add(base, name="base")
    ft = train(base, 5, seed=1)
    work.add(ft, name="ft", parent="base")
    work.add(
        {k: v.astype(np.float16).astype(np.float32) for k, v in ft.items()}, name="q", parent="ft", relation="quantize"
    )
    bad = train(base, 40, seed=2, flip=True)
    work.add(bad, name="base", message="retrained")
    ft2 = train(bad, 5, seed=1)
    work.add(ft2, name="ft", parent="base")
    work.add(
        {k: v.astype(np.float16).astype(np.float32) for k, v in ft2.items()}, name="q", parent="ft", relation="quantize"
    )
    run_cli(
        "test",
        "add",
        "base",
        "--fn",
        "evals.py:accuracy",
        "--name",
        "acc",
        "--min",
        "acc=0.8",
        "--inherit",
        cwd=work.root,
    )
    code, out, err = run_cli("bisect", "acc", "q", cwd=work.root)
    assert code == 0, err
    assert "acc started failing at base@2 (a new version from base@1, which passes)" in out
    result = bisect(work, "acc", "q")
    assert (result.culprit, result.parent) == ("base@2", "base@1") and result.tests_run == 0

    # A bug planted in one derivation edge: a quantization that writes a NaN.
    work.add(train(base, 1, seed=9), name="base", message="fixed")
    ft3 = train(work.load_state_dict("base"), 5, seed=1)
    work.add(ft3, name="ft", parent="base")
    broken = {k: v.copy() for k, v in ft3.items()}
    broken["linear.bias"][1] = np.nan
    work.add(broken, name="q-nan", parent="ft", relation="quantize")
    result = bisect(work, "acc", "q-nan")
    assert (result.culprit, result.parent, result.edge, result.relation) == ("q-nan@1", "ft@3", "lineage", "quantize")


@needs_torch
def test_bisect_errors(work: Repo) -> None:
    work.add(train(None, 30, seed=0), name="m")
    Checks(work).attach("m", "evals.py:accuracy", name="acc")
    code, _, err = run_cli("bisect", "acc", "m", cwd=work.root)
    assert code == 1 and "Error: acc passes on m@1: there is no failure to trace" in err
    code, _, err = run_cli("bisect", "nope", "m", cwd=work.root)
    assert code == 1 and err.strip() == "Error: no test named 'nope'. See: mgit test ls"


@needs_torch
def test_results_survive_a_catalog_rebuild(work: Repo) -> None:
    work.add(train(None, 30, seed=0), name="m")
    Checks(work).attach("m", "evals.py:accuracy")
    Checks(work).run(["m"])
    code, _, err = run_cli("fsck", "--rebuild-catalog", cwd=work.root)
    assert code == 0, err
    again = Checks(Repo(work.root)).run(["m"])
    assert [o.reused for o in again.outcomes] == [True] and calls(work) == 1


@needs_torch
def test_user_code_runs_only_in_commands_that_run_it(work: Repo, tmp_path: Path) -> None:
    marker = work.root / "imported.marker"
    work.add(train(None, 30, seed=0), name="m")
    (work.root / "recipes.py").write_text(
        textwrap.dedent("""
        import pathlib
        pathlib.Path("imported.marker").write_text("recipe")
        def copy(parents, out):
            pass
    """)
    )
    run_mgit(
        "add",
        str(_folder(tmp_path / "n", train(None, 3, seed=5))),
        "--name",
        "n",
        "--parent",
        "m",
        "--recipe",
        "recipes.py:copy",
        "--param",
        "seed=3",
        cwd=work.root,
    )
    for args in (
        ["test", "add", "m", "--fn", "evals.py:accuracy"],
        ["ls"],
        ["log", "n"],
        ["lineage"],
        ["show", "n"],
        ["test", "ls"],
        ["test", "show"],
        ["checkout", "n", "-o", str(tmp_path / "out")],
    ):
        proc = run_mgit(*args, cwd=work.root)
        assert proc.returncode == 0, proc.stderr
        assert not marker.exists(), args
    proc = run_mgit("test", "run", "m", cwd=work.root)
    assert proc.returncode == 0 and marker.read_text() == "yes"


@needs_torch
def test_add_records_a_recipe_without_running_it(work: Repo, tmp_path: Path) -> None:
    (work.root / "recipes.py").write_text(
        "import pathlib\npathlib.Path('imported.marker').write_text('r')\ndef tune(parents, out, seed=0):\n    pass\n"
    )
    work.add(train(None, 30, seed=0), name="base")
    code, _, err = run_cli(
        "add",
        str(_folder(tmp_path, train(None, 3, seed=5))),
        "--name",
        "ft",
        "--parent",
        "base",
        "--recipe",
        "recipes.py:tune",
        "--param",
        "seed=3",
        "--param",
        "lr=2e-5",
        "--param",
        "note=warm",
        cwd=work.root,
    )
    assert code == 0, err
    recipe = work.version("ft").recipe
    assert recipe["fn"] == "recipes.py:tune" and recipe["params"] == {"seed": 3, "lr": 2e-5, "note": "warm"}
    assert len(recipe["source_sha256"]) == 64 and not (work.root / "imported.marker").exists()
    code, _, err = run_cli("add", str(tmp_path), "--name", "x", "--recipe", "nothere.py:f", cwd=work.root)
    assert code == 1 and "cannot use 'nothere.py:f': no file nothere.py" in err


def _folder(path: Path, state: dict[str, np.ndarray]) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"))
    return path


def test_latest_results_of_many_versions_in_one_call(repo: Repo) -> None:
    (repo.root / "evals.py").write_text(
        "def size(folder):\n    return {'n': 1.0}\ndef never(folder):\n    return {'n': 0.0, 'passed': False}\n"
    )
    repo.add({"w": np.ones(4, np.float32)}, name="base")
    repo.add({"w": np.full(4, 2, np.float32)}, name="ft", parent="base")
    repo.add({"w": np.zeros(4, np.float32)}, name="other")
    checks = Checks(repo)
    checks.attach("base", "evals.py:size", inherit=True)
    checks.attach("ft", "evals.py:never")
    checks.run()
    checks.attach("o*", "evals.py:size", name="glob")  # never run
    lineage = repo.lineage
    assert {n: [t.name for t in checks.applicable(n, lineage)] for n in lineage.nodes} == {
        "base": ["size"],
        "ft": ["never", "size"],
        "other": ["glob"],
    }
    assert checks.applicable_all(lineage) == {n: checks.applicable(n, lineage) for n in lineage.nodes}
    heads = {n: lineage.nodes[n].head for n in lineage.nodes}
    with pytest.MonkeyPatch.context() as mp:  # the versions' names in one query, not one by one
        mp.setattr(ResultTable, "model_seq", lambda self, vid: pytest.fail(f"{vid} looked up alone"))
        found = checks.latest(list(heads.values()))
    assert found[heads["other"]] == {}
    assert {t: o.status for t, o in found[heads["ft"]].items()} == {"never": "fail", "size": "pass"}
    assert found[heads["ft"]] == {t: checks.recorded(heads["ft"], t) for t in ("never", "size")}  # one by one
    assert checks.latest([heads["ft"]], {heads["ft"]: ("as-given", 9)})[heads["ft"]]["size"].ref == "as-given@9"
