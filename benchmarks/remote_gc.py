"""Remote gc benchmark: what leases cost a push, what a gc of a remote costs, and what a
push pays once a gc has run there (it then asks about what its known versions need).

    python benchmarks/remote_gc.py               # writes docs/benchmarks.md (remote gc section)
    python benchmarks/remote_gc.py --no-doc --models 20

Data: a generated family (`--models` bases of 4 float32 tensors of 256 x 256, each with a
fine-tune: deltas against it), added once to a repository under .cache/bench/remote-gc/. The
remote is a bucket of moto's S3 server on 127.0.0.1 (tests/s3server.py). Requests are counted
on the S3 client's events (every request a boto3 call makes, retries included).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
from core import machine, write_doc  # noqa: E402
from s3server import S3Server, aws_env  # noqa: E402

from mgit import Repo, sync  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "remote-gc"
BEGIN, END = "<!-- remote-gc:begin -->", "<!-- remote-gc:end -->"


class Requests:
    """Counts the S3 requests every S3Backend makes, by operation."""

    def __init__(self) -> None:
        from mgit.remotes.s3 import S3Backend

        self.calls: Counter[str] = Counter()
        original = S3Backend._connect

        def connect(backend: Any, *args: Any, **kwargs: Any) -> Any:
            client = original(backend, *args, **kwargs)
            client.meta.events.register("before-send.s3", self._count)
            return client

        S3Backend._connect = connect  # type: ignore[method-assign]

    def _count(self, request: Any, **kwargs: Any) -> None:
        path = str(getattr(request, "url", "")).split("?")[0]
        self.calls["gc" if "/leases/" in path or "/gc/" in path else "other"] += 1

    def take(self) -> tuple[int, int]:
        """(every request since the last take, those to leases/ and gc/)."""
        counts = (sum(self.calls.values()), self.calls["gc"])
        self.calls.clear()
        return counts


def family(models: int) -> Repo:
    path = WORK / f"repo-{models}"
    if (path / ".built").exists():
        return Repo(path)
    shutil.rmtree(path, ignore_errors=True)
    repo = Repo.init(path)
    rng = np.random.default_rng(0)
    for i in range(models):
        base = {f"layer.{j}.weight": rng.standard_normal((256, 256)).astype(np.float32) for j in range(4)}
        repo.add(base, name=f"base-{i}")
        tuned = {k: v + rng.standard_normal(v.shape).astype(np.float32) * np.float32(1e-3) for k, v in base.items()}
        repo.add(tuned, name=f"ft-{i}", parent=f"base-{i}")
    (path / ".built").write_text("ok\n")
    return repo


def clone_of(url: str, name: str) -> Repo:
    path = WORK / name
    shutil.rmtree(path, ignore_errors=True)
    sync.clone(url, path)
    return Repo(path)


def timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def measure(models: int) -> dict[str, Any]:
    load_before = Path("/proc/loadavg").read_text().split()[0]
    repo = family(models)
    server = S3Server()
    os.environ.update(aws_env(server.endpoint))
    counter = Requests()
    out: dict[str, Any] = {"models": models, "versions": 2 * models, "objects": len(list(repo.store.ids()))}
    try:
        url = f"s3://{server.new_bucket()}/models"
        sync.init_bare(url)
        for name in list(sync.list_remotes(repo)):
            sync.remove_remote(repo, name.name)
        sync.add_remote(repo, "origin", url)
        counter.take()
        out["push_s"], _ = timed(lambda: sync.push(repo))
        out["push_requests"], out["push_lease_requests"] = counter.take()
        tip = clone_of(url, "bob")
        tip.add({"layer.0.weight": np.ones((256, 256), np.float32)}, name="ft-0", message="next")
        counter.take()
        out["incremental_s"], _ = timed(lambda: sync.push(tip))
        out["incremental_requests"], out["incremental_lease_requests"] = counter.take()
        out["dry_s"], dry = timed(lambda: sync.gc_remote(repo, expire=0.0, dry_run=True))
        out["dry_requests"], out["dry_lease_requests"] = counter.take()
        doomed = [f"base-{i}" for i in range(models // 2)] + [f"ft-{i}" for i in range(models // 2)]
        sync.fetch(repo)
        sync.delete_remote_models(repo, "origin", doomed)
        counter.take()
        out["gc_s"], gc = timed(lambda: sync.gc_remote(repo, expire=0.0))
        out["gc_requests"], out["gc_lease_requests"] = counter.take()
        out["gc_removed"], out["gc_bytes"], out["gc_kept"] = len(gc.removed), gc.removed_bytes, gc.kept
        out["dry_removed"] = len(dry.removed)
        tip2 = clone_of(url, "carol")
        last = f"ft-{models - 1}"
        tip2.add({"layer.0.weight": np.full((256, 256), 2, np.float32)}, name=last, message="after gc")
        counter.take()
        out["after_gc_s"], _ = timed(lambda: sync.push(tip2))
        out["after_gc_requests"], out["after_gc_lease_requests"] = counter.take()
        out["fsck_ok"] = sync.fsck_remote(url).ok
        out["load"] = (load_before, Path("/proc/loadavg").read_text().split()[0])
    finally:
        server.stop()
    return out


def table(r: dict[str, Any]) -> str:
    mb = r["gc_bytes"] / 1e6
    steps = [
        ("push", "first push of the family"),
        ("incremental", "push of one new version, from a clone, no gc ever run"),
        ("dry", f"`gc --remote --dry-run --expire now`, nothing to remove ({r['dry_removed']} found)"),
        (
            "gc",
            f"`gc --remote --expire now` after half the models were deleted: {r['gc_removed']:,} objects, "
            f"{mb:.1f} MB removed, {r['gc_kept']:,} kept",
        ),
        ("after_gc", "push of one new version from a clone after that gc (it asks about what its base needs)"),
    ]
    rows = [
        f"| {what} | {r[key + '_s']:.2f} s | {r[key + '_requests']:,} | {r[key + '_lease_requests']} |"
        for key, what in steps
    ]
    head = "| step | time | S3 requests | of which to leases/ and gc/ |\n| --- | ---: | ---: | ---: |\n"
    return head + "\n".join(rows)


def render(r: dict[str, Any]) -> str:
    return f"""{BEGIN}
## Remote gc (`benchmarks/remote_gc.py`, issue 25)

Measured {time.strftime("%Y-%m-%d")} on {machine()}. One-minute load average {r["load"][0]}
before the run and {r["load"][1]} at its end (a machine shared with other work: the times are
pessimistic; the request counts do not depend on it).

Reproduce: `.venv/bin/python benchmarks/remote_gc.py`. A generated family of {r["models"]} bases
(4 float32 tensors of 256 x 256 each) and a fine-tune of each ({r["versions"]} versions,
{r["objects"]} objects), pushed to a bucket of moto's S3 server on loopback; requests counted
on the S3 client. Times are one run each, wall clock.

{table(r)}

The remote passed `mgit fsck URL` after the last push: {r["fsck_ok"]}. A gc downloads every
reachable tensor once to read its header (its delta bases): its requests and bytes grow with
what the remote keeps, not with what it removes.
{END}"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=50)
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    section = render(measure(args.models))
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
