"""Warm interpreters for user code: a fork server per job slot that has done the heavy imports
(numpy, safetensors, torch) once, and forks a fresh child for each job.

Starting `python -m mgit.usercode` and importing torch costs seconds per test or recipe run,
more than a small recipe itself. A server started here imports numpy and the module its jobs
run, then waits on a socket, and imports torch (and the other `LEARNED` libraries) once a job
of this process has imported it: a process whose jobs never use torch never waits for it.
Each job is `python -m MODULE ARGS` run in a child forked from the server, with the job's own
folder, environment, `sys.path`, standard output and error (two files the caller opens and
passes over the socket), so that what isolated a fresh interpreter isolates the child: it
crashes, hangs, exits or segfaults alone. User code never runs in the server itself.

The server kills a child that outlives its time limit (it is the only one who reaps it, so the
pid it kills is that child's); a child dies with its server (`PR_SET_PDEATHSIG`), and a server
exits, killing its running child, when its socket closes: when the process that started it
ends, however it ends. What a forked child shares with its server and a fresh interpreter
would not: the modules already imported and the string hash seed; `random` and numpy's global
generator are seeded anew in each child.

`MGIT_WARM_WORKER=0` turns this off (every run starts a fresh interpreter, as before); it is off
where there is no `fork` with `PR_SET_PDEATHSIG` (anything but Linux). A server that cannot
start, or dies before it forked the job, makes the caller run the job the cold way.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO

VARIABLE = "MGIT_WARM_WORKER"
# Imported by each server, each when installed; with the module its jobs run (importing it runs
# no job: a module run with `-m` guards its work with `__name__ == "__main__"`).
PRELOAD = ("numpy", "safetensors.numpy")
# Libraries a server imports once a job of this process has imported them (torch takes seconds
# to import: a server imports it only for callers whose jobs use it). Never user code.
LEARNED = ("torch", "safetensors.torch", "transformers", "peft", "scipy", "sklearn", "pandas", "mgit.repo")
MAX_IDLE = 8  # servers kept waiting, all environments together (the least recently used go first)
START_WAIT = 300.0  # seconds a job waits for its server's imports and its fork
GRACE = 30.0  # beyond a job's time limit before the caller gives up on the server too
MAX_REQUEST = 16 << 20  # bytes of one job's request (its arguments and environment)
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Finished:
    """How a job's child ended: its exit code (negative: the signal that killed it), what it
    wrote to standard output and error, and whether the server killed it at its time limit."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def enabled() -> bool:
    return sys.platform.startswith("linux") and os.environ.get(VARIABLE, "1") != "0"


def run_module(module: str, args: list[str], *, cwd: str, env: dict[str, str], timeout: float) -> Finished | None:
    """Run `python -m module args` in a child of a warm server for this process's environment,
    or None when no server can take it (off, or it could not start: run it cold)."""
    if not enabled():
        return None
    server = _take(module)
    if server is None:
        return None
    try:
        done = server.run(module, args, cwd=cwd, env=env, timeout=timeout)
    except _NotStarted:
        server.close()
        return None
    except BaseException:
        server.close()
        raise
    if done.returncode == -signal.SIGKILL and not server.alive():
        server.close()
    else:
        _give_back(server, module)
    return done


def shutdown() -> None:
    """Stop every idle server (they also stop by themselves when this process ends)."""
    with _LOCK:
        servers = [s for idle in _IDLE.values() for s in idle]
        _IDLE.clear()
    _close_all(servers)


def _close_all(servers: list[_Server]) -> None:
    """Close servers together: each is told at once, then all get one shared wait (a server
    still importing torch may take seconds to see it, and N of them must not take N waits)."""
    for server in servers:
        server.sock.close()
    deadline = time.monotonic() + 2
    for server in servers:
        server.close(wait=max(0.0, deadline - time.monotonic()))


# --- the caller's side -----------------------------------------------------------------------
class _NotStarted(Exception):
    """The server ended before it forked the job: nothing of the job ran."""


