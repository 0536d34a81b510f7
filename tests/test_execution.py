"""Executors without a cluster: choosing one, declared resources recorded with recipes and
tests (and travelling with push and pull), the local executor's jobs, and a lazy clone's
add of a tensor it has not fetched (what a cluster node's cache does)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from conftest import copy_user_code, make_model, run_cli, tensors

from mgit import Repo, execution, sync
from mgit.checks import Checks
from mgit.cluster import open_executor
from mgit.errors import InvalidOptionError
from mgit.execution import CheckJob, LocalExecutor, RecipeJob, register_derived_chains, resources_of


@pytest.fixture()
def work(tmp_path: Path) -> Repo:
    repo = Repo.init(tmp_path / "work")
    copy_user_code(repo.root, "execution")
    make_model(tmp_path / "base", seed=1)
    repo.add(tmp_path / "base", name="base")
    return repo


def test_executors_by_name_and_their_errors(work: Repo) -> None:
    assert isinstance(open_executor(work, "local"), LocalExecutor)
    with pytest.raises(InvalidOptionError, match="unknown executor 'slurm'"):
        open_executor(work, "slurm")
    with pytest.raises(InvalidOptionError, match="--num-gpus and --max-retries are for a cluster executor"):
        open_executor(work, "local", num_cpus=2)
    # Ray needs a remote its nodes reach: said before any cluster is contacted.
    with pytest.raises(InvalidOptionError, match="needs a remote that the cluster's nodes reach"):
        open_executor(work, "ray")
    code, out, err = run_cli("cascade", "base", "--executor", "slurm", cwd=work.root)
    assert (
        code == 1 and err.startswith("Error: unknown executor 'slurm'") and "Use local, ray or ray://HOST:PORT" in err
    )
    code, out, err = run_cli("test", "run", "--all", "--num-gpus", "1", cwd=work.root)
    assert code == 1 and "are for a cluster executor" in err


def test_resources_are_checked() -> None:
    assert resources_of({"num_cpus": 2, "num_gpus": 0.5}) == {"num_cpus": 2.0, "num_gpus": 0.5}
    assert resources_of({"num_cpus": None}) == {}
    for bad in ({"memory": 1}, {"num_gpus": -1}, {"num_cpus": float("nan")}, {"num_cpus": True}, {"num_gpus": "1"}):
        with pytest.raises(InvalidOptionError):
            resources_of(bad)


def test_resources_recorded_with_a_recipe_and_a_test_travel_with_push_and_pull(work: Repo, tmp_path: Path) -> None:
    code, _, err = run_cli(
        "add",
        str(tmp_path / "base"),
        "--name",
        "ft",
        "--parent",
        "base",
        "--recipe",
        "recipes.py:copy",
        "--param",
        "note=hi",
        "--num-gpus",
        "1",
        "--num-cpus",
        "4",
        cwd=work.root,
    )
    assert code == 0, err
    assert work.version("ft").recipe["resources"] == {"num_cpus": 4.0, "num_gpus": 1.0}
    code, _, err = run_cli("add", str(tmp_path / "base"), "--name", "x", "--num-gpus", "1", cwd=work.root)
    assert code == 2 and "recorded with a recipe: add --recipe" in err
    code, out, err = run_cli(
        "test", "add", "ft", "--fn", "recipes.py:count", "--num-cpus", "2", "--json", cwd=work.root
    )
    assert code == 0, err
    assert json.loads(out)["resources"] == {"num_cpus": 2.0}
    remote = tmp_path / "team.mgit"
    sync.init_bare(str(remote))
    sync.add_remote(work, "origin", str(remote))
    sync.push(work)
    bob = Repo(sync.clone(str(remote), tmp_path / "bob").path)
    assert Checks(bob).test("count").resources == {"num_cpus": 2.0}
    assert bob.version("ft").recipe["resources"] == {"num_cpus": 4.0, "num_gpus": 1.0}


def test_a_cascade_keeps_the_recorded_resources(work: Repo, tmp_path: Path) -> None:
    work.add(
        tmp_path / "base",
        name="ft",
        parent="base",
        recipe="recipes.py:copy",
        params={"note": "a"},
        resources={"num_gpus": 1},
    )
    make_model(tmp_path / "base2", seed=2)
    work.add(tmp_path / "base2", name="base")
    code, out, err = run_cli("cascade", "base", "--json", cwd=work.root)
    assert code == 0, err
    (result,) = json.loads(out)["results"]
    assert result["status"] == "updated" and result["where"] == "local"
    assert work.version("ft").recipe["resources"] == {"num_gpus": 1.0}


def test_the_local_executor_runs_jobs_and_commits_by_compare_and_swap(work: Repo) -> None:
    executor = LocalExecutor(work)
    head = work.resolve("base")
    record = work.recipe_record("recipes.py:copy", {"note": "x"})
    job = RecipeJob("copy", "0" * 64, [head], "finetune", record, "by a job", {}, 60.0)
    run = executor.run_recipe(job)  # `copy` has no version: its head is not the job's
    assert not run.ok and "got another version during the cascade" in (run.error or "")
    assert "copy" not in work.refs.all()
    first = work.add(dict(tensors(3)), name="copy")
    run = executor.run_recipe(RecipeJob("copy", first.version, [head], "finetune", record, "by a job", {}, 60.0))
    assert run.ok and run.created and run.seq == 2 and work.refs.get("copy") == run.version
    assert (work.manifest("copy").files[-1].path, work.version("copy").parents[0].version) == ("note.txt", head)
    (outcome,) = executor.run_tests([CheckJob(run.version, "count", "recipes.py:count", 60.0)])
    assert outcome.ok and outcome.value == {"files": 3.0}  # config, weights, note


class PreparingExecutor(LocalExecutor):
    """The local executor, noting what each run asks it to make readable."""

    def __init__(self, repo: Repo) -> None:
        super().__init__(repo)
        self.prepared: list[list[str]] = []

    def prepare(self, *, models: Sequence[str] = (), versions: Sequence[str] = ()) -> None:
        self.prepared.append(list(versions))


def test_a_test_run_prepares_only_the_versions_it_will_run_tests_on(work: Repo, tmp_path: Path) -> None:
    work.add(tmp_path / "base", name="ft", parent="base")
    checks = Checks(work)
    checks.attach("base", "recipes.py:count", inherit=True)
    base, ft = work.resolve("base"), work.resolve("ft")
    checks.run(["base"])  # base's result is recorded: the next run reuses it
    executor = PreparingExecutor(work)
    ran = checks.run(None, executor=executor)
    assert executor.prepared == [[ft]]
    assert {(o.version, o.reused) for o in ran.outcomes} == {(base, True), (ft, False)}
    checks.run(None, force=True, executor=executor)
    assert sorted(executor.prepared[-1]) == sorted([base, ft])


def test_a_lazy_clone_adds_a_tensor_it_has_not_fetched_without_coding_it_against_itself(tmp_path: Path) -> None:
    alice = Repo.init(tmp_path / "alice")
    base = tensors(1, width=64)
    alice.add(base, name="ft")
    remote = tmp_path / "team.mgit"
    sync.init_bare(str(remote))
    sync.add_remote(alice, "origin", str(remote))
    sync.push(alice)
    lazy = Repo(sync.clone(str(remote), tmp_path / "lazy", lazy=True).path)
    # The next version changes one tensor; the others are the previous version's, not fetched here.
    changed = {**base, "embed.weight": (base["embed.weight"] + np.float32(1e-3)).astype(np.float32)}
    added = lazy.add(changed, name="ft")
    assert added.created and lazy.fsck().ok
    got = lazy.load_state_dict("ft")
    assert all(got[k].tobytes() == v.tobytes() for k, v in changed.items())
    sync.push(lazy)
    bob = Repo(sync.clone(str(remote), tmp_path / "bob").path)
    assert bob.fsck().ok and bob.load_state_dict("ft")["layer.0.weight"].tobytes() == base["layer.0.weight"].tobytes()


def test_the_local_executor_never_imports_ray(work: Repo, tmp_path: Path) -> None:
    import subprocess
    import sys

    work.add(tmp_path / "base", name="ft", parent="base", recipe="recipes.py:copy")
    make_model(tmp_path / "base2", seed=2)
    work.add(tmp_path / "base2", name="base")
    work.root.joinpath("run.py").write_text(
        "import sys\nfrom mgit.cli.main import main\n"
        "for args in (['cascade', 'base'], ['test', 'run', '--all']):\n"
        "    try:\n        main(args)\n    except SystemExit:\n        pass\n"
        "print('RAY-IMPORTED' if 'ray' in sys.modules else 'NO-RAY')\n"
    )
    run = subprocess.run([sys.executable, "run.py"], cwd=work.root, capture_output=True, text=True, timeout=300)
    assert "updated" in run.stdout and run.stdout.strip().endswith("NO-RAY"), run.stdout + run.stderr


def test_a_recipe_output_is_stored_as_its_package_registered(work: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(execution, "_DERIVED", {})
    head = work.resolve("base")
    job = RecipeJob("copy", head, [head], "finetune", {"fn": "mgit.tools:rebuild"}, "", {}, 60.0)
    assert execution.derived_chains(work, job) == {}  # not registered
    register_derived_chains("mgit.tools:rebuild", lambda repo, j: {"w": [repo.resolve(j.parents[0])]})
    assert execution.derived_chains(work, job) == {"w": [head]}
    other = RecipeJob("copy", head, [head], "finetune", work.recipe_record("recipes.py:copy", {}), "", {}, 60.0)
    assert execution.derived_chains(work, other) == {}


def test_a_cascade_alone_stores_a_re_merge_as_weighted_sums(tmp_path: Path) -> None:
    """A process that imports mgit.cascade and not mgit.merging still stores a re-merge as the
    merge's weighted sums: the cascade brings in the recipes of MGit's own, which register how."""
    import subprocess
    import sys

    from merge_models import MODELS, write_model

    from mgit.merging import merge

    repo = Repo.init(tmp_path / "repo")
    for name, (_, parent) in MODELS.items():
        repo.add(write_model(tmp_path / name, name), name=name, parent=parent)
    merge(repo, ["ft1", "ft2"], method="linear", name="lib")
    repo.add({k: v + np.float32(0.01) for k, v in repo.load_state_dict("ft2").items()}, name="ft2")
    probe = (
        "import sys\nfrom mgit import Repo\nfrom mgit.cascade import cascade\n"
        "report = cascade(Repo(sys.argv[1]), 'ft2')\n"
        "print([r.status for r in report.results], 'mgit.merging' in sys.modules)\n"
    )
    run = subprocess.run([sys.executable, "-c", probe, str(repo.root)], capture_output=True, text=True, timeout=300)
    assert run.stdout.split() == ["['updated']", "True"], run.stdout + run.stderr
    assert Repo(repo.root).show("lib").tensor_storage == {"derived": len(repo.manifest("lib").tensors())}
