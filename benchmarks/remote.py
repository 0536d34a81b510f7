"""Remote benchmark: push and clone throughput to a folder remote and to an S3 server, what a
fine-tune costs to send after its base, a lazy clone of a thousand models, and what a lazy
checkout fetches.

    python benchmarks/remote.py                 # everything; writes docs/benchmarks.md (remote section)
    python benchmarks/remote.py --runs 1 --no-doc --skip-lazy

Data: the MiniLM family of `minilm_family.py` (full preset, cached under .cache/family-full/)
and the generated LLM-shaped bf16 base and fine-tune of `llm_family.py` (1.08 GB each),
each added to a repository once (cached under .cache/bench/remote/). The S3 server is
moto's server process on 127.0.0.1 (tests/s3server.py), reached over HTTP as a bucket is.
Baselines in the same run: `cp -r` of the repository's .mgit folder, and the S3 client's own
parallel upload (boto3/s3transfer, the settings MGit uses) of the same object files.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

import llm_family  # noqa: E402
from core import machine, write_doc  # noqa: E402
from s3server import S3Server, aws_env  # noqa: E402

from mgit import Repo, sync  # noqa: E402
from mgit.index.refs import RefStore  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
WORK = CACHE / "remote"
BEGIN, END = "<!-- remote:begin -->", "<!-- remote:end -->"
MB = 1e6
TARGETS = {"folder": 300.0, "s3_ratio": 1.5, "lazy_clone_s": 10.0}


def median_time(runs: int, prepare: Callable[[], Any], action: Callable[[Any], Any]) -> tuple[float, Any]:
    times, last = [], None
    for _ in range(runs):
        state = prepare()
        started = time.perf_counter()
        last = action(state)
        times.append(time.perf_counter() - started)
    return statistics.median(times), last


def fresh(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    return path


def stored_bytes(repo: Repo) -> int:
    return sum(repo.store.stored_size(o) for o in repo.store.ids())


def minilm_repo() -> Repo:
    from minilm_family import build_family

    path = WORK / "minilm"
    if (path / ".built").exists():
        return Repo(path)
    members = build_family(CACHE.parent / "family-full", preset="full", progress=lambda _: None)
    repo = Repo.init(fresh(path))
    for m in members:
        repo.add(
            m.path,
            name=m.version_of or m.name,
            parent=list(m.parents) or None,
            relation=None if m.relation == "base" else m.relation,
        )
    (path / ".built").write_text("ok\n")
    return repo


def llm_repo() -> Repo:
    path = WORK / "llm"
    if (path / ".built").exists():
        return Repo(path)
    base, ft = llm_family.build()
    repo = Repo.init(fresh(path))
    repo.add(base, name="llm-base")
    repo.add(ft, name="llm-ft", parent="llm-base")
    (path / ".built").write_text("ok\n")
    return repo


class S3:
    """moto's server and a bucket per measurement (the previous one deleted: moto keeps
    objects in memory), with the AWS_* variables set here."""

    def __init__(self) -> None:
        self.server = S3Server()
        os.environ.update(aws_env(self.server.endpoint))
        self.last: str | None = None

    def bucket(self) -> str:
        if self.last is not None:
            self.server.delete_bucket(self.last, max_pages=10_000)
        self.last = self.server.new_bucket()
        return self.last

    def url(self) -> str:
        return f"s3://{self.bucket()}/models"

    def client_upload(self, files: list[tuple[str, Path]], bucket: str) -> None:
        from mgit.remotes.s3 import transfer_config

        client = self.server.client()
        config = transfer_config(max_workers=16)
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda kp: client.upload_file(str(kp[1]), bucket, kp[0], Config=config), files))

    def stop(self) -> None:
        self.server.stop()


def throughput(repo: Repo, runs: int, s3: S3 | None) -> dict[str, Any]:
    """Push and clone, folder and S3, beside cp -r and the client's upload."""
    stored, logical = stored_bytes(repo), repo.du().logical_bytes
    out: dict[str, Any] = {"stored": stored, "logical": logical}
    out["cp"], _ = median_time(runs, lambda: fresh(WORK / "cp"), lambda dst: shutil.copytree(repo.dir, dst))
    subprocess.run(["sync"], check=False)
    out["cp_cmd"], _ = median_time(
        runs, lambda: fresh(WORK / "cpr"), lambda dst: subprocess.run(["cp", "-r", str(repo.dir), str(dst)], check=True)
    )

    def remote_folder() -> str:
        url = str(fresh(WORK / "remote.mgit"))
        sync.init_bare(url)
        _set_url(repo, "bench", url)
        return url

    out["folder_push"], _ = median_time(runs, remote_folder, lambda url: sync.push(repo, "bench"))
    out["folder_clone"], _ = median_time(
        runs, lambda: fresh(WORK / "clone"), lambda dst: sync.clone(str(WORK / "remote.mgit"), dst)
    )
    if s3 is not None:

        def remote_s3() -> str:
            url = s3.url()
            sync.init_bare(url)
            _set_url(repo, "bench", url)
            return url

        out["s3_push"], url = median_time(runs, remote_s3, lambda url: (sync.push(repo, "bench"), url)[1])
        out["s3_clone"], _ = median_time(runs, lambda: fresh(WORK / "clone"), lambda dst: sync.clone(url, dst))
        files = [(f"models/objects/{o[:2]}/{o[2:]}", repo.store.path_of(o)) for o in repo.store.ids()]
        out["s3_client"], _ = median_time(runs, s3.bucket, lambda b: s3.client_upload(files, b))
    return out


