"""Code that arrives from a remote: a pulled test registration, the recipe of a fetched
version. A registration's function reference is checked where it is read (from a remote, or
from checks.sqlite), so that none writes its recorded source outside a temporary folder; and
code from a remote runs only once the user said so (`--trust-remote-code`, or the
repository's `trust-remote-code` setting), after a one-line error naming it.

Alice and Bob share a folder remote; Bob's clone has neither her recipes.py nor her
evals.py, so what runs there is what arrived. Her test and recipe touch a marker file each
time they run (the one MGIT_TEST_MARKER names), so "nothing ran" is checked on disk.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from conftest import copy_user_code, make_model, run_cli, tensors

from mgit import Repo, sync, usercode
from mgit.cascade import cascade
from mgit.checks import Checks
from mgit.errors import RemoteError, UntrustedCodeError
from mgit.sync.check_results import registration_key
from mgit.sync.connection import connect


def cli(repo: Repo, *args: str) -> tuple[int, str, str]:
    return run_cli("-C", str(repo.root), *args)


def ran(marker: Path) -> list[str]:
    return marker.read_text().split() if marker.exists() else []


@pytest.fixture
def shared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Repo, Repo, Path]:
    """Alice's family (base, ft with a recipe, a test on ft), pushed; Bob's clone; the marker."""
    marker = tmp_path / "ran.txt"
    monkeypatch.setenv("MGIT_TEST_MARKER", str(marker))
    assert run_cli("init", "--bare", str(tmp_path / "team.mgit"))[0] == 0
    alice = Repo.init(tmp_path / "alice")
    sync.add_remote(alice, "origin", str(tmp_path / "team.mgit"))
    copy_user_code(alice.root, "tune")
    alice.add(make_model(tmp_path / "src-base", state=tensors(1)), name="base")
    alice.add(
        make_model(tmp_path / "src-ft", state=tensors(2)),
        name="ft",
        parent="base",
        recipe="recipes.py:tune",
        params={"scale": 2},
    )
    Checks(alice).attach("ft", "evals.py:size", name="size")
    alice.add(make_model(tmp_path / "src-base2", state=tensors(3)), name="base")
    sync.push(alice)
    sync.clone(str(tmp_path / "team.mgit"), tmp_path / "bob")
    return alice, Repo(tmp_path / "bob"), marker


def state(repo: Repo) -> tuple[object, ...]:
    """What a refused run must leave as it was: refs, listing, recorded results."""
    code, listing, _ = cli(repo, "ls", "--json")
    assert code == 0
    return repo.refs.all(), listing, [o.to_json() for o in Checks(repo).show()]


# --- item: a registration's reference writes its source anywhere -----------------------------------
def test_a_recorded_source_is_written_inside_its_temporary_folder_whatever_the_reference(tmp_path: Path) -> None:
    """usercode.run named the file `target.rpartition('.')[2] + ".py"`: `x./ABS/PATH/pwned`
    made that an absolute path, written and left there."""
    planted = tmp_path / "planted" / "pwned"
    planted.parent.mkdir()
    outcome = usercode.run(
        "call", f"x.{planted}:f", ["arg"], timeout=60, source=b"def f(arg):\n    return {'ok': 1.0}\n"
    )
    assert outcome.ok and outcome.value == {"ok": 1.0}, outcome
    assert list(planted.parent.iterdir()) == []


def forge_registration(bob: Repo, alice: Repo, fn: str) -> None:
    """A registration on the shared remote naming `fn`, with Alice's test's source object."""
    source = Checks(alice).test("size").source
    record = {**Checks(alice).registrations()[0], "name": "pwned", "fn": fn, "source": source}
    conn = connect(bob, "origin")
    try:
        conn.remote.write_json(registration_key("pwned"), record, token=None, create_only=True)
    finally:
        conn.close()


@pytest.mark.parametrize(
    "fn", ["x.{abs}/pwned:f", "{abs}/pwned.py:f", "../../{name}/pwned.py:f", "a..b:f", "ok.py\n:f"]
)
def test_a_pulled_registration_whose_reference_is_no_module_or_relative_file_is_refused(
    fn: str, shared: tuple[Repo, Repo, Path], tmp_path: Path
) -> None:
    alice, bob, marker = shared
    planted = tmp_path / "planted"
    planted.mkdir()
    forge_registration(bob, alice, fn.format(abs=planted, name=planted.name))
    before = state(bob)
    code, out, err = cli(bob, "pull")
    assert code == 1 and err.startswith("Error: a malformed test registration") and err.count("\n") == 1, err
    assert state(bob) == before and "pwned" not in [t.name for t in Checks(bob).tests()]
    cli(bob, "test", "run", "--all", "--trust-remote-code")
    assert list(planted.iterdir()) == []


def test_a_registration_in_checks_sqlite_is_checked_when_read(shared: tuple[Repo, Repo, Path], tmp_path: Path) -> None:
    """One that got in before references were checked (an older mgit's pull) is refused,
    not run."""
    alice, bob, marker = shared
    planted = tmp_path / "planted"
    planted.mkdir()
    Checks(bob)  # (its tables)
    with sqlite3.connect(bob.dir / "checks.sqlite") as db:
        db.execute(
            "INSERT INTO tests (name, fn, target, inherit, conditions, timeout, created, source, resources) "
            "VALUES ('pwned', ?, 'ft', 0, '[]', NULL, '2026-01-01T00:00:00Z', ?, '{}')",
            (f"x.{planted}/pwned:f", Checks(alice).test("size").source),
        )
    code, out, err = cli(bob, "test", "run", "--all", "--trust-remote-code")
    assert code == 1 and err.startswith("Error: test 'pwned' in checks.sqlite: cannot use") and err.count("\n") == 1
    assert list(planted.iterdir()) == [] and ran(marker) == []


# --- item: code from a remote runs only when trusted ------------------------------------------------
def test_a_pulled_test_runs_only_with_trust_remote_code(shared: tuple[Repo, Repo, Path]) -> None:
    alice, bob, marker = shared
    before = state(bob)
    code, out, err = cli(bob, "test", "run", "--all")
    assert code == 1 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith(
        "Error: this would run code that came from a remote: test 'size' (evals.py:size, pulled from origin)"
    ), err
    assert "--trust-remote-code" in err
    assert ran(marker) == [] and state(bob) == before
    with pytest.raises(UntrustedCodeError):
        Checks(bob).run()
    code, out, err = cli(bob, "test", "run", "--all", "--trust-remote-code")
    assert code == 0 and ran(marker) == ["test"], err
    # Trusted from then on: a forced run needs no flag, and the library agrees.
    assert cli(bob, "test", "run", "--all", "--force")[0] == 0 and ran(marker) == ["test", "test"]
    assert Checks(bob).run(force=True).outcomes[0].passed


def test_a_fetched_recipe_runs_only_with_trust_remote_code(shared: tuple[Repo, Repo, Path]) -> None:
    alice, bob, marker = shared
    before = state(bob)
    code, out, err = cli(bob, "cascade", "base")
    assert code == 1 and out == "" and err.count("\n") == 1, (code, out, err)
    assert err.startswith(
        "Error: this would run code that came from a remote: the recipe of ft@1 (recipes.py:tune, recorded by "
    ), err
    assert "test 'size' (evals.py:size, pulled from origin)" in err
    assert ran(marker) == [] and state(bob) == before
    with pytest.raises(UntrustedCodeError):
        cascade(bob, "base")
    assert cli(bob, "cascade", "base", "--dry-run")[0] == 0  # a plan runs nothing
    code, out, err = cli(bob, "cascade", "base", "--trust-remote-code")
    assert code == 0, err
    assert sorted(ran(marker)) == ["recipe", "test", "test"] and bob.info("ft").seq == 2


def test_code_made_here_needs_no_flag_and_the_repository_setting_trusts_all(shared: tuple[Repo, Repo, Path]) -> None:
    alice, bob, marker = shared
    assert cli(alice, "test", "run", "--all")[0] == 0 and ran(marker) == ["test"]  # attached there
    assert cascade(alice, "base").count("updated") == 1  # recorded there
    config = json.loads((bob.dir / "config.json").read_text())
    (bob.dir / "config.json").write_text(json.dumps({**config, "trust-remote-code": True}))
    assert cli(bob, "test", "run", "--all")[0] == 0


def test_a_library_run_takes_trust_remote_code(shared: tuple[Repo, Repo, Path]) -> None:
    alice, bob, marker = shared
    result = Checks(bob).run(trust_remote_code=True)
    assert result.outcomes[0].passed and ran(marker) == ["test"]
    report = cascade(bob, "base", trust_remote_code=True)
    assert report.count("updated") == 1


def test_a_malformed_registration_from_a_remote_is_a_remote_error(shared: tuple[Repo, Repo, Path]) -> None:
    alice, bob, marker = shared
    record = {**Checks(alice).registrations()[0], "fn": "/etc/passwd.py:f"}
    with pytest.raises(RemoteError, match="a malformed test registration"):
        Checks(bob).add_registration(record)
