"""User tests over the lineage graph: attach, run isolated, record, compare with the parent.

A test is a function (`module:function` or `file.py:function`) that takes a checked-out
model folder and returns a dict of metrics, optionally with `passed`. Pass conditions are
declared when it is attached (`acc >= 0.9`, `loss <= 0.5`); a run that raises, hangs, exits
or returns a NaN fails. A test is attached to a model name, a name glob or a tag, and with
`inherit` to every descendant of those models, present and future.

Registrations and results live in `checks.sqlite`, apart from the catalog: they are not
derived from objects and refs, so rebuilding (or losing) the catalog never touches them. A
result is keyed by (version, test, sha256 of the test's source file): it is reused until
the version or the source changes, or `force` is given.

A registration pulled from a remote is another person's code: its function reference is
checked where it is read (a module path or a file below the work folder: never a path that
reaches elsewhere), and it runs only once trusted (`trust_remote_code`, which marks it
trusted in the repository's `trusted-code`, mgit.repo.location); a test attached here is trusted
when it is attached.

Over 500 lines, not split: registrations, runs and recorded results are one table pair and
one set of rules (what applies where, which result counts), read together by every verb.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from mgit import usercode
from mgit.errors import (
    CheckExistsError,
    CheckNotFoundError,
    MgitError,
    RemoteError,
    UnknownRefError,
    UnsafeRegistrationError,
    UntrustedCodeError,
)
from mgit.execution import CheckJob, Executor, LocalExecutor, resources_of
from mgit.lineage.graph import Lineage
from mgit.repo.location import trust_code, trusted_code, trusts_remote_code
from mgit.repo.repository import Repo
from mgit.reports import Report, json_safe
from mgit.store.objects import OID_RE, tag_matches, user_at_host, utc_now
from mgit.usercode import DEFAULT_TIMEOUT
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


@dataclass(frozen=True)
class Condition(Report):
    metric: str
    bound: str  # "min" (metric >= value) or "max" (metric <= value)
    value: float

    def check(self, metrics: dict[str, float]) -> str | None:
        """Why the metrics break this condition, or None."""
        got = metrics.get(self.metric)
        if got is None:
            return f"{self.metric} is missing"
        if math.isnan(got) or (got < self.value if self.bound == "min" else got > self.value):
            return f"{self.metric} {got:g} {'<' if self.bound == 'min' else '>'} {self.value:g}"
        return None


@dataclass(frozen=True)
class CheckSpec(Report):
    name: str
    fn: str
    target: str  # a model name, a glob (`bert-*`) or a tag (`tag:KEY[=VALUE]`)
    inherit: bool
    conditions: list[Condition]
    timeout: float | None = None
    source: str | None = None  # the object holding the function's source file when attached
    resources: dict[str, float] = field(default_factory=dict)  # declared to a cluster (mgit.execution)

    def matches(self, model: str, tags: dict[str, str]) -> bool:
        if self.target.startswith("tag:"):
            return tag_matches(self.target[4:], tags)
        return fnmatch.fnmatchcase(model, self.target)


@dataclass(frozen=True)
class CheckOutcome(Report):
    version: str
    model: str
    seq: int
    test: str
    source: str  # sha256 of the test's source file
    status: str  # pass, fail or error (the test could not run or returned no usable metrics)
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
        return [o for o in self.outcomes if not o.passed]

    def to_json(self) -> dict[str, Any]:
        return {
            "outcomes": [o.to_json() for o in self.outcomes],
            "skipped": self.skipped,
            "notes": self.notes,
            "passed": sum(o.passed for o in self.outcomes),
            "failed": len(self.failed),
        }


class Checks:
    """The tests of one repository: `Checks(repo)`. Built from Repo's public verbs
    (lineage, resolve, info, checkout); registrations and results in `checks.sqlite`."""

    def __init__(self, repo: Repo) -> None:
        self.repo = repo
        self._sql = Database(repo.dir / "checks.sqlite", MIGRATIONS)

    # --- registrations ------------------------------------------------------------------
    def attach(
        self,
        target: str,
        fn: str,
        *,
        name: str | None = None,
        conditions: list[Condition] | None = None,
        inherit: bool = False,
        timeout: float | None = None,
        resources: dict[str, float] | None = None,
    ) -> CheckSpec:
        """Attach a test to a model, a glob of names or `tag:KEY[=VALUE]`. The function is
        located (its file must exist) but not run. `resources` (`num_cpus`, `num_gpus`) are
        what each run declares to a cluster's scheduler."""
        fn = usercode.anchored(fn, self.repo.root)
        usercode.source_hash(fn, cwd=self.repo.root)  # the file names the function: read, never run
        source = self.repo.store.put_blob(usercode.source_file(fn, cwd=self.repo.root).read_bytes()).oid
        self.repo.refs.pin(source)  # kept through gc, sent by push: a teammate runs it without the file
        spec = CheckSpec(
            name or usercode.split_spec(fn)[1],
            fn,
            target,
            inherit,
            list(conditions or []),
            timeout,
            source,
            resources_of(resources),
        )
        lineage = self.repo.lineage
        if not any(spec.matches(n, m.tags) for n, m in lineage.nodes.items()) and not _is_pattern(target):
            raise UnknownRefError(
                target, "no model", hint="Attach to a model name, a glob like 'bert-*' or tag:KEY=VALUE"
            )
        with self._sql.atomic() as db:
            if db.execute("SELECT 1 FROM tests WHERE name = ?", (spec.name,)).fetchone():
                raise CheckExistsError(spec.name)
            self._insert_test(db, spec, utc_now(), "")
        trust_code(self.repo.dir, [(spec.fn, spec.source)])  # attached here: the user's own code
        return spec

    @staticmethod
    def _insert_test(db: Any, spec: CheckSpec, created: str, origin: str) -> None:
        db.execute(
            "INSERT INTO tests (name, fn, target, inherit, conditions, timeout, created, source, resources, "
            "origin) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                spec.name,
                spec.fn,
                spec.target,
                int(spec.inherit),
                json.dumps([c.to_json() for c in spec.conditions]),
                spec.timeout,
                created,
                spec.source,
                json.dumps(spec.resources, sort_keys=True),
                origin,
            ),
        )

    def detach(self, name: str) -> CheckSpec:
        spec = self.test(name, checked=False)  # (an unsafe registration is removed this way)
        with self._sql.atomic() as db:
            db.execute("DELETE FROM tests WHERE name = ?", (name,))
        return spec

    def tests(self, *, checked: bool = True) -> list[CheckSpec]:
        """Every registration. Each function reference is checked as it is read (see the
        module's docstring): one that is not a module path or a file below the work folder
        (an absolute file too, for a test attached here) is an UnsafeRegistrationError,
        unless `checked` is False (to list or remove it)."""
        rows = self._sql.db.execute(
            "SELECT name, fn, target, inherit, conditions, timeout, source, resources, origin FROM tests ORDER BY name"
        )
        specs = []
        for n, f, t, i, cs, to, src, res, origin in rows:
            if checked:
                try:
                    usercode.check_reference(f, absolute=origin == "")
                except usercode.UserCodeError as exc:
                    raise UnsafeRegistrationError(n, exc.message) from None
            conditions = [Condition(**c) for c in json.loads(cs)]
            specs.append(CheckSpec(n, f, t, bool(i), conditions, to, src, json.loads(res)))
        return specs

    def test(self, name: str, *, checked: bool = True) -> CheckSpec:
        for spec in self.tests(checked=checked):
            if spec.name == name:
                return spec
        raise CheckNotFoundError(name)

    def origins(self) -> dict[str, str]:
        """Where each registration came from: the remote it was pulled from, '' if attached here."""
        return dict(self._sql.db.execute("SELECT name, origin FROM tests").fetchall())

    def applicable(self, model: str, lineage: Lineage | None = None) -> list[CheckSpec]:
        """Tests that apply to a model: attached to it (by name, glob or tag), or inherited
        from an ancestor they were attached to with `inherit`."""
        lineage = lineage or self.repo.lineage
        node = lineage.node(model)
        ancestors = [(a, lineage.nodes[a].tags) for a in lineage.ancestors(model)]
        return [
            t
            for t in self.tests()
            if t.matches(model, node.tags) or (t.inherit and any(t.matches(a, tags) for a, tags in ancestors))
        ]

    def applicable_all(
        self, lineage: Lineage | None = None, *, specs: list[CheckSpec] | None = None
    ) -> dict[str, list[CheckSpec]]:
        """`applicable` of every model at once: each test's models, then their descendants
        when it is inherited, in one pass over the graph however many models it holds."""
        lineage = lineage or self.repo.lineage
        found: dict[str, list[CheckSpec]] = {n: [] for n in lineage.nodes}
        for t in self.tests() if specs is None else specs:
            if _is_pattern(t.target):
                hit = {n for n, node in lineage.nodes.items() if t.matches(n, node.tags)}
            else:  # a model's name: looked up, not matched against every model
                hit = {t.target} & lineage.nodes.keys()
            for n in sorted(hit | ({d for h in hit for d in lineage.descendants(h)} if t.inherit else set())):
                found[n].append(t)
        return found

    # --- trust --------------------------------------------------------------------------
    def untrusted(self, specs: list[CheckSpec]) -> list[str]:
        """What of these tests came from a remote and is not trusted here, each as a user
        reads it: `test 'size' (evals.py:size, pulled from origin)`."""
        trusted, origins = trusted_code(self.repo.dir), self.origins()
        out = []
        for t in {t.name: t for t in specs}.values():
            if (t.fn, t.source or "") not in trusted:
                origin = origins.get(t.name, "")
                where = f"pulled from {origin}" if origin else "attached before this repository recorded trusted code"
                out.append(f"test {t.name!r} ({t.fn}, {where})")
        return out

    def require_trust(
        self,
        specs: list[CheckSpec],
        *,
        trust_remote_code: bool = False,
        more: dict[str, tuple[str, str | None]] | None = None,
    ) -> None:
        """Refuse (UntrustedCodeError, nothing run) to go on with code from a remote that is
        not trusted here, unless `trust_remote_code` (or the repository's `trust-remote-code`
        setting) says to: then it is marked trusted, and later runs need no telling. `more`
        is other untrusted code the caller would run (a cascade's recipes): {what: (fn, source)}."""
        more = more or {}
        listed = [*more, *self.untrusted(specs)]
        if not listed:
            return
        if not (trust_remote_code or trusts_remote_code(self.repo.config)):
            raise UntrustedCodeError(listed)
        trust_code(self.repo.dir, [(t.fn, t.source) for t in specs] + list(more.values()))

    # --- running ------------------------------------------------------------------------
    def run(
        self,
        refs: list[str] | None = None,
        *,
        descendants: bool = False,
        tests: list[str] | None = None,
        jobs: int | None = None,
        timeout: float | None = None,
        force: bool = False,
        recorded_source: bool = False,
        executor: Executor | None = None,
        trust_remote_code: bool = False,
    ) -> CheckRunResult:
        """Run the tests that apply to these versions (every model's latest by default; with
        `descendants`, the latest of every descendant too), reusing recorded results.

        A test runs from its file here; from the source recorded when it was attached if
        the file is not here (a teammate's clone) or with `recorded_source`. `executor`
        says where runs happen (default: here; `mgit.cluster` has Ray's); results are
        judged and recorded here either way. A test pulled from a remote and not trusted
        here stops the run before anything runs (`require_trust`), unless `trust_remote_code`."""
        lineage = self.repo.lineage
        if refs is None:
            vids = [n.head for n in lineage.nodes.values() if not n.removed]
        else:
            vids = [self.repo.resolve(r) for r in refs]
            if descendants:
                names = {self.repo.model_of(v) for v in vids}
                extra = {d for n in names for d in lineage.descendants(n)}
                vids += [lineage.nodes[d].head for d in sorted(extra) if not lineage.nodes[d].removed]
        vids = list(dict.fromkeys(vids))
        wanted = set(tests) if tests else None
        for t in wanted or ():
            self.test(t)
        work: list[tuple[str, list[CheckSpec]]] = []
        skipped = []
        applying = self.applicable_all(lineage)  # every model's tests, from one pass over the graph
        for vid in vids:
            model = self.repo.model_of(vid)
            specs = [t for t in applying.get(model, []) if wanted is None or t.name in wanted]
            if specs:
                work.append((vid, specs))
            else:
                skipped.append(self._ref(vid))
        notes: list[str] = []
        sources = {t.name: self.source_of(t, recorded=recorded_source, notes=notes) for _, specs in work for t in specs}
        reused = {vid: self._reusable(vid, specs, sources, force) for vid, specs in work}
        self.require_trust(
            [t for vid, specs in work for t in specs if t.name not in reused[vid]], trust_remote_code=trust_remote_code
        )
        executor = executor or LocalExecutor(self.repo)
        executor.prepare(
            versions=[
                vid
                for vid, specs in work  # (a cluster's: only what will run there)
                if len(reused[vid]) < len(specs)
            ]
        )
        # One session: versions of a family share parents, decoded once for all their checkouts.
        with self.repo.caching(), ThreadPoolExecutor(max_workers=jobs or 2) as pool:
            done = list(
                pool.map(lambda w: self._run_version(w[0], w[1], sources, timeout, reused[w[0]], executor), work)
            )
        outcomes = [self._with_parent(o) for group in done for o in group]
        return CheckRunResult(outcomes, skipped, notes)

    def run_one(
        self, vid: str, test: str, *, timeout: float | None = None, force: bool = False, trust_remote_code: bool = False
    ) -> CheckOutcome:
        spec = self.test(test)
        sources = {spec.name: self.source_of(spec)}
        reused = self._reusable(vid, [spec], sources, force)
        if not reused:
            self.require_trust([spec], trust_remote_code=trust_remote_code)
        return self._with_parent(self._run_version(vid, [spec], sources, timeout, reused, LocalExecutor(self.repo))[0])

    def source_of(
        self, spec: CheckSpec, *, recorded: bool = False, notes: list[str] | None = None
    ) -> tuple[str, bytes | None]:
        """(sha256 of the source a run uses, its bytes when it is the recorded one rather
        than the file here). A local file that differs from the recorded source is noted."""
        try:
            local = usercode.source_file(spec.fn, cwd=self.repo.root)
        except usercode.UserCodeError:
            if spec.source is None:
                raise
            local = None
        if local is not None and not recorded:
            data = local.read_bytes()
            if spec.source is not None and notes is not None and blob_sha256(self.repo, spec.source) != sha256(data):
                notes.append(
                    f"{spec.fn} changed since test {spec.name} was attached; it ran as it is here "
                    "(--recorded-source runs the recorded one)"
                )
            return sha256(data), None
        if spec.source is None:
            raise usercode.UserCodeError(spec.fn, "no source was recorded for it when it was attached")
        data = self.repo.store.get(spec.source)[1].tobytes()
        if notes is not None:
            notes.append(
                f"test {spec.name} ran from the source recorded when it was attached"
                + ("" if local is not None else f" ({spec.fn} is not here)")
            )
        return sha256(data), data

    def _reusable(
        self, vid: str, specs: list[CheckSpec], sources: dict[str, tuple[str, bytes | None]], force: bool
    ) -> dict[str, CheckOutcome]:
        """The recorded results of these tests on `vid` for the sources a run would use (none
        with `force`), by test name, marked reused."""
        if force:
            return {}
        found = {s.name: self.recorded(vid, s.name, sources[s.name][0]) for s in specs}
        return {name: replace(o, reused=True) for name, o in found.items() if o is not None}

    def _run_version(
        self,
        vid: str,
        specs: list[CheckSpec],
        sources: dict[str, tuple[str, bytes | None]],
        timeout: float | None,
        reused: dict[str, CheckOutcome],
        executor: Executor,
    ) -> list[CheckOutcome]:
        results = dict(reused)
        todo = [s for s in specs if s.name not in results]
        if todo:
            jobs = [
                CheckJob(vid, s.name, s.fn, timeout or s.timeout or DEFAULT_TIMEOUT, sources[s.name][1], s.resources)
                for s in todo
            ]
            for spec, run in zip(todo, executor.run_tests(jobs), strict=True):
                results[spec.name] = self.record(vid, spec, sources[spec.name][0], run)
        return [results[s.name] for s in specs]

    def record(self, vid: str, spec: CheckSpec, source: str, run: usercode.RunOutcome) -> CheckOutcome:
        """Judge a run of `spec` on `vid` (its metrics against the test's conditions) and
        record the result, wherever the run happened."""
        metrics: dict[str, float] = {}
        if not run.ok:
            status, reasons = "error", [f"the test {run.error}"]
        else:
            metrics, passed, problem = usercode.metrics_of(run.value)
            reasons = [problem] if problem else []
            reasons += [r for c in spec.conditions if (r := c.check(metrics))]
            if passed is False:
                reasons.insert(0, "the test returned passed: false")
            status = "error" if problem and not metrics else "fail" if reasons else "pass"
        model, seq = self._model_seq(vid)
        outcome = CheckOutcome(
            vid,
            model,
            seq,
            spec.name,
            source,
            status,
            metrics,
            reasons,
            round(run.seconds, 3),
            utc_now(),
            output=run.output,
            origin=run.origin or user_at_host(),
        )
        with self._sql.atomic() as db:
            db.execute(
                f"INSERT OR REPLACE INTO results ({RESULT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    vid,
                    spec.name,
                    source,
                    status,
                    json.dumps(json_safe(metrics)),
                    json.dumps(reasons),
                    run.output,
                    outcome.seconds,
                    outcome.time,
                    outcome.origin,
                ),
            )
        return outcome

    # --- results ------------------------------------------------------------------------
    def recorded(self, vid: str, test: str, source: str | None = None) -> CheckOutcome | None:
        """The recorded result of a test on a version (for that source, or the latest)."""
        sql = f"SELECT {RESULT_COLUMNS} FROM results WHERE version = ? AND test = ?"
        args: tuple[Any, ...] = (vid, test)
        if source is not None:
            sql, args = sql + " AND source = ?", (*args, source)
        row = self._sql.db.execute(sql + " ORDER BY time DESC LIMIT 1", args).fetchone()
        return self._outcome(row) if row else None

    def failing(self, vid: str, lineage: Lineage | None = None) -> list[str]:
        """The tests that apply to a version now whose recorded result for their current
        source is not a pass. Runs nothing: a test never run, or whose file is gone, is not
        counted (a detached test, or one whose source changed since, no longer judges)."""
        out = []
        for t in self.applicable(self.repo.model_of(vid), lineage):
            try:
                found = self.recorded(vid, t.name, self.source_of(t)[0])
            except MgitError:
                continue
            if found is not None and not found.passed:
                out.append(t.name)
        return out

    def show(self, ref: str | None = None) -> list[CheckOutcome]:
        """Recorded results (the latest per test) of a version, or of every model's latest."""
        if ref is not None:
            vids = [self.repo.resolve(ref)]
        else:
            vids = [n.head for n in self.repo.lineage.nodes.values() if not n.removed]
        return [self._with_parent(o) for found in self.latest(vids).values() for o in found.values()]

    def latest(
        self, vids: list[str], refs: dict[str, tuple[str, int]] | None = None
    ) -> dict[str, dict[str, CheckOutcome]]:
        """{version: {test: its latest recorded result}} in one query, without the parent's.
        The (model, seq) of the versions not in `refs` are read in one more query, never one
        by one (a page of a thousand models)."""
        rows = self._sql.db.execute(
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
            out[row[0]][row[1]] = self._outcome(row, refs.get(row[0]))
        return out

    # --- travelling with push and pull --------------------------------------------------------
    def registrations(self) -> list[dict[str, Any]]:
        """Every registration as data (what a push sends)."""
        rows = self._sql.db.execute("SELECT name, created FROM tests ORDER BY name")
        created = dict(rows)
        return [{**t.to_json(), "created": created[t.name]} for t in self.tests()]

    def add_registration(self, record: Any, *, origin: str = "a remote") -> str:
        """Take a registration from a remote (named `origin`): `added`, `same` (here
        already), or `differs` (a test of that name here is another one: the one here is
        kept). It is not trusted here (see the module's docstring)."""
        spec, created = parse_registration(record)
        with self._sql.atomic() as db:
            row = db.execute("SELECT 1 FROM tests WHERE name = ?", (spec.name,)).fetchone()
            if row is None:
                self._insert_test(db, spec, created, origin or "a remote")
                if spec.source is not None:
                    self.repo.refs.pin(spec.source)
                return "added"
        here = self.test(spec.name, checked=False)
        return (
            "same"
            if (here.fn, here.target, here.inherit, here.conditions, here.resources)
            == (spec.fn, spec.target, spec.inherit, spec.conditions, spec.resources)
            else "differs"
        )

    def result_records(self) -> list[dict[str, Any]]:
        """Every recorded result as data, output and origin included (what a push sends)."""
        names = RESULT_COLUMNS.split(", ")
        rows = self._sql.db.execute(f"SELECT {RESULT_COLUMNS} FROM results ORDER BY version, test, source")
        return [dict(zip(names, r, strict=True)) for r in rows]

    def add_results(self, records: list[Any]) -> int:
        """Take recorded results from a remote (a result already here for the same version,
        test and source stays as it is); return how many were new."""
        rows = [_result_row(r) for r in records]
        with self._sql.atomic() as db:
            before = db.total_changes
            db.executemany(
                f"INSERT OR IGNORE INTO results ({RESULT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows
            )
            return db.total_changes - before

    def retarget(self, old: str, new: str) -> list[str]:
        """Tests attached to exactly the model name `old` follow it to `new` (a rename); the
        names of those tests. A glob or a tag target is left as it is."""
        with self._sql.atomic() as tx:
            names = [r[0] for r in tx.execute("SELECT name FROM tests WHERE target = ? ORDER BY name", (old,))]
            tx.execute("UPDATE tests SET target = ? WHERE target = ?", (new, old))
        return names

    def copy_results(self, renamed: dict[str, str]) -> int:
        """Give versions rewritten with the same content (a pull that replays local versions
        after the remote's) the results of the versions they replace."""
        copied = [{**r, "version": renamed[r["version"]]} for r in self.result_records() if r["version"] in renamed]
        return self.add_results(copied)

    def _outcome(self, row: tuple[Any, ...], ref: tuple[str, int] | None = None) -> CheckOutcome:
        vid, test, source, status, metrics, reasons, output, seconds, time, origin = row
        model, seq = ref or self._model_seq(vid)
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

    def _with_parent(self, o: CheckOutcome) -> CheckOutcome:
        """The outcome with its lineage parent's latest recorded result of the same test."""
        try:
            parents = self.repo.info(o.version).parents
        except MgitError:  # a result recorded for a version removed since
            return o
        if not parents:
            return o
        pvid = parents[0].version
        found = self.recorded(pvid, o.test)
        if found is None:
            return replace(o, parent=self._ref(pvid))
        return replace(o, parent=found.ref, parent_status=found.status, parent_metrics=found.metrics)

    def _model_seq(self, vid: str) -> tuple[str, int]:
        try:
            info = self.repo.info(vid)
        except MgitError:
            return "?", 0
        return info.model, info.seq

    def _ref(self, vid: str) -> str:
        model, seq = self._model_seq(vid)
        return f"{model}@{seq}"


def _is_pattern(target: str) -> bool:
    return target.startswith("tag:") or any(c in target for c in "*?[")


def parse_registration(record: Any) -> tuple[CheckSpec, str]:
    """A registration from a remote, checked field by field (a RemoteError if malformed)."""
    try:
        conditions = [Condition(str(c["metric"]), c["bound"], float(c["value"])) for c in record["conditions"]]
        spec = CheckSpec(
            record["name"],
            record["fn"],
            record["target"],
            record["inherit"],
            conditions,
            record.get("timeout"),
            record.get("source"),
            resources_of(record.get("resources")),
        )
        ok = (
            all(isinstance(v, str) and 0 < len(v) <= 1024 for v in (spec.name, spec.fn, spec.target))
            and isinstance(spec.inherit, bool)
            and all(c.bound in ("min", "max") for c in conditions)
            and (spec.timeout is None or (isinstance(spec.timeout, (int, float)) and spec.timeout > 0))
            and (spec.source is None or (isinstance(spec.source, str) and OID_RE.match(spec.source) is not None))
            and isinstance(record.get("created"), str)
        )
        usercode.check_reference(spec.fn)  # a module path or a file below the work folder, nothing else
    except (KeyError, TypeError, ValueError, AttributeError, MgitError):
        ok = False
    if not ok:
        raise RemoteError(f"a malformed test registration {str(record)[:80]!r}")
    return spec, record["created"]


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


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_sha256(repo: Repo, oid: str) -> str | None:
    try:
        return sha256(repo.store.get(oid)[1].tobytes())
    except MgitError:
        return None


def _floats(metrics: dict[str, float | None]) -> dict[str, float]:
    return {k: float("nan") if v is None else float(v) for k, v in metrics.items()}
