"""The registrations of one repository's tests (the `tests` table of `checks.sqlite`): attach,
detach, list, what applies to which model, what travels with push and pull, and trust."""

from __future__ import annotations

import json
from typing import Any

from mgit import usercode
from mgit.checks.specs import CheckSpec, Condition, is_pattern, parse_registration
from mgit.errors import (
    CheckExistsError,
    CheckNotFoundError,
    UnknownRefError,
    UnsafeRegistrationError,
    UntrustedCodeError,
)
from mgit.execution import resources_of
from mgit.lineage.graph import Lineage
from mgit.repo.location import trust_code, trusted_code, trusts_remote_code
from mgit.repo.repository import Repo
from mgit.store.objects import utc_now
from mgit.util.database import Database


class Registrations:
    """The tests attached in a repository: `Registrations(repo, database)`, the database its
    `checks.sqlite` (mgit.checks.schema)."""

    def __init__(self, repo: Repo, database: Database) -> None:
        self.repo = repo
        self.database = database

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
        if not any(spec.matches(n, m.tags) for n, m in lineage.nodes.items()) and not is_pattern(target):
            raise UnknownRefError(
                target, "no model", hint="Attach to a model name, a glob like 'bert-*' or tag:KEY=VALUE"
            )
        with self.database.atomic() as db:
            if db.execute("SELECT 1 FROM tests WHERE name = ?", (spec.name,)).fetchone():
                raise CheckExistsError(spec.name)
            _insert_test(db, spec, utc_now(), "")
        trust_code(self.repo.dir, [(spec.fn, spec.source)])  # attached here: the user's own code
        return spec

    def detach(self, name: str) -> CheckSpec:
        spec = self.test(name, checked=False)  # (an unsafe registration is removed this way)
        with self.database.atomic() as db:
            db.execute("DELETE FROM tests WHERE name = ?", (name,))
        return spec

    def retarget(self, old: str, new: str) -> list[str]:
        """Tests attached to exactly the model name `old` follow it to `new` (a rename); the
        names of those tests. A glob or a tag target is left as it is."""
        with self.database.atomic() as db:
            names = [r[0] for r in db.execute("SELECT name FROM tests WHERE target = ? ORDER BY name", (old,))]
            db.execute("UPDATE tests SET target = ? WHERE target = ?", (new, old))
        return names

    def tests(self, *, checked: bool = True) -> list[CheckSpec]:
        """Every registration. Each function reference is checked as it is read (see the
        package's docstring): one that is not a module path or a file below the work folder
        (an absolute file too, for a test attached here) is an UnsafeRegistrationError,
        unless `checked` is False (to list or remove it)."""
        rows = self.database.db.execute(
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
        return dict(self.database.db.execute("SELECT name, origin FROM tests").fetchall())

    def applicable(self, model: str, lineage: Lineage | None = None) -> list[CheckSpec]:
        """Tests that apply to a model: attached to it (by name, glob or tag), or inherited
        from an ancestor they were attached to with `inherit`."""
        lineage = lineage or self.repo.lineage
        node = lineage.node(model)
        # An ancestor of a removed or remote-only model may have no node of its own: no tags to match.
        ancestors = [(a, lineage.nodes[a].tags if a in lineage.nodes else {}) for a in lineage.ancestors(model)]
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
            if is_pattern(t.target):
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

    # --- travelling with push and pull --------------------------------------------------------
    def registrations(self) -> list[dict[str, Any]]:
        """Every registration as data (what a push sends)."""
        rows = self.database.db.execute("SELECT name, created FROM tests ORDER BY name")
        created = dict(rows)
        return [{**t.to_json(), "created": created[t.name]} for t in self.tests()]

    def add_registration(self, record: Any, *, origin: str = "a remote") -> str:
        """Take a registration from a remote (named `origin`): `added`, `same` (here
        already), or `differs` (a test of that name here is another one: the one here is
        kept). It is not trusted here (see the package's docstring)."""
        spec, created = parse_registration(record)
        with self.database.atomic() as db:
            row = db.execute("SELECT 1 FROM tests WHERE name = ?", (spec.name,)).fetchone()
            if row is None:
                _insert_test(db, spec, created, origin or "a remote")
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
