"""Collocation benchmark (issue 16): every member of the MiniLM family held in one process,
loaded with `mgit.load_many` against `mgit.load` one by one and safetensors' `load_file`.

    .venv/bin/python benchmarks/loading.py            # writes docs/benchmarks.md (loading section)
    .venv/bin/python benchmarks/loading.py --no-doc   # print only

Data: the full MiniLM family of `minilm_family.py` (10 members: the base, fine-tunes, one with
its early layers frozen, a merged LoRA, int8, pruned and bfloat16 copies, a second version of a
fine-tune), or the demo preset's 5 with --preset demo; added to a repository under
.cache/bench/loading/ with their lineage. Each way of loading runs in a fresh child process
(torch imported first): wall time of the loads, and peak RSS (VmHWM, after every tensor was read
once, as a forward pass would) above the process's RSS before them, against the family's total
tensor bytes and its distinct ones (tensors that
several members hold by the same object id counted once). Median of --runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import machine, write_doc  # noqa: E402
from minilm_family import build_family  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "loading"
BEGIN, END = "<!-- loading:begin -->", "<!-- loading:end -->"
MB = 1e6
FAMILY_DIRS = {"demo": ROOT / ".cache" / "demo-family", "full": ROOT / ".cache" / "family-full"}

CHILD = r"""
import json, sys, time
import torch
import mgit
from safetensors.torch import load_file

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

how, repo, refs, folders = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
mgit.Repo(repo)  # the catalog opened, as any load opens it
before = rss("VmRSS:")
started = time.perf_counter()
if how == "load_many":
    held = mgit.load_many(refs, repo=repo)
elif how == "load":
    held = [mgit.load(r, repo=repo) for r in refs]
else:
    held = [load_file(f) for f in folders]
elapsed = time.perf_counter() - started
for sd in held:  # every page touched, as a first forward pass would (load_file maps the files lazily)
    for t in sd.values():
        t.float().sum() if t.numel() else None
storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for sd in held for t in sd.values()}
print(json.dumps({"seconds": elapsed, "peak": rss("VmHWM:") - before, "held": sum(storages.values())}))
"""

WAYS = {
    "load_many": "`mgit.load_many(refs)`",
    "load": "`mgit.load(ref)` for each ref",
    "load_file": "safetensors `load_file` of each folder (after a checkout; page cache warm)",
}


def repository(preset: str) -> tuple[Path, list[str], list[Path]]:
    """The family added to a repository (once); the refs of its versions and their folders."""
    from mgit import Repo

    members = build_family(FAMILY_DIRS[preset], preset=preset, progress=lambda line: None)
    path = WORK / preset
    marker = path / ".refs.json"
    if not marker.exists():
        shutil.rmtree(path, ignore_errors=True)
        repo = Repo.init(path)
        ids: dict[str, str] = {}  # parents by version id: a second version of a model keeps its children's parent
        refs = []
        for m in members:
            name = m.version_of or m.name
            added = repo.add(
                m.path,
                name=name,
                parent=[ids[p] for p in m.parents] or None,
                relation=m.relation if m.parents else None,
            )
            ids[m.name] = added.version
            refs.append(f"{name}@{added.version[:12]}")
        marker.write_text(json.dumps(refs))
    return path, json.loads(marker.read_text()), [m.path / "model.safetensors" for m in members]


def sizes(path: Path, refs: list[str]) -> tuple[int, int]:
    """The family's tensor bytes in all, and counting each object id once."""
    from mgit import Repo

    repo = Repo(path)
    total, distinct = 0, {}
    for ref in refs:
        for t in repo.manifest(ref).tensors():
            total += t.nbytes
            distinct[t.object] = t.nbytes
    return total, sum(distinct.values())


def run(how: str, path: Path, refs: list[str], folders: list[Path]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, how, str(path), json.dumps(refs), json.dumps([str(f) for f in folders])],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(FAMILY_DIRS), default="full")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-doc", action="store_true", help="print only, leave docs/ alone")
    opts = parser.parse_args()
    path, refs, folders = repository(opts.preset)
    total, distinct = sizes(path, refs)
    for f in folders:  # the page cache warm for load_file, as for the repository's objects
        f.read_bytes()
    load_start = os.getloadavg()[0]
    rows = []
    for how in WAYS:
        results = [run(how, path, refs, folders) for _ in range(opts.runs)]
        row = {k: statistics.median(r[k] for r in results) for k in ("seconds", "peak", "held")}
        rows.append((how, row))
        print(
            f"{how}: {row['seconds']:.2f} s, peak +{row['peak'] / MB:.0f} MB, held {row['held'] / MB:.0f} MB",
            flush=True,
        )
    lines = [
        BEGIN,
        "## Loading a family into one process (`benchmarks/loading.py`, issue 16)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, load {load_start:.1f} -> {os.getloadavg()[0]:.1f}. "
        f"The {opts.preset} MiniLM family: {len(refs)} versions, {total / MB:.0f} MB of tensors, "
        f"{distinct / MB:.0f} MB of distinct ones (one object id counted once). Each way in a fresh process "
        f"(torch imported), median of {opts.runs}: time of the loads, peak RSS above the RSS before them "
        "(VmHWM, after every tensor was read once: load_file maps the files and reads pages as they are "
        "touched, which RSS counts), and the bytes of the distinct tensor storages the process then holds.",
        "",
        "| loading | time (s) | peak RSS above start (MB) | tensor memory held (MB) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for how, row in rows:
        lines.append(f"| {WAYS[how]} | {row['seconds']:.2f} | {row['peak'] / MB:.0f} | {row['held'] / MB:.0f} |")
    lines += ["", "Reproduce: `.venv/bin/python benchmarks/loading.py [--preset demo] [--runs N]`.", END]
    section = "\n".join(lines)
    print(section)
    if not opts.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
