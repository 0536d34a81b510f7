"""Warm workers (mgit.forkserver): each job runs in a fresh child forked from a server that did
the heavy imports once, never in the server; a job that crashes, hangs, exits or segfaults ends
alone; the job's folder and environment are its own; nothing outlives the process that asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from mgit import forkserver, usercode

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="warm workers need Linux")

USER_CODE = textwrap.dedent(
    """
    import ctypes, os, random, sys, time

    def where(folder):
        print("ran in", os.getcwd())
        return {"pid": os.getpid(), "ppid": os.getppid(), "cwd": os.getcwd(), "path0": sys.path[0],
                "var": os.environ.get("MGIT_TEST_VAR"), "numpy": "numpy" in sys.modules,
                "random": random.random()}

    def uses_torch(folder):
        warm = "torch" in sys.modules
        import torch
        return {"warm": warm, "ppid": os.getppid()}

    def crash(folder):
        raise RuntimeError("boom in the job")

    def segfault(folder):
        ctypes.string_at(0)

    def exits(folder):
        sys.exit(3)

    def hang(folder):
        with open(folder, "w") as f:
            f.write(str(os.getpid()))
        print("about to hang", flush=True)
        time.sleep(600)
    """
)


@pytest.fixture
def code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv(forkserver.VARIABLE, raising=False)
    forkserver.shutdown()  # servers that earlier tests in this process left warm are not this test's
    monkeypatch.setattr(forkserver, "_USED", set())  # nor what their jobs taught this process to preload
    (tmp_path / "jobs.py").write_text(USER_CODE)
    yield tmp_path
    forkserver.shutdown()


def _call(folder: Path, fn: str, arg: str = "x", timeout: float = 120) -> usercode.RunOutcome:
    return usercode.run("call", f"jobs.py:{fn}", [arg], timeout=timeout, cwd=folder)


def _servers() -> list[int]:
    return [s.pid for idle in forkserver._IDLE.values() for s in idle]


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie has ended; only its parent's reaping is left


def _wait_gone(pids: list[int], within: float = 20) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if not _gone(p)]


def test_each_job_runs_in_its_own_child_of_a_warm_server(code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGIT_TEST_VAR", "one")
    first = _call(code, "where")
    assert first.ok and first.output.strip() == f"ran in {code}"
    (server,) = _servers()
    second = _call(code, "where")
    assert second.ok and _servers() == [server]  # the same server, kept warm
    for run in (first, second):
        assert run.value["ppid"] == server and run.value["pid"] not in (server, os.getpid())
        assert run.value["cwd"] == str(code) and run.value["path0"] == str(code)
        assert run.value["var"] == "one" and run.value["numpy"]  # imported once, by the server
    assert first.value["pid"] != second.value["pid"]
    assert first.value["random"] != second.value["random"]  # each child seeded anew


def test_a_server_imports_the_libraries_jobs_here_used(code: Path) -> None:
    pytest.importorskip("torch")
    first = _call(code, "uses_torch")
    assert first.ok and not first.value["warm"]  # the job imported torch itself
    (server,) = _servers()
    second = _call(code, "uses_torch")
    assert second.ok and second.value["warm"] and second.value["ppid"] == server  # imported while it waited
    assert _call(code, "where").ok  # which a job that does not use it sees too, but does not wait for


def test_a_changed_environment_gets_a_server_of_its_own(code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGIT_TEST_VAR", "one")
    one = _call(code, "where")
    monkeypatch.setenv("MGIT_TEST_VAR", "two")
    two = _call(code, "where")
    assert (one.value["var"], two.value["var"]) == ("one", "two")
    assert one.value["ppid"] != two.value["ppid"] and len(_servers()) == 2


def test_a_variable_that_names_the_running_test_does_not_start_another_server(
    code: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest rewrites PYTEST_CURRENT_TEST at every test and phase: a suite's jobs must not
    start a server each (any other change of the environment still does, above)."""
    runs = []
    for value in ("tests/a.py::one (call)", "tests/a.py::two (setup)"):
        monkeypatch.setenv("PYTEST_CURRENT_TEST", value)
        runs.append(_call(code, "where"))
        assert runs[-1].ok
    assert runs[0].value["ppid"] == runs[1].value["ppid"] and _servers() == [runs[0].value["ppid"]]


