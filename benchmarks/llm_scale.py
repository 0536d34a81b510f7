"""Speed and memory at LLM scale, as a user meets them: one `mgit` process per command, wall
clock and peak RSS of that process, median of N runs, beside `cp -r` of the same folder in
the same run; and the start-up of the commands that touch no tensor.

    python benchmarks/llm_scale.py                    # both models; writes docs/benchmarks.md (llm-scale section)
    python benchmarks/llm_scale.py --sizes 1 --no-doc # the 1.08 GB model only, print only
    python benchmarks/llm_scale.py --only cli         # start-up rows only

Models (`llm_family.py`, generated once under .cache/bench/): a bf16 LLM-shaped base of
1.08 GB (8 layers) or 4 GB (36 layers of the same shape) in two safetensors shards with index
and config, a fine-tune of it (0.2% relative noise cast back to bf16: ~18% of the values move
by a unit or two in the last place) and a fine-tune of the fine-tune, which sits at the
repository's delta-depth bound (2). Every checkout is compared file by file (sha256) with its
source folder, untimed.

Rows: `cp -r` of the base folder; `mgit add` of the base into a fresh repository; of the
fine-tune with `--parent` into a copy of that repository; of the second fine-tune; `mgit
checkout` of each into an empty folder. Before each timed run, untimed: what the previous run
wrote is deleted and the repository copied where the row needs it; `sync` (write-back of
earlier runs must not land on this one); the page cache dropped, as root (a run must not pay
for reclaiming the cache that earlier runs filled: on this VM that alone moved a checkout
between 1.4 and 2.3 s); then what the run reads (source folder, repository) read once, so
it starts warm, as cp does.
Peak RSS is the process's maximum resident set (ru_maxrss from wait4: it counts file pages
the process maps too). Start-up rows run `mgit --version`, `ls`, `log`, `show`, `lineage` on
the 10-member MiniLM family repository of `remote.py`, and `ls`, `lineage` on the 1,000 x 5
repository of `lineage_scale.py`, with Python's bytecode cache on, as installed.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

import llm_family  # noqa: E402
from core import machine, warm_page_cache, write_doc  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
WORK = CACHE / "llm-scale"
BEGIN, END = "<!-- llm-scale:begin -->", "<!-- llm-scale:end -->"
MB = 1e6
RSS_BOUND = 512 << 20
TARGETS = {"add base": 400.0, "add fine-tune": 300.0, "checkout fine-tune": 500.0, "checkout at depth bound": 400.0}
STARTUP_MS = {"10": 100.0, "1000x5": 250.0}


TIME = shutil.which("time", path="/usr/bin:/bin") or sys.exit("GNU time (/usr/bin/time) is needed: apt install time")


def mgit_command() -> list[str]:
    script = Path(sys.executable).parent / "mgit"
    return [str(script)] if script.exists() else [sys.executable, "-m", "mgit.cli.main"]


def child_env() -> dict[str, str]:
    """The environment of a user's shell: bytecode cached (as pip installs it), no colour."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["NO_COLOR"] = "1"
    return env


@dataclass
class Run:
    seconds: float
    cpu: float
    rss: int


