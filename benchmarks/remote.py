"""Remote benchmark: push and clone throughput to a folder remote and to an S3 server, what a
fine-tune costs to send after its base, a lazy clone of a thousand models, and what a lazy
checkout fetches.

    python benchmarks/remote.py                 # everything; writes docs/benchmarks.md (remote section)
    python benchmarks/remote.py --runs 1 --no-doc --skip-lazy
    python benchmarks/remote.py --latency-only --preset demo   # only the section at 20 and 50 ms a request
    python benchmarks/remote.py --scale-only --latencies 20,50   # only 1,000 x 5's no-op push and lazy clone

Data: the MiniLM family of `minilm_family.py` (full preset, cached under .cache/family-full/)
and the generated LLM-shaped bf16 base and fine-tune of `llm_family.py` (1.08 GB each),
each added to a repository once (cached under .cache/bench/remote/). The S3 server is
moto's server process on 127.0.0.1 (tests/s3server.py), reached over HTTP as a bucket is.
Baselines in the same run: `cp -r` of the repository's .mgit folder, and the S3 client's own
parallel upload (boto3/s3transfer, the settings MGit uses) of the same object files.

At real latency: a proxy (tests/s3server.py's FaultProxy with `latency`) before the S3 server
delays every request by 20 ms, then 50 ms, and counts them; through it, the first push (with
data packs, a bucket's default, and without), a no-op push, a clone, a lazy clone and a lazy
checkout of a fine-tune, of the MiniLM family and of 1,000 models x 5, beside the plain client.
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
LATENCY_BEGIN, LATENCY_END = "<!-- remote-latency:begin -->", "<!-- remote-latency:end -->"
SCALE_BEGIN, SCALE_END = "<!-- remote-scale:begin -->", "<!-- remote-scale:end -->"
MB = 1e6
TARGETS = {"folder": 300.0, "s3_ratio": 1.5, "lazy_clone_s": 10.0}
LATENCIES = (0.020, 0.050)  # seconds a request costs a bucket over what it costs on loopback
LATENCY_TARGETS = {"push_vs_client": 10.0, "noop_push_s": 2.0, "lazy_clone_s": 2.0}  # at 20 ms
LATENCY_STEPS = {
    "push": "first push",
    "push_loose": "first push, no packs",
    "noop_push": "no-op push",
    "clone": "clone",
    "lazy_clone": "lazy clone",
    "lazy_checkout": "lazy checkout of a fine-tune",
    "client_upload": "plain client: upload",
    "client_download": "plain client: download",
    "client_refs": "plain client: GET of every ref",
    "client_heads": "plain client: a no-op push's requests",
}


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


def minilm_repo(preset: str = "full") -> Repo:
    from minilm_family import build_family

    path = WORK / ("minilm" if preset == "full" else f"minilm-{preset}")
    if (path / ".built").exists():
        return Repo(path)
    members = build_family(CACHE.parent / f"family-{preset}", preset=preset, progress=lambda _: None)
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
        self.server = S3Server(startup_timeout=180)
        os.environ.update(aws_env(self.server.endpoint))
        self.last: str | None = None

    def bucket(self) -> str:
        if self.last is not None:
            self.server.delete_bucket(self.last, max_pages=10_000)
        self.last = self.server.new_bucket()
        return self.last

    def url(self) -> str:
        return f"s3://{self.bucket()}/models"

    def client_upload(self, files: list[tuple[str, Path]], bucket: str, endpoint: str | None = None) -> None:
        self.each(lambda c, cfg, kp: c.upload_file(str(kp[1]), bucket, kp[0], Config=cfg), files, endpoint)

    def each(self, one: Callable[..., Any], files: list[tuple[str, Path]], endpoint: str | None) -> None:
        """`one(client, config, (key, path))` over the files, 16 at a time (MGit's WORKERS)."""
        from botocore.config import Config
        from s3server import s3_client

        from mgit.remotes.s3 import transfer_config

        client = s3_client(endpoint or self.server.endpoint, Config(max_pool_connections=32))
        config = transfer_config(max_workers=16)
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda kp: one(client, config, kp), files))

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