def _set_url(repo: Repo, name: str, url: str) -> None:
    from mgit.remotes.config import update_config

    repo.config = update_config(repo.dir, lambda c: c.setdefault("remotes", {}).__setitem__(name, {"url": url}))
    tracking = RefStore(repo.dir, namespace=f"remotes/{name}")  # a new remote: nothing known of it
    for model, head in tracking.all().items():
        tracking.update(model, None, expected=head)
    (repo.dir / "remotes" / name / "packs.json").unlink(missing_ok=True)


def fine_tune_cost(repo: Repo, base: str, ft: str) -> dict[str, int]:
    """Bytes a push of `ft` sends to a remote that has `base`, against ft's stored size."""
    url = str(fresh(WORK / "remote-ft.mgit"))
    sync.init_bare(url)
    _set_url(repo, "bench", url)
    sync.push(repo, "bench", [base])
    first = f"{ft}@1"  # its first version: one version's worth
    sent = sync.push(repo, "bench", [first]).sent
    return {
        "sent": sent.bytes,
        "objects": sent.objects,
        "ft_new": repo.info(first).new_bytes,
        "ft_logical": repo.info(first).logical_bytes,
    }


def lazy_checkout(repo: Repo, ft: str) -> dict[str, int]:
    """What a lazy clone fetches to check out `ft`, against what ft and its bases need."""
    url = str(WORK / "remote.mgit")
    lazy = Repo(sync.clone(url, fresh(WORK / "lazy"), lazy=True).path)
    before = set(lazy.store.ids())
    lazy.checkout(ft, fresh(WORK / "lazy-out"))
    fetched = set(lazy.store.ids()) - before
    needed = set(repo.manifest(ft).object_ids())
    stack = list(needed)
    while stack:
        for b in repo.store.header(stack.pop()).bases:
            if b not in needed:
                needed.add(b)
                stack.append(b)
    need = needed - before
    return {
        "fetched": len(fetched),
        "fetched_bytes": sum(lazy.store.stored_size(o) for o in fetched),
        "needed": len(need),
        "needed_bytes": sum(repo.store.stored_size(o) for o in need),
        "extra": len(fetched - need),
    }


def lazy_scale(s3: S3 | None, runs: int) -> dict[str, Any]:
    """A lazy clone of the 1,000-model x 5-version repository of lineage_scale.py."""
    from lineage_scale import FORMAT, build

    path = CACHE / f"lineage-1000x5-s4-f{FORMAT}"
    if not (path / ".built").exists():
        (path / ".built").write_text(f"{build(path, 1000, 5, 4):.1f}\n")
    repo = Repo(path)
    out: dict[str, Any] = {"versions": len(repo.catalog.graph_rows()[0]), "models": len(repo.refs.all())}
    remotes = [("folder", str(fresh(WORK / "scale.mgit")))] + ([("s3", s3.url())] if s3 else [])
    for kind, url in remotes:
        sync.init_bare(url)
        _set_url(repo, "bench", url)
        started = time.perf_counter()
        sync.push(repo, "bench")
        out[f"{kind}_push"] = time.perf_counter() - started
        seconds, result = median_time(
            runs, lambda: fresh(WORK / "scale-lazy"), lambda dst, url=url: sync.clone(url, dst, lazy=True)
        )
        out[f"{kind}_lazy"], out[f"{kind}_lazy_bytes"] = seconds, result.fetch.received.bytes
        lazy = Repo(WORK / "scale-lazy")
        started = time.perf_counter()
        lazy.ls()
        out[f"{kind}_ls"] = time.perf_counter() - started
    return out


def rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / MB / seconds:,.0f} MB/s" if seconds else "-"


