"""Recorded results (the `results` table of `checks.sqlite`): what one run of a test on one
version gave, keyed by (version, test, sha256 of the test's source), read back one at a
time or a page of versions in one query, and travelling with push and pull."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from mgit import usercode
from mgit.checks.schema import RESULT_COLUMNS
from mgit.errors import MgitError, RemoteError
from mgit.repo.repository import Repo
from mgit.reports import Report, json_safe
from mgit.store.objects import OID_RE
from mgit.util.database import Database


@dataclass(frozen=True)
class CheckOutcome(Report):
    version: str
    model: str
    seq: int
    test: str
    source: str  # sha256 of the test's source file
    status: str  # pass, fail or error (mgit.checks.verdicts): judged by the test's conditions now
    metrics: dict[str, float]
    reasons: list[str]
    seconds: float
    time: str
    reused: bool = False
    output: str = field(default="", repr=False)
    origin: str = ""  # where it was recorded: `user@host`
    parent: str | None = None  # `model@seq` of the lineage parent whose result is compared
    parent_status: str | None = None
    parent_metrics: dict[str, float] | None = None
    recorded_status: str | None = None  # the verdict recorded with the metrics, when judged otherwise now

    @property
    def ref(self) -> str:
        return f"{self.model}@{self.seq}"

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def to_json(self, *, output: bool = False) -> dict[str, Any]:
        d = super().to_json()  # a non-finite metric is null, as everywhere in mgit's JSON
        if not output:
            d.pop("output")
        return d


@dataclass(frozen=True)
class CheckRunResult(Report):
    outcomes: list[CheckOutcome]
    skipped: list[str]  # `model@seq` with no test attached
    notes: list[str] = field(default_factory=list)  # recorded sources used, local files changed since

    @property
    def failed(self) -> list[CheckOutcome]:
        """Outcomes whose metrics break a condition (a verdict on the model)."""
        return [o for o in self.outcomes if o.status == "fail"]

    @property
    def errors(self) -> list[CheckOutcome]:
        """Outcomes where the test gave no verdict: it raised, hung, crashed, returned no metrics."""
        return [o for o in self.outcomes if o.status == "error"]

    @property
    def ok(self) -> bool:
        """Every outcome passed (a failure and an error both make `mgit test run` exit 1)."""
        return all(o.passed for o in self.outcomes)

    def to_json(self) -> dict[str, Any]:
        return {
            "outcomes": [o.to_json() for o in self.outcomes],
            "skipped": self.skipped,
            "notes": self.notes,
            "passed": sum(o.passed for o in self.outcomes),
            "failed": len(self.failed),
            "errors": len(self.errors),
        }


class ResultTable:
    """The recorded results of one repository, as recorded: `ResultTable(repo, database)`."""

    def __init__(self, repo: Repo, database: Database) -> None:
        self.repo = repo
        self.database = database

    def insert(self, outcome: CheckOutcome) -> None:
        """Record an outcome (replacing one for the same version, test and source)."""
        with self.database.atomic() as db:
            db.execute(
                f"INSERT OR REPLACE INTO results ({RESULT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    outcome.version,
                    outcome.test,
                    outcome.source,
                    outcome.status,
                    json.dumps(json_safe(outcome.metrics)),
                    json.dumps(outcome.reasons),
                    outcome.output,
                    outcome.seconds,
                    outcome.time,
                    outcome.origin,
                ),
            )

    def recorded(self, vid: str, test: str, source: str | None = None) -> CheckOutcome | None:
        """The recorded result of a test on a version (for that source, or the latest)."""
        sql = f"SELECT {RESULT_COLUMNS} FROM results WHERE version = ? AND test = ?"
        args: tuple[Any, ...] = (vid, test)
        if source is not None:
            sql, args = sql + " AND source = ?", (*args, source)
        row = self.database.db.execute(sql + " ORDER BY time DESC LIMIT 1", args).fetchone()
        return self.outcome(row) if row else None

    def latest(
        self, vids: list[str], refs: dict[str, tuple[str, int]] | None = None
    ) -> dict[str, dict[str, CheckOutcome]]:
        """{version: {test: its latest recorded result}} in one query. The (model, seq) of
        the versions not in `refs` are read in one more query, never one by one (a page of a
        thousand models)."""
        rows = self.database.db.execute(
            f"""SELECT {RESULT_COLUMNS} FROM results r WHERE version IN (SELECT value FROM json_each(?))
                AND time = (SELECT MAX(time) FROM results r2 WHERE r2.version = r.version AND r2.test = r.test)
                ORDER BY version, test""",
            (json.dumps(vids),),
        ).fetchall()
        refs = dict(refs or {})
        unnamed = sorted({row[0] for row in rows} - refs.keys())
        if unnamed:
            refs.update((vid, (v.model, v.seq)) for vid, v in self.repo.catalog.versions_of(unnamed).items())
        out: dict[str, dict[str, CheckOutcome]] = {vid: {} for vid in vids}
        for row in rows:
            out[row[0]][row[1]] = self.outcome(row, refs.get(row[0]))
        return out

    # --- travelling with push and pull --------------------------------------------------------
    def result_records(self) -> list[dict[str, Any]]:
        """Every recorded result as data, output and origin included (what a push sends)."""
        names = RESULT_COLUMNS.split(", ")
        rows = self.database.db.execute(f"SELECT {RESULT_COLUMNS} FROM results ORDER BY version, test, source")
        return [dict(zip(names, r, strict=True)) for r in rows]

    def add_results(self, records: list[Any]) -> int:
        """Take recorded results from a remote (a result already here for the same version,
        test and source stays as it is); return how many were new."""
        rows = [_result_row(r) for r in records]
        with self.database.atomic() as db:
            before = db.total_changes
            db.executemany(
                f"INSERT OR IGNORE INTO results ({RESULT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
            return db.total_changes - before

    def copy_results(self, renamed: dict[str, str]) -> int:
        """Give versions rewritten with the same content (a pull that replays local versions
        after the remote's) the results of the versions they replace."""
        copied = [{**r, "version": renamed[r["version"]]} for r in self.result_records() if r["version"] in renamed]
        return self.add_results(copied)

    # --- rows -----------------------------------------------------------------------------------
    def outcome(self, row: tuple[Any, ...], ref: tuple[str, int] | None = None) -> CheckOutcome:
        vid, test, source, status, metrics, reasons, output, seconds, time, origin = row
        model, seq = ref or self.model_seq(vid)
        return CheckOutcome(
            vid,
            model,
            seq,
            test,
            source,
            status,
            _floats(json.loads(metrics)),
            json.loads(reasons),
            seconds,
            time,
            output=output,
            origin=origin,
        )

    def model_seq(self, vid: str) -> tuple[str, int]:
        try:
            info = self.repo.info(vid)
        except MgitError:
            return "?", 0
        return info.model, info.seq


def _result_row(record: Any) -> tuple[Any, ...]:
    """A recorded result from a remote as a row, checked field by field."""
    try:
        names = RESULT_COLUMNS.split(", ")
        row = tuple(record[n] for n in names)
        vid, test, source, status, metrics, reasons, output, seconds, time, origin = row
        json.loads(metrics), json.loads(reasons)
        ok = (
            OID_RE.match(vid) is not None
            and status in ("pass", "fail", "error")
            and all(isinstance(v, str) for v in (test, source, metrics, reasons, output, time, origin))
            and isinstance(seconds, (int, float))
            and len(output) <= 2 * usercode.MAX_OUTPUT
        )
    except (KeyError, TypeError, ValueError):
        ok = False
    if not ok:
        raise RemoteError(f"a malformed test result {str(record)[:80]!r}")
    return row


def _floats(metrics: dict[str, float | None]) -> dict[str, float]:
    return {k: float("nan") if v is None else float(v) for k, v in metrics.items()}