def test_servers_of_environments_no_longer_used_are_stopped(code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Idle servers are bounded across environments: the least recently used are stopped."""
    monkeypatch.setattr(forkserver, "MAX_IDLE", 2)
    parents = []
    for value in ("one", "two", "three", "two"):
        monkeypatch.setenv("MGIT_TEST_VAR", value)
        run = _call(code, "where")
        assert run.ok and run.value["var"] == value
        parents.append(run.value["ppid"])
    assert parents[3] == parents[1]  # "two" was kept warm: used more recently than "one"
    assert sorted(_servers()) == sorted(parents[1:3])
    assert not _wait_gone([parents[0]])  # "one"'s server was stopped, not only forgotten


def test_a_job_that_crashes_hangs_exits_or_segfaults_ends_alone(code: Path) -> None:
    assert _call(code, "where").ok
    (server,) = _servers()
    crashed = _call(code, "crash")
    assert not crashed.ok and crashed.error == "raised RuntimeError: boom in the job"
    assert "Traceback" in crashed.output
    segfault = _call(code, "segfault")
    assert not segfault.ok and segfault.error.startswith(f"killed by signal {signal.SIGSEGV}")
    exits = _call(code, "exits")
    assert not exits.ok and exits.error.startswith("exit code 3")
    pidfile = code / "hang.pid"
    hung = _call(code, "hang", str(pidfile), timeout=2)
    assert not hung.ok and hung.error == "did not finish within 2 s" and "about to hang" in hung.output
    assert not _wait_gone([int(pidfile.read_text())], within=5)  # killed at its limit, not left running
    assert _servers() == [server] and _call(code, "where").value["ppid"] == server


def test_off_every_job_starts_a_fresh_interpreter(code: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forkserver.VARIABLE, "0")
    run = _call(code, "where")
    assert run.ok and run.value["ppid"] == os.getpid() and not _servers()
    pidfile = code / "hang.pid"  # a fresh interpreter is ended at its limit as a warm child is
    hung = _call(code, "hang", str(pidfile), timeout=2)
    assert not hung.ok and hung.error == "did not finish within 2 s" and "about to hang" in hung.output
    assert not _wait_gone([int(pidfile.read_text())], within=5) and not _servers()


def test_a_job_dies_with_its_server(code: Path) -> None:
    assert _call(code, "where").ok
    (server,) = _servers()
    pidfile = code / "hang.pid"
    killer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time\nwhile not os.path.exists({str(pidfile)!r}): time.sleep(0.05)\n"
            f"time.sleep(0.2); os.kill({server}, 9)",
        ]
    )
    run = _call(code, "hang", str(pidfile), timeout=60)
    killer.wait()
    assert not run.ok and run.error.startswith(f"killed by signal {signal.SIGKILL}")
    assert "the warm worker running it died" in run.output
    assert not _wait_gone([int(pidfile.read_text())], within=10)
    assert _call(code, "where").ok and _servers() != [server]  # a new server took over


PARENT = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from mgit import forkserver, usercode
    folder = Path(sys.argv[1])
    usercode.run("call", "jobs.py:hang", [str(folder / "hang.pid")], timeout=600, cwd=folder)
    """
)


def test_killing_the_parent_leaves_no_server_and_no_job_behind(code: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(code)], env={**os.environ})
    pidfile = code / "hang.pid"
    deadline = time.monotonic() + 120
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    job = int(pidfile.read_text())
    server = int(Path(f"/proc/{job}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the job's parent
    assert server != parent.pid and not _gone(server)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_gone([server, job]) == []
