"""Running cascades and test runs on a cluster: Ray's executor (`mgit.cluster.driver`) and
what its tasks do on the worker nodes (`mgit.cluster.node`), which share no disk with the
driver and read and write through the repository's remote.

`open_executor(repo, "local" | "ray" | "ray://HOST:PORT")` gives the executor a command
asked for; the local one never imports Ray."""

from __future__ import annotations

from mgit.errors import InvalidOptionError
from mgit.execution import Executor, LocalExecutor
from mgit.repo.repository import Repo

EXECUTORS = "local, ray or ray://HOST:PORT"


def open_executor(
    repo: Repo,
    spec: str = "local",
    *,
    remote: str | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    max_retries: int | None = None,
) -> Executor:
    """The executor `spec` names: `local` (here, the default), `ray` (the cluster RAY_ADDRESS
    names, else a new local Ray instance) or `ray://HOST:PORT` (a cluster's Ray Client
    address). `remote` is the repository's remote the cluster reads and writes through."""
    if spec == "local":
        if any(v is not None for v in (remote, num_cpus, num_gpus, max_retries)):
            raise InvalidOptionError(
                "--remote, --num-cpus, --num-gpus and --max-retries are for a cluster executor",
                hint="Add --executor ray",
            )
        return LocalExecutor(repo)
    if spec == "ray" or spec.startswith("ray://"):
        from mgit.cluster.driver import MAX_RETRIES, RayExecutor

        return RayExecutor(
            repo,
            address=None if spec == "ray" else spec,
            remote=remote,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            max_retries=MAX_RETRIES if max_retries is None else max_retries,
        )
    raise InvalidOptionError(f"unknown executor {spec!r}", hint=f"Use {EXECUTORS}")
