"""The Ray executor, driver side: recipe and test jobs as Ray tasks, refs moved here.

The driver keeps the state, as in Ray's own examples: it plans, hands each job to a task
with the resources it declares, and is the only one to move refs. Before jobs run it makes
what they read reachable on the repository's remote (`prepare`: a cascade pushes the
models it involves, fast-forward only; a test run sends the versions it tests, moving no
ref). A recipe task sends its new version to the remote (`mgit.cluster.node`); the driver
then fetches it here, verified, and moves the model's ref here and on the remote, each by
compare-and-swap, in the cascade's topological order (the cascade waits for a parent's
commit before it starts the children).

A worker process or node that dies mid-task is Ray's to retry (`max_retries`); after the
last retry the job fails as a failing recipe does and blocks the models below it. A driver
killed mid-cascade leaves every model at its old version or its new one, here and on the
remote, and the next run resumes.

With `signing.always` the driver signs each version it adopts, before its ref moves, and
sends the signature to the remote with it: the key stays on the driver (a task gets its job
and the remote's address, nothing of the key), and a node's versions are never signed there.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

from mgit import usercode
from mgit.errors import (
    ClusterError,
    InvalidOptionError,
    MgitError,
    RefConflictError,
    RemoteConflictError,
)
from mgit.execution import CheckJob, RecipeJob, RecipeRun
from mgit.remotes.config import remote_of, remotes_of
from mgit.repo.repository import Repo
from mgit.signing.policy import signs_always
from mgit.sync.connection import DEFAULT_REMOTE, connect
from mgit.sync.fetch import fetch_versions
from mgit.sync.push import move_head, publish_to, push
from mgit.sync.signatures import push_signatures
from mgit.usercode import RunOutcome, resources_of

MAX_RETRIES = 3  # of a task whose worker process or node died (Ray's own retry)
CONNECT_ATTEMPTS = 3  # of a Ray Client connection
GET_MARGIN = 900.0  # seconds a task may take beyond its user code's limit (checkouts, transfers)


def ray_module() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError("the Ray executor needs Ray", hint="Install it: pip install 'mgit-models[ray]'") from None
    return ray


class RayExecutor:
    """Jobs as Ray tasks on the cluster at `address` (`None`: Ray's own choice, RAY_ADDRESS
    or a new local instance; `ray://HOST:PORT`: Ray Client), reading and writing through the
    repository's remote `remote`. `num_cpus`/`num_gpus` are what a job declares when its
    recipe or test recorded nothing."""

    name = "ray"

    def __init__(
        self,
        repo: Repo,
        *,
        address: str | None = None,
        remote: str | None = None,
        num_cpus: float | None = None,
        num_gpus: float | None = None,
        max_retries: int = MAX_RETRIES,
    ) -> None:
        self.repo = repo
        self.remote_name = remote or _default_remote(repo)
        self.spec = remote_of(repo.config, self.remote_name)
        self.defaults = resources_of({"num_cpus": num_cpus, "num_gpus": num_gpus})
        self.max_retries = max_retries
        self._lock = threading.Lock()  # one ref move, one fetch here at a time
        self._there: set[str] = set()  # versions known to be on the remote
        self._sources: dict[str, bytes] = {}  # a function's file, by reference
        ray = ray_module()  # (before the remote is connected: nothing to close if Ray is missing)
        from mgit.cluster import node

        self.conn = connect(repo, self.remote_name)
        try:
            self._started = not ray.is_initialized()
            if self._started:
                _connect(ray, address)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            self.conn.close()
            raise ClusterError(
                f"cannot reach the Ray cluster at {address or os.environ.get('RAY_ADDRESS') or 'auto'}: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                hint="Start one (ray start --head) or give --executor ray://HOST:PORT",
            ) from None
        self._ray = ray
        self._stdout = sys.stdout
        sys.stdout = RayMessagesToStderr(self._stdout)
        self._recipe = ray.remote(node.recipe_task)
        self._test = ray.remote(node.test_task)
        self.where = address or os.environ.get("RAY_ADDRESS") or "ray"

    # --- before jobs run --------------------------------------------------------------------
    def prepare(self, *, models: Sequence[str] = (), versions: Sequence[str] = ()) -> None:
        """Make what jobs read reachable on the remote: `models` pushed (their refs move there,
        fast-forward only: a model the remote has a newer version of is refused, pull first),
        `versions` sent without a ref."""
        if models:
            pushed = push(self.repo, self.remote_name, sorted(models))
            self._there.update(u.new for u in pushed.models if u.new)
        todo = [v for v in versions if v not in self._there]
        if todo:  # (a cascade tests each new version: those are there already)
            known = [h for h, _ in self.conn.remote.heads().values()]
            if self.conn.tracking is not None:
                known += list(self.conn.tracking.all().values())
            publish_to(self.repo, self.conn, todo, known)
            self._there.update(todo)

    # --- jobs -------------------------------------------------------------------------------
    def run_recipe(self, job: RecipeJob) -> RecipeRun:
        job = self._carrying_source(job)
        task = self._recipe.options(**self._options(job.resources, f"mgit recipe {job.model}"))
        ran = self._get(task.remote(self.spec, job), job.timeout)
        if isinstance(ran, str):
            return RecipeRun(False, error=ran, where=self.where)
        if not ran.ok or not ran.created or ran.version is None:
            return ran
        return self._adopt(job, ran)

    def run_tests(self, jobs: list[CheckJob]) -> list[RunOutcome]:
        refs = []
        for job in jobs:
            job = self._carrying_source(job)
            refs.append(
                self._test.options(**self._options(job.resources, f"mgit test {job.test}")).remote(self.spec, job)
            )
        out = []
        for job, ref in zip(jobs, refs, strict=True):
            ran = self._get(ref, job.timeout)
            out.append(RunOutcome(False, None, ran, "", 0.0, self.where) if isinstance(ran, str) else ran)
        return out

    def _carrying_source(self, job: Any) -> Any:
        """The job with the function's file as it is here when it carries no recorded source
        (each file read once per command: a test run hands out one job per model and test),
        and the work folder it was planned in."""
        if job.source is None:
            if job.fn not in self._sources:
                self._sources[job.fn] = usercode.source_file(job.fn, cwd=self.repo.root).read_bytes()
            job = replace(job, source=self._sources[job.fn])
        return replace(job, root=str(self.repo.root))

    def close(self) -> None:
        self.conn.close()
        if self._started:
            self._ray.shutdown()
        if isinstance(sys.stdout, RayMessagesToStderr):
            sys.stdout = self._stdout

    def _options(self, resources: dict[str, float], name: str) -> dict[str, Any]:
        declared = {**self.defaults, **resources}  # what the recipe or test recorded wins
        # SPREAD: recipes and tests are long and independent; packing them onto the driver's
        # node while others idle is Ray's default for short tasks, not what these need.
        return {
            "num_cpus": declared.get("num_cpus", 1.0),
            "num_gpus": declared.get("num_gpus", 0.0),
            "max_retries": self.max_retries,
            "retry_exceptions": False,
            "name": name,
            "scheduling_strategy": "SPREAD",
        }

    def _get(self, ref: Any, timeout: float) -> Any:
        """The task's result, or one line saying why there is none (after Ray's retries)."""
        ray = self._ray
        try:
            return ray.get(ref, timeout=timeout + GET_MARGIN)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            return f"the Ray task did not finish within {timeout + GET_MARGIN:g} s"
        except ray.exceptions.RayTaskError as exc:  # the task raised (the remote, the node cache)
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            last_line = str(cause).strip().splitlines()[-1] if str(cause).strip() else type(cause).__name__
            return f"the Ray task failed: {last_line}"
        except ray.exceptions.RayError as exc:  # its worker or node died past the retries
            return f"the Ray task was lost after {self.max_retries} retries ({type(exc).__name__})"

    def _adopt(self, job: RecipeJob, ran: RecipeRun) -> RecipeRun:
        """Bring the task's new version here (verified) and move the model's ref here, then
        on the remote, each by compare-and-swap from the head the job replaced."""
        vid = ran.version
        assert vid is not None
        notes = list(ran.notes)
        with self._lock:
            step = f"fetching {vid[:12]} from {self.remote_name}"
            try:
                fetch_versions(self.repo, self.conn, [vid], verify=False)  # made by this run: signed here
                if signs_always(self.repo.config):  # on the driver: no key is ever shipped to a node
                    step = f"signing {vid[:12]}"
                    self.repo.sign(vid)
                    step = f"sending the signature of {vid[:12]} to {self.remote_name}"
                    push_signatures(self.repo, self.conn, {vid})
                step = f"moving {job.model} to {vid[:12]}"
                self.repo.refs.update(job.model, vid, expected=job.head)
            except RefConflictError:
                return RecipeRun(
                    False, error=f"{job.model} got another version during the cascade; run it again", where=ran.where
                )
            except MgitError as exc:
                return RecipeRun(False, error=f"{step}: {exc}", where=ran.where)
            self.repo.catalog.set_head(job.model, lambda: self.repo.refs.get(job.model))  # (indexed by the fetch)
            theirs, token = self.conn.remote.heads([job.model]).get(job.model, (None, None))
            try:
                if theirs != job.head:
                    raise RemoteConflictError(self.remote_name, job.model)
                new = move_head(self.conn, job.model, vid, expected=theirs, token=token)
                self.conn.remote.refresh_heads({job.model: (vid, new)})  # the heads index follows
            except RemoteConflictError:
                notes.append(
                    f"{job.model} on {self.remote_name} got another version meanwhile and stays there; "
                    f"run: mgit pull {self.remote_name} && mgit push {self.remote_name}"
                )
            seq = self.repo.info(vid).seq
            self._there.add(vid)
        return RecipeRun(True, vid, seq, True, output=ran.output, where=ran.where, notes=notes)


def _connect(ray: Any, address: str | None) -> None:
    """ray.init, tried CONNECT_ATTEMPTS times a few seconds apart for a Ray Client address:
    its server starts a process per client, which a busy head can fail to start in time."""
    attempts = CONNECT_ATTEMPTS if address and address.startswith("ray://") else 1
    for attempt in range(attempts):
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False, configure_logging=False)
            return
        except ConnectionError:
            if attempt == attempts - 1:
                raise
            time.sleep(2.0 * (attempt + 1))


class RayMessagesToStderr:
    """stdout, except for what Ray's own threads print there (the cluster's events, such as
    a node marked dead), which goes to stderr: a command's stdout stays its own (--json)."""

    def __init__(self, stdout: TextIO) -> None:
        self._stdout = stdout

    def _sink(self) -> TextIO:
        return sys.stderr if threading.current_thread().name.startswith("ray_") else self._stdout

    def write(self, text: str) -> int:
        return self._sink().write(text)

    def flush(self) -> None:
        self._sink().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stdout, name)


def _default_remote(repo: Repo) -> str:
    names = list(remotes_of(repo.config))
    if DEFAULT_REMOTE in names or not names:
        return DEFAULT_REMOTE if names else _no_remote()
    if len(names) == 1:
        return names[0]
    raise InvalidOptionError(
        "this repository has several remotes; say which one the cluster shares",
        hint=f"Add --remote NAME (one of: {', '.join(names)})",
    )


def _no_remote() -> str:
    raise InvalidOptionError(
        "the Ray executor needs a remote that the cluster's nodes reach (an S3 prefix)",
        hint="Add one: mgit remote add origin s3://BUCKET/PREFIX",
    )
