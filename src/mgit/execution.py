"""Where user code runs: the jobs a cascade and a test run hand out, and the local executor.

A cascade and a test run decide *what* runs (the plan, which results are reused, what a
result means); an executor decides *where*. Two jobs exist: a `RecipeJob` (check out the
parents, run the recipe, commit what it wrote as the next version of a model, by
compare-and-swap on the head it replaces) and a `CheckJob` (check out a version, run one
test function, return what it returned). Both are plain data, so that an executor can send
them to other machines (`mgit.cluster`, on Ray); the `LocalExecutor` here runs them in this
process's repository, each user function in a child process (`mgit.usercode`).

Resources (`num_cpus`, `num_gpus`) are what a job declares to a scheduler: recorded with a
recipe (`mgit add --recipe ... --num-gpus 1`) or a test (`mgit test add ... --num-cpus 2`),
else the command's defaults. The local executor runs every job whatever it declares.

A job handed to another machine is untrusted input there: `received_recipe_job` and
`received_test_job` check every field against this contract before anything is done with
it (ids are object ids, a model name is a name, the function a module path or a file
below the work folder, the source carried and bounded, numbers finite and bounded, the work
folder an absolute normalized path), and name the first field at fault (InvalidJobError).

A recipe of MGit's own says how its output is stored (a merge's tensors as weighted sums of
its parents): its package registers that here (`register_derived_chains`) when imported, and
every code path that runs recipe jobs imports it (mgit.cascade, mgit.cluster's nodes).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from mgit import usercode
from mgit.errors import InvalidJobError, InvalidOptionError, MgitError, RefConflictError
from mgit.index.refs import is_model_name
from mgit.jobfolders import JobFolders, signature
from mgit.repo.add import AddOptions
from mgit.repo.repository import Repo
from mgit.reports import Report
from mgit.store.objects import OID_RE, RELATIONS
from mgit.usercode import RESOURCE_KEYS, resources_of

__all__ = [
    "RESOURCE_KEYS",
    "CheckJob",
    "Executor",
    "LocalExecutor",
    "RecipeJob",
    "RecipeRun",
    "received_recipe_job",
    "received_test_job",
    "register_derived_chains",
    "resources_of",
    "run_recipe_in",
    "run_tests_in",
]

MAX_JOB_TIMEOUT = 7 * 24 * 3600.0  # seconds a job's user code may be given
MAX_JOB_SOURCE = 64 << 20  # bytes of a function's source file a job carries
MAX_JOB_TEXT = 64 << 10  # characters of a job's message, and of each tag's key or value
MAX_JOB_TAGS = 1024
MAX_JOB_PARENTS = 64


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
class CheckJob(Report):
    """Run test `test` (the function `fn`) on version `version`. `source` as for a recipe."""

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

    def run_tests(self, jobs: list[CheckJob]) -> list[usercode.RunOutcome]:
        """Run these tests (all of one version), in order; one outcome each."""
        ...

    def close(self) -> None: ...


class LocalExecutor:
    """Jobs run here, in this process's repository on its own disk: the default executor. Its
    jobs share the versions they read, each checked out once (mgit.jobfolders) until `close`;
    `shared=False` checks out a version for each job that reads it, as before."""

    name = "local"

    def __init__(self, repo: Repo, *, shared: bool = True) -> None:
        self.repo = repo
        self.shared = shared
        self._folders: JobFolders | None = None
        self._lock = threading.Lock()

    def prepare(self, *, models: Sequence[str] = (), versions: Sequence[str] = ()) -> None:
        pass  # jobs read this repository

    def run_recipe(self, job: RecipeJob) -> RecipeRun:
        return run_recipe_in(self.repo, job, where=self.name, folders=self.folders())

    def run_tests(self, jobs: list[CheckJob]) -> list[usercode.RunOutcome]:
        return run_tests_in(self.repo, jobs, folders=self.folders())

    def folders(self) -> JobFolders | None:
        with self._lock:
            if self._folders is None and self.shared:
                self._folders = JobFolders(self.repo)
            return self._folders

    def close(self) -> None:
        with self._lock:
            folders, self._folders = self._folders, None
        if folders is not None:
            folders.close()


def run_recipe_in(
    repo: Repo, job: RecipeJob, *, where: str, cwd: Path | None = None, folders: JobFolders | None = None
) -> RecipeRun:
    """Check out the parents, run the recipe in a child process and add its output as the next
    version of `job.model`, only if the model's head is still `job.head` (compare-and-swap
    under the ref's lock). A failure commits nothing. `cwd` is where user code runs (default:
    the repository's work folder). With `folders`, the parents are the shared read-only
    checkouts of them, and the output, once added, becomes the new version's (mgit.jobfolders);
    without, each parent is checked out into a temporary folder of this job's."""
    try:
        with tempfile.TemporaryDirectory(prefix="mgit-recipe-", ignore_cleanup_errors=True) as tmp:
            if folders is not None:
                inputs = [folders.folder(vid) for vid in job.parents]
            else:
                inputs = [Path(tmp) / f"parent-{i}" for i in range(len(job.parents))]
                for vid, folder in zip(job.parents, inputs, strict=True):
                    repo.checkout(vid, folder)
            out = Path(tmp) / "out"
            out.mkdir()
            run = usercode.run(
                "recipe",
                job.fn,
                [str(out), json.dumps(job.params), *map(str, inputs)],
                timeout=job.timeout,
                cwd=cwd or repo.root,
                source=job.source,
            )
            if folders is not None and (changed := folders.changed(job.parents)):
                why = f"the recipe changed the folder of its parent {changed[0][:12]}, which is shared read-only"
                return RecipeRun(False, error=why, output=run.output, where=where)
            if not run.ok:
                return RecipeRun(False, error=f"the recipe {run.error}", output=run.output, where=where)
            if not any(out.iterdir()):
                return RecipeRun(
                    False, error="the recipe wrote nothing into its output folder", output=run.output, where=where
                )
            read = signature(out) if folders is not None else {}  # the add's digests are the folder's while it holds
            added = repo.add_with(
                out,
                AddOptions(
                    name=job.model,
                    parents=tuple(job.parents),
                    relation=job.relation,
                    message=job.message,
                    recipe=job.recipe,
                    tags=job.tags,
                    model_card=False,
                    expected_head=job.head,
                    derived=derived_chains(repo, job),
                ),
            )
            if folders is not None:
                folders.adopt(added, out, read)  # its tests and children read it as it is
    except RefConflictError:
        return RecipeRun(False, error=f"{job.model} got another version during the cascade; run it again", where=where)
    except (MgitError, OSError) as exc:
        return RecipeRun(False, error=str(exc), where=where)
    return RecipeRun(True, added.version, added.seq, added.created, output=run.output, where=where)


