"""A real local Ray cluster for tests, inside a network namespace that holds only loopback.

Ray binds some of its processes to the machine's own interface address whatever
`--node-ip-address` says, so a test cluster (its head, a second node, the S3 server they
share and the driver) runs in a new network namespace where 127.0.0.1 is the only address:

    with loopback_only():          # this thread (and every process it starts) in a new netns
        s3 = S3Server()
        cluster = RayCluster(tmp, env)     # `ray start --head`, then `ray start --address ...`
        cluster.add_node("n2")
        ...
        cluster.kill("n2")                 # SIGKILL to exactly the processes that node started
        cluster.stop()

Each node is `ray start --block` in a session of its own, so its process group holds
exactly the processes it started (raylet, GCS, workers...), and stopping a node signals
that group by its id, never a process by its name. Each node gets its own temporary folder
(its Ray session files, TMPDIR and the mgit node cache), standing for its own disk.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from s3server import free_port

CLONE_NEWNET = 0x40000000
RAY = str(Path(sys.executable).with_name("ray"))


def can_make_netns() -> str | None:
    """None if this process may make a network namespace, else why not."""
    if os.geteuid() != 0:
        return "a network namespace needs root"
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, text=True)
    return None if probe.returncode == 0 else f"unshare --net failed: {probe.stderr.strip()}"


@contextlib.contextmanager
def loopback_only() -> Iterator[None]:
    """Move this thread into a new network namespace with loopback up (what `unshare --net`
    then `ip link set lo up` do), and back on exit. Processes started meanwhile from this
    thread are born inside it."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET) failed")
        try:
            subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
            yield
        finally:
            if libc.setns(old, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back to the original network namespace failed")
    finally:
        os.close(old)


class RayCluster:
    """A head node (started here) and more nodes (`add_node`), each `ray start --block` in
    its own session. `env` is every node's environment (credentials for the S3 server)."""

    def __init__(self, root: Path, env: dict[str, str], *, cpus: int = 1) -> None:
        self.root = root
        self.env = env
        self.cpus = cpus
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, Path] = {}
        self._sessions: list[Path] = []
        self.client_address = f"ray://127.0.0.1:{free_port()}"  # Ray Client's
        try:
            self._start(
                "head",
                [
                    "--head",
                    f"--port={self.port}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={self.client_address.rpartition(':')[2]}",
                ],
            )
        except BaseException:  # the caller has no cluster to stop: stop the head that did start
            self.stop()
            raise

    def folder(self, name: str) -> Path:
        return self.root / name

    def disks(self) -> list[Path]:
        """Every folder the nodes write: their own (caches, TMPDIR) and Ray's session folders."""
        return [self.root, *self._sessions]

    def add_node(self, name: str) -> None:
        self._start(name, [f"--address={self.address}"])

    def _start(self, name: str, args: list[str]) -> None:
        disk = self.folder(name)
        (disk / "tmp").mkdir(parents=True, exist_ok=True)
        env = {
            **self.env,
            "TMPDIR": str(disk / "tmp"),
            "MGIT_CLUSTER_CACHE": str(disk / "cache"),
            "MGIT_TEST_NODE": name,
            "RAY_USAGE_STATS_ENABLED": "0",
            # A killed node is declared dead after ~3 s instead of ~30 s.
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
            "RAY_health_check_timeout_ms": "1000",
            "RAY_health_check_initial_delay_ms": "1000",
        }
        # Ray's session folder holds unix sockets, whose paths must stay under 108 bytes.
        session = Path(tempfile.mkdtemp(prefix="mgit-ray-", dir="/tmp"))
        self._sessions.append(session)
        log = disk / "ray-start.log"
        self._logs[name] = log
        with open(log, "wb") as out:
            self.nodes[name] = subprocess.Popen(
                [
                    RAY,
                    "start",
                    "--block",
                    "--node-ip-address=127.0.0.1",
                    f"--num-cpus={self.cpus}",
                    "--object-store-memory=78643200",
                    "--disable-usage-stats",
                    f"--temp-dir={session}",
                    f'--resources={{"node:{name}": 1}}',
                    *args,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.wait_for_nodes(len(self.nodes))

    def alive(self) -> int:
        """How many nodes the cluster counts as alive (asked from a separate driver process)."""
        probe = (
            f"import ray; ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False); "
            "print(sum(n['Alive'] for n in ray.nodes()))"
        )
        try:
            run = subprocess.run(
                [sys.executable, "-c", probe], env=self.env, capture_output=True, text=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            return -1
        return int(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 and run.stdout.strip() else -1

    def wait_for_nodes(self, count: int, *, timeout: float = 90.0) -> None:
        """Until every node started says so and the cluster counts `count` alive."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.nodes.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"ray node {name} exited: {self.log(name)}")
            started = all("Ray runtime started" in self.log(n) for n in self.nodes)
            if started and self.alive() == count:
                return
            time.sleep(0.3)
        raise RuntimeError(f"the Ray cluster did not reach {count} nodes within {timeout:.0f} s")

    def kill(self, name: str) -> None:
        """SIGKILL every process node `name` started (its process group), at once."""
        proc = self.nodes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for name in [n for n in self.nodes if n != "head"] + [n for n in self.nodes if n == "head"]:
            self.kill(name)
        for session in self._sessions:
            shutil.rmtree(session, ignore_errors=True)

    def log(self, name: str) -> str:
        return self._logs[name].read_text(errors="replace")[-4000:] if self._logs[name].exists() else ""
