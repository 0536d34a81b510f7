"""How deep may delta chains go? Storage against checkout time of the newest version.

A history of versions, each a small drift of the one before (like continued training), is
added to one repository per `delta_max_depth`. A deeper bound stores less (fewer tensors
restart as standalone) but a checkout decodes every link of a chain. The result picks the
default. Writes its section of docs/benchmarks.md.

    .venv/bin/python benchmarks/chain_depth.py [--versions 12] [--megabytes 64]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import machine, write_doc  # noqa: E402

import mgit  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".cache" / "bench" / "chain-depth"
DEPTHS = (1, 2, 4, 8, 16)
BEGIN, END = "<!-- depth:begin -->", "<!-- depth:end -->"


def make_history(folder: Path, versions: int, megabytes: int) -> list[Path]:
    """`versions` model folders: random fp32 weights, then each a 1e-3 relative drift."""
    rng = np.random.default_rng(0)
    shapes = [(1024, 1024)] * (megabytes // 4)
    state = {f"layer.{i}.weight": (rng.standard_normal(s) * 0.05).astype(np.float32) for i, s in enumerate(shapes)}
    paths = []
    for v in range(versions):
        path = folder / f"v{v + 1}"
        if not (path / "model.safetensors").exists():
            path.mkdir(parents=True, exist_ok=True)
            save_file(state, str(path / "model.safetensors"))
        paths.append(path)
        state = {k: (w * (1 + 1e-3 * rng.standard_normal(w.shape))).astype(np.float32) for k, w in state.items()}
    return paths


def measure(depth: int, history: list[Path], runs: int) -> dict[str, float]:
    """Add the history with this bound; time checkouts of the newest and the second version."""
    repo_dir = WORK / f"repo-depth{depth}"
    shutil.rmtree(repo_dir, ignore_errors=True)
    repo = mgit.Repo.init(repo_dir)
    config = json.loads((repo.dir / "config.json").read_text())
    config["delta_max_depth"] = depth
    (repo.dir / "config.json").chmod(0o644)
    (repo.dir / "config.json").write_text(json.dumps(config))
    repo = mgit.Repo(repo.dir)
    start = time.perf_counter()
    for path in history:
        repo.add(path, name="model")
    add_s = time.perf_counter() - start
    logical = sum(p.joinpath("model.safetensors").stat().st_size for p in history)

    def checkout(ref: str) -> float:
        times = []
        for _ in range(runs):
            out = repo_dir / "out"
            shutil.rmtree(out, ignore_errors=True)
            os.sync()
            t = time.perf_counter()
            repo.checkout(ref, out)
            times.append(time.perf_counter() - t)
        return statistics.median(times)

    size = history[0].joinpath("model.safetensors").stat().st_size
    # Chains restart after `depth` links, so version depth + 1 is the deepest there is.
    deepest, second = checkout(f"model@{min(depth + 1, len(history))}"), checkout("model@2")
    return {
        "stored": repo.du().stored_bytes,
        "reduction": logical / repo.du().stored_bytes,
        "add_mbs": logical / 1e6 / add_s,
        "deepest_s": deepest,
        "second_s": second,
        "deepest_mbs": size / 1e6 / deepest,
        "second_mbs": size / 1e6 / second,
    }


def report(results: dict[int, dict[str, float]], versions: int, megabytes: int, load: float) -> str:
    lines = [
        BEGIN,
        "## Delta chain depth: storage against checkout speed",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}. One-minute load average {load:.2f} at the start.",
        "",
        f"Reproduce: `.venv/bin/python benchmarks/chain_depth.py --versions {versions} --megabytes {megabytes}`. "
        f"A history of {versions} versions of a {megabytes} MB fp32 model, each a 1e-3 relative drift of the one "
        "before, added to one repository per `delta_max_depth`; checkout times are medians of 3 runs. Chains "
        "restart after `delta_max_depth` links, so version `delta_max_depth + 1` is the slowest to check out.",
        "",
        "| max depth | stored | reduction | add MB/s | checkout of the deepest version (MB/s) | checkout @2 (MB/s) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for depth, r in results.items():
        lines.append(
            f"| {depth} | {r['stored'] / 1e6:,.0f} MB | {r['reduction']:.2f}x | {r['add_mbs']:,.0f} | "
            f"{r['deepest_s']:.2f} s ({r['deepest_mbs']:,.0f}) | {r['second_s']:.2f} s ({r['second_mbs']:,.0f}) |"
        )
    return "\n".join([*lines, END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", type=int, default=12)
    parser.add_argument("--megabytes", type=int, default=64)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    history = make_history(WORK / "history", args.versions, args.megabytes)
    results = {}
    for depth in DEPTHS:
        results[depth] = measure(depth, history, runs=3)
        r = results[depth]
        print(
            f"depth {depth}: {r['reduction']:.2f}x, add {r['add_mbs']:.0f} MB/s,"
            f" checkout deepest {r['deepest_s']:.2f}s, @2 {r['second_s']:.2f}s",
            flush=True,
        )
    section = report(results, args.versions, args.megabytes, load)
    write_doc(section, BEGIN, END)
    print(section)


if __name__ == "__main__":
    main()