DerivedChains = Callable[[Repo, RecipeJob], Mapping[str, list[Any]]]
_DERIVED: dict[str, DerivedChains] = {}  # recipe function reference -> how its output is stored


def register_derived_chains(fn: str, chains: DerivedChains) -> None:
    """Say how the output of the recipe `fn` (its function reference, `module:function`) is
    stored: `chains(repo, job)` gives the codec chain of each tensor (by name) derived from
    the job's parents, which the add tries first. For recipes of MGit's own, registered by
    their package when imported (mgit.merging); a user's recipe runs in a child process."""
    _DERIVED[fn] = chains


def derived_chains(repo: Repo, job: RecipeJob) -> dict[str, Any]:
    """The chains registered for a job's recipe (`register_derived_chains`); none for any other."""
    chains = _DERIVED.get(str((job.recipe or {}).get("fn", "")))
    return dict(chains(repo, job)) if chains is not None else {}


def run_tests_in(
    repo: Repo, jobs: list[CheckJob], *, cwd: Path | None = None, folders: JobFolders | None = None
) -> list[usercode.RunOutcome]:
    """Check out each version once and run its tests on it, each in a child process. With
    `folders`, a version's folder is the shared read-only one (mgit.jobfolders), and a test
    that changed it is an error."""
    outcomes: list[usercode.RunOutcome] = []
    mine: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="mgit-test-", ignore_cleanup_errors=True) as tmp:
        for job in jobs:
            if folders is not None:
                folder = folders.folder(job.version)
            elif (folder := mine.get(job.version)) is None:
                folder = mine[job.version] = Path(tmp) / f"model-{len(mine)}"
                repo.checkout(job.version, folder)
            run = usercode.run(
                "call", job.fn, [str(folder)], timeout=job.timeout, cwd=cwd or repo.root, source=job.source
            )
            if folders is not None and folders.changed([job.version]):
                why = "changed the model folder it was given, which is shared read-only"
                run = replace(run, ok=False, value=None, error=why)
            outcomes.append(run)
    return outcomes