def at_latency(s3: S3, label: str, repo: Repo, ft: str, latency: float) -> dict[str, Any]:
    """Through a proxy adding `latency` to every request: each step's (seconds, requests by
    kind) for `repo` and its fine-tune `ft`."""
    from s3server import FaultProxy

    proxy = FaultProxy(s3.server.endpoint, latency=latency)
    saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
    os.environ.update(dict.fromkeys(saved, proxy.endpoint))
    try:
        return _latency_steps(s3, proxy, f"{latency * 1000:.0f} ms {label}", repo, ft)
    finally:
        proxy.stop()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _latency_steps(s3: S3, proxy: Any, label: str, repo: Repo, ft: str) -> dict[str, Any]:
    steps: dict[str, Any] = {}

    def step(name: str, action: Callable[[], Any]) -> None:
        start, started = len(proxy.seen), time.perf_counter()
        action()
        seconds = time.perf_counter() - started
        steps[name] = (seconds, proxy.kinds(start))
        print(f"  {label} {name}: {seconds:.2f} s, {steps[name][1]}", flush=True)

    url = s3.url()
    sync.init_bare(url)  # a bucket: data packs
    _set_url(repo, "bench", url)
    step("push", lambda: sync.push(repo, "bench"))
    step("noop_push", lambda: sync.push(repo, "bench"))
    step("clone", lambda: sync.clone(url, fresh(WORK / "lat-clone")))
    step("lazy_clone", lambda: sync.clone(url, fresh(WORK / "lat-lazy"), lazy=True))
    lazy = Repo(WORK / "lat-lazy")
    step("lazy_checkout", lambda: lazy.checkout(ft, fresh(WORK / "lat-out")))
    loose = s3.url()
    sync.init_bare(loose, packs=False)
    _set_url(repo, "bench", loose)
    step("push_loose", lambda: sync.push(repo, "bench"))
    bucket = loose.removeprefix("s3://").split("/")[0]
    files = [(f"plain/{o[:2]}/{o[2:]}", repo.store.path_of(o)) for o in repo.store.ids()]
    step("client_upload", lambda: s3.client_upload(files, bucket, proxy.endpoint))
    down = fresh(WORK / "lat-plain")
    down.mkdir()
    back = [(k, down / k.replace("/", "-")) for k, _ in files]
    down_one = lambda c, cfg, kp: c.download_file(bucket, kp[0], str(kp[1]), Config=cfg)  # noqa: E731
    step("client_download", lambda: s3.each(down_one, back, proxy.endpoint))
    steps["stored"] = stored_bytes(repo)
    steps["objects"] = len(files)
    return steps


def a_fine_tune(repo: Repo) -> str:
    """The first model (by name) whose head is a fine-tune of another."""
    for name, vid in sorted(repo.refs.all().items()):
        if any(p.relation == "finetune" for p in repo.store.get_version(vid).parents):
            return name
    raise SystemExit("no fine-tune in the repository")


