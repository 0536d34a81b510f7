"""Verdicts: a recorded result is judged by the test's registration in force now (in `test
run`, `test show`, bisect, the cascade's plan and run, and `mgit serve`), a test that raises
is an error and not a failure, and a cascade's exit status, dry run and run agree. A family
whose models state their accuracy in config.json (tests/fixtures/scored): no torch, fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import copy_user_code, make_model, mgit_json, one_line_error, run_cli

from mgit import Repo
from mgit.bisect import bisect
from mgit.cascade import plan_cascade
from mgit.checks import Checks

LOW, HIGH = ("--metric", "acc", "--min", "0.6"), ("--metric", "acc", "--min", "0.995")


def scored_model(path: Path, seed: int, acc: float | None) -> Path:
    make_model(path, seed=seed)
    config = {"model_type": "toy", "seed": seed} | ({} if acc is None else {"acc": acc})
    (path / "config.json").write_text(json.dumps(config))
    return path


def add(root: Path, name: str, seed: int, acc: float | None, *extra: str) -> None:
    mgit_json(root, "add", str(scored_model(root / "made" / f"{name}-{seed}", seed, acc)), "--name", name, *extra)


@pytest.fixture
def family(tmp_path: Path) -> Path:
    """base@1 (acc 0.9) -> ft@1 (acc 0.7, recipe tune) -> ft-fp16@1 (recipe tune), then ft@2
    (acc 0.7): ft-fp16 is built on an old ft. No test attached."""
    assert run_cli("init", str(tmp_path))[0] == 0
    copy_user_code(tmp_path, "scored")
    add(tmp_path, "base", 1, 0.9)
    add(tmp_path, "ft", 2, 0.7, "--parent", "base", "--recipe", "recipes.py:tune", "--param", "acc=0.7")
    add(tmp_path, "ft-fp16", 3, 0.7, "--parent", "ft", "--recipe", "recipes.py:tune", "--param", "acc=0.7")
    add(tmp_path, "ft", 4, 0.7, "-m", "ft retrained")
    return tmp_path


def cli_json(root: Path, *args: str) -> tuple[int, Any]:
    code, out, err = run_cli(*args, "--json", cwd=root)
    assert out, err
    return code, json.loads(out)


def attach(root: Path, name: str, fn: str, *bounds: str, target: str = "ft") -> None:
    code, _, err = run_cli(
        "test", "add", target, "--fn", f"evals.py:{fn}", "--name", name, *bounds, "--inherit", cwd=root
    )
    assert code == 0, err


def planned(report: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {s["model"]: (s["action"], s["reason"]) for s in report["plan"]["steps"]}


# --- item 1: verdicts are judged by the registration in force, not stored ----------------------
def test_a_test_attached_again_with_other_bounds_rejudges_its_recorded_metrics(family: Path) -> None:
    attach(family, "agree", "accuracy", *HIGH)
    code, run = cli_json(family, "test", "run", "ft")
    assert code == 1 and [(o["status"], o["reasons"]) for o in run["outcomes"]] == [("fail", ["acc 0.7 < 0.995"])]
    code, dry = cli_json(family, "cascade", "ft", "--dry-run")
    assert planned(dry) == {"ft-fp16": ("blocked", "ft@2 fails agree")}

    assert run_cli("test", "rm", "agree", cwd=family)[0] == 0
    attach(family, "agree", "accuracy", *LOW)

    code, out, err = run_cli("test", "run", "ft", cwd=family)
    assert code == 0 and "PASS (recorded" in out and "0.995" not in out, (out, err)
    code, run = cli_json(family, "test", "run", "ft")
    [o] = run["outcomes"]
    assert code == 0 and (o["status"], o["reasons"], o["reused"], o["metrics"]) == ("pass", [], True, {"acc": 0.7})
    assert o["recorded_status"] == "fail"  # what was recorded under the old bound, for the record
    code, shown = cli_json(family, "test", "show", "ft")
    assert code == 0 and [(o["test"], o["status"]) for o in shown] == [("agree", "pass")]
    code, dry = cli_json(family, "cascade", "ft", "--dry-run")
    assert code == 0 and planned(dry) == {"ft-fp16": ("recipe", None)}

    # The library says the same, with no run in between: every reader judges.
    repo = Repo(family)
    checks, ft = Checks(repo), repo.resolve("ft")
    assert checks.recorded(ft, "agree").status == "pass" and checks.failing(ft) == []
    assert checks.latest([ft])[ft]["agree"].status == "pass" and checks.show("ft")[0].passed
    assert [(s.model, s.action) for s in plan_cascade(repo, "ft").steps] == [("ft-fp16", "recipe")]
    assert not bisect_fails(repo, "agree", "ft")

    # And back: a stricter bound fails the same recorded metrics, with the reason it gives now.
    checks.detach("agree")
    attach(family, "agree", "accuracy", "--metric", "acc", "--min", "0.8")
    assert checks.recorded(ft, "agree").reasons == ["acc 0.7 < 0.8"]
    code, out, _ = run_cli("test", "run", "ft", cwd=family)
    assert code == 1 and "FAIL (recorded" in out and "acc 0.7 < 0.8" in out


def bisect_fails(repo: Repo, test: str, ref: str) -> bool:
    try:
        bisect(repo, test, ref)
    except Exception as exc:  # NothingToBisectError: the start passes
        assert "passes" in str(exc), exc
        return False
    return True


def test_the_web_pages_judge_by_the_registration_in_force(family: Path) -> None:
    pytest.importorskip("starlette")
    from starlette.testclient import TestClient

    from mgit.web.app import create_app

    attach(family, "agree", "accuracy", *HIGH)
    assert run_cli("test", "run", "ft", cwd=family)[0] == 1
    Checks(Repo(family)).detach("agree")
    attach(family, "agree", "accuracy", *LOW)
    repo = Repo(family)
    ft = repo.resolve("ft")
    with TestClient(create_app(repo), base_url="http://127.0.0.1:8808") as client:
        rows = {r["model"]: r for r in client.get("/api/tests").json()["rows"]}
        assert rows["ft"]["cells"]["agree"]["status"] == "pass"
        models = {m["name"]: m for m in client.get("/api/models").json()["models"]}
        assert models["ft"]["tests"]["status"] == "pass"
        page = client.get("/api/models/ft").json()["tests"]["versions"]
        assert [v["results"]["agree"]["status"] for v in page if v["version"] == ft] == ["pass"]
        result = client.get("/api/tests/result", params={"version": ft, "test": "agree"}).json()["result"]
        assert result["status"] == "pass" and result["recorded_status"] == "fail"
        page = client.get("/tests/result", params={"version": ft, "test": "agree"}).text
        assert 'id="judged"' in page and "judged now by the test" in page


# --- item 7: an exception in the test is an error, not a failure -------------------------------
def test_a_test_that_raises_is_an_error_counted_apart(family: Path) -> None:
    attach(family, "acc", "accuracy", *LOW)
    attach(family, "strict", "accuracy", *HIGH)
    attach(family, "attr", "attribute")
    code, out, err = run_cli("test", "run", "ft", cwd=family)
    assert code == 1 and "1 test passed, 1 failed, 1 error" in out, (out, err)
    assert "ERROR" in out and "AttributeError: 'dict' object has no attribute 'acc'" in out
    code, run = cli_json(family, "test", "run", "ft")
    assert code == 1 and (run["passed"], run["failed"], run["errors"]) == (1, 1, 1)
    by = {o["test"]: o for o in run["outcomes"]}
    assert by["attr"]["status"] == "error" and by["strict"]["status"] == "fail"
    assert by["attr"]["reasons"] == ["the test raised AttributeError: 'dict' object has no attribute 'acc'"]
    # An error alone still makes the exit status 1.
    code, run = cli_json(family, "test", "run", "ft", "--test", "attr")
    assert code == 1 and (run["passed"], run["failed"], run["errors"]) == (0, 0, 1)
    # A cascade does not build on it, and says why in words that name the error.
    code, dry = cli_json(family, "cascade", "ft", "--dry-run")
    assert code == 1 and planned(dry)["ft-fp16"] == ("blocked", "ft@2 fails strict; errors in attr")


def test_bisect_says_error_where_the_test_started_to_raise(family: Path) -> None:
    attach(family, "acc", "accuracy", *LOW, target="base")
    add(family, "base", 5, None, "-m", "config without acc")  # accuracy raises KeyError on it
    code, found = cli_json(family, "bisect", "acc", "base")
    assert code == 0 and (found["culprit"], found["parent"], found["status"]) == ("base@2", "base@1", "error")
    assert found["reasons"] == ["the test raised KeyError: 'acc'"]
    code, out, _ = run_cli("bisect", "acc", "base", cwd=family)
    assert code == 0 and "acc started to raise an error at base@2 (a new version from base@1, which passes)" in out


# --- item 11: a cascade's exit status; its dry run and its run agree ---------------------------
AGREE = {"recipe": ("updated", "failed-recipe", "failed-tests")}  # what a planned rebuild becomes
EXPECTED = {
    None: {"ft": ("blocked", "base@2 fails strict"), "ft-fp16": ("blocked", "below ft, which is blocked")},
    "ft-fp16": {
        "ft": ("skipped", "not matched by --only ft-fp16"),
        "ft-fp16": ("blocked", "below ft, which is skipped"),
    },
    "ft*": {"ft": ("blocked", "base@2 fails strict"), "ft-fp16": ("blocked", "below ft, which is blocked")},
}


def strict_base(family: Path) -> None:
    """The test `strict` (acc >= 0.995) on base alone, which fails it; base@2 (ft is built on base@1)."""
    code, _, err = run_cli("test", "add", "base", "--fn", "evals.py:accuracy", "--name", "strict", *HIGH, cwd=family)
    assert code == 0, err
    add(family, "base", 6, 0.9, "-m", "base retrained")


@pytest.mark.parametrize("only", [None, "ft-fp16", "ft*"])
def test_a_blocked_cascade_exits_1_and_its_dry_run_says_what_the_run_does(family: Path, only: str | None) -> None:
    strict_base(family)
    extra = ("--only", only) if only else ()
    # Not run yet: the dry run runs no test, and names the one the run will run first.
    code, dry = cli_json(family, "cascade", "base", "--dry-run", *extra)
    if only == "ft-fp16":
        assert code == 1 and planned(dry) == EXPECTED[only]
    else:
        steps = {s["model"]: s for s in dry["plan"]["steps"]}
        assert code == 0 and steps["ft"]["action"] == "recipe" and steps["ft"]["untested"] == ["base@2: strict"]
        code, out, _ = run_cli("cascade", "base", "--dry-run", *extra, cwd=family)
        assert "not tested yet, the run tests first: base@2: strict" in out
    assert run_cli("test", "run", "base", cwd=family)[0] == 1  # now recorded: base@2 fails strict

    code_dry, dry = cli_json(family, "cascade", "base", "--dry-run", *extra)
    code_run, done = cli_json(family, "cascade", "base", *extra)
    plan = {s["model"]: s["action"] for s in dry["plan"]["steps"]}
    ran = {r["model"]: r["status"] for r in done["results"]}
    assert plan.keys() == ran.keys() and all(ran[m] in AGREE.get(a, (a,)) for m, a in plan.items()), (plan, ran)
    assert planned(dry) == EXPECTED[only] == {r["model"]: (r["status"], r["reason"]) for r in done["results"]}
    assert (code_dry, dry["ok"], code_run, done["ok"]) == (1, False, 1, False)
    code, out, _ = run_cli("cascade", "base", *extra, cwd=family)
    assert code == 1 and "ft-fp16 is blocked: below ft" in out
    assert len(Repo(family).log("ft")) == 2  # nothing was built


def test_ignore_tests_overrides_a_failing_parent_test_and_says_so(family: Path) -> None:
    strict_base(family)
    assert run_cli("test", "run", "base", cwd=family)[0] == 1
    code, dry = cli_json(family, "cascade", "base", "--dry-run", "--ignore-tests", "strict")
    steps = {s["model"]: s for s in dry["plan"]["steps"]}
    assert code == 0 and dry["plan"]["ignored_tests"] == ["strict"]
    assert (steps["ft"]["action"], steps["ft"]["ignored"]) == ("recipe", ["base@2 fails strict"])
    code, out, err = run_cli("cascade", "base", "--ignore-tests", "strict", cwd=family)
    assert code == 0, out + err
    assert "Failing tests ignored (--ignore-tests): strict" in out
    assert "ft was rebuilt over failing tests ignored: base@2 fails strict" in out
    repo = Repo(family)
    assert [v.message for v in repo.log("ft")][0] == (
        "cascade from base@2: recipes.py:tune re-run on base@2; failing tests ignored (--ignore-tests): "
        "base@2 fails strict"
    )
    assert len(repo.log("ft-fp16")) == 2  # rebuilt on the new ft: no ignored test failed on it
    assert "ignored" not in repo.log("ft-fp16")[0].message


def test_ignore_tests_names_an_attached_test(family: Path) -> None:
    one_line_error(run_cli("cascade", "base", "--ignore-tests", "nosuch", cwd=family), "nosuch")


def test_an_ignored_test_failing_on_a_rebuilt_model_blocks_nothing_below_it(family: Path) -> None:
    attach(family, "strict", "accuracy", *HIGH, target="base")  # inherited: fails on every model
    add(family, "base", 7, 0.9, "-m", "base retrained")
    code, done = cli_json(family, "cascade", "base", "--ignore-tests", "strict")
    results = {r["model"]: r for r in done["results"]}
    assert code == 0 and done["ok"] and [r["status"] for r in results.values()] == ["updated", "updated"]
    assert results["ft"]["ignored"] == ["base@2 fails strict", "ft@3 fails strict"]
    assert results["ft-fp16"]["ignored"] == ["ft@3 fails strict", "ft-fp16@2 fails strict"]
    assert [t["status"] for t in results["ft-fp16"]["tests_after"]] == ["fail"]  # shown, not hidden
    assert Repo(family).log("ft-fp16")[0].message.endswith("failing tests ignored (--ignore-tests): ft@3 fails strict")
    # Without the override the same failure blocks: the first model and everything below it.
    add(family, "base", 8, 0.9, "-m", "base retrained again")
    code, done = cli_json(family, "cascade", "base")
    assert code == 1 and [r["status"] for r in done["results"]] == ["blocked", "blocked"]


def test_results_recorded_before_errors_were_told_apart_keep_their_status(family: Path) -> None:
    attach(family, "acc", "accuracy", *LOW)
    repo = Repo(family)
    checks, ft = Checks(repo), repo.resolve("ft")
    source = checks.source_of(checks.test("acc"))[0]
    old = {  # as an older MGit recorded a test that raised: a failure without metrics
        "version": ft,
        "test": "acc",
        "source": source,
        "status": "fail",
        "metrics": "{}",
        "reasons": json.dumps(["the test exit code 1: RuntimeError: boom"]),
        "output": "",
        "seconds": 0.1,
        "time": "2026-01-01T00:00:00Z",
        "origin": "someone@elsewhere",
    }
    assert checks.add_results([old]) == 1
    [shown] = checks.show("ft")
    assert (shown.status, shown.reasons, shown.recorded_status) == (
        "fail",
        ["the test exit code 1: RuntimeError: boom"],
        None,
    )
    code, run = cli_json(family, "test", "run", "ft")
    [o] = run["outcomes"]
    assert code == 1 and (o["status"], o["reused"]) == ("fail", True) and (run["failed"], run["errors"]) == (1, 0)
