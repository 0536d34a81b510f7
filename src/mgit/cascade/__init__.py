"""Cascades: after a model gets a new version, rebuild its descendants by re-running their
recipes on the new parent versions, commit each result as a new version and run its tests.

A descendant of the cascade's model is *planned* when one of its lineage parents (the
cascade's model or another descendant) is rebuilt in this cascade, or when the parent
version it records is no longer that parent's latest. The second rule is what makes a
cascade resumable: after a failure or a kill, running it again finds exactly the models
still built on old versions, and the finished ones are up to date.

A planned model without a recipe needs a manual update (the plan gives the command that
records a recipe); everything below it is blocked, as is everything below a model whose
recipe or tests failed, or below a parent whose tests fail.

Recipes are user code: they run only here, each in a child process (`mgit.usercode`), on
parent folders checked out into a temporary folder. The output folder is added as one
version, atomically, so a kill leaves the old head or the new one, never half of one.
Independent branches run in parallel on a thread pool: a model starts once all the planned
parents it waits for are done.

A recipe recorded with a version that came from a remote, and a test pulled from one, are
another person's code: a cascade that would run any of it not trusted here stops before it
runs anything, naming it, unless `trust_remote_code` (mgit.checks.Checks.require_trust);
recipes recorded here are trusted (mgit.repo.location). Under `signing.always` the cascade
loads the signing key first, the same way (`require_signer`), and signs each version it
commits; on a cluster the driver signs (mgit.cluster.driver).
"""

from mgit.cascade.plan import CascadePlan, CascadeStep, PlannedParent, plan_cascade
from mgit.cascade.rebuild import (
    FAILED,
    RECIPE_TIMEOUT,
    CascadeReport,
    CheckLine,
    ModelResult,
    cascade,
    execute,
    require_signer,
    require_trust,
    tests_summary,
)

__all__ = [
    "FAILED",
    "RECIPE_TIMEOUT",
    "CascadePlan",
    "CascadeReport",
    "CascadeStep",
    "CheckLine",
    "ModelResult",
    "PlannedParent",
    "cascade",
    "execute",
    "plan_cascade",
    "require_signer",
    "require_trust",
    "tests_summary",
]