@dataclass
class Row:
    label: str
    nbytes: int
    runs: list[Run] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    @property
    def rate(self) -> float:
        return self.nbytes / self.median / MB

    @property
    def rss(self) -> int:
        return max(r.rss for r in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(r.cpu for r in self.runs)


def timed(cmd: list[str], env: dict[str, str] | None = None) -> Run:
    """Run `cmd` as its own process under GNU time (in `env`, by default a user's shell's):
    wall seconds, its CPU seconds and its peak RSS. (wait4's figure would not do: a child
    started by vfork reports the benchmark's own resident set as its peak, the kernel
    carrying the parent's mark over the exec.)"""
    with tempfile.NamedTemporaryFile("w+") as figures, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        done = subprocess.run(
            [TIME, "-q", "-f", "%M %U %S", "-o", figures.name, *cmd],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env or child_env(),
            check=False,
        )
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{' '.join(cmd)} exited with {done.returncode}: {err.read().decode(errors='replace')}")
        rss_kb, user, system = figures.read().split()[-3:]
    return Run(seconds, float(user) + float(system), int(rss_kb) * 1024)


def settle(reads: list[Path]) -> None:
    """The same start for every run: dirty pages written back, the page cache emptied (when
    this process may: as root) so that the run's output finds free memory instead of
    reclaiming it, then what the run reads read once (warm, as a file just downloaded or a
    repository in use is)."""
    os.sync()
    if reads:
        with contextlib.suppress(OSError):  # not root: runs start with whatever the cache holds
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
    for path in reads:
        warm_page_cache(path)


def measure(row: Row, runs: int, prepare, command, reads: list[Path] | None = None) -> Row:
    for i in range(runs):
        arg = prepare(i)
        settle(reads(arg) if callable(reads) else list(reads or []))
        row.runs.append(timed(command(arg)))
        r = row.runs[-1]
        speed = f"{row.nbytes / r.seconds / MB:,.0f} MB/s, " if row.nbytes else ""
        print(
            f"  {row.label} {i + 1}/{runs}: {r.seconds:.3f} s ({speed}RSS {r.rss / MB:,.0f} MB, CPU {r.cpu:.2f} s)",
            flush=True,
        )
    return row


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    return path


def copy_tree(src: Path, dst: Path) -> Path:
    subprocess.run(["cp", "-r", str(src), str(fresh(dst))], check=True)
    return dst


def file_hashes(folder: Path) -> dict[str, str]:
    out = {}
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h = hashlib.sha256()
            with open(f, "rb") as fh:
                while chunk := fh.read(16 << 20):
                    h.update(chunk)
            out[str(f.relative_to(folder))] = h.hexdigest()
    return out


def chain_depth(repo_path: Path, ref: str) -> int:
    from mgit import Repo

    repo = Repo(repo_path)
    return max(repo.store.header(t.object).depth for f in repo.manifest(ref).files for t in f.tensors)


def stored_bytes(repo_path: Path, ref: str) -> int:
    from mgit import Repo

    repo = Repo(repo_path)
    return repo.log(ref)[0].new_bytes


def model_rows(layers: int, runs: int) -> tuple[str, list[Row], dict[str, object]]:
    shape = llm_family.Shape(layers=layers)
    base, ft1, ft2 = llm_family.build(shape, generations=2)
    size = llm_family.folder_bytes(base)
    label = f"{size / 1e9:.2f} GB ({layers} layers)"
    print(f"\n{label}: {base.parent}", flush=True)
    work = WORK / shape.key
    work.mkdir(parents=True, exist_ok=True)
    mgit = mgit_command()
    rows: list[Row] = []

    rows.append(
        measure(
            Row("cp -r (base folder)", size),
            runs,
            lambda i: fresh(work / "copy"),
            lambda out: ["cp", "-r", str(base), str(out)],
            [base],
        )
    )
    shutil.rmtree(work / "copy")

    def fresh_repo(_: int) -> Path:
        path = fresh(work / "repo-base")
        subprocess.run([*mgit, "init", str(path)], check=True, stdout=subprocess.DEVNULL, env=child_env())
        return path

    rows.append(
        measure(
            Row("add base", size),
            runs,
            fresh_repo,
            lambda repo: [*mgit, "-C", str(repo), "add", str(base), "-n", "llm-base"],
            lambda repo: [base, repo],
        )
    )

    def repo_copy(src: str, dst: str):
        def prepare(_: int) -> Path:
            return copy_tree(work / src, work / dst)

        return prepare

    rows.append(
        measure(
            Row("add fine-tune", size),
            runs,
            repo_copy("repo-base", "repo-ft"),
            lambda repo: [*mgit, "-C", str(repo), "add", str(ft1), "-n", "llm-ft", "-p", "llm-base"],
            lambda repo: [ft1, repo],
        )
    )
    rows.append(
        measure(
            Row("add fine-tune of fine-tune", size),
            runs,
            repo_copy("repo-ft", "repo-chain"),
            lambda repo: [*mgit, "-C", str(repo), "add", str(ft2), "-n", "llm-ft2", "-p", "llm-ft"],
            lambda repo: [ft2, repo],
        )
    )
    repo = work / "repo-chain"
    shutil.rmtree(work / "repo-ft")
    depth = chain_depth(repo, "llm-ft2")
    facts: dict[str, object] = {
        "stored": {name: stored_bytes(repo, name) for name in ("llm-base", "llm-ft", "llm-ft2")},
        "depth": depth,
        "label": label,
        "size": size,
    }
    for name, src, row_label in (
        ("llm-base", base, "checkout base"),
        ("llm-ft", ft1, "checkout fine-tune"),
        ("llm-ft2", ft2, "checkout at depth bound"),
    ):
        out = work / "out"
        rows.append(
            measure(
                Row(row_label, size),
                runs,
                lambda i, out=out: fresh(out),
                lambda o, name=name: [*mgit, "-C", str(repo), "checkout", name, "-o", str(o)],
                [repo],
            )
        )
        if file_hashes(out) != file_hashes(src):
            raise SystemExit(f"checkout of {name} differs from {src}")
        print(f"  {name}: checkout identical to its folder (sha256 of every file)", flush=True)
        shutil.rmtree(out)
    shutil.rmtree(work / "repo-base")
    return label, rows, facts


def startup_rows(runs: int) -> list[tuple[str, Row]]:
    import lineage_scale
    from remote import minilm_repo

    small = minilm_repo().root
    big = CACHE / f"lineage-1000x5-s4-f{lineage_scale.FORMAT}"
    if not (big / ".built").exists():
        print(f"building {big} ...", flush=True)
        (big / ".built").write_text(f"{lineage_scale.build(big, 1000, 5, 4):.1f}\n")
    from mgit import Repo

    name = sorted(s.name for s in Repo(small).ls())[0]
    mgit = mgit_command()
    rows = []
    for repo, key, args in (
        (small, "10", ["--version"]),
        (small, "10", ["ls"]),
        (small, "10", ["log", name]),
        (small, "10", ["show", name]),
        (small, "10", ["lineage"]),
        (big, "1000x5", ["ls"]),
        (big, "1000x5", ["lineage"]),
    ):
        timed([*mgit, "-C", str(repo), *args])  # bytecode compiled, files in the page cache
        label = f"mgit {' '.join(args)}"
        rows.append(
            (key, measure(Row(label, 0), runs, lambda i: None, lambda _, a=args, r=repo: [*mgit, "-C", str(r), *a]))
        )
    return rows


# --- report ------------------------------------------------------------------------------------


def verdict(ok: bool, how: str) -> str:
    return f"met ({how})" if ok else f"**missed** ({how})"


def report(
    models: list[tuple[str, list[Row], dict[str, object]]],
    startup: list[tuple[str, Row]],
    runs: int,
    load: tuple[float, float],
) -> str:
    lines = [
        BEGIN,
        "## Speed and memory at LLM scale (issue 12)",
        "",
        f"Machine: {machine()}. One-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the end; "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "Reproduce: `.venv/bin/python benchmarks/llm_scale.py` (its docstring says what each row does). One "
        f"`mgit` process per command, wall clock, median of {runs} runs (min-max in brackets); MB = 10^6 bytes "
        "of the model's files; peak RSS is the process's maximum resident set (file pages it maps included); "
        "CPU is user + system seconds of the process. Every checkout was compared with its source folder by "
        "sha256, file by file.",
        "",
    ]
    for label, rows, facts in models:
        copy = rows[0]
        lines += [
            f"### {label}",
            "",
            "| command | throughput | vs cp -r | peak RSS | CPU | target |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for row in rows:
            secs = [r.seconds for r in row.runs]
            rate = f"{row.rate:,.0f} MB/s ({row.nbytes / max(secs) / MB:,.0f}-{row.nbytes / min(secs) / MB:,.0f})"
            target = TARGETS.get(row.label)
            goals = []
            if target:
                goals.append(verdict(row.rate >= target, f">= {target:.0f} MB/s"))
            if row is not copy:
                goals.append(verdict(row.rss <= RSS_BOUND, "RSS <= 512 MB"))
            lines.append(
                f"| {row.label} | {rate} | {row.rate / copy.rate:.2f}x | {row.rss / MB:,.0f} MB | "
                f"{row.cpu:.1f} s | {'; '.join(goals) or '-'} |"
            )
        stored = facts["stored"]
        assert isinstance(stored, dict)
        lines += [
            "",
            f"Stored: base {stored['llm-base'] / MB:,.0f} MB, fine-tune {stored['llm-ft'] / MB:,.0f} MB, "
            f"fine-tune of the fine-tune {stored['llm-ft2'] / MB:,.0f} MB (its deepest tensor at delta "
            f"depth {facts['depth']}).",
            "",
        ]
    if startup:
        lines += [
            "### Start-up: commands that touch no tensor",
            "",
            "| repository | command | wall (median, min-max) | peak RSS | CPU | target |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for key, row in startup:
            secs = [r.seconds * 1000 for r in row.runs]
            where = "MiniLM family, 10 models" if key == "10" else "1,000 models x 5 versions"
            goal = STARTUP_MS[key]
            lines.append(
                f"| {where} | `{row.label}` | {row.median * 1000:.0f} ms ({min(secs):.0f}-{max(secs):.0f}) | "
                f"{row.rss / MB:.0f} MB | {row.cpu * 1000:.0f} ms | "
                f"{verdict(row.median * 1000 < goal, f'< {goal:.0f} ms')} |"
            )
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,4", help="models to run: 1 (1.08 GB, 8 layers), 4 (4 GB, 36 layers)")
    parser.add_argument("--only", choices=["models", "cli"], help="run only the model rows or the start-up rows")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cli-runs", type=int, default=5)
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    args = parser.parse_args()
    layers = {"1": 8, "4": 36}
    load_start = os.getloadavg()[0]
    models = []
    if args.only != "cli":
        models = [model_rows(layers[s], args.runs) for s in args.sizes.split(",")]
    startup = startup_rows(args.cli_runs) if args.only != "models" else []
    section = report(models, startup, args.runs, (load_start, os.getloadavg()[0]))
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
