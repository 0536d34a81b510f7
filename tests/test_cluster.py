"""Cascades and test runs on a real two-node Ray cluster, through an S3 remote (moto's
server), all inside a network namespace that holds only loopback (see raycluster.py).

One family of ten models made by recipes, pushed to S3 and cloned twice: one clone runs
each cascade with the local executor, the other with `--executor ray`; the versions the
two produce must hold the same files and tensors (the same manifest ids). Then the faults:
a node killed while it runs a recipe, the driver killed after a commit, a push racing the
cascade. Last, signing.always: the driver signs what the cluster makes, with a key that
exists only in the driver's own mount namespace.
"""

# ruff: noqa: F811
from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MGIT, copy_user_code, load_recipes, make_model, run_cli
from raycluster import RayCluster, can_make_netns, loopback_only
from s3server import S3Server, aws_env
from signers import KEYGEN, allowed_file, configure, keygen

from mgit import Repo
from mgit.checks import Checks

pytestmark = pytest.mark.slow
ray = pytest.importorskip("ray")
if (why := can_make_netns()) is not None:
    pytest.skip(f"the Ray cluster tests run in a network namespace: {why}", allow_module_level=True)


# name, parents, relation, recipe, params
FAMILY = [
    ("ft-a", ["base"], "finetune", "finetune", {"seed": 1}),
    ("ft-b", ["base"], "finetune", "finetune", {"seed": 2}),
    ("ft-c", ["base"], "finetune", "finetune", {"seed": 3}),
    ("ft-a-int8", ["ft-a"], "quantize", "quantize", {}),
    ("ft-b-int8", ["ft-b"], "quantize", "quantize", {}),
    ("ft-c-int8", ["ft-c"], "quantize", "quantize", {}),
    ("ft-a2", ["ft-a"], "finetune", "finetune", {"seed": 4}),
    ("ft-a2-int8", ["ft-a2"], "quantize", "quantize", {}),
    ("merge-ab", ["ft-a", "ft-b"], "merge", "merge", {}),
]


IN_A_CHILD = ("cascade", "test")  # commands that run user code: each in a process of its own, as a user runs it


