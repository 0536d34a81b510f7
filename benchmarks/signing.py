"""Signed lineage: what signing and verifying cost, beside the unsigned path.

    python benchmarks/signing.py                  # 3 runs; writes the signing section of docs/benchmarks.md
    python benchmarks/signing.py --runs 1 --no-doc
    python benchmarks/signing.py --work /dev/shm     # remotes and clones in memory (see below)

On the 1,000 models x 5 versions repository of `lineage_scale.py` (built once under
.cache/bench/, shared with startup.py and llm_scale.py; a copy is signed here, the cached one
is left as it is):

- sign and verify per version, in-process: an SSHSIG made with an ed25519 key (and an ecdsa
  P-256 one) over each version id and kept, then every signature judged against an
  allowed-signers file (`mgit.signing.policy.signature_checks`, what show and log
  --show-signature run);
- `mgit verify --lineage` (a subprocess, as a user runs it) on the model with the most
  ancestors, beside `mgit log` of it;
- a lazy clone of a folder remote holding the 5,000 versions: unsigned (no signatures, no
  policy) beside signed with `--verify trusted`;
- a full clone then a checkout of that deepest model: unsigned beside signed with
  verify.require trusted (clone and checkout both apply it). Target: verification adds < 5%.

On this machine's disk a clone of the 5,000 versions varies 2x from one run to the next (file
creation in the kernel: 14-31 s for the same full clone, quiet machine), far more than the 5%
measured; with `--work /dev/shm` both sides write to memory, the clones take a third of the
time and vary by a few percent, and what verification adds is a larger share of a smaller
whole (so a figure under the target there is under it on disk too). The section says where.

Each timed command is a fresh process; the runs of the two sides alternate, so a change of
the machine's load falls on both (each side first in every other run, and the disk's dirty
pages written back before each clone); medians (min-max) are reported.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lineage_scale  # noqa: E402
from core import machine, write_doc  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.signing.policy import signature_checks  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "bench"
BEGIN, END = "<!-- signing:begin -->", "<!-- signing:end -->"
TARGET = 0.05  # verification adds less than this to clone and checkout
MGIT = [sys.executable, "-m", "mgit.cli.main"]


def large() -> Path:
    path = CACHE / f"lineage-1000x5-s4-f{lineage_scale.FORMAT}"
    if not (path / ".built").exists():
        print("building the 1,000 x 5 repository (once) ...", flush=True)
        (path / ".built").parent.mkdir(parents=True, exist_ok=True)
        seconds = lineage_scale.build(path, 1000, 5, 4)
        (path / ".built").write_text(f"{seconds:.1f}\n")
    return path


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_COLOR": "1", "COLUMNS": "200"}


def mgit(*args: str, cwd: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run([*MGIT, *args], cwd=cwd, env=env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mgit {' '.join(args)} failed: {done.stderr}")
    return time.perf_counter() - started


def keygen(folder: Path, name: str, kind: str, bits: str) -> Path:
    path = folder / name
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-b", bits, "-N", "", "-C", name, "-f", str(path)], check=True)
    return path


def ancestors(store, vid: str) -> list[str]:  # noqa: ANN001 - an ObjectStore
    """`vid` and every version it derives from, each once: the chain verify --lineage walks."""
    order, seen = [vid], {vid}
    for v in order:
        for linked in store.get_version(v).linked_versions():
            if linked not in seen:
                seen.add(linked)
                order.append(linked)
    return order


def settle() -> None:
    """Write back what the commands before wrote (thousands of files each): a clone timed while
    the disk flushes the previous one's pays for it."""
    os.sync()
    time.sleep(1)


