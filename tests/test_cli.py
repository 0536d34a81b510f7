"""The command line: help with an example on every command, `--json` twins, one-line errors
with exit code 1, usage errors with 2, tracebacks only with MGIT_DEBUG=1."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
import pytest
from conftest import copy_user_code, make_model, mgit_json, run_cli, run_mgit, sha256_tree, tensors

from mgit import Repo
from mgit.cli.main import cli


def _leaves(group: click.Group, prefix: tuple[str, ...] = ()) -> list[str]:
    """Every runnable command as it is typed ("ls", "lineage tree", "test run")."""
    out = []
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            out += _leaves(command, (*prefix, name))
        else:
            out.append(" ".join((*prefix, name)))
    return sorted(out)


COMMANDS = _leaves(cli)
# Each prints its result as data with --json (see the tests of the JSON twins below).
DATA_COMMANDS = {
    "init",
    "add",
    "checkout",
    "ls",
    "log",
    "show",
    "du",
    "fsck",
    "gc",
    "rm",
    "tag",
    "rename",
    "sign",
    "verify",
    "config",
    "diff",
    "graph",
    "lineage tree",
    "lineage suggest",
    "test add",
    "test ls",
    "test run",
    "test show",
    "bisect",
    "cascade",
    "remote add",
    "remote ls",
    "remote rm",
    "remote show",
    "push",
    "fetch",
    "pull",
    "clone",
    "merge",
    "import-hf",
    "export-hf",
    "status",
    "prune-run",
}
NO_DATA = {"test rm", "serve"}  # one confirmation line; a server (its data is its /api, tests/test_serve.py)


def test_every_command_is_covered_here() -> None:
    assert set(COMMANDS) == DATA_COMMANDS | NO_DATA


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_with_an_example(command: str) -> None:
    code, out, _ = run_cli(*command.split(), "--help")
    assert code == 0
    assert "Example" in out and f"mgit {command}" in out
    assert "--json" in out or command in NO_DATA


@pytest.mark.parametrize("command", COMMANDS)
def test_no_example_in_help_runs_two_lines_together(command: str) -> None:
    # A continuation written as a single backslash in a docstring joins its two lines (the
    # second's indentation left in the middle of the first).
    code, out, _ = run_cli(*command.split(), "--help")
    assert code == 0
    assert [line for line in out.splitlines() if line.lstrip().startswith("mgit ") and "     --" in line] == []


@pytest.mark.parametrize(
    "group",
    sorted(
        n
        for n in cli.list_commands(click.Context(cli))
        if isinstance(cli.get_command(click.Context(cli), n), click.Group)
    ),
)
def test_every_group_has_help_with_an_example(group: str) -> None:
    code, out, _ = run_cli(group, "--help")
    assert code == 0 and "Example" in out and f"mgit {group}" in out


@pytest.fixture
def work(tmp_path: Path) -> Path:
    code, _, _ = run_cli("init", str(tmp_path))
    assert code == 0
    make_model(tmp_path / "base", seed=1)
    make_model(tmp_path / "ft", seed=2)
    return tmp_path


def test_tour_through_the_commands(work: Path) -> None:
    added = mgit_json(work, "add", "base", "--name", "base", "-m", "first")
    assert added["created"] and added["seq"] == 1 and added["tensors"] == 6
    ft = mgit_json(work, "add", "ft", "--name", "ft", "--parent", "base", "--relation", "finetune", "-t", "k=v")
    assert ft["parents"][0]["model"] == "base" and ft["parents"][0]["relation"] == "finetune"

    models = mgit_json(work, "ls")
    assert [m["name"] for m in models] == ["base", "ft"]
    log = mgit_json(work, "log", "ft")
    assert log[0]["tags"] == {"k": "v"} and log[0]["id"] == ft["version"]
    shown = mgit_json(work, "show", "base@1")
    assert shown["version"]["message"] == "first"
    du = mgit_json(work, "du")
    assert du["logical_bytes"] == added["logical_bytes"] + ft["logical_bytes"] and du["stored_bytes"] > 0
    assert mgit_json(work, "fsck")["ok"] is True

    code, out, _ = run_cli("checkout", "ft", "-o", str(work / "out"), cwd=work)
    assert code == 0 and "verified" in out
    assert sha256_tree(work / "out") == sha256_tree(work / "ft")

    code, out, _ = run_cli("ls", cwd=work)
    assert "base" in out and "ft" in out and "base@1 (finetune)" in out
    code, out, _ = run_cli("du", cwd=work)
    assert code == 0 and "repository" in out
    removed = mgit_json(work, "rm", "ft")
    assert removed["model"] == "ft"
    gc = mgit_json(work, "gc")
    assert gc["removed"] and not gc["dry_run"]


# --- JSON twins (the tour above covers add, ls, log, show, du, fsck, rm and gc) -----------------


def scored_model(path: Path, seed: int, acc: float) -> Path:
    """A model folder whose config.json states its accuracy (what evals.py:accuracy reads)."""
    make_model(path, seed=seed)
    (path / "config.json").write_text(json.dumps({"model_type": "toy", "seed": seed, "acc": acc}))
    return path


@pytest.fixture
def scored(work: Path) -> Path:
    """base@1 (acc 0.9); ft@1 (acc 0.85), derived from it by the recipe recipes.py:tune; the
    test `acc` (acc >= 0.5) attached to base and inherited by ft. Nothing run yet."""
    copy_user_code(work, "scored")
    mgit_json(work, "add", str(scored_model(work / "base-v1", 1, 0.9)), "--name", "base")
    mgit_json(
        work,
        "add",
        str(scored_model(work / "ft-v1", 2, 0.85)),
        "--name",
        "ft",
        "--parent",
        "base",
        "--recipe",
        "recipes.py:tune",
        "--param",
        "acc=0.85",
    )
    code, _, err = run_cli(
        "test", "add", "base", "--fn", "evals.py:accuracy", "--name", "acc", "--min", "acc=0.5", "--inherit", cwd=work
    )
    assert code == 0, err
    return work


def test_init_json(tmp_path: Path) -> None:
    assert mgit_json(tmp_path, "init", str(tmp_path / "r")) == {"path": str(tmp_path / "r" / ".mgit"), "bare": False}
    assert mgit_json(tmp_path, "init", "--bare", str(tmp_path / "b")) == {"path": str(tmp_path / "b"), "bare": True}
    assert (tmp_path / "r" / ".mgit").is_dir()


def test_checkout_json(work: Path) -> None:
    added = mgit_json(work, "add", "base", "--name", "base")

    done = mgit_json(work, "checkout", "base", "-o", str(work / "out"))

    assert (done["model"], done["seq"], done["version"]) == ("base", 1, added["version"])
    assert done["out_dir"] == str(work / "out") and done["bytes"] == added["logical_bytes"]
    files = {f["path"]: f for f in done["files"]}
    assert sorted(files) == sorted(sha256_tree(work / "out")) == sorted(sha256_tree(work / "base"))
    assert files["model.safetensors"]["tensors"] == 6 and files["config.json"]["tensors"] == 0
    assert all(f["size"] == (work / "out" / path).stat().st_size for path, f in files.items())


def test_test_commands_json(scored: Path) -> None:
    attached = mgit_json(
        scored, "test", "add", "ft", "--fn", "evals.py:accuracy", "--name", "strict", "--metric", "acc", "--min", "0.99"
    )
    source = attached.pop("source")  # the source file, stored as an object when attached
    assert attached == {
        "name": "strict",
        "fn": "evals.py:accuracy",
        "target": "ft",
        "inherit": False,
        "conditions": [{"metric": "acc", "bound": "min", "value": 0.99}],
        "timeout": None,
        "resources": {},
    }
    assert Repo(scored).store.get(source)[1].tobytes() == (scored / "evals.py").read_bytes()
    listed = mgit_json(scored, "test", "ls")
    assert [t["name"] for t in listed] == ["acc", "strict"] and listed[1] == {**attached, "source": source}
    assert listed[0]["target"] == "base" and listed[0]["inherit"] is True

    code, out, err = run_cli("test", "run", "--all", "--json", cwd=scored)
    assert code == 1, err  # strict fails on ft
    run = json.loads(out)
    got = {(o["model"], o["test"]): (o["status"], o["metrics"], o["reused"]) for o in run["outcomes"]}
    assert got == {
        ("base", "acc"): ("pass", {"acc": 0.9}, False),
        ("ft", "acc"): ("pass", {"acc": 0.85}, False),
        ("ft", "strict"): ("fail", {"acc": 0.85}, False),
    }
    assert (run["passed"], run["failed"], run["skipped"]) == (2, 1, [])
    ft_strict = next(o for o in run["outcomes"] if o["test"] == "strict")
    assert ft_strict["reasons"] == ["acc 0.85 < 0.99"] and ft_strict["parent"] == "base@1"

    shown = mgit_json(scored, "test", "show", "ft")
    assert [(o["test"], o["status"], o["metrics"]) for o in shown] == [
        ("acc", "pass", {"acc": 0.85}),
        ("strict", "fail", {"acc": 0.85}),
    ]
    assert shown[0]["parent_status"] == "pass" and shown[0]["parent_metrics"] == {"acc": 0.9}


def test_bisect_json(scored: Path) -> None:
    mgit_json(scored, "add", str(scored_model(scored / "base-v2", 1, 0.2)), "--name", "base", "-m", "regressed")
    code, out, err = run_cli("test", "run", "base", "--json", cwd=scored)
    assert code == 1 and json.loads(out)["failed"] == 1, err

    found = mgit_json(scored, "bisect", "acc", "base")

    assert (found["start"], found["culprit"], found["parent"], found["edge"]) == (
        "base@2",
        "base@2",
        "base@1",
        "history",
    )
    assert found["reasons"] == ["acc 0.2 < 0.5"]
    assert [(s["ref"], s["status"]) for s in found["steps"]] == [("base@2", "fail"), ("base@1", "pass")]
    assert found["tests_run"] == 1  # base@2's result was recorded by the run above
    assert found["diff"]["summary"]["files"] == {"changed": 1, "identical": 2}  # only config.json differs


def test_cascade_json(scored: Path) -> None:
    new_base = mgit_json(scored, "add", str(scored_model(scored / "base-v2", 3, 0.95)), "--name", "base")
    old_ft = mgit_json(scored, "log", "ft")[0]["id"]

    dry = mgit_json(scored, "cascade", "base", "--dry-run")  # a report with the plan and no results
    assert dry["dry_run"] is True and dry["results"] == []
    plan = dry["plan"]

    assert (plan["ref"], plan["version"]) == ("base@2", new_base["version"])
    [step] = plan["steps"]
    assert (step["model"], step["head_ref"], step["action"]) == ("ft", "ft@1", "recipe")
    assert [(p["recorded_ref"], p["ref"]) for p in step["parents"]] == [("base@1", "base@2")]
    assert step["recipe"]["fn"] == "recipes.py:tune" and step["recipe"]["params"] == {"acc": 0.85}
    assert mgit_json(scored, "log", "ft")[0]["id"] == old_ft  # a dry run changes nothing

    report = mgit_json(scored, "cascade", "base")

    [result] = report["results"]
    assert (result["model"], result["status"], result["old_ref"], result["new_ref"]) == (
        "ft",
        "updated",
        "ft@1",
        "ft@2",
    )
    assert result["rebuilt_on"] == ["base@2"] and report["dry_run"] is False
    assert [(t["test"], t["status"], t["metrics"]) for t in result["tests_after"]] == [("acc", "pass", {"acc": 0.85})]
    ft = mgit_json(scored, "show", "ft")["version"]
    assert ft["id"] == result["new"] and ft["parents"][0]["version"] == new_base["version"]
    code, _, err = run_cli("checkout", "ft", "-o", str(scored / "ft-v2"), cwd=scored)
    assert code == 0, err
    assert json.loads((scored / "ft-v2" / "config.json").read_text())["acc"] == 0.85  # the recipe ran on base@2
    assert sha256_tree(scored / "ft-v2")["model.safetensors"] == sha256_tree(scored / "base-v2")["model.safetensors"]


def test_lineage_graph_diff_and_suggest_json(scored: Path) -> None:
    mgit_json(scored, "add", str(scored_model(scored / "base-v2", 3, 0.95)), "--name", "base")

    [tree] = mgit_json(scored, "lineage")
    assert (tree["model"]["name"], tree["model"]["seq"], tree["edge"]) == ("base", 2, None)
    [child] = tree["children"]
    assert child["model"]["name"] == "ft" and child["children"] == []
    edge = child["edge"]
    assert (edge["relation"], edge["parent_seq"], edge["latest_seq"], edge["stale"]) == ("finetune", 1, 2, True)
    [up] = mgit_json(scored, "lineage", "tree", "ft", "--up")
    assert [up["model"]["name"], up["children"][0]["model"]["name"]] == ["ft", "base"]

    graph = mgit_json(scored, "graph")
    assert [n["name"] for n in graph["nodes"]] == ["base", "ft"]
    assert [(e["parent"], e["child"], e["stale"]) for e in graph["edges"]] == [("base", "ft", True)]

    diff = mgit_json(scored, "diff", "base@1", "base@2")  # "base" alone is the folder of that name
    assert (diff["a"]["label"], diff["b"]["label"]) == ("base@1", "base@2")
    assert diff["summary"]["counts"] == {"changed": 3, "identical": 3}  # new weights; zero biases, positions
    assert {f["path"]: f["status"] for f in diff["files"]}["config.json"] == "changed"

    state = tensors(1)  # base@1's weights, cast to float16: a quantization of it
    quantized = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in state.items()}
    make_model(scored / "q", state=quantized)
    suggestion = mgit_json(scored, "lineage", "suggest", str(scored / "q"))
    best = suggestion["candidates"][0]
    assert (best["model"], best["seq"], best["relation"]) == ("base", 1, "quantize")
    assert suggestion["parents"] == [best["version"]] and suggestion["verdict"].startswith("base@1 (quantize)")


def test_unchanged_add_says_so(work: Path) -> None:
    run_cli("add", "base", "--name", "base", cwd=work)
    code, out, _ = run_cli("add", "base", "--name", "base", cwd=work)
    assert code == 0 and "unchanged" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["show", "nope"], "Error: no model named 'nope'. See: mgit ls"),
        (["log", "base@9"], "Error: model 'base' has 1 version; no version named 'base@9'"),
        (["checkout", "nope", "-o", "x"], "Error: no model named 'nope'"),
        (["add", "missing-folder", "--name", "x"], "Error: missing-folder: no such file or folder"),
        (["add", "base", "--name", "../x"], "Error: invalid model name '../x'"),
        (["init"], "Error: a repository already exists at .mgit"),
        (["init", "{work}"], "Error: a repository already exists at {work}/.mgit"),
        (["test", "rm", "nope"], "Error: no test named 'nope'. See: mgit test ls"),
        (["test", "show", "nope"], "Error: no model named 'nope'. See: mgit ls"),
        (["test", "show", "bsae"], "Error: no model named 'bsae'. Did you mean 'base'? See: mgit ls"),
        (
            ["test", "show", "base@2"],
            "Error: model 'base' has 1 version; no version named 'base@2'. See: mgit log base",
        ),
    ],
)
def test_errors_are_one_line_with_exit_code_1(work: Path, args: list[str], message: str) -> None:
    run_cli("add", "base", "--name", "base", cwd=work)
    before = {sub: sha256_tree(work / ".mgit" / sub) for sub in ("objects", "refs")}
    code, out, err = run_cli(*(a.format(work=work) for a in args), cwd=work)
    assert code == 1 and out == ""
    message = message.format(work=work)
    assert err.startswith(message), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert {sub: sha256_tree(work / ".mgit" / sub) for sub in ("objects", "refs")} == before


@pytest.mark.parametrize(
    "args",
    [
        ["add"],
        ["add", "base", "--name", "x", "--relation", "cousin"],
        ["frobnicate"],
        ["log", "-n", "-1"],
        ["add", "base", "--name", "x", "--tag", "novalue"],
    ],
)
def test_usage_errors_exit_2(work: Path, args: list[str]) -> None:
    code, _, err = run_cli(*args, cwd=work)
    assert code == 2, err
    assert "Usage:" in err or "Error:" in err


def test_outside_a_repository(tmp_path: Path) -> None:
    code, _, err = run_cli("ls", cwd=tmp_path)
    assert code == 1 and "not an mgit repository" in err and "mgit init" in err


def test_dash_c_and_mgit_dir(work: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    code, _, err = run_cli("-C", str(work), "add", str(work / "base"), "--name", "base", cwd=elsewhere)
    assert code == 0, err
    code, out, _ = run_cli("-C", str(work), "ls", cwd=elsewhere)
    assert code == 0 and "base" in out
    code, out, _ = run_cli("ls", cwd=elsewhere, env={"MGIT_DIR": str(work / ".mgit")})
    assert code == 0 and "base" in out


def test_fsck_exits_1_on_corruption(work: Path) -> None:
    run_cli("add", "base", "--name", "base", cwd=work)
    obj = next(p for p in (work / ".mgit" / "objects").rglob("*") if p.is_file() and p.stat().st_size > 1000)
    obj.chmod(0o644)
    data = bytearray(obj.read_bytes())
    data[-3] ^= 0xFF
    obj.write_bytes(bytes(data))
    code, out, _ = run_cli("fsck", cwd=work)
    assert code == 1 and "corrupt" in out and "base@1" in out


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
def test_gc_refuses_when_a_reachable_object_is_damaged(work: Path, damage: str) -> None:
    mgit_json(work, "add", "base", "--name", "base")
    mgit_json(work, "add", "ft", "--name", "ft", "--parent", "base")
    mgit_json(work, "add", "ft", "--name", "old")
    mgit_json(work, "rm", "old")
    assert mgit_json(work, "gc", "--dry-run")["removed"]  # there is garbage to collect
    vid = mgit_json(work, "log", "ft")[0]["id"]
    record = work / ".mgit" / "objects" / vid[:2] / vid[2:]  # ft's head version: reachable
    if damage == "missing":
        record.unlink()
    else:
        record.chmod(0o644)
        record.write_bytes(record.read_bytes()[:-3] + b"XXX")
    objects = sha256_tree(work / ".mgit" / "objects")

    code, out, err = run_cli("gc", cwd=work)

    assert code == 1 and out == ""
    assert err.startswith(f"Error: cannot collect garbage: object {vid[:16]} is {damage}. Run: mgit fsck"), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sha256_tree(work / ".mgit" / "objects") == objects  # nothing removed


def test_real_process_exit_codes_and_debug_traceback(work: Path) -> None:
    proc = run_mgit("show", "nope", cwd=work)
    assert proc.returncode == 1 and proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    proc = run_mgit("show", "nope", cwd=work, env={"MGIT_DEBUG": "1"})
    assert proc.returncode == 1 and "Traceback" in proc.stderr
    proc = run_mgit("--version", cwd=work)
    assert proc.returncode == 0 and "mgit" in proc.stdout


def test_a_nan_metric_is_null_in_every_json(scored: Path) -> None:
    # One convention for numbers JSON cannot hold: null, in the run, the recorded results and
    # the cascade's report alike (never the string "nan").
    code, _, err = run_cli("test", "add", "base", "--fn", "evals.py:broken", "--name", "broken", cwd=scored)
    assert code == 0, err
    code, out, _ = run_cli("test", "run", "base", "--test", "broken", "--json", cwd=scored)
    assert code == 1 and '"nan"' not in out and "NaN" not in out
    [outcome] = json.loads(out)["outcomes"]
    assert outcome["metrics"] == {"loss": None, "acc": 1.0} and outcome["status"] == "fail"
    [shown] = [o for o in mgit_json(scored, "test", "show", "base") if o["test"] == "broken"]
    assert shown["metrics"] == {"loss": None, "acc": 1.0}