class _Server:
    def __init__(self, env: dict[str, str], module: str) -> None:
        self.preloaded = set(_USED)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mgit.forkserver", str(theirs.fileno()), module, *sorted(self.preloaded)],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env=env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.sock = ours
        self.replies = ours.makefile("rb")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, module: str, args: list[str], *, cwd: str, env: dict[str, str], timeout: float) -> Finished:
        request = json.dumps({"module": module, "args": args, "cwd": cwd, "env": env, "timeout": timeout}).encode()
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                self.sock.settimeout(START_WAIT)
                socket.send_fds(self.sock, [len(request).to_bytes(4, "big") + request], [out.fileno(), err.fileno()])
                if self.replies.readline() != b"started\n":
                    raise _NotStarted
            except (OSError, ValueError) as exc:
                raise _NotStarted from exc
            try:
                self.sock.settimeout(timeout + GRACE)
                reply = self.replies.readline().split()
                if len(reply) == 2 and reply[0] == b"uses":  # the libraries the job imported
                    _USED.update(n for n in reply[1].decode().split(",") if n in LEARNED)
                    reply = self.replies.readline().split()
            except OSError:  # the server did not kill it in time: stop both
                self.close()
                reply = []
            if len(reply) == 3 and reply[0] == b"done":
                code, timed_out = int(reply[1]), reply[2] == b"1"
                note = ""
            else:
                self.close()
                code, timed_out = -signal.SIGKILL, False
                note = "\nthe warm worker running it died"
            return Finished(code, _read(out), _read(err) + note, timed_out)

    def preload(self) -> None:
        """Have the server import, while it waits, what jobs here have been importing."""
        wanted = sorted(_USED - self.preloaded)
        if wanted:
            request = json.dumps({"import": wanted}).encode()
            self.sock.sendall(len(request).to_bytes(4, "big") + request)
            self.preloaded.update(wanted)

    def close(self, wait: float = 2) -> None:
        self.sock.close()  # the server sees the end of its socket and exits
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _read(file: BinaryIO) -> str:
    file.seek(0)
    return file.read().decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")


_IDLE: dict[tuple[str, tuple[tuple[str, str], ...]], list[_Server]] = {}
_USED: set[str] = set()  # of LEARNED, what jobs of this process imported
_LOCK = threading.Lock()


# Variables that change while a process runs and that no library reads at import: a server
# started under another value serves as well (each job still runs in its own environment).
# pytest names the test and phase under way in PYTEST_CURRENT_TEST, so a suite would otherwise
# start a server for every test.
VOLATILE = frozenset({"PYTEST_CURRENT_TEST"})


def _key(module: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    # A server keeps the environment it started with (libraries read some of it at import).
    return module, tuple(sorted((k, v) for k, v in os.environ.items() if k not in VOLATILE))


def _take(module: str) -> _Server | None:
    key = _key(module)
    with _LOCK:
        idle = _IDLE.get(key, [])
        while idle:
            server = idle.pop()
            if server.alive():
                return server
            server.close()
    try:
        return _Server(dict(os.environ), module)
    except OSError:
        return None


def _give_back(server: _Server, module: str) -> None:
    key = _key(module)
    evicted: list[_Server] = []
    with _LOCK:
        idle = _IDLE.pop(key, [])
        _IDLE[key] = idle  # the most recently used environment last
        kept = False
        if len(idle) < MAX_IDLE and server.alive():
            try:
                server.preload()
            except OSError:
                pass
            else:
                idle.append(server)
                kept = True
        # A process whose environment changed (a test suite, a long-lived caller) must not keep a
        # server, and its memory, for every environment it ever had.
        while sum(len(v) for v in _IDLE.values()) > MAX_IDLE:
            oldest = next(iter(_IDLE))
            evicted += _IDLE.pop(oldest) if oldest != key else [idle.pop(0)]
    if not kept:
        evicted.append(server)
    _close_all(evicted)


atexit.register(shutdown)


# --- the server's side -----------------------------------------------------------------------
def serve(fd: int, module: str, more: list[str]) -> None:
    """The server's loop: preload, then one request at a time: a job, each in a forked child,
    or libraries to import."""
    sock = socket.socket(fileno=fd)
    _import([*PRELOAD, module, *more])
    inherited = set(filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep)))
    base = [p for p in sys.path[1:] if p not in inherited]
    while True:
        request, fds = _receive(sock)
        if request is None:
            return
        if "import" in request:
            _import([n for n in request["import"] if n in LEARNED])
            continue
        used, told = os.pipe()  # the job's child says there which libraries it imported
        pid = os.fork()
        if pid == 0:
            os.close(used)
            _child(request, [*fds, told], sock, base)
        for f in (*fds, told):
            os.close(f)
        sock.sendall(b"started\n")
        code, timed_out = _wait(pid, float(request["timeout"]), sock)
        names = _used(used)
        if code is None:  # the caller is gone: so is its job
            return
        sock.sendall((f"uses {names}\n" if names else "").encode() + f"done {code} {int(timed_out)}\n".encode())