def report(results: dict[str, Any], runs: int) -> str:
    lines = [
        BEGIN,
        "## Remotes: push, clone, lazy clone (`benchmarks/remote.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, load {os.getloadavg()[0]:.1f}, commit "
        f"{_commit()}; median of {runs} runs. Stored bytes are what travels (objects as stored); "
        "logical bytes what the versions hold as plain files. Folder remote on the same disk; S3 is "
        "moto's server process on 127.0.0.1 (Python, in-memory), so S3 figures measure MGit against "
        "the same client's plain upload to the same server, not AWS.",
        "",
    ]
    lines += [
        "| data | stored | logical | cp -r .mgit | folder push | folder clone "
        "| S3 client upload | S3 push (vs client) | S3 clone |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in results["throughput"].items():
        s3 = (
            ("-", "-", "-")
            if "s3_push" not in r
            else (
                rate(r["stored"], r["s3_client"]),
                f"{rate(r['stored'], r['s3_push'])} ({r['s3_push'] / r['s3_client']:.2f}x)",
                rate(r["stored"], r["s3_clone"]),
            )
        )
        lines.append(
            f"| {label} | {r['stored'] / MB:,.0f} MB | {r['logical'] / MB:,.0f} MB | {rate(r['stored'], r['cp_cmd'])} "
            f"| {rate(r['stored'], r['folder_push'])} ({rate(r['logical'], r['folder_push'])} logical) "
            f"| {rate(r['stored'], r['folder_clone'])} ({rate(r['logical'], r['folder_clone'])} logical) "
            f"| {s3[0]} | {s3[1]} | {s3[2]} |"
        )
    lines += [
        "",
        "| a fine-tune pushed after its base | bytes sent | its stored size (new bytes) | its logical size |",
        "| --- | --- | --- | --- |",
    ]
    for label, r in results["fine_tune"].items():
        lines.append(
            f"| {label} | {r['sent'] / MB:,.2f} MB ({r['objects']} objects) | {r['ft_new'] / MB:,.2f} MB "
            f"| {r['ft_logical'] / MB:,.0f} MB |"
        )
    lines += [
        "",
        "| lazy checkout of a fine-tune | objects fetched | bytes fetched "
        "| needed (objects, bytes) | fetched but not needed |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, r in results["lazy_checkout"].items():
        lines.append(
            f"| {label} | {r['fetched']} | {r['fetched_bytes'] / MB:,.2f} MB | {r['needed']}, "
            f"{r['needed_bytes'] / MB:,.2f} MB | {r['extra']} |"
        )
    if "lazy_scale" in results:
        r = results["lazy_scale"]
        lines += [
            "",
            f"Lazy clone of {r['models']:,} models x 5 ({r['versions']:,} versions) "
            f"(target < {TARGETS['lazy_clone_s']:.0f} s):",
            "",
            "| remote | first push | lazy clone | received | `ls` in the clone |",
            "| --- | --- | --- | --- | --- |",
        ]
        for kind in ("folder", "s3"):
            if f"{kind}_lazy" in r:
                lines.append(
                    f"| {kind} | {r[f'{kind}_push']:.1f} s | {r[f'{kind}_lazy']:.2f} s | "
                    f"{r[f'{kind}_lazy_bytes'] / MB:,.1f} MB | {r[f'{kind}_ls'] * 1000:.0f} ms |"
                )
    lines += ["", END]
    return "\n".join(lines)


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "src"], capture_output=True, text=True)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    parser.add_argument("--skip-s3", action="store_true")
    parser.add_argument("--skip-lazy", action="store_true", help="skip the 1,000-model lazy clone")
    parser.add_argument("--only", choices=["minilm", "llm"], help="one data set")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    s3 = None if args.skip_s3 else S3()
    results: dict[str, Any] = {"throughput": {}, "fine_tune": {}, "lazy_checkout": {}}
    try:
        sets = {"minilm": (minilm_repo, "minilm-base", "minilm-sentiment"), "llm": (llm_repo, "llm-base", "llm-ft")}
        for label, (make, base, ft) in sets.items():
            if args.only and label != args.only:
                continue
            repo = make()
            print(
                f"{label}: {len(list(repo.store.ids()))} objects, {stored_bytes(repo) / MB:,.0f} MB stored", flush=True
            )
            results["throughput"][label] = throughput(repo, args.runs, s3)
            print(results["throughput"][label], flush=True)
            results["lazy_checkout"][label] = lazy_checkout(repo, ft)
            results["fine_tune"][label] = fine_tune_cost(repo, base, ft)
            print(results["fine_tune"][label], results["lazy_checkout"][label], flush=True)
        if not args.skip_lazy:
            results["lazy_scale"] = lazy_scale(s3, args.runs)
            print(results["lazy_scale"], flush=True)
    finally:
        if s3 is not None:
            s3.stop()
    section = report(results, args.runs)
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
