"""What a cluster task does on a worker node, which shares no disk with the driver.

Each node keeps a lazy clone of the repository's remote (the *node cache*, one per remote
URL, under `MGIT_CLUSTER_CACHE` or `~/.cache/mgit/cluster`), made by the first task that
needs it and reused by every later one: a task fetches the records of the versions it
reads (by id: a parent rebuilt a moment ago on another node has no ref on the remote yet),
and checkout fetches exactly the tensors it reads, verified, once per node.

A recipe task checks out the parents, runs the recipe in a child process, adds the output
to the node cache as the version after the job's head (compare-and-swap on the cache's own
ref, under a per-model lock: tasks on one node run in several processes) and sends that
version's new objects and records to the remote. It moves no ref on the remote: the driver
does, in the cascade's order. A retried task finds its objects there already (content
addressing) and sends nothing twice.

A job is untrusted input here: each task checks it against the job contract first
(mgit.execution's `received_recipe_job`, `received_test_job`) and refuses a forged one in
one line before it opens the node cache or runs anything.

These functions run inside Ray worker processes; they import nothing of Ray but the
runtime context, to say where they ran.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import mgit.merging  # noqa: F401  (registers how a re-run merge is stored: mgit.execution)
from mgit import usercode
from mgit.errors import InvalidJobError, MgitError
from mgit.execution import (
    CheckJob,
    RecipeJob,
    RecipeRun,
    received_recipe_job,
    received_test_job,
    run_recipe_in,
    run_tests_in,
)
from mgit.remotes import RemoteSpec
from mgit.repo.repository import Repo
from mgit.store.objects import user_at_host
from mgit.sync.connection import DEFAULT_REMOTE, Connection, connect
from mgit.sync.fetch import fetch_versions
from mgit.sync.mirror import cached_clone
from mgit.sync.push import publish_to
from mgit.usercode import RunOutcome
from mgit.util.locks import FileLock

J = TypeVar("J", RecipeJob, CheckJob)
CACHE_VARIABLE = "MGIT_CLUSTER_CACHE"
LOCK_WAIT = 3600.0  # a task waits this long for another task's clone or commit on this node


def cache_root() -> Path:
    configured = os.environ.get(CACHE_VARIABLE)
    return Path(configured) if configured else Path.home() / ".cache" / "mgit" / "cluster"


_OPEN: dict[tuple[Path, RemoteSpec], tuple[Repo, Connection]] = {}  # per worker process, reused by its tasks
_OPEN_LOCK = threading.Lock()


@contextmanager
def node_cache(remote: RemoteSpec) -> Iterator[tuple[Repo, Connection]]:
    """This node's lazy clone of `remote` (made on first use, under a lock: tasks start in
    several processes at once), and a connection to the remote. A worker process keeps both
    open for its next tasks (Ray reuses worker processes): the repository and the S3 client
    are made once per process, not once per task."""
    root = cache_root()
    key = (root, remote)
    with _OPEN_LOCK:
        opened = _OPEN.get(key)
        if opened is None:
            with cached_clone(
                root,
                remote.url,
                what=f"the node cache of {remote.url}",
                wait=LOCK_WAIT,
                endpoint_url=remote.endpoint_url,
                region=remote.region,
                profile=remote.profile,
            ) as (repo, _):
                pass
            opened = _OPEN[key] = (repo, connect(repo, DEFAULT_REMOTE))
    try:
        yield opened
    except BaseException:  # a failure may have left either in a bad state: the next task opens anew
        with _OPEN_LOCK:
            if _OPEN.get(key) is opened:
                del _OPEN[key]
                opened[1].close()
        raise


def where() -> str:
    """This node, as reports show it: `user@host/NODE` (the first characters of Ray's node id)."""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
    except Exception:  # not in a Ray worker (a test calling the task body directly)
        node = str(os.getpid())
    return f"{user_at_host()}/{node}"


def recipe_task(remote: RemoteSpec, job: RecipeJob) -> RecipeRun:
    """The body of a recipe task: see the module docstring. Never raises for what the
    recipe does (that is a failed run); raises for what a retry may cure (the remote), and
    for a job that breaks the job contract (InvalidJobError: nothing is done)."""
    job = received_recipe_job(job)
    _check_remote(remote)
    here = where()
    with node_cache(remote) as (repo, conn):
        fetch_versions(repo, conn, [job.head, *job.parents])
        source = repo.store.put_blob(job.source).oid  # the recipe's source object, which the new version names
        if job.recipe.get("source") not in (None, source):
            raise InvalidJobError("recipe", "the source it carries is not the object its recipe names")
        lock = FileLock(
            repo.dir / "cluster-locks" / _lock_name(job.model), what=f"model {job.model!r}", timeout=LOCK_WAIT
        )
        job, cwd = in_place(job)
        with lock:
            head = repo.refs.get(job.model)
            if head != job.head:  # the cache's ref only says what the next version follows
                repo.refs.update(job.model, job.head, expected=head)
            run = run_recipe_in(repo, job, where=here, cwd=cwd)
        if run.ok and run.created and run.version is not None:
            _, _, sent = publish_to(repo, conn, [run.version], [job.head, *job.parents])
            run = replace(run, notes=[*run.notes, f"sent {sent.objects} objects ({sent.bytes} bytes) from {here}"])
        return run


def test_task(remote: RemoteSpec, job: CheckJob) -> RunOutcome:
    """The body of a test task: check out the version from the node cache and run the test
    (a job that breaks the job contract is refused first: InvalidJobError)."""
    job = received_test_job(job)
    _check_remote(remote)
    job, cwd = in_place(job)
    with node_cache(remote) as (repo, conn):
        fetch_versions(repo, conn, [job.version])
        (run,) = run_tests_in(repo, [job], cwd=cwd)
    return replace(run, origin=where())


def in_place(job: J) -> tuple[J, Path | None]:
    """The job as it runs here, and the folder it runs in: when this node has the function's
    file where the driver has it, with the same bytes (code deployed alike on every node),
    it runs there as a local run would, its sibling modules importable; else the source the
    job carries runs from a temporary folder (always, for a function in a file the driver
    named by an absolute path: no path outside the work folder is read here)."""
    if (
        job.root is None
        or job.source is None
        or usercode.split_spec(job.fn)[0].startswith("/")
        or not Path(job.root).is_dir()
    ):
        return job, None
    try:
        here = usercode.source_file(job.fn, cwd=Path(job.root)).read_bytes()
    except (MgitError, OSError):
        return job, None
    if here != job.source:
        return job, None
    return replace(job, source=None), Path(job.root)


def _check_remote(remote: object) -> None:
    if not isinstance(remote, RemoteSpec) or not isinstance(remote.url, str):
        raise InvalidJobError("cluster", "the remote it names is not a remote")


def _lock_name(model: str) -> str:
    return hashlib.sha256(model.encode()).hexdigest()[:16] + ".lock"
