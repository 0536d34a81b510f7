"""Cluster benchmark: cascades and test runs with the local executor against Ray on two nodes.

    sudo .venv/bin/python benchmarks/cluster.py            # writes docs/benchmarks.md (cluster section)
    .venv/bin/python benchmarks/cluster.py --no-doc --skip-demo

Needs root: like the tests, it runs the S3 server (moto's server process), a Ray cluster (a
head and a second node, `ray start`, one CPU each: the machine has two cores) and every mgit
command inside a network namespace holding only loopback (tests/raycluster.py).

Two workloads, each run with both executors in the same run, on the same inputs:

- the demo family's cascade (benchmarks/minilm_family.py, preset "demo": the MiniLM base, a
  fine-tune, its int8 and pruned copies, with the recipes of demo/recipes.py and the held-out
  accuracy test of demo/evals.py inherited from the fine-tune), after the base gets the new
  version `make demo` gives it: `mgit cascade minilm-base --jobs 2` against `--executor ray`;
- a test run over 20 small models (a base and 19 fine-tunes, made by a numpy recipe) with a
  test that reads the weights: `mgit test run --all --force --jobs 2` against `--executor ray`.

Per-task overhead is what a task costs beyond its user function: (wall time x 2 slots -
the user functions' own seconds) / tasks, for each executor; and, for scale, a no-op Ray
task's round trip on the same cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "demo"))

from core import machine, write_doc  # noqa: E402
from raycluster import RayCluster, can_make_netns, loopback_only  # noqa: E402
from s3server import S3Server, aws_env  # noqa: E402

CACHE = ROOT / ".cache"
WORK = CACHE / "bench" / "cluster"
BEGIN, END = "<!-- cluster:begin -->", "<!-- cluster:end -->"
MGIT = [sys.executable, "-m", "mgit.cli.main"]

TOY_RECIPES = """
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file, save_file

def finetune(parents, out, seed=0):
    rng = np.random.default_rng(seed)
    state = load_file(str(Path(parents[0]) / "model.safetensors"))
    state = {k: (v + rng.standard_normal(v.shape).astype(v.dtype) * 0.01) for k, v in sorted(state.items())}
    save_file(state, str(Path(out) / "model.safetensors"), metadata={"format": "pt"})
"""
TOY_EVALS = """
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file

def spread(folder):
    state = load_file(str(Path(folder) / "model.safetensors"))
    return {"mean_abs": float(np.mean([np.abs(v).mean() for v in state.values()]))}