def median(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def per_version(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e6:,.0f} µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    parser.add_argument(
        "--work",
        help="where the remotes and clones go (default: the temporary folder; /dev/shm "
        "takes the disk's variance out of the comparison)",
    )
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mgit-signing-", dir=args.work))
    try:
        section = measure(large(), work, args.runs)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


def measure(source: Path, work: Path, runs: int) -> str:
    keys = work / "keys"
    keys.mkdir()
    ed, ec = keygen(keys, "alice", "ed25519", "256"), keygen(keys, "bob", "ecdsa", "256")
    allowed = keys / "allowed"
    allowed.write_text(
        f"alice@example.com {ed.with_suffix('.pub').read_text()}bob@example.com {ec.with_suffix('.pub').read_text()}"
    )
    unsigned_remote, signed_remote, repo_dir = work / "unsigned.mgit", work / "signed.mgit", work / "repo"
    shutil.copytree(source, repo_dir)
    for remote in (unsigned_remote, signed_remote):
        mgit("init", "--bare", str(remote), cwd=work)
    mgit("remote", "add", "origin", str(unsigned_remote), cwd=repo_dir)
    mgit("push", cwd=repo_dir)  # the unsigned remote: as every remote before signatures
    shutil.rmtree(signed_remote)
    shutil.copytree(unsigned_remote, signed_remote)

    repo = Repo(repo_dir)
    vids = [v.id for m in repo.ls() for v in repo.log(m.name)]
    mgit("config", "signing.key", str(ed), cwd=repo_dir)
    mgit("config", "verify.allowed-signers", str(allowed), cwd=repo_dir)
    repo = Repo(repo_dir)
    started = time.perf_counter()
    for vid in vids:
        repo.sign(vid)
    sign_ed = time.perf_counter() - started
    sample = vids[:500]
    started = time.perf_counter()
    for vid in sample:
        repo.sign(vid, key=str(ec))
    sign_ec = time.perf_counter() - started
    started = time.perf_counter()
    checked = list(signature_checks(repo.signatures, repo.config, vids).values())
    verify_all = time.perf_counter() - started
    assert all(c and all(x.trusted for x in c) for c in checked)
    deepest = max((m.head for m in repo.ls()), key=lambda h: len(ancestors(repo.store, h)))
    depth, deep_name = len(ancestors(repo.store, deepest)), repo.catalog.version(deepest).model
    mgit("remote", "add", "signed", str(signed_remote), cwd=repo_dir)
    mgit("push", "signed", cwd=repo_dir)  # only the signatures travel: the objects are there

    lineage_t, log_t, lazy_u, lazy_s, full_u, full_s = [], [], [], [], [], []
    for i in range(runs):
        lineage_t.append(mgit("verify", deep_name, "--lineage", cwd=repo_dir))
        log_t.append(mgit("log", deep_name, cwd=repo_dir))
        sides = [
            (unsigned_remote, [], lazy_u, full_u),
            (signed_remote, ["--verify", "trusted", "--allowed-signers", str(allowed)], lazy_s, full_s),
        ]
        for remote, policy, lazy_out, full_out in sides if i % 2 == 0 else sides[::-1]:  # each side first in turn
            target = work / f"lazy-{remote.stem}-{i}"
            settle()
            lazy_out.append(mgit("clone", str(remote), str(target), "--lazy", *policy, cwd=work))
            shutil.rmtree(target)
            target = work / f"full-{remote.stem}-{i}"
            settle()
            took = mgit("clone", str(remote), str(target), *policy, cwd=work)
            took += mgit("checkout", deep_name, "-o", str(work / f"out-{i}"), cwd=target)
            full_out.append(took)
            shutil.rmtree(target)
            shutil.rmtree(work / f"out-{i}")
    lazy_extra = statistics.median(lazy_s) / statistics.median(lazy_u) - 1
    full_extra = statistics.median(full_s) / statistics.median(full_u) - 1
    ok = "met" if full_extra < TARGET else "NOT met"
    n = len(vids)
    where = "memory (/dev/shm)" if str(work).startswith("/dev/shm") else f"one folder on disk ({work.parent})"
    return "\n".join(
        [
            BEGIN,
            "## Signed lineage: signing and verifying (`benchmarks/signing.py`, issue 27)",
            "",
            f"Measured {datetime.now(UTC):%Y-%m-%d} on {machine()}, load {os.getloadavg()[0]:.1f}; "
            f"median of {runs} runs (min-max). The 1,000 models x 5 versions repository ({n:,} versions), "
            f"folder remotes and clones in {where}.",
            "",
            "| in-process, per version | cost |",
            "| --- | --- |",
            f"| sign (ed25519: SSHSIG made, checked, kept) | {per_version(sign_ed, n)} ({sign_ed:.1f} s for {n:,}) |",
            f"| sign (ecdsa P-256) | {per_version(sign_ec, len(sample))} ({len(sample)} versions) |",
            f"| verify (every signature judged: parse, verify, allowed signers) | {per_version(verify_all, n)} |",
            "",
            "| command (a fresh process) | unsigned | signed, verified | verification adds |",
            "| --- | --- | --- | --- |",
            f"| `mgit verify {deep_name} --lineage` ({depth} versions) beside `mgit log {deep_name}` | "
            f"{median(log_t)} | {median(lineage_t)} | - |",
            f"| lazy clone ({n:,} versions; signed: `--verify trusted`) | {median(lazy_u)} | {median(lazy_s)} | "
            f"{lazy_extra:+.1%} |",
            f"| clone + checkout of {deep_name} (signed: verify.require trusted) | {median(full_u)} | "
            f"{median(full_s)} | {full_extra:+.1%} (target < {TARGET:.0%}: {ok}) |",
            "",
            "The signed clones list signatures/ once, read the push's bundle of signatures (one request),",
            "and verify each signature against its version id and the allowed signers before anything is kept.",
            END,
        ]
    )


if __name__ == "__main__":
    main()
