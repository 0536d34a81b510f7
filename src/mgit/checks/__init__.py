"""User tests over the lineage graph: attach, run isolated, record, compare with the parent.

A test is a function (`module:function` or `file.py:function`) that takes a checked-out
model folder and returns a dict of metrics, optionally with `passed`. Pass conditions are
declared when it is attached (`acc >= 0.9`, `loss <= 0.5`); a run whose metrics break them
(or hold a NaN) fails, and one that raises, hangs or exits is an error (mgit.checks.verdicts).
A test is attached to a model name, a name glob or a tag, and with `inherit` to every
descendant of those models, present and future.

Registrations and results live in `checks.sqlite`, apart from the catalog: they are not
derived from objects and refs, so rebuilding (or losing) the catalog never touches them. A
result is keyed by (version, test, sha256 of the test's source file): it is reused until
the version or the source changes, or `force` is given, and judged again when read, by the
conditions of the test's registration then.

A registration pulled from a remote is another person's code: its function reference is
checked where it is read (a module path or a file below the work folder: never a path that
reaches elsewhere), and it runs only once trusted (`trust_remote_code`, which marks it
trusted in the repository's `trusted-code`, mgit.repo.location); a test attached here is trusted
when it is attached.

The package, by noun: `specs` (a registration: its conditions, what it applies to, one from a
remote checked), `registrations` (the table of them, and trust), `results` (the table of
recorded results and what they hold), `verdicts` (pass, fail or error, judged from metrics
by the conditions in force), `runs` (Checks: running tests and reading results).
"""

from mgit.checks.registrations import Registrations
from mgit.checks.results import CheckOutcome, CheckRunResult, ResultTable
from mgit.checks.runs import Checks, blob_sha256, sha256
from mgit.checks.specs import CheckSpec, Condition, parse_registration

__all__ = [
    "CheckOutcome",
    "CheckRunResult",
    "CheckSpec",
    "Checks",
    "Condition",
    "Registrations",
    "ResultTable",
    "blob_sha256",
    "parse_registration",
    "sha256",
]