class Setup:
    """The cluster, the S3 server, and the repositories of the scenario."""

    def __init__(self, root: Path, s3: S3Server, cluster: RayCluster, env: dict[str, str]) -> None:
        self.root, self.s3, self.cluster, self.env = root, s3, cluster, env
        self.hold = root / "hold"
        self.hold.mkdir()

    def mgit(
        self, cwd: Path, *args: str, ray_env: bool = False, extra: dict[str, str] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """`mgit ARGS` in `cwd`: a command that runs neither user code nor Ray (nor a crash
        point) runs in this process, in the same environment, with no interpreter to start;
        cascades and test runs, which start processes and connect to Ray, in a child."""
        env = {**self.env, **(extra or {})}
        if ray_env:
            env["RAY_ADDRESS"] = self.cluster.address
        if not ray_env and not extra and args[0] not in IN_A_CHILD:
            with pytest.MonkeyPatch.context() as here:  # this process's own AWS_* left out, as for a child
                for name in [k for k in os.environ if k.startswith("AWS_") and k not in env]:
                    here.delenv(name)
                code, out, err = run_cli(*args, cwd=cwd, env=env)
            run = subprocess.CompletedProcess([*MGIT, *args], code, out, err)
        else:
            run = subprocess.run([*MGIT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        if check and run.returncode != 0:
            raise AssertionError(f"mgit {' '.join(args)} exited {run.returncode}:\n{run.stdout}\n{run.stderr}")
        return run


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("cluster")
    with loopback_only():
        s3 = S3Server()
        cluster = None
        try:
            bucket = s3.new_bucket()
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                **aws_env(s3.endpoint),
                "MGIT_TEST_HOLD": str(root / "hold"),
                "PYTHONPATH": os.pathsep.join(sys.path),
                # A token in ~/.ray/auth_token (left by any earlier Ray run) turns token auth on for
                # the head but not for drivers: the test cluster never reads the user's.
                "RAY_AUTH_MODE": "disabled",
            }
            cluster = RayCluster(root / "nodes", env)
            cluster.add_node("n2")
            setup = Setup(root, s3, cluster, env)
            _build_family(setup, f"s3://{bucket}/family")
            yield setup
        finally:
            if cluster is not None:
                cluster.stop()
            s3.stop()


def _build_family(setup: Setup, url: str) -> None:
    """A repository with the family, its recipes recorded, a test inherited from the base;
    pushed to `url`, then cloned twice: `local` and `ray`."""
    origin = setup.root / "origin"
    origin.mkdir()
    copy_user_code(origin, "cluster")
    make_model(origin / "m" / "base", seed=0)
    setup.mgit(origin, "init")
    setup.mgit(origin, "add", "m/base", "--name", "base")
    recipes = load_recipes(origin)
    for name, parents, relation, recipe, params in FAMILY:
        params = {"name": name, **params}
        getattr(recipes, recipe)([origin / "m" / p for p in parents], _fresh(origin / "m" / name), **params)
        args = ["add", f"m/{name}", "--name", name, "--relation", relation, "--recipe", f"recipes.py:{recipe}"]
        for p in parents:
            args += ["--parent", p]
        for k, v in params.items():
            args += ["--param", f"{k}={json.dumps(v)}"]
        setup.mgit(origin, *args)
    setup.mgit(
        origin,
        "test",
        "add",
        "base",
        "--fn",
        "evals.py:spread",
        "--name",
        "spread",
        "--metric",
        "mean_abs",
        "--max",
        "10",
        "--inherit",
    )
    setup.mgit(origin, "init", "--bare", url)
    setup.mgit(origin, "remote", "add", "origin", url)
    setup.mgit(origin, "push")
    for clone in ("local", "ray"):
        setup.mgit(setup.root, "clone", url, clone)
        for f in ("recipes.py", "evals.py"):
            (setup.root / clone / f).write_text((origin / f).read_text())


def _fresh(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def new_base(setup: Setup, seed: int) -> None:
    """The same new base version in both clones (the same files: the same manifest)."""
    folder = make_model(setup.root / f"base-{seed}", seed=seed)
    for clone in ("local", "ray"):
        setup.mgit(setup.root / clone, "add", str(folder), "--name", "base")


def without_ids(value: Any) -> Any:
    """A report with version ids left out (the two clones' new base versions differ by time)."""
    if isinstance(value, dict):
        return {k: without_ids(v) for k, v in value.items() if k not in ("head", "version", "recorded")}
    if isinstance(value, list):
        return [without_ids(v) for v in value]
    return value


def manifests(repo: Repo) -> dict[str, str]:
    return {name: repo.version(head).manifest for name, head in sorted(repo.refs.all().items())}


def cascade_json(setup: Setup, clone: str, *extra: str, check: bool = True, **kw: Any) -> dict[str, Any]:
    args = ["cascade", "base", "--json", "--trust-remote-code", *extra]  # the clones run origin's code
    if clone == "ray":
        args += ["--executor", "ray"]
    run = setup.mgit(setup.root / clone, *args, ray_env=clone == "ray", check=check, **kw)
    return json.loads(run.stdout) if run.stdout.strip() else {"exit": run.returncode, "stderr": run.stderr}


# --- the tests, in order: each builds on the state the previous one left ---------------------
def test_a_cascade_on_ray_commits_what_the_local_executor_commits(setup: Setup) -> None:
    new_base(setup, seed=10)
    local = cascade_json(setup, "local")
    remote = cascade_json(setup, "ray")
    assert [r["status"] for r in remote["results"]] == [r["status"] for r in local["results"]] == ["updated"] * 9
    ray_repo, local_repo = Repo(setup.root / "ray"), Repo(setup.root / "local")
    assert manifests(ray_repo) == manifests(local_repo)
    # Same plan, same tests, same report shape; the recipes ran on both nodes.
    assert without_ids(remote["plan"]) == without_ids(local["plan"])
    assert [r["tests_after"] for r in remote["results"]] == [r["tests_after"] for r in local["results"]]
    nodes = {r["where"].rpartition("/")[2] for r in remote["results"]}
    assert len(nodes) == 2, nodes
    assert {r["where"] for r in local["results"]} == {"local"}
    # Only the driver moved refs: the remote's heads are the Ray clone's, and a fresh clone
    # of the remote checks out byte for byte what the local executor made.
    setup.mgit(setup.root, "clone", ray_repo.config["remotes"]["origin"]["url"], "fresh")
    fresh = Repo(setup.root / "fresh")
    assert fresh.refs.all() == ray_repo.refs.all()
    setup.mgit(setup.root / "fresh", "fsck")
    for model in ("merge-ab", "ft-a2-int8"):
        setup.mgit(setup.root / "fresh", "checkout", model, "-o", str(setup.root / "out-ray" / model))
        local_repo.checkout(model, setup.root / "out-local" / model)
    from conftest import sha256_tree

    assert sha256_tree(setup.root / "out-ray") == sha256_tree(setup.root / "out-local")


def test_a_test_run_on_ray_records_what_a_local_run_records(setup: Setup) -> None:
    """Through Ray Client this time: --executor ray://HOST:PORT."""
    runs = {}
    for clone in ("local", "ray"):
        args = ["test", "run", "--all", "--force", "--json", "--trust-remote-code"]
        if clone == "ray":
            args += ["--executor", setup.cluster.client_address]
        runs[clone] = json.loads(setup.mgit(setup.root / clone, *args).stdout)
    key = lambda o: (o["model"], o["test"])  # noqa: E731
    local = {key(o): (o["status"], o["metrics"]) for o in runs["local"]["outcomes"]}
    remote = {key(o): (o["status"], o["metrics"]) for o in runs["ray"]["outcomes"]}
    assert remote == local and len(local) == 10
    recorded = Checks(Repo(setup.root / "ray")).show()
    assert {(o.model, o.test): o.status for o in recorded} == {k: v[0] for k, v in local.items()}
    assert all(re.fullmatch(r"[^@/]+@[^/]+/[0-9a-f]{8}", o.origin) for o in recorded)  # user@host/NODE


def wait_for(path: Path, timeout: float = 120.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path.name} did not appear within {timeout:.0f} s")
        time.sleep(0.1)
    return path.read_text()


def arm(setup: Setup, names: tuple[str, ...], node: str) -> None:
    """Stall the recipes of these models on `node` ('any': on whichever runs them)."""
    for name in names:
        for suffix in ("started", "go"):
            (setup.hold / f"{name}.{suffix}").unlink(missing_ok=True)
        (setup.hold / f"{name}.hold").write_text(node)


def disarm(setup: Setup, names: tuple[str, ...]) -> None:
    for name in names:
        for suffix in ("hold", "started", "go"):
            (setup.hold / f"{name}.{suffix}").unlink(missing_ok=True)


def start_cascade(setup: Setup, *extra: str) -> subprocess.Popen[str]:
    env = {**setup.env, "RAY_ADDRESS": setup.cluster.address}
    return subprocess.Popen(
        [*MGIT, "cascade", "base", "--json", "--executor", "ray", "--trust-remote-code", *extra],
        cwd=setup.root / "ray",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def remote_heads(setup: Setup) -> dict[str, str]:
    shown = json.loads(setup.mgit(setup.root / "ray", "remote", "show", "origin", "--json").stdout)
    return {m["model"]: m["remote"] for m in shown["models"] if m["remote"]}


def test_a_driver_killed_mid_cascade_leaves_no_half_commit_and_a_rerun_resumes(setup: Setup) -> None:
    new_base(setup, seed=20)
    local = cascade_json(setup, "local")
    ray_repo = Repo(setup.root / "ray")
    before = ray_repo.refs.all()
    killed = cascade_json(setup, "ray", check=False, extra={"MGIT_CRASH_AT": "cascade-after-commit"})
    assert killed["exit"] == -9  # SIGKILLed right after its first commit
    after = Repo(setup.root / "ray").refs.all()
    moved = {m for m in after if after[m] != before[m]}
    assert 1 <= len(moved) <= 2 and "base" not in moved  # one commit, or two that finished at once
    setup.mgit(setup.root / "ray", "fsck")
    # What moved here moved on the remote too (the driver moves it here, then there).
    theirs = remote_heads(setup)
    assert {m: theirs[m] for m in moved} == {m: after[m] for m in moved}
    resumed = cascade_json(setup, "ray")
    statuses = {r["model"]: r["status"] for r in resumed["results"]}
    assert {m for m, s in statuses.items() if s == "up-to-date"} == moved
    assert set(statuses.values()) == {"updated", "up-to-date"}
    assert manifests(Repo(setup.root / "ray")) == manifests(Repo(setup.root / "local"))
    assert [r["status"] for r in local["results"]] == ["updated"] * 9


def test_a_push_racing_the_cascade_loses_no_version(setup: Setup) -> None:
    new_base(setup, seed=30)
    cascade_json(setup, "local")
    arm(setup, ("ft-c",), "any")
    try:
        running = start_cascade(setup)
        wait_for(setup.hold / "ft-c.started")
        # Meanwhile a teammate pushes a new version of ft-c (made by hand) to the same remote.
        teammate = setup.root / "fresh"
        setup.mgit(teammate, "pull")
        make_model(setup.root / "ft-c-by-hand", seed=77)
        setup.mgit(teammate, "add", str(setup.root / "ft-c-by-hand"), "--name", "ft-c", "-m", "by hand")
        setup.mgit(teammate, "push", "origin", "ft-c")
        theirs = Repo(teammate).refs.get("ft-c")
        (setup.hold / "ft-c.go").write_text("")
        out, err = running.communicate(timeout=300)
    finally:
        disarm(setup, ("ft-c",))
    assert running.returncode == 0, err
    report = {r["model"]: r for r in json.loads(out)["results"]}
    assert {r["status"] for r in report.values()} == {"updated"}
    assert any("got another version meanwhile" in n for n in report["ft-c"]["notes"])
    ours = report["ft-c"]["new"]
    assert remote_heads(setup)["ft-c"] == theirs  # the teammate's push stays
    assert manifests(Repo(setup.root / "ray")) == manifests(Repo(setup.root / "local"))
    # Pulling replays the cascade's ft-c after the teammate's; then both are on the remote.
    setup.mgit(setup.root / "ray", "pull")
    setup.mgit(setup.root / "ray", "push")
    repo = Repo(setup.root / "ray")
    chain = repo.chain(repo.refs.get("ft-c"))
    assert theirs in chain
    assert repo.version(chain[0]).manifest == repo.version(ours).manifest
    assert remote_heads(setup)["ft-c"] == chain[0]


def test_a_node_killed_mid_recipe_is_retried_on_the_other_node(setup: Setup) -> None:
    new_base(setup, seed=40)
    local = cascade_json(setup, "local")
    # The recipes' file is not in this work folder: each node runs the source recorded with
    # the versions, from a temporary folder.
    (setup.root / "ray" / "recipes.py").unlink()
    first_level = ("ft-a", "ft-b", "ft-c")
    arm(setup, first_level, "n2")  # whichever of them the second node runs stalls there
    try:
        running = start_cascade(setup)
        deadline = time.monotonic() + 120
        while not (stalled := [n for n in first_level if (setup.hold / f"{n}.started").exists()]):
            assert time.monotonic() < deadline and running.poll() is None, "no recipe stalled on n2"
            time.sleep(0.1)
        setup.cluster.kill("n2")  # the node and every process it started, mid-recipe
        out, err = running.communicate(timeout=300)
    finally:
        disarm(setup, first_level)
    assert running.returncode == 0, err
    report = {r["model"]: r for r in json.loads(out)["results"]}
    assert [r["status"] for r in report.values()] == [r["status"] for r in local["results"]] == ["updated"] * 9
    # The stalled recipe ran again, on the head: its result is the same as everyone's.
    assert manifests(Repo(setup.root / "ray")) == manifests(Repo(setup.root / "local"))
    assert len({report[n]["where"] for n in stalled} | {report["merge-ab"]["where"]}) == 1
    setup.mgit(setup.root / "ray", "fsck")
    plan = {s["model"]: s for s in json.loads(out)["plan"]["steps"]}
    assert all(s["recorded_source"] for s in plan.values())


def test_a_task_lost_past_its_retries_fails_its_model_and_blocks_the_models_below(setup: Setup) -> None:
    setup.cluster.add_node("n3")
    new_base(setup, seed=50)
    first_level = ("ft-a", "ft-b", "ft-c")
    arm(setup, first_level, "n3")
    try:
        running = start_cascade(setup, "--max-retries", "0")
        deadline = time.monotonic() + 120
        while not any((setup.hold / f"{n}.started").exists() for n in first_level):
            assert time.monotonic() < deadline and running.poll() is None, "no recipe stalled on n3"
            time.sleep(0.1)
        setup.cluster.kill("n3")
        out, err = running.communicate(timeout=300)
    finally:
        disarm(setup, first_level)
    report = {r["model"]: r for r in json.loads(out)["results"]}
    assert running.returncode == 1, json.dumps({m: (r["status"], r["where"], r["reason"]) for m, r in report.items()})
    lost = [m for m, r in report.items() if r["status"] == "failed-recipe"]
    assert len(lost) == 1 and "was lost after 0 retries" in report[lost[0]]["reason"]
    below = {
        "ft-a": ["ft-a-int8", "ft-a2", "ft-a2-int8", "merge-ab"],
        "ft-b": ["ft-b-int8", "merge-ab"],
        "ft-c": ["ft-c-int8"],
    }[lost[0]]
    assert all(report[m]["status"] == "blocked" for m in below)
    # Nothing of it was committed; the next run (through Ray Client this time) rebuilds
    # exactly what is left, and ends where the local executor does.
    client = setup.mgit(setup.root / "ray", "cascade", "base", "--json", "--executor", setup.cluster.client_address)
    resumed = json.loads(client.stdout)
    rebuilt = {r["model"] for r in resumed["results"] if r["status"] == "updated"}
    assert rebuilt == {lost[0], *below}
    local = cascade_json(setup, "local")
    assert {r["status"] for r in local["results"]} == {"updated"}
    assert manifests(Repo(setup.root / "ray")) == manifests(Repo(setup.root / "local"))


# A driver whose recipe tasks each keep what they received (the driver's payload) before they
# run: `recording_recipe_task` is defined in __main__, so Ray ships it to the nodes by value.
RECORDING_DRIVER = """
import os
import pickle
import sys
import uuid
from pathlib import Path

from mgit.cli.main import main
from mgit.cluster import node


def recording_recipe_task(remote, job):
    from mgit.cluster import node as here  # on a node: mgit's own task

    received = pickle.dumps((remote, job))
    (Path(os.environ["MGIT_TEST_HOLD"]) / f"payload-{uuid.uuid4().hex}.pickle").write_bytes(received)
    return here.recipe_task(remote, job)


node.recipe_task = recording_recipe_task
sys.exit(main())
"""
# The driver's namespace: a tmpfs over the key's folder, seen by no other process, the key
# written into it from stdin; then the driver.
IN_DRIVER_NAMESPACE = 'mount -t tmpfs -o mode=0700,size=1m tmpfs "$0" && (umask 077 && cat > "$0/driver") && exec "$@"'


def sign_lineage(repo: Repo, key: Path) -> int:
    """Sign every version the heads of `repo` derive from (what verify --lineage walks)."""
    todo, seen = list(repo.refs.all().values()), set()
    while todo:
        vid = todo.pop()
        if vid not in seen:
            seen.add(vid)
            repo.sign(vid, key=str(key))
            todo += repo.version(vid).linked_versions()
    return len(seen)


def secrets_of(key: Path) -> list[bytes]:
    """What shipping the key would carry: its file, each line of its base64 body, its raw
    private bytes, its path."""
    from cryptography.hazmat.primitives import serialization

    data = key.read_bytes()
    private = serialization.load_ssh_private_key(data, password=None)
    raw = private.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    body = [line for line in data.splitlines() if line and not line.startswith(b"-----")]
    return [data, raw, *body, str(key).encode()]


def files_holding(folders: list[Path], needles: list[bytes]) -> list[str]:
    found = []
    for folder in folders:
        for dirpath, _, names in os.walk(folder):
            for name in names:
                path = Path(dirpath) / name
                if path.is_file() and not path.is_symlink():
                    data = path.read_bytes()
                    found += [str(path) for needle in needles if needle in data][:1]
    return found


@pytest.mark.skipif(not Path(KEYGEN).exists(), reason="openssh-client's ssh-keygen is not installed")
def test_a_cascade_on_ray_under_signing_always_is_signed_on_the_driver_and_the_key_never_leaves_it(
    setup: Setup,
) -> None:
    """Every version the cluster commits is signed by the driver's key and verifies with its
    whole lineage. The key is on a tmpfs mounted in the driver's own mount namespace: a
    recipe that reads its path on a node finds nothing; what each task received holds none of
    its bytes nor its path, and neither does anything the nodes wrote."""
    ray_root = setup.root / "ray"
    new_base(setup, seed=60)
    keys = setup.root / "driver-key"
    key = keygen(keys, "driver")
    allowed = allowed_file(setup.root / "allowed-signers", ("driver@cluster", key))
    repo = Repo(ray_root)
    assert sign_lineage(repo, key) >= len(FAMILY) + 2  # what the cascade builds on, signed by the same key
    secret, needles = key.read_bytes(), secrets_of(key)
    key.unlink()  # from now on the private key is in the driver's namespace alone
    configure(ray_root, signing_key=key, signing_always="true", verify_allowed_signers=allowed)
    (setup.hold / "peek").write_text(str(key))
    (setup.root / "recording_driver.py").write_text(RECORDING_DRIVER)
    try:
        run = subprocess.run(
            [
                "unshare",
                "--mount",
                "sh",
                "-c",
                IN_DRIVER_NAMESPACE,
                str(keys),
                sys.executable,
                str(setup.root / "recording_driver.py"),
                "cascade",
                "base",
                "--json",
                "--executor",
                "ray",
                "--trust-remote-code",
            ],
            cwd=ray_root,
            env={**setup.env, "RAY_ADDRESS": setup.cluster.address},
            input=secret,
            capture_output=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stderr.decode(errors="replace")
        results = json.loads(run.stdout)["results"]
        peeks = {m: json.loads((setup.hold / f"{m}.peek").read_text()) for m, *_ in FAMILY}
        payloads = [p.read_bytes() for p in sorted(setup.hold.glob("payload-*.pickle"))]
    finally:
        for leftover in [setup.hold / "peek", *setup.hold.glob("*.peek"), *setup.hold.glob("payload-*.pickle")]:
            leftover.unlink(missing_ok=True)
        configure(ray_root, signing_always="false")
    assert [r["status"] for r in results] == ["updated"] * 9
    assert all(r["where"] != "local" for r in results)
    for r in results:  # each new version: signed by the driver's key, its lineage trusted to the root
        shown = json.loads(setup.mgit(ray_root, "verify", r["new"], "--lineage", "--json").stdout)
        assert shown["ok"] and len(shown["versions"]) > 2
        first = shown["versions"][0]
        assert first["id"] == r["new"] and first["content_ok"]
        assert [(s["principals"], s["status"]) for s in first["signatures"]] == [(["driver@cluster"], "trusted")]
    # Each recipe ran on a node, where the key's path held nothing and no variable named it
    # or held a private key.
    assert {p["seen"] for p in peeks.values()} == {"FileNotFoundError"}, peeks
    assert all(p["node"] != "local" and p["env"] == [] for p in peeks.values()), peeks
    # What the tasks received: every job of the cascade, and nothing of the key.
    received = [pickle.loads(p) for p in payloads]  # written by this test's own driver, just now
    assert {job.model for _, job in received} == {m for m, *_ in FAMILY}
    assert [i for i, p in enumerate(payloads) if any(n in p for n in needles)] == []
    assert files_holding(setup.cluster.disks(), needles) == []
    # The signatures went to the remote with the versions: a clone that trusts only this
    # key takes the whole repository.
    url = repo.config["remotes"]["origin"]["url"]
    setup.mgit(setup.root, "clone", url, "trusting", "--lazy", "--verify", "trusted", "--allowed-signers", str(allowed))
    setup.mgit(setup.root / "trusting", "verify", "merge-ab", "--lineage")