def latency_report(
    results: dict[float, dict[str, Any]],
    markers: tuple[str, str] = (LATENCY_BEGIN, LATENCY_END),
    title: str = "Remotes at a bucket's latency (`benchmarks/remote.py --latency-only`)",
    runs: str = "one run",
) -> list[str]:
    t = LATENCY_TARGETS
    columns = [(ms, label, steps) for ms, by_data in results.items() for label, steps in by_data.items()]
    lines = [
        markers[0],
        f"## {title}",
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}, "
        f"load {os.getloadavg()[0]:.1f} at the end; "
        f"{runs}. Every request goes through a proxy that delays it by 20 or 50 ms "
        "before moto sees it (tests/s3server.py's FaultProxy; requests on separate connections wait in "
        "parallel, as on a network; MGit and the plain client both keep 16 in flight). Seconds, then "
        f"requests by kind. Targets at 20 ms: a first push of 1,000 x 5 under {t['push_vs_client']:.0f}x "
        f"the plain client's upload of the same object files; a no-op push and a lazy clone under "
        f"{t['noop_push_s']:.0f} s.",
        "",
        "| step | " + " | ".join(f"{label}, {ms * 1000:.0f} ms" for ms, label, _ in columns) + " |",
        "| --- | " + " | ".join("---" for _ in columns) + " |",
        "| data | "
        + " | ".join(f"{st['objects']:,} objects, {st['stored'] / MB:,.0f} MB" for *_, st in columns)
        + " |",
    ]
    for key, step in LATENCY_STEPS.items():
        if not any(key in steps for *_, steps in columns):
            continue
        cells = []
        for *_, steps in columns:
            seconds, kinds = steps.get(key, (None, {}))  # (a step a run did not reach: "-")
            detail = ", ".join(f"{k} {n:,}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
            cells.append("-" if seconds is None else f"{seconds:.2f} s; {sum(kinds.values()):,} ({detail})")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return [*lines, "", markers[1]]


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
    parser.add_argument("--preset", choices=["full", "demo"], default="full", help="the MiniLM family's preset")
    parser.add_argument("--latency-only", action="store_true", help="only the section at a bucket's latency")
    parser.add_argument("--latencies", default="20,50", help="milliseconds a request, comma-separated")
    parser.add_argument(
        "--scale-only", action="store_true", help="at latency, only 1,000 x 5's no-op push and lazy clone"
    )
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    if args.scale_only:
        scale_main(args)
        return
    if args.latency_only:
        latency_main(args)
        return
    s3 = None if args.skip_s3 else S3()
    results: dict[str, Any] = {"throughput": {}, "fine_tune": {}, "lazy_checkout": {}}
    try:
        sets = {
            "minilm": (lambda: minilm_repo(args.preset), "minilm-base", "minilm-sentiment"),
            "llm": (llm_repo, "llm-base", "llm-ft"),
        }
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


def latency_main(args: argparse.Namespace) -> None:
    """The MiniLM family, then 1,000 x 5, at each latency; the section between its own markers."""
    from lineage_scale import FORMAT, build

    def scale() -> tuple[Repo, str]:
        path = CACHE / f"lineage-1000x5-s4-f{FORMAT}"
        while path.exists() and not (path / ".built").exists():  # another run is building it
            time.sleep(5)
        if not (path / ".built").exists():
            (path / ".built").write_text(f"{build(path, 1000, 5, 4):.1f}\n")
        return Repo(path), a_fine_tune(Repo(path))

    datasets = {f"MiniLM family ({args.preset})": lambda: (minilm_repo(args.preset), "minilm-sentiment")}
    if not args.skip_lazy:
        datasets["1,000 models x 5"] = scale
    s3 = S3()
    results: dict[float, dict[str, Any]] = {}
    try:
        for label, make in datasets.items():
            repo, ft = make()
            for ms in (float(x) for x in args.latencies.split(",")):
                results.setdefault(ms / 1000, {})[label] = at_latency(s3, label, repo, ft, ms / 1000)
    finally:
        s3.stop()
    section = "\n".join(latency_report(results))
    print(section)
    if not args.no_doc:
        write_doc(section, LATENCY_BEGIN, LATENCY_END)


def scale_main(args: argparse.Namespace) -> None:
    """1,000 models x 5 pushed to moto directly, then through the proxy at each latency: a no-op
    push and a lazy clone (the requests they make, by kind), beside the plain client's GET of
    every ref (what reading the heads cost before the heads index) and its own run of a no-op
    push's requests (the floor). Each step but the lazy clone is the median of --runs."""
    from lineage_scale import FORMAT, build
    from s3server import FaultProxy

    path = CACHE / f"lineage-1000x5-s4-f{FORMAT}"
    if not (path / ".built").exists():
        (path / ".built").write_text(f"{build(path, 1000, 5, 4):.1f}\n")
    repo, label = Repo(path), "1,000 models x 5"
    s3 = S3()
    results: dict[float, dict[str, Any]] = {}
    try:
        url = s3.url()
        sync.init_bare(url)
        _set_url(repo, "bench", url)
        started = time.perf_counter()
        sync.push(repo, "bench")
        print(f"  first push, no proxy: {time.perf_counter() - started:.1f} s", flush=True)
        bucket = url.removeprefix("s3://").split("/")[0]
        refs = [(f"models/refs/models/{n}", WORK / "lat-refs" / n) for n in sorted(repo.refs.all())]
        for ms in (float(x) for x in args.latencies.split(",")):
            proxy = FaultProxy(s3.server.endpoint, latency=ms / 1000)
            saved = {k: os.environ.get(k) for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")}
            os.environ.update(dict.fromkeys(saved, proxy.endpoint))
            steps: dict[str, Any] = {"stored": stored_bytes(repo), "objects": len(list(repo.store.ids()))}
            try:
                for name, action in (
                    ("noop_push", lambda: sync.push(repo, "bench")),
                    ("lazy_clone", lambda: sync.clone(url, fresh(WORK / "lat-lazy"), lazy=True)),
                    ("client_refs", lambda p=proxy: _get_all(s3, bucket, refs, p.endpoint)),
                    ("client_heads", lambda p=proxy: _noop_requests(bucket, p.endpoint)),
                ):
                    times = []
                    for _ in range(1 if name == "lazy_clone" else args.runs):  # (quick ones: the median)
                        start, began = len(proxy.seen), time.perf_counter()
                        action()
                        times.append(time.perf_counter() - began)
                    steps[name] = (statistics.median(times), proxy.kinds(start))
                    print(f"  {ms:.0f} ms {name}: {times} s, {steps[name][1]}", flush=True)
            finally:
                proxy.stop()
                for k, v in saved.items():
                    os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
            results.setdefault(ms / 1000, {})[label] = steps
    finally:
        s3.stop()
    title = "Remotes at a bucket's latency, 1,000 models x 5 (`benchmarks/remote.py --scale-only`)"
    runs = f"each step the median of {args.runs} runs, the lazy clone one run"
    section = "\n".join(latency_report(results, (SCALE_BEGIN, SCALE_END), title, runs))
    print(section)
    if not args.no_doc:
        write_doc(section, SCALE_BEGIN, SCALE_END)


def _noop_requests(bucket: str, endpoint: str) -> None:
    """The requests of a no-op push with the heads index, by a new plain boto3 client: the floor
    under MGit's (HEAD of the bucket, GET config.json, LIST the refs, GET the index)."""
    from s3server import s3_client

    client = s3_client(endpoint)
    client.head_bucket(Bucket=bucket)
    client.get_object(Bucket=bucket, Key="models/config.json")["Body"].read()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="models/refs/models/"):
        list(page.get("Contents", ()))
    client.get_object(Bucket=bucket, Key="models/refs/heads.json")["Body"].read()


def _get_all(s3: S3, bucket: str, keys: list[tuple[str, Path]], endpoint: str) -> None:
    fresh(WORK / "lat-refs").mkdir(parents=True)
    s3.each(lambda c, cfg, kp: c.download_file(bucket, kp[0], str(kp[1]), Config=cfg), keys, endpoint)


if __name__ == "__main__":
    main()
