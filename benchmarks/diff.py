"""How fast is `mgit diff` on two related ~100 MB models? Writes its section of docs/benchmarks.md.

    .venv/bin/python benchmarks/diff.py              # about a minute on 2 cores
    .venv/bin/python benchmarks/diff.py --runs 5 --no-doc

Two generated fp32 models of about 110 MB, written once under `.cache/bench/diff/` and reused:
a random transformer-like base (an embedding, three layers of attention and MLP matrices,
norms) and a fine-tune-like copy: layer 0 gets a merged rank-8 LoRA on its query and value
matrices, layer 1 a dense 1e-3 relative drift on every matrix, every norm a small change, and
everything else (the embedding, most of layers 0 and 2) stays identical. Both are added to a
fresh repository, the fine-tune with the base as its parent (so its changed tensors are stored
as deltas against the base's). Then `repo.diff` is timed (median of N runs, page cache warm)
between two stored refs, a stored ref and the fine-tune's folder, the two folders, and, for
comparison, two refs with one thread and two refs in --structural mode. A separate untimed run
under tracemalloc gives the peak of Python and numpy allocations during each kind of diff.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import CACHE, MB, ROOT, cpu_seconds, empty_dir, machine, table, warm_page_cache, write_doc  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.diff import DiffResult  # noqa: E402

WORK = CACHE / "diff"
BEGIN, END = "<!-- diff:begin -->", "<!-- diff:end -->"
SPEC = {"format": 1, "seed": 7, "vocab": 8192, "hidden": 768, "ffn": 3072, "layers": 3, "lora_rank": 8}


def make_models(spec: dict[str, int]) -> tuple[Path, Path]:
    """The base and fine-tune folders, generated once per spec."""
    base_dir, ft_dir, marker = WORK / "base", WORK / "ft", WORK / ".complete"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return base_dir, ft_dir
    rng = np.random.default_rng(spec["seed"])
    h, f = spec["hidden"], spec["ffn"]

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    base = {"embed.weight": w(spec["vocab"], h)}
    for i in range(spec["layers"]):
        p = f"layers.{i}"
        base.update({f"{p}.attn.{k}.weight": w(h, h) for k in "qkvo"})
        base.update({f"{p}.mlp.up.weight": w(f, h), f"{p}.mlp.down.weight": w(h, f)})
        base.update({f"{p}.norm{k}.weight": np.ones(h, np.float32) for k in (1, 2)})
    base["norm.weight"] = np.ones(h, np.float32)
    ft = dict(base)
    r = spec["lora_rank"]
    for k in "qv":  # a merged LoRA
        name = f"layers.0.attn.{k}.weight"
        ft[name] = (base[name] + (rng.standard_normal((h, r)) * 0.02) @ (rng.standard_normal((r, h)) * 0.02)).astype(
            np.float32
        )
    for name in [n for n in base if n.startswith("layers.1.") and base[n].ndim == 2]:  # a full fine-tune
        ft[name] = (base[name] * (1 + rng.standard_normal(base[name].shape) * 1e-3)).astype(np.float32)
    for name in [n for n in base if "norm" in n]:
        ft[name] = (base[name] + rng.standard_normal(h) * 1e-2).astype(np.float32)
    for folder, state, step in ((base_dir, base, 0), (ft_dir, ft, 1000)):
        empty_dir(folder)
        save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = {"model_type": "toy", "hidden_size": h, "num_hidden_layers": spec["layers"], "step": step}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    marker.write_text(json.dumps(spec))
    return base_dir, ft_dir


def timed(fn: Callable[[], DiffResult], runs: int) -> tuple[list[float], list[float], DiffResult]:
    """Wall-clock and CPU seconds (user + system, all threads) of each run, after a warm-up run."""
    fn()
    seconds, cpu, result = [], [], None
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), cpu_seconds()
        result = fn()
        seconds.append(time.perf_counter() - start)
        cpu.append(cpu_seconds() - start_cpu)
    assert result is not None
    return seconds, cpu, result


def peak_allocations(fn: Callable[[], DiffResult]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _rank_range(result: DiffResult, prefix: str) -> str:
    """'>= 64' when every estimate there hit the cap, else the smallest estimate."""
    stats = [t.stats for t in result.tensors if t.name.startswith(prefix) and t.stats and t.stats.rank is not None]
    low = min(s.rank for s in stats)
    return f">= {low}" if all(s.rank_capped for s in stats) else str(low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs per case (default 5)")
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    blas = "held to one thread (threadpoolctl)"  # mgit.util.parallel.one_blas_thread, a core dependency
    base_dir, ft_dir = make_models(SPEC)
    size = (base_dir / "model.safetensors").stat().st_size
    repo = Repo.init(empty_dir(WORK / "repo"))
    repo.add(base_dir, name="base")
    repo.add(ft_dir, name="ft", parent="base")
    warm_page_cache(WORK)
    cases: list[tuple[str, str, Callable[[], DiffResult]]] = [
        ("two stored refs", "`repo.diff('base', 'ft')`", lambda: repo.diff("base", "ft")),
        ("stored ref and folder", "`repo.diff('base', ft_dir)`", lambda: repo.diff("base", ft_dir)),
        ("two folders", "`repo.diff(base_dir, ft_dir)`", lambda: repo.diff(base_dir, ft_dir)),
        ("two stored refs, one thread", "`repo.diff('base', 'ft', jobs=1)`", lambda: repo.diff("base", "ft", jobs=1)),
        (
            "two stored refs, structural",
            "`repo.diff('base', 'ft', structural=True)`",
            lambda: repo.diff("base", "ft", structural=True),
        ),
    ]
    rows, peak_list = [], []
    for label, call, fn in cases:
        seconds, cpu, result = timed(fn, args.runs)
        s = result.summary
        median = statistics.median(seconds)
        peak = peak_allocations(fn) if "structural" not in label and "one thread" not in label else None
        peak_list.append(peak)
        counts = ", ".join(f"{n} {k}" for k, n in s.counts.items())
        rows.append(
            [
                label,
                call,
                f"{median:.2f} s",
                f"{min(seconds):.2f}-{max(seconds):.2f}",
                f"{statistics.median(cpu):.2f} s",
                f"{2 * size / MB / median:,.0f}" if "structural" not in label else "-",
                counts,
                f"{s.decoded} / {s.reused}",
                f"{peak / MB:.0f} MB" if peak is not None else "-",
            ]
        )
        print(
            f"{label}: {median:.3f} s, CPU {statistics.median(cpu):.3f} s ({counts}; decoded {s.decoded}, "
            f"reused {s.reused})",
            flush=True,
        )
    result = repo.diff("base", "ft")
    largest = max(t.stats.values for t in result.tensors if t.stats) * 4
    ranks = {t.name: t.stats.rank for t in result.tensors if t.stats and t.stats.rank is not None}
    params = result.summary.params_a
    peaks = [p for p in peak_list if p is not None]
    identical_mb = sum(4 * math.prod(t.shape_a or []) for t in result.tensors if t.status == "identical") / MB
    section = "\n".join(
        [
            BEGIN,
            "## Diff: two related ~100 MB models",
            "",
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}. One-minute load average {load:.2f} at the start, "
            f"{os.getloadavg()[0]:.2f} at the end; BLAS threads {blas}.",
            "",
            f"Reproduce: `.venv/bin/python benchmarks/diff.py --runs {args.runs}`. Two generated fp32 models of "
            f"{size / MB:.0f} MB each ({params / 1e6:.1f} M parameters, {result.summary.tensors_a} tensors): "
            "a random base and a fine-tune "
            f"of it (a merged rank-{SPEC['lora_rank']} LoRA on layer 0's query and value, a dense 1e-3 drift on every "
            "matrix of layer 1, small changes to every norm; the embedding and the rest identical), "
            "the fine-tune added "
            "with the base as its parent. Median of the runs after one warm-up run, page cache warm; MB/s counts both "
            "models' bytes. *CPU*: median user + system time of all threads, which says what a diff costs even when "
            "other processes share the machine. *decoded / reused*: stored objects decoded, and decodes saved by "
            "taking a delta's base from "
            "the other side. *peak alloc*: the peak of Python and numpy allocations (tracemalloc) during one more run.",
            "",
            *table(
                ["case", "call", "median", "min-max", "CPU", "MB/s", "tensors", "decoded / reused", "peak alloc"], rows
            ),
            "",
            f"Rank estimates in that diff: layer 0 query and value (the merged LoRA) "
            f"{ranks.get('layers.0.attn.q.weight')} and {ranks.get('layers.0.attn.v.weight')}; "
            f"layer 1 matrices (dense drift) {_rank_range(result, 'layers.1.')}.",
            "",
            f"The largest changed tensor is {largest / MB:.1f} MB; the peaks above are "
            f"{min(peaks) / largest:.0f}-{max(peaks) / largest:.0f} times it and at most "
            f"{100 * max(peaks) / (2 * size):.0f}% of the two models' bytes. Identical tensors (the "
            f"{result.summary.counts.get('identical', 0)} here, {identical_mb:.0f} MB of each model) "
            "are never compared; each is read once, from A, "
            "for its share of ||A|| (the relative change counts every shared value).",
            END,
        ]
    )
    print("\n" + section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)
        print(f"\nwritten to {(ROOT / 'docs' / 'benchmarks.md').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
