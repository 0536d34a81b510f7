"""A cluster node's tasks take their jobs as untrusted input: a forged recipe or test job
(a path out of the work folder, an id that is not an object id, a reference that is not a
module or a relative file, an unbounded number, a source that is not the recipe's) is
refused in one line before the node opens its cache or runs anything.

The node-side functions are called directly, as a Ray worker would call them, against a
real folder remote; no Ray cluster is needed. Every job's code touches a marker file (the one
MGIT_TEST_MARKER names), so "nothing ran" is checked on disk.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, make_model, run_cli

from mgit import Repo, sync
from mgit.cluster import node
from mgit.errors import InvalidJobError
from mgit.execution import CheckJob, RecipeJob
from mgit.remotes import RemoteSpec

OID = "ab" * 32


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A driver's repository pushed to a folder remote, the node cache's folder, a marker,
    and a well-formed test job and recipe job."""
    marker = tmp_path / "ran.txt"
    monkeypatch.setenv("MGIT_TEST_MARKER", str(marker))
    assert run_cli("init", "--bare", str(tmp_path / "remote.mgit"))[0] == 0
    driver = Repo.init(tmp_path / "driver")
    sync.add_remote(driver, "origin", str(tmp_path / "remote.mgit"))
    vid = driver.add(make_model(tmp_path / "src"), name="base").version
    tuned = driver.add(make_model(tmp_path / "tuned", seed=7), name="tuned", parent="base").version
    sync.push(driver)
    monkeypatch.setenv(node.CACHE_VARIABLE, str(tmp_path / "cache"))
    evals, recipes = (FIXTURES / "tune" / "evals.py").read_bytes(), (FIXTURES / "tune" / "recipes.py").read_bytes()
    record = {
        "fn": "recipes.py:tune",
        "params": {"scale": 2},
        "source_sha256": hashlib.sha256(recipes).hexdigest(),
        "source": driver.store.put_blob(recipes).oid,
    }
    return {
        "remote": RemoteSpec(str(tmp_path / "remote.mgit")),
        "marker": marker,
        "cache": tmp_path / "cache",
        "test": CheckJob(vid, "size", "evals.py:size", 60.0, evals, root=str(driver.root)),
        "recipe": RecipeJob(
            "tuned", tuned, [vid], "finetune", record, "by a node", {"team": "a"}, 60.0, recipes, root=str(driver.root)
        ),
    }


def test_well_formed_jobs_run_on_the_node(cluster: dict[str, Any]) -> None:
    run = node.test_task(cluster["remote"], cluster["test"])
    assert run.ok and run.value == {"files": 4.0}, run
    made = node.recipe_task(cluster["remote"], cluster["recipe"])
    assert made.ok and made.created, made
    assert cluster["marker"].read_text().split() == ["test", "recipe"]


FORGED_TESTS = {
    "version is not an object id": {"version": "HEAD~1"},
    "function: cannot use 'x./": {"fn": "x./tmp/planted/pwned:f"},
    "function: cannot use '../../evil.py:f'": {"fn": "../../evil.py:f"},
    "timeout is not a number": [{"timeout": float("inf")}, {"timeout": -1.0}, {"timeout": 1e12}, {"timeout": True}],
    "it carries no source file": [{"source": None}, {"source": "text"}],
    "resource num_gpus must be a number": {"resources": {"num_gpus": 1e9}},
    "unknown resource 'memory'": {"resources": {"memory": 1}},
    "its work folder is not an absolute, normalized path": [{"root": "relative/work"}, {"root": "/a/../etc"}],
    "its test name is not": {"test": ""},
}
FORGED_RECIPES = {
    "model '../../x' is not a model name": {"model": "../../x"},
    "head is not an object id": {"head": "main"},
    "parents are not 1 to 64 object ids": [{"parents": []}, {"parents": ["x"]}, {"parents": "ab" * 32}],
    "relation 'pwn' is not one of": {"relation": "pwn"},
    "the source it carries is not the one its recipe records": {"source": b"import os\nos.system('true')\n"},
    "function: cannot use": {"recipe": {"fn": "x./tmp/planted/pwned:tune"}},
    "recipe parameters are not named by identifiers": {"recipe": {"params": {"a-b": 1}}},
    "the recipe's source is not an object id": {"recipe": {"source": "../../x"}},
    "its tags are not short text": {"tags": {"k": 1}},
    "its message is not a short text": {"message": "x" * (1 << 20)},
    "timeout is not a number": {"timeout": float("nan")},
}


def cases(table: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(why, c) for why, forged in table.items() for c in (forged if isinstance(forged, list) else [forged])]


def forged_job(job: Any, changes: dict[str, Any]) -> Any:
    if "recipe" in changes:
        changes = {**changes, "recipe": {**job.recipe, **changes["recipe"]}}
    return replace(job, **changes)


def refused(cluster: dict[str, Any], task: Any, job: Any, why: str, kind: str) -> None:
    with pytest.raises(InvalidJobError) as caught:
        task(cluster["remote"], job)
    message = str(caught.value)
    assert message.startswith(f"refusing a forged {kind} job: {why}"), message
    assert "\n" not in message
    assert not cluster["marker"].exists() and not cluster["cache"].exists()  # nothing ran, no cache opened


@pytest.mark.parametrize(("why", "changes"), cases(FORGED_TESTS))
def test_a_forged_test_job_is_refused_before_anything_runs(
    why: str, changes: dict[str, Any], cluster: dict[str, Any]
) -> None:
    refused(cluster, node.test_task, forged_job(cluster["test"], changes), why, "test")


@pytest.mark.parametrize(("why", "changes"), cases(FORGED_RECIPES))
def test_a_forged_recipe_job_is_refused_before_anything_runs(
    why: str, changes: dict[str, Any], cluster: dict[str, Any]
) -> None:
    refused(cluster, node.recipe_task, forged_job(cluster["recipe"], changes), why, "recipe")


def test_what_is_not_a_job_or_a_remote_is_refused(cluster: dict[str, Any]) -> None:
    refused(cluster, node.test_task, {"version": OID, "fn": "os:system"}, "not a test job", "test")
    refused(cluster, node.recipe_task, cluster["test"], "not a recipe job", "recipe")
    refused(cluster, lambda _, job: node.test_task("/etc", job), cluster["test"], "the remote it names", "cluster")


def test_a_function_named_by_an_absolute_path_is_never_read_on_the_node(
    cluster: dict[str, Any], tmp_path: Path
) -> None:
    """The driver's file outside its work folder: the node runs the carried source and does
    not open that path (here: a folder, which would fail a read)."""
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.mkdir()
    job = replace(cluster["test"], fn=f"{elsewhere}:size", root="/")
    run = node.test_task(cluster["remote"], job)
    assert run.ok and cluster["marker"].read_text().split() == ["test"], run
