"""Issue 26, target 2: add and checkout of the 1.08 GB bf16 family and of the MiniLM family, as a
user runs them (one `mgit` process per command, start-up included), this tree beside another
source tree in alternating runs, each beside `cp -r` of the same folder in the same round.

    python benchmarks/io_speed.py --before /path/to/main/src            # 5 rounds; writes docs/benchmarks.md
    git archive main src | tar -x -C /tmp/main && \
        python benchmarks/io_speed.py --before /tmp/main/src --before-name "main (abc1234)" --runs 3 --no-doc

On a machine shared with other work the wall clock moves with the load, so each round measures
`cp -r` first and then every row for both trees (which tree goes first alternates by round): the
ratios to cp and between the trees are what one round's conditions cannot skew much. Rows, per
tree: `mgit add` of the base (1.08 GB, two shards, `llm_family.py`) into a fresh repository; of
its fine-tune with `-p` into a copy of that repository; `mgit checkout` of the fine-tune and of
the base from it; `mgit add` of MiniLM (`minilm-base` of the demo family) into a fresh
repository, of its fine-tune `minilm-sentiment` with `-p`, and the checkout of that fine-tune.
Before each timed command (untimed, as in `llm_scale.py`): `sync`, the page cache dropped
(as root), what the command reads read once. Every checkout is compared with its source folder
(sha256 of every file) in the last round, and the stored bytes of each tree's versions are
reported, so that a faster tree that stores more shows it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_family  # noqa: E402
from core import machine, write_doc  # noqa: E402
from llm_scale import RSS_BOUND, Run, child_env, copy_tree, file_hashes, fresh, mgit_command, settle, timed  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "io-speed"
FAMILY = ROOT / ".cache" / "demo-family"
BEGIN, END = "<!-- io-speed:begin -->", "<!-- io-speed:end -->"
MB = 1e6
TARGETS = {  # MB/s (issue 26, target 2)
    "add base": 600.0,
    "add fine-tune": 500.0,
    "checkout fine-tune": 1000.0,
    "MiniLM add base": 300.0,
    "MiniLM add fine-tune": 300.0,
    "MiniLM checkout fine-tune": 500.0,
}


@dataclass
class Row:
    label: str
    nbytes: int
    runs: dict[str, list[Run]] = field(default_factory=dict)  # by tree

    def median(self, tree: str) -> float:
        return statistics.median(r.seconds for r in self.runs[tree])

    def rate(self, tree: str) -> float:
        return self.nbytes / self.median(tree) / MB

    def cpu(self, tree: str) -> float:
        return statistics.median(r.cpu for r in self.runs[tree])

    def rss(self, tree: str) -> int:
        return max(r.rss for r in self.runs[tree])


def tree_env(src: Path) -> dict[str, str]:
    env = child_env()
    env["PYTHONPATH"] = str(src)
    return env


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def stored(repo: Path, ref: str, env: dict[str, str]) -> int:
    """What adding `ref` wrote (`mgit show --json`'s new bytes), read with that tree's own mgit."""
    import json

    out = subprocess.run(
        [*mgit_command(), "-C", str(repo), "log", ref, "--json"], env=env, capture_output=True, text=True, check=True
    )
    return int(json.loads(out.stdout)[0]["new_bytes"])


class Round:
    """One round of every row for one tree, in its own folders under WORK/<tree>."""

    def __init__(self, tree: str, env: dict[str, str], rows: dict[str, Row], sources: dict[str, Path]) -> None:
        self.tree, self.env, self.rows, self.src = tree, env, rows, sources
        self.work = WORK / tree
        self.work.mkdir(parents=True, exist_ok=True)
        self.mgit = mgit_command()

    def time(self, label: str, cmd: list[str], reads: list[Path]) -> None:
        settle(reads)
        run = timed(cmd, self.env)
        row = self.rows[label]
        row.runs.setdefault(self.tree, []).append(run)
        print(
            f"  {self.tree:>6} {label}: {run.seconds:.3f} s ({row.nbytes / run.seconds / MB:,.0f} MB/s, "
            f"CPU {run.cpu:.2f} s, RSS {run.rss / MB:,.0f} MB)",
            flush=True,
        )

    def init(self, name: str) -> Path:
        path = fresh(self.work / name)
        subprocess.run([*self.mgit, "init", str(path)], check=True, stdout=subprocess.DEVNULL, env=self.env)
        return path

    def family(self, prefix: str, base: Path, ft: Path, *, checkout_base: bool) -> tuple[Path, Path | None]:
        """Add the base, add the fine-tune onto a copy, check out the fine-tune (and the base)."""
        key = prefix.strip().replace(" ", "-").lower() or "llm"
        repo = self.init(f"{key}-base")
        self.time(f"{prefix}add base", [*self.mgit, "-C", str(repo), "add", str(base), "-n", "base"], [base, repo])
        ft_repo = copy_tree(repo, self.work / f"{key}-ft")
        self.time(
            f"{prefix}add fine-tune",
            [*self.mgit, "-C", str(ft_repo), "add", str(ft), "-n", "ft", "-p", "base"],
            [ft, ft_repo],
        )
        out = fresh(self.work / f"{key}-out")
        self.time(
            f"{prefix}checkout fine-tune", [*self.mgit, "-C", str(ft_repo), "checkout", "ft", "-o", str(out)], [ft_repo]
        )
        base_out = None
        if checkout_base:
            base_out = fresh(self.work / f"{key}-out-base")
            cmd = [*self.mgit, "-C", str(ft_repo), "checkout", "base", "-o", str(base_out)]
            self.time(f"{prefix}checkout base", cmd, [ft_repo])
        return out, base_out

    def run(self, last: bool) -> dict[str, int]:
        llm_out, llm_base_out = self.family("", self.src["base"], self.src["ft"], checkout_base=True)
        mini_out, _ = self.family("MiniLM ", self.src["minilm-base"], self.src["minilm-ft"], checkout_base=False)
        sizes: dict[str, int] = {}
        if last:
            for out, src in ((llm_out, "ft"), (llm_base_out, "base"), (mini_out, "minilm-ft")):
                assert out is not None
                if file_hashes(out) != file_hashes(self.src[src]):
                    raise SystemExit(f"{self.tree}: the checkout of {src} differs from its folder")
            print(f"  {self.tree}: every checkout identical to its folder (sha256 of every file)", flush=True)
            for repo, ref, key in (
                ("llm-ft", "base", "base"),
                ("llm-ft", "ft", "fine-tune"),
                ("minilm-ft", "ft", "MiniLM fine-tune"),
            ):
                sizes[key] = stored(self.work / repo, ref, self.env)
        for path in (llm_out, llm_base_out, mini_out):
            if path is not None:
                shutil.rmtree(path)
        return sizes


def copy_row(row: Row, src: Path) -> None:
    out = fresh(WORK / "copy")
    settle([src])
    started = time.perf_counter()
    subprocess.run(["cp", "-r", str(src), str(out)], check=True)
    row.runs.setdefault("cp", []).append(Run(time.perf_counter() - started, 0.0, 0))
    shutil.rmtree(out)


def report(rows: dict[str, Row], copies: dict[str, Row], sizes: dict[str, dict[str, int]], args, load, commits) -> str:
    lines = [
        BEGIN,
        "## Add and checkout speed, this tree beside main (issue 26, target 2)",
        "",
        f"Machine: {machine()}. {time.strftime('%Y-%m-%d %H:%M')} UTC; one-minute load average "
        f"{load[0]:.1f} at the start, {load[1]:.1f} at the end (other work shared the two cores).",
        f"Trees: *before* = {commits['before']}, *after* = {commits['after']}. Reproduce: "
        f"`.venv/bin/python benchmarks/io_speed.py --before OTHER/src --runs {args.runs}` (its docstring says what "
        "each row does). Median of the rounds (min-max in brackets), one `mgit` process per command, start-up "
        "included; cp = `cp -r` of the same folder in the same rounds; CPU = user + system seconds (median); RSS = "
        "peak resident set (max).",
        "",
        "| command | before | after | after/before | before vs cp | after vs cp | CPU before | CPU after "
        "| RSS after | target (after) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, row in rows.items():
        cp = copies["minilm" if label.startswith("MiniLM") else "llm"]
        cp_rate = cp.rate("cp")
        span = {t: [row.nbytes / r.seconds / MB for r in row.runs[t]] for t in ("before", "after")}
        cells = [f"{row.rate(t):,.0f} MB/s ({min(span[t]):,.0f}-{max(span[t]):,.0f})" for t in ("before", "after")]
        goal = TARGETS.get(label)
        verdict = []
        if goal:
            verdict.append(("met" if row.rate("after") >= goal else "**missed**") + f" (>= {goal:,.0f} MB/s)")
        verdict.append(("met" if row.rss("after") <= RSS_BOUND else "**missed**") + " (RSS <= 512 MB)")
        lines.append(
            f"| {label} | {cells[0]} | {cells[1]} | {row.rate('after') / row.rate('before'):.2f}x | "
            f"{row.rate('before') / cp_rate:.2f}x | {row.rate('after') / cp_rate:.2f}x | {row.cpu('before'):.2f} s | "
            f"{row.cpu('after'):.2f} s | {row.rss('after') / MB:,.0f} MB | {'; '.join(verdict)} |"
        )
    lines += [
        "",
        "| cp -r | MB/s (median, min-max) |",
        "| --- | --- |",
    ]
    for key, row in copies.items():
        rates = [row.nbytes / r.seconds / MB for r in row.runs["cp"]]
        what = "1.08 GB bf16 base" if key == "llm" else "MiniLM base"
        lines.append(f"| {what} | {row.rate('cp'):,.0f} ({min(rates):,.0f}-{max(rates):,.0f}) |")
    lines += [
        "",
        "Stored (bytes each add wrote): "
        + "; ".join(f"{key}: before {sizes['before'][key]:,}, after {sizes['after'][key]:,}" for key in sizes["after"])
        + ".",
        "",
        END,
    ]
    return "\n".join(lines)


def commit_of(src: Path) -> str:
    done = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(src), "status", "--porcelain", "--", "."], capture_output=True, text=True)
    return (done.stdout.strip() or "unknown") + (" (with uncommitted changes)" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other tree's src/ (main's, say)")
    parser.add_argument("--before-name", help="what to call it in the report (default: its git commit)")
    parser.add_argument("--runs", type=int, default=5, help="rounds (each measures every row for both trees)")
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    args = parser.parse_args()
    from minilm_family import build_family

    base, ft = llm_family.build(llm_family.Shape(layers=8))
    members = {m.name: m.path for m in build_family(FAMILY, preset="demo", progress=lambda _: None)}
    sources = {"base": base, "ft": ft, "minilm-base": members["minilm-base"], "minilm-ft": members["minilm-sentiment"]}
    trees = {"before": tree_env(args.before.resolve()), "after": tree_env(ROOT / "src")}
    commits = {"before": args.before_name or commit_of(args.before.resolve()), "after": commit_of(ROOT / "src")}
    labels = [
        *(f"{p}{what}" for p in ("",) for what in ("add base", "add fine-tune", "checkout fine-tune", "checkout base")),
        *(f"MiniLM {what}" for what in ("add base", "add fine-tune", "checkout fine-tune")),
    ]
    size = {"llm": folder_bytes(base), "minilm": folder_bytes(sources["minilm-base"])}
    rows = {label: Row(label, size["minilm" if label.startswith("MiniLM") else "llm"]) for label in labels}
    copies = {key: Row(f"cp -r {key}", n) for key, n in size.items()}
    sizes: dict[str, dict[str, int]] = {}
    WORK.mkdir(parents=True, exist_ok=True)
    load_start = os.getloadavg()[0]
    for i in range(args.runs):
        print(f"round {i + 1}/{args.runs} (load {os.getloadavg()[0]:.1f})", flush=True)
        copy_row(copies["llm"], base)
        copy_row(copies["minilm"], sources["minilm-base"])
        order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
        for tree in order:
            got = Round(tree, trees[tree], rows, sources).run(last=i == args.runs - 1)
            if got:
                sizes[tree] = got
    section = report(rows, copies, sizes, args, (load_start, os.getloadavg()[0]), commits)
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