# --- a job received from elsewhere ---------------------------------------------------------------
def received_recipe_job(job: Any) -> RecipeJob:
    """`job` if it holds to the contract of a recipe job sent to another machine (see the
    module's docstring), else InvalidJobError naming the first field at fault."""
    kind = "recipe"
    _job(isinstance(job, RecipeJob), kind, "not a recipe job")
    _job(
        isinstance(job.model, str) and is_model_name(job.model),
        kind,
        f"model {str(job.model)[:80]!r} is not a model name",
    )
    _job(_is_oid(job.head), kind, "head is not an object id")
    _job(
        isinstance(job.parents, list)
        and 0 < len(job.parents) <= MAX_JOB_PARENTS
        and all(_is_oid(p) for p in job.parents),
        kind,
        "parents are not 1 to 64 object ids",
    )
    _job(job.relation in RELATIONS, kind, f"relation {str(job.relation)[:40]!r} is not one of {', '.join(RELATIONS)}")
    recipe = job.recipe
    _job(isinstance(recipe, dict), kind, "its recipe is not a record")
    _common(kind, recipe.get("fn"), job.timeout, job.source, job.resources, job.root)
    params = recipe.get("params") or {}
    _job(
        isinstance(params, dict) and all(isinstance(k, str) and k.isidentifier() for k in params),
        kind,
        "recipe parameters are not named by identifiers",
    )
    try:
        json.dumps(params, allow_nan=False)
    except (TypeError, ValueError):
        _job(False, kind, "recipe parameters are not JSON values")
    _job(recipe.get("source") is None or _is_oid(recipe.get("source")), kind, "the recipe's source is not an object id")
    _job(
        recipe.get("source_sha256") == hashlib.sha256(job.source).hexdigest(),
        kind,
        "the source it carries is not the one its recipe records (source_sha256)",
    )
    _resources(kind, recipe.get("resources"))
    _job(isinstance(job.message, str) and len(job.message) <= MAX_JOB_TEXT, kind, "its message is not a short text")
    _job(
        isinstance(job.tags, dict)
        and len(job.tags) <= MAX_JOB_TAGS
        and all(
            isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= MAX_JOB_TEXT and len(v) <= MAX_JOB_TEXT
            for k, v in job.tags.items()
        ),
        kind,
        "its tags are not short text to short text",
    )
    return job


def received_test_job(job: Any) -> CheckJob:
    """`job` if it holds to the contract of a test job sent to another machine, else
    InvalidJobError naming the first field at fault."""
    kind = "test"
    _job(isinstance(job, CheckJob), kind, "not a test job")
    _job(_is_oid(job.version), kind, "version is not an object id")
    _job(
        isinstance(job.test, str) and 0 < len(job.test) <= 1024 and job.test.isprintable(),
        kind,
        "its test name is not a short printable text",
    )
    _common(kind, job.fn, job.timeout, job.source, job.resources, job.root)
    return job


def _common(kind: str, fn: Any, timeout: Any, source: Any, resources: Any, root: Any) -> None:
    """The fields both jobs have: the function (a module path or a relative file; an
    absolute file names only where the driver had it, so it is never read here), its
    carried source, the time limit, declared resources and the planning work folder."""
    _job(
        isinstance(source, bytes) and len(source) <= MAX_JOB_SOURCE,
        kind,
        f"it carries no source file of at most {MAX_JOB_SOURCE >> 20} MiB",
    )
    try:
        usercode.check_reference(fn, absolute=True)
    except MgitError as exc:
        _job(False, kind, f"function: {exc.message}")
    _job(
        isinstance(timeout, (int, float))
        and not isinstance(timeout, bool)
        and math.isfinite(timeout)
        and 0 < timeout <= MAX_JOB_TIMEOUT,
        kind,
        f"timeout is not a number of seconds in (0, {MAX_JOB_TIMEOUT:g}]",
    )
    _resources(kind, resources)
    _job(
        root is None
        or (
            isinstance(root, str)
            and root.startswith("/")
            and root.isprintable()
            and os.path.normpath(root) == root
            and len(root) <= 4096
        ),
        kind,
        "its work folder is not an absolute, normalized path",
    )


def _resources(kind: str, values: Any) -> None:
    try:
        _job(values is None or isinstance(values, dict), kind, "its resources are not a record")
        resources_of(values)
    except InvalidOptionError as exc:
        _job(False, kind, exc.message)


def _is_oid(value: Any) -> bool:
    return isinstance(value, str) and OID_RE.match(value) is not None


def _job(ok: bool, kind: str, why: str) -> None:
    if not ok:
        raise InvalidJobError(kind, why)