def _used(fd: int) -> str:
    """What the job's child wrote on its pipe (never waiting: a process it started may hold the
    pipe open), as LEARNED names alone."""
    os.set_blocking(fd, False)
    try:
        said = os.read(fd, 4096).decode(errors="replace")
    except OSError:
        said = ""
    finally:
        os.close(fd)
    return ",".join(n for n in said.split(",") if n in LEARNED)


def _import(names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(Exception):  # not installed, or broken: a job imports it itself if it needs it
            __import__(name)


def _receive(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    head, fds, _, _ = socket.recv_fds(sock, 4, 2)
    if len(head) < 4:
        for f in fds:
            os.close(f)
        return None, []
    size = int.from_bytes(head[:4], "big")
    if len(fds) not in (0, 2) or size > MAX_REQUEST:
        for f in fds:
            os.close(f)
        return None, []
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            return None, []
        data += chunk
    request = json.loads(data)
    if ("import" in request) != (not fds):
        for f in fds:
            os.close(f)
        return None, []
    return request, fds


def _wait(pid: int, timeout: float, sock: socket.socket) -> tuple[int | None, bool]:
    """(exit code, killed at the time limit) of the child, or (None, _) when the socket closed
    first (the child is killed). Only this process reaps the child, so until it does, the pid
    names it and no other process."""
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock.fileno(), select.POLLIN | select.POLLHUP)
    deadline = time.monotonic() + timeout
    timed_out = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                timed_out = True
                break
            events = dict(poller.poll(max(1, int(left * 1000))))
            if pidfd in events:
                break
            if sock.fileno() in events:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None, False
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), timed_out


def _child(request: dict[str, Any], fds: list[int], sock: socket.socket, base: list[str]) -> None:
    """A job's child: becomes `python -m MODULE ARGS` in the job's folder and environment, and
    exits with its exit code; never returns."""
    code = 1
    try:
        server = os.getppid()
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != server:  # the server died before the line above
            os._exit(1)
        sock.close()  # the job never talks to its caller but through its outputs and exit code
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for f in (devnull, *fds[:2]):
            os.close(f)
        cwd, env = str(request["cwd"]), dict(request["env"])
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        # sys.path as `python -m` makes it: the folder, PYTHONPATH, then the installation's.
        sys.path[:] = [cwd, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *base]
        _reseed()
        import runpy

        module = str(request["module"])
        sys.argv = [module, *map(str, request["args"])]
        sys.modules.pop(module, None)  # imported by the server to warm its imports; it runs anew as __main__
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        with contextlib.suppress(Exception):  # which libraries the job used, for the next servers
            os.write(fds[2], ",".join(n for n in LEARNED if n in sys.modules).encode())
        os._exit(code)


def _exit_code(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, int):
        return int(value) & 0xFF
    print(value, file=sys.stderr)
    return 1


def _reseed() -> None:
    """Fresh random state, as a fresh interpreter would have (fork copies the server's)."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2], sys.argv[3:])
