"""Resume benchmark: a push of the 1.08 GB LLM-shaped base (llm_family.py) to an S3 server,
SIGKILLed when about half of its bytes have gone, then run again; beside a full push, and beside
the same re-run without the transfer journal (what a re-run sends when only whole objects
count). The same for a clone cut off halfway and run again.

    python benchmarks/resume.py                     # writes docs/benchmarks.md (resume section)
    python benchmarks/resume.py --no-doc --part-size 0 --part-size 8388608   # 0: the default

The S3 server is moto's server process on 127.0.0.1 (tests/s3server.py); every request goes
through the test proxy (FaultProxy, no faults), which counts the bytes that cross it both
ways, so "bytes sent" is what went on the wire (heads included), not what MGit says it sent.
The push and the clone run as `mgit` subprocesses, killed with SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

import llm_family  # noqa: E402
from core import machine, write_doc  # noqa: E402
from s3server import FaultProxy, S3Server, aws_env  # noqa: E402

from mgit import Repo, sync  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "resume"
BEGIN, END = "<!-- resume:begin -->", "<!-- resume:end -->"
MGIT = [sys.executable, "-m", "mgit.cli.main"]
MB = 1e6


def base_repo() -> Repo:
    path = WORK / "llm"
    if (path / ".built").exists():
        return Repo(path)
    base = llm_family.build()[0]
    if path.exists():
        shutil.rmtree(path)
    repo = Repo.init(path)
    repo.add(base, name="llm-base")
    (path / ".built").write_text("ok\n")
    return repo


def run(args: list[str], cwd: Path, env: dict[str, str], proxy: FaultProxy, *, kill_at: int | None = None) -> dict:
    """Run `mgit ARGS`; with `kill_at`, SIGKILL it once that many bytes crossed the proxy."""
    up, down = proxy.bytes_up, proxy.bytes_down
    started = time.perf_counter()
    proc = subprocess.Popen([*MGIT, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while kill_at is not None and proc.poll() is None:
        if (proxy.bytes_up - up) + (proxy.bytes_down - down) >= kill_at:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    _, err = proc.communicate()
    seconds = time.perf_counter() - started
    if kill_at is None and proc.returncode != 0:
        raise SystemExit(f"mgit {' '.join(args)} failed: {err.decode()[-2000:]}")
    if kill_at is not None and proc.returncode != -signal.SIGKILL:
        raise SystemExit(f"mgit {' '.join(args)} ended before the kill ({proc.returncode})")
    return {"s": seconds, "up": proxy.bytes_up - up, "down": proxy.bytes_down - down}


def push_case(repo: Repo, server: S3Server, proxy: FaultProxy, env: dict[str, str], journal: bool) -> dict:
    """A full push, then a push killed halfway and its re-run (the journal kept or not)."""
    results: dict[str, Any] = {}
    for label in ("full", "killed"):
        bucket = server.new_bucket()
        url = f"s3://{bucket}/models"
        sync.init_bare(url)
        shutil.rmtree(repo.dir / "transfers", ignore_errors=True)
        if label == "full":
            results["full"] = run(["push", url], repo.root, env, proxy)
        else:
            half = results["full"]["up"] // 2
            results["killed"] = run(["push", url], repo.root, env, proxy, kill_at=half)
            if not journal:
                shutil.rmtree(repo.dir / "transfers", ignore_errors=True)
            results["rerun"] = run(["push", url], repo.root, env, proxy)
        server.delete_bucket(bucket, max_pages=10_000)
    return results


def clone_case(repo: Repo, server: S3Server, proxy: FaultProxy, env: dict[str, str], journal: bool) -> dict:
    bucket = server.new_bucket()
    url = f"s3://{bucket}/models"
    sync.init_bare(url)
    run(["push", url], repo.root, env, proxy)
    results: dict[str, Any] = {}
    target = WORK / "clone"
    shutil.rmtree(target, ignore_errors=True)
    results["full"] = run(["clone", url, str(target)], WORK, env, proxy)
    shutil.rmtree(target)
    results["killed"] = run(["clone", url, str(target)], WORK, env, proxy, kill_at=results["full"]["down"] // 2)
    if not journal:
        shutil.rmtree(target / ".mgit" / "transfers", ignore_errors=True)
    results["rerun"] = run(["clone", url, str(target)], WORK, env, proxy)
    shutil.rmtree(target)
    server.delete_bucket(bucket, max_pages=10_000)
    return results


def report(rows: list[tuple[str, str, int, dict]], stored: int) -> str:
    lines = [
        BEGIN,
        "## Resuming a killed push or clone (`benchmarks/resume.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}. One run each. The model: the 1.08 GB "
        f"LLM-shaped bf16 base of `llm_family.py` ({stored / MB:,.0f} MB stored, its two 131 MB "
        "tensors (embedding, head) go in multipart uploads). moto's S3 server on 127.0.0.1, every "
        "request through the test proxy, which counts the bytes crossing it (heads included); "
        "`mgit` runs as a subprocess, SIGKILLed once half of a full run's bytes have crossed. "
        "Part size: S3's (MGIT_S3_PART_SIZE; objects from twice it go in parts and come down in "
        "ranges): by default 16 MiB, so only the two 131 MB tensors go in parts; at 8 MiB the 23 MB "
        "MLP matrices too.",
        "",
        "| run | part size | full run | killed at | re-run | re-run / full (time) | bytes of the re-run "
        "| re-run / full (bytes) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for what, journal, part_size, r in rows:
        key = "up" if what == "push" else "down"
        full, killed, rerun = r["full"], r["killed"], r["rerun"]
        lines.append(
            f"| {what}, {journal} | {part_size >> 20 or 16} MiB | {full['s']:.1f} s, {full[key] / MB:,.0f} MB "
            f"| {killed['s']:.1f} s, "
            f"{killed[key] / MB:,.0f} MB | {rerun['s']:.1f} s | {rerun['s'] / full['s']:.2f} | "
            f"{rerun[key] / MB:,.0f} MB | {rerun[key] / full[key]:.2f} |"
        )
    lines += [
        "",
        '"journal kept" is MGit as it runs; "journal removed" deletes `.mgit/transfers/` before '
        "the re-run, so that only whole objects count as done: the difference is what the journal "
        "saves of the large objects in flight at the kill (their parts sent, their ranges fetched). "
        "A killed clone's whole objects are taken up from its quarantine either way.",
        END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    parser.add_argument("--part-size", type=int, action="append", help="MGIT_S3_PART_SIZE (0: default); repeatable")
    parser.add_argument("--skip-clone", action="store_true")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    repo = base_repo()
    stored = sum(repo.store.stored_size(o) for o in repo.store.ids())
    server = S3Server()
    rows = []
    try:
        with FaultProxy(server.endpoint) as proxy:
            env = {**os.environ, **aws_env(server.endpoint), "AWS_ENDPOINT_URL": proxy.endpoint}
            env["AWS_ENDPOINT_URL_S3"] = proxy.endpoint
            env["PYTHONPATH"] = str(ROOT / "src")
            os.environ.update(aws_env(server.endpoint))  # (in-process: init --bare, straight to moto)
            for part in args.part_size or [0]:
                env.pop("MGIT_S3_PART_SIZE", None)
                if part:
                    env["MGIT_S3_PART_SIZE"] = str(part)
                for journal in (True, False):
                    label = "journal kept" if journal else "journal removed"
                    rows.append(("push", label, part, push_case(repo, server, proxy, env, journal)))
                    print(rows[-1], flush=True)
                    if not args.skip_clone:
                        rows.append(("clone", label, part, clone_case(repo, server, proxy, env, journal)))
                        print(rows[-1], flush=True)
    finally:
        server.stop()
    text = report(rows, stored)
    print(text)
    if not args.no_doc:
        write_doc(text, BEGIN, END)


if __name__ == "__main__":
    main()
