"""Options shared by the commands that run user code somewhere: `--executor`, `--remote`,
`--num-cpus`, `--num-gpus`, `--trust-remote-code` (`mgit cascade`, `mgit test run`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from mgit.cluster import EXECUTORS, open_executor
from mgit.execution import Executor
from mgit.repo.repository import Repo

CLUSTER_JOBS = 32  # jobs in flight at once on a cluster when --jobs is not given: Ray schedules them


trust_option = click.option(
    "--trust-remote-code",
    is_flag=True,
    help="Run code that came from a remote (a pulled test, the recipe of a fetched version) and trust it from then "
    "on; without it such code is listed and nothing runs. Read it first.",
)


def executor_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option(
            "--executor",
            default="local",
            show_default=True,
            metavar="local|ray|ray://HOST:PORT",
            help=f"Where recipes and tests run: {EXECUTORS}. `ray` joins the cluster RAY_ADDRESS names; "
            "its nodes read and write through the repository's remote.",
        ),
        click.option(
            "--remote",
            default=None,
            metavar="NAME",
            help="The remote the cluster shares (default: origin, or the only remote).",
        ),
        click.option(
            "--num-cpus",
            type=click.FloatRange(0, 1024),
            default=None,
            help="CPUs each task declares to the cluster, unless its recipe or test recorded its own (default 1).",
        ),
        click.option(
            "--num-gpus",
            type=click.FloatRange(0, 1024),
            default=None,
            help="GPUs each task declares, unless recorded (default 0).",
        ),
        click.option(
            "--max-retries",
            type=click.IntRange(0, 100),
            default=None,
            help="Times Ray runs a task again whose worker or node died (default 3); then it fails.",
        ),
        trust_option,
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def executor_from(repo: Repo, options: dict[str, Any]) -> Executor:
    return open_executor(
        repo,
        options["executor"],
        remote=options["remote"],
        num_cpus=options["num_cpus"],
        num_gpus=options["num_gpus"],
        max_retries=options["max_retries"],
    )


def resource_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--num-cpus`/`--num-gpus` recorded with a recipe or a test (what each run declares)."""
    fn = click.option(
        "--num-gpus",
        type=click.FloatRange(0, 1024),
        default=None,
        help="GPUs each run declares to a cluster (recorded).",
    )(fn)
    return click.option(
        "--num-cpus",
        type=click.FloatRange(0, 1024),
        default=None,
        help="CPUs each run declares to a cluster (recorded).",
    )(fn)