"""


class Bench:
    def __init__(self, env: dict[str, str], cluster: RayCluster) -> None:
        self.env, self.cluster = env, cluster

    def mgit(self, cwd: Path, *args: str, ray: bool = False) -> tuple[float, str]:
        env = {**self.env, **({"RAY_ADDRESS": self.cluster.address} if ray else {})}
        started = time.perf_counter()
        run = subprocess.run([*MGIT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=3600)
        took = time.perf_counter() - started
        if run.returncode not in (0, 1):
            raise SystemExit(f"mgit {' '.join(args)} failed ({run.returncode}):\n{run.stdout}\n{run.stderr}")
        return took, run.stdout


def demo_repos(bench: Bench, url: str) -> tuple[Path, Path]:
    """The demo family in a repository pushed to `url`, cloned twice, with the new base."""
    from minilm_family import build_family
    from tour import add_commands, base_v2

    members = build_family(CACHE / "demo-family", preset="demo", progress=lambda _: None)
    origin = WORK / "demo-origin"
    origin.mkdir(parents=True)
    bench.mgit(origin, "init")
    for args in add_commands(members):  # as `make demo` adds them
        bench.mgit(origin, *args)
    bench.mgit(
        origin,
        "test",
        "add",
        "minilm-sentiment",
        "--fn",
        f"{ROOT / 'demo' / 'evals.py'}:sentiment_accuracy",
        "--name",
        "accuracy",
        "--metric",
        "accuracy",
        "--min",
        "0.8",
        "--inherit",
    )
    return clone_pair(bench, origin, url, "demo", new_base=("minilm-base", base_v2(members[0].path)))


def toy_repos(bench: Bench, url: str, count: int) -> tuple[Path, Path]:
    """A base and count-1 fine-tunes made by a recipe, with a test on every one of them."""
    import numpy as np
    from safetensors.numpy import save_file

    origin = WORK / "toy-origin"
    origin.mkdir(parents=True)
    (origin / "recipes.py").write_text(TOY_RECIPES)
    (origin / "evals.py").write_text(TOY_EVALS)
    rng = np.random.default_rng(0)
    (origin / "m" / "base").mkdir(parents=True)
    state = {f"layer.{i}.weight": rng.standard_normal((256, 256)).astype(np.float32) for i in range(8)}
    save_file(state, str(origin / "m" / "base" / "model.safetensors"), metadata={"format": "pt"})
    bench.mgit(origin, "init")
    bench.mgit(origin, "add", "m/base", "--name", "base")
    namespace: dict[str, Any] = {}
    exec(compile(TOY_RECIPES, "recipes.py", "exec"), namespace)  # the recipe, to make the first versions
    for i in range(1, count):
        out = origin / "m" / f"ft-{i:02d}"
        out.mkdir(parents=True)
        namespace["finetune"]([origin / "m" / "base"], out, seed=i)
        bench.mgit(
            origin,
            "add",
            f"m/ft-{i:02d}",
            "--name",
            f"ft-{i:02d}",
            "--parent",
            "base",
            "--recipe",
            "recipes.py:finetune",
            "--param",
            f"seed={i}",
        )
    bench.mgit(origin, "test", "add", "*", "--fn", "evals.py:spread", "--name", "spread")
    return clone_pair(bench, origin, url, "toy", files=("recipes.py", "evals.py"))


def clone_pair(
    bench: Bench,
    origin: Path,
    url: str,
    name: str,
    *,
    files: tuple[str, ...] = (),
    new_base: tuple[str, Path] | None = None,
) -> tuple[Path, Path]:
    bench.mgit(origin, "init", "--bare", url)
    bench.mgit(origin, "remote", "add", "origin", url)
    bench.mgit(origin, "push")
    pair = []
    for kind in ("local", "ray"):
        clone = WORK / f"{name}-{kind}"
        bench.mgit(WORK, "clone", url, str(clone))
        for f in files:
            shutil.copyfile(origin / f, clone / f)
        if new_base is not None:
            bench.mgit(clone, "add", str(new_base[1]), "--name", new_base[0], "-m", "new base")
        pair.append(clone)
    return pair[0], pair[1]


def cascade_both(bench: Bench, local: Path, ray: Path, model: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, clone in (("local", local), ("ray", ray)):
        args = ["cascade", model, "--json"] + (["--executor", "ray"] if kind == "ray" else ["--jobs", "2"])
        wall, text = bench.mgit(clone, *args, ray=kind == "ray")
        report = json.loads(text)
        out[kind] = {
            "wall": wall,
            "tasks": len(report["results"]),
            "statuses": sorted({r["status"] for r in report["results"]}),
            "recipe_seconds": sum(r["seconds"] for r in report["results"]),
            "nodes": len({r["where"] for r in report["results"]}),
        }
    from mgit import Repo

    a, b = Repo(local), Repo(ray)
    out["same_manifests"] = all(
        a.version(h).manifest == b.version(b.refs.get(n)).manifest for n, h in a.refs.all().items()
    )
    return out


def tests_both(bench: Bench, local: Path, ray: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind, clone in (("local", local), ("ray", ray)):
        args = ["test", "run", "--all", "--force", "--json"] + (
            ["--executor", "ray"] if kind == "ray" else ["--jobs", "2"]
        )
        wall, text = bench.mgit(clone, *args, ray=kind == "ray")
        outcomes = json.loads(text)["outcomes"]
        user = sum(o["seconds"] for o in outcomes)
        out[kind] = {
            "wall": wall,
            "tasks": len(outcomes),
            "user_seconds": user,
            "overhead_per_task": (wall * 2 - user) / len(outcomes),
            "passed": sum(o["status"] == "pass" for o in outcomes),
        }
    return out


def noop_round_trip(bench: Bench, count: int = 20) -> float:
    """Seconds per no-op Ray task (submitted one after another) from a driver on this cluster."""
    code = (
        f"import ray, time; ray.init(address={bench.cluster.address!r}, logging_level='ERROR', log_to_driver=False)\n"
        "f = ray.remote(num_cpus=1)(lambda: None); ray.get(f.remote())\n"
        f"t = time.perf_counter()\nfor _ in range({count}): ray.get(f.remote())\n"
        f"print((time.perf_counter() - t) / {count})"
    )
    run = subprocess.run([sys.executable, "-c", code], env=bench.env, capture_output=True, text=True, timeout=300)
    return float(run.stdout.strip().splitlines()[-1])


def render(results: dict[str, Any]) -> str:
    lines = [
        BEGIN,
        "## Cascades and test runs on a Ray cluster (`benchmarks/cluster.py`, issue 13)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}; Ray {results['ray_version']}. A single run of each.",
        "The cluster: a head and a second node on this machine (`ray start`, one CPU each), moto's S3 server as "
        "the shared remote, all in a network namespace holding only loopback; each node its own node cache. "
        "Local runs use `--jobs 2` (two slots, as the cluster has). "
        "Reproduce: `sudo .venv/bin/python benchmarks/cluster.py`.",
        "",
        "| workload | executor | wall (s) | tasks | user code (s) | per-task overhead (s) | notes |",
        "| --- | --- | ---: | ---: | ---: | ---: | --- |",
    ]
    if "demo" in results:
        d = results["demo"]
        for kind in ("local", "ray"):
            r = d[kind]
            lines.append(
                f"| demo family cascade (MiniLM, {r['tasks']} models) | {kind} | {r['wall']:.1f} | {r['tasks']} | "
                f"{r['recipe_seconds']:.1f} (recipe and tests, per model) | - | {', '.join(r['statuses'])}; "
                f"{r['nodes']} node(s) |"
            )
        lines.append(f"| | | | | | | same manifests as the local run: {'yes' if d['same_manifests'] else 'NO'} |")
    t = results["tests"]
    for kind in ("local", "ray"):
        r = t[kind]
        lines.append(
            f"| test run, 20 small models | {kind} | {r['wall']:.1f} | {r['tasks']} | {r['user_seconds']:.1f} | "
            f"{r['overhead_per_task']:.2f} | {r['passed']} passed |"
        )
    lines += [
        "",
        f"A no-op Ray task's round trip on the same cluster: {results['noop'] * 1000:.1f} ms.",
        "",
        "Per-task overhead = (wall x 2 slots - the user functions' own seconds) / tasks: the checkout, the "
        "child process, and on Ray the scheduling, the node cache's fetch of records and objects from S3, "
        "and the driver's fetch and ref moves.",
        END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-doc", action="store_true", help="print only, leave docs/ alone")
    parser.add_argument("--skip-demo", action="store_true", help="only the test run over 20 models")
    opts = parser.parse_args()
    why = can_make_netns()
    if why is not None:
        raise SystemExit(f"benchmarks/cluster.py runs in a network namespace: {why}")
    import ray

    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir(parents=True)
    results: dict[str, Any] = {"ray_version": ray.__version__}
    with loopback_only():
        s3 = S3Server()
        cluster = None
        try:
            env = {
                **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                **aws_env(s3.endpoint),
                "HF_HUB_OFFLINE": "1",
            }
            cluster = RayCluster(WORK / "nodes", env)
            cluster.add_node("n2")
            bench = Bench(env, cluster)
            results["noop"] = noop_round_trip(bench)
            local, remote = toy_repos(bench, f"s3://{s3.new_bucket()}/toy", 20)
            results["tests"] = tests_both(bench, local, remote)
            print(json.dumps(results["tests"], indent=2), flush=True)
            if not opts.skip_demo:
                local, remote = demo_repos(bench, f"s3://{s3.new_bucket()}/demo")
                results["demo"] = cascade_both(bench, local, remote, "minilm-base")
                print(json.dumps(results["demo"], indent=2), flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
            s3.stop()
    section = render(results)
    print(section)
    if not opts.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
