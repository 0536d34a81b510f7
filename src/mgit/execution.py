"""Where user code runs: the jobs a cascade and a test run hand out, and the local executor.

A cascade and a test run decide *what* runs (the plan, which results are reused, what a
result means); an executor decides *where*. Two jobs exist: a `RecipeJob` (check out the
parents, run the recipe, commit what it wrote as the next version of a model, by
compare-and-swap on the head it replaces) and a `TestJob` (check out a version, run one
test function, return what it returned). Both are plain data, so that an executor can send
them to other machines (`mgit.cluster`, on Ray); the `LocalExecutor` here runs them in this
process's repository, each user function in a child process (`mgit.usercode`).

Resources (`num_cpus`, `num_gpus`) are what a job declares to a scheduler: recorded with a
recipe (`mgit add --recipe ... --num-gpus 1`) or a test (`mgit test add ... --num-cpus 2`),
else the command's defaults. The local executor runs every job whatever it declares.
"""

from __future__ import annotations

import importlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from mgit import usercode
from mgit.errors import MgitError, RefConflictError
from mgit.repo import Repo
from mgit.reports import Report
from mgit.usercode import RESOURCE_KEYS, resources_of

__all__ = ["RESOURCE_KEYS", "Executor", "LocalExecutor", "RecipeJob", "RecipeRun", "TestJob", "resources_of",
           "run_recipe_in", "run_tests_in"]

@dataclass(frozen=True)
class RecipeJob(Report):
    """Rebuild `model`: run `recipe` on `parents` (version ids, in the recorded order) and
    commit its output as the version after `head`, with these lineage parents, relation,
    tags and message. `recipe` is the record the new version keeps (its source object
    among it); `source` is the code to run, the recorded source's bytes, or None to run the
    recipe's file in the work folder."""

    model: str
    head: str
    parents: list[str]
    relation: str
    recipe: dict[str, Any]
    message: str
    tags: dict[str, str]
    timeout: float
    source: bytes | None = field(default=None, repr=False)
    resources: dict[str, float] = field(default_factory=dict)
    root: str | None = None  # the work folder it was planned in: where a relative `fn` is

    @property
    def fn(self) -> str:
        return str(self.recipe["fn"])

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.recipe.get("params") or {})


@dataclass(frozen=True)
class RecipeRun(Report):
    """What became of a recipe job: the committed version (`created` False when it holds
    the same as the head, which is then up to date), or why nothing was committed."""

    ok: bool
    version: str | None = None
    seq: int | None = None
    created: bool = False
    error: str | None = None
    output: str = ""
    where: str = "local"  # the node that ran it
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TestJob(Report):
    """Run test `test` (the function `fn`) on version `version`. `source` as for a recipe."""

    __test__ = False  # not a pytest class

    version: str
    test: str
    fn: str
    timeout: float
    source: bytes | None = field(default=None, repr=False)
    resources: dict[str, float] = field(default_factory=dict)
    root: str | None = None


class Executor(Protocol):
    """Runs jobs somewhere. Thread-safe: a cascade calls it from several threads at once."""

    name: str

    def prepare(self, *, models: Sequence[str] = (), versions: Sequence[str] = ()) -> None:
        """Before jobs run: make these models' heads and these versions readable where jobs
        run (a cluster's executor sends them to the shared remote)."""
        ...

    def run_recipe(self, job: RecipeJob) -> RecipeRun: ...

    def run_tests(self, jobs: list[TestJob]) -> list[usercode.RunOutcome]:
        """Run these tests (all of one version), in order; one outcome each."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Jobs run here, on the repository's own disk: today's behaviour, and the default."""

    name = "local"

    def __init__(self, repo: Repo) -> None:
        self.repo = repo

    def prepare(self, *, models: Sequence[str] = (), versions: Sequence[str] = ()) -> None:
        pass  # jobs read this repository

    def run_recipe(self, job: RecipeJob) -> RecipeRun:
        return run_recipe_in(self.repo, job, where=self.name)

    def run_tests(self, jobs: list[TestJob]) -> list[usercode.RunOutcome]:
        return run_tests_in(self.repo, jobs)

    def close(self) -> None:
        pass


def run_recipe_in(repo: Repo, job: RecipeJob, *, where: str, cwd: Path | None = None) -> RecipeRun:
    """Check out the parents into a temporary folder, run the recipe in a child process and
    add its output as the next version of `job.model`, only if the model's head is still
    `job.head` (compare-and-swap under the ref's lock). A failure commits nothing. `cwd` is
    where user code runs (default: the repository's work folder)."""
    try:
        with tempfile.TemporaryDirectory(prefix="mgit-recipe-", ignore_cleanup_errors=True) as tmp:
            folders = [Path(tmp) / f"parent-{i}" for i in range(len(job.parents))]
            for vid, folder in zip(job.parents, folders, strict=True):
                repo.checkout(vid, folder)
            out = Path(tmp) / "out"
            out.mkdir()
            run = usercode.run("recipe", job.fn, [str(out), json.dumps(job.params), *map(str, folders)],
                               timeout=job.timeout, cwd=cwd or repo.root, source=job.source)  # fmt: skip
            if not run.ok:
                return RecipeRun(False, error=f"the recipe {run.error}", output=run.output, where=where)
            if not any(out.iterdir()):
                return RecipeRun(False, error="the recipe wrote nothing into its output folder", output=run.output,
                                 where=where)  # fmt: skip
            added = repo.add(out, name=job.model, parent=list(job.parents), relation=job.relation,
                             message=job.message, recipe=job.recipe, tags=job.tags, model_card=False,
                             expected_head=job.head, derived=derived_chains(repo, job))  # fmt: skip
    except RefConflictError:
        return RecipeRun(False, error=f"{job.model} got another version during the cascade; run it again", where=where)
    except (MgitError, OSError) as exc:
        return RecipeRun(False, error=str(exc), where=where)
    return RecipeRun(True, added.version, added.seq, added.created, output=run.output, where=where)


def derived_chains(repo: Repo, job: RecipeJob) -> dict[str, Any]:
    """How a recipe of MGit's own stores its output, for any executor and any caller: the
    `derived_chains(repo, job)` of its module (`mgit.merging.recipe`: a merge's weighted
    sums of its parents). A user's recipe module is never imported here: it runs only in
    its child process."""
    module = str((job.recipe or {}).get("fn", "")).partition(":")[0]
    if not module.startswith("mgit."):
        return {}
    try:
        hook = getattr(importlib.import_module(module), "derived_chains", None)
    except ImportError:
        return {}
    return dict(hook(repo, job)) if hook is not None else {}


def run_tests_in(repo: Repo, jobs: list[TestJob], *, cwd: Path | None = None) -> list[usercode.RunOutcome]:
    """Check out each version once and run its tests on it, each in a child process."""
    outcomes: list[usercode.RunOutcome] = []
    folders: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="mgit-test-", ignore_cleanup_errors=True) as tmp:
        for job in jobs:
            folder = folders.get(job.version)
            if folder is None:
                folder = folders[job.version] = Path(tmp) / f"model-{len(folders)}"
                repo.checkout(job.version, folder)
            outcomes.append(usercode.run("call", job.fn, [str(folder)], timeout=job.timeout, cwd=cwd or repo.root,
                                         source=job.source))  # fmt: skip
    return outcomes
