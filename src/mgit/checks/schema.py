"""`checks.sqlite`: its two tables (registrations and recorded results) and their migrations."""

from __future__ import annotations

from pathlib import Path

from mgit.util.database import Database

MIGRATIONS: list[tuple[str, list[str]]] = [
    (
        "0001_tests",
        [
            """CREATE TABLE tests (name TEXT PRIMARY KEY, fn TEXT NOT NULL, target TEXT NOT NULL,
            inherit INTEGER NOT NULL, conditions TEXT NOT NULL, timeout REAL, created TEXT NOT NULL)""",
            """CREATE TABLE results (version TEXT NOT NULL, test TEXT NOT NULL, source TEXT NOT NULL,
            status TEXT NOT NULL, metrics TEXT NOT NULL, reasons TEXT NOT NULL, output TEXT NOT NULL,
            seconds REAL NOT NULL, time TEXT NOT NULL, PRIMARY KEY (version, test, source))""",
        ],
    ),
    # The test's source file as an object (so a teammate without the file can run it), and
    # where each result was recorded (`user@host`; results travel with push and pull).
    (
        "0002_sources_and_origins",
        [
            "ALTER TABLE tests ADD COLUMN source TEXT",
            "ALTER TABLE results ADD COLUMN origin TEXT NOT NULL DEFAULT ''",
        ],
    ),
    # What a run of the test declares to a cluster's scheduler: {"num_cpus": 2, "num_gpus": 1}.
    ("0003_resources", ["ALTER TABLE tests ADD COLUMN resources TEXT NOT NULL DEFAULT '{}'"]),
    # The remote a registration was pulled from; '' when it was attached here.
    ("0004_registration_origin", ["ALTER TABLE tests ADD COLUMN origin TEXT NOT NULL DEFAULT ''"]),
]
RESULT_COLUMNS = "version, test, source, status, metrics, reasons, output, seconds, time, origin"


def open_checks(repository_dir: Path) -> Database:
    """A repository's `checks.sqlite`, migrated to the current schema."""
    return Database(repository_dir / "checks.sqlite", MIGRATIONS)
