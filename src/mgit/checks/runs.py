"""Checks: running a repository's tests on versions (each run in a child process, here or
on a cluster's executor), judging and recording each run, and reading recorded results with
the lineage parent's beside them."""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from mgit import usercode
from mgit.checks.registrations import Registrations
from mgit.checks.results import CheckOutcome, CheckRunResult, ResultTable
from mgit.checks.schema import open_checks
from mgit.checks.specs import CheckSpec
from mgit.checks.verdicts import judge_run, rejudged
from mgit.errors import MgitError
from mgit.execution import CheckJob, Executor, LocalExecutor
from mgit.lineage.graph import Lineage
from mgit.repo.repository import Repo
from mgit.store.objects import user_at_host, utc_now
from mgit.usercode import DEFAULT_TIMEOUT


class Checks(Registrations):
    """The tests of one repository: `Checks(repo)`. Built from Repo's public verbs
    (lineage, resolve, info, checkout); registrations (mgit.checks.registrations) and
    recorded results (`results`, mgit.checks.results) in `checks.sqlite`."""

    def __init__(self, repo: Repo) -> None:
        super().__init__(repo, open_checks(repo.dir))
        self.results = ResultTable(repo, self.database)

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
        own = executor is None
        executor = executor or LocalExecutor(self.repo)
        try:
            return self._run_all(work, sources, timeout, reused, executor, skipped, notes, jobs)
        finally:
            if own:
                executor.close()  # the versions its jobs shared

    def _run_all(
        self,
        work: list[tuple[str, list[CheckSpec]]],
        sources: dict[str, tuple[str, bytes | None]],
        timeout: float | None,
        reused: dict[str, dict[str, CheckOutcome]],
        executor: Executor,
        skipped: list[str],
        notes: list[str],
        jobs: int | None,
    ) -> CheckRunResult:
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
        executor = LocalExecutor(self.repo)
        try:
            return self._with_parent(self._run_version(vid, [spec], sources, timeout, reused, executor)[0])
        finally:
            executor.close()

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
        with `force`), by test name, marked reused and judged by the registrations given."""
        if force:
            return {}
        found = [(s, self.results.recorded(vid, s.name, sources[s.name][0])) for s in specs]
        return {s.name: replace(rejudged(o, s), reused=True) for s, o in found if o is not None}

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
        """Judge a run of `spec` on `vid` (mgit.checks.verdicts) and record the result,
        wherever the run happened."""
        status, metrics, reasons = judge_run(spec.conditions, run)
        model, seq = self.results.model_seq(vid)
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
        self.results.insert(outcome)
        return outcome

    # --- results ------------------------------------------------------------------------
    def recorded(self, vid: str, test: str, source: str | None = None) -> CheckOutcome | None:
        """The recorded result of a test on a version (for that source, or the latest),
        judged by the test's registration now (mgit.checks.verdicts)."""
        found = self.results.recorded(vid, test, source)
        return None if found is None else rejudged(found, self._specs().get(test))

    def standing(self, vid: str, lineage: Lineage | None = None) -> dict[str, CheckOutcome | None]:
        """Each test that applies to a version now, with its recorded result for the test's
        current source judged now; None where there is none (never run, or its file is gone
        and no source was recorded). Runs nothing."""
        out: dict[str, CheckOutcome | None] = {}
        for t in self.applicable(self.repo.model_of(vid), lineage):
            try:
                source = self.source_of(t)[0]
            except MgitError:
                out[t.name] = None
                continue
            found = self.results.recorded(vid, t.name, source)
            out[t.name] = None if found is None else rejudged(found, t)
        return out

    def failing(self, vid: str, lineage: Lineage | None = None) -> list[str]:
        """The tests that apply to a version now whose recorded result for their current
        source does not pass, judged now (a failure or an error). Runs nothing: a test never
        run, or whose file is gone, is not counted (a detached test, or one whose source
        changed since, no longer judges)."""
        return [name for name, o in self.standing(vid, lineage).items() if o is not None and not o.passed]

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
        """{version: {test: its latest recorded result}} in one query, judged now, without
        the parent's (`refs`: the (model, seq) of versions the caller knows already)."""
        specs = self._specs()
        found = self.results.latest(vids, refs)
        return {vid: {t: rejudged(o, specs.get(t)) for t, o in tests.items()} for vid, tests in found.items()}

    def result_records(self) -> list[dict[str, Any]]:
        """Every recorded result as data (what a push sends)."""
        return self.results.result_records()

    def add_results(self, records: list[Any]) -> int:
        """Take recorded results from a remote; how many were new (mgit.checks.results)."""
        return self.results.add_results(records)

    def copy_results(self, renamed: dict[str, str]) -> int:
        """Give versions rewritten with the same content the results of those they replace."""
        return self.results.copy_results(renamed)

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

    def _specs(self) -> dict[str, CheckSpec]:
        """The registrations in force, by name, that judge recorded results."""
        return {t.name: t for t in self.tests(checked=False)}

    def _ref(self, vid: str) -> str:
        model, seq = self.results.model_seq(vid)
        return f"{model}@{seq}"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def blob_sha256(repo: Repo, oid: str) -> str | None:
    try:
        return sha256(repo.store.get(oid)[1].tobytes())
    except MgitError:
        return None
