"""S3 clients benchmark: the first push and the clone of the MiniLM family to an s3:// remote,
through the boto3 backend (remotes/s3.py, what s3:// uses) and through obstore
(remotes/objectstore.py, what az:// uses), in the same run against the same server.

    python benchmarks/s3_clients.py             # writes docs/benchmarks.md (s3-clients section)
    python benchmarks/s3_clients.py --runs 1 --no-doc --preset full

Data: the MiniLM family of `minilm_family.py` (the demo preset unless --preset full: the
full one fine-tunes for 1,300 steps first), added once to a repository cached under
.cache/bench/s3-clients/<preset>. The server is moto's S3
server process on 127.0.0.1 (tests/s3server.py), a fresh bucket per push. The clients take
turns run by run (boto3, obstore, boto3, ...) so that a drift of the machine's load weighs on
both; each figure is the median of the runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import machine, write_doc  # noqa: E402
from remote import CACHE, MB, S3, WORK, _commit, _set_url, fresh, stored_bytes  # noqa: E402

import mgit.remotes.s3 as s3_module  # noqa: E402
from mgit import Repo, sync  # noqa: E402
from mgit.remotes.objectstore import ObjectStoreBackend  # noqa: E402

BEGIN, END = "<!-- s3-clients:begin -->", "<!-- s3-clients:end -->"
BOTO3 = s3_module.S3Backend


def family_repo(preset: str) -> Repo:
    """The family of `preset`, added to a repository once (parents first)."""
    from minilm_family import build_family

    path = CACHE / "s3-clients" / preset
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


def obstore_backend(url: str, *, endpoint_url: str | None = None, region: str | None = None, **_: Any) -> Any:
    """What `open_backend` builds for s3:// while obstore is measured."""
    return ObjectStoreBackend.s3(url, endpoint_url=endpoint_url, region=region)


def use(client: str) -> None:
    """Make s3:// remotes go through `client` ("boto3" or "obstore") from here on."""
    s3_module.S3Backend = BOTO3 if client == "boto3" else obstore_backend  # type: ignore[assignment,misc]


def one_run(repo: Repo, s3: S3, client: str) -> tuple[float, float]:
    """(seconds to push the family to a fresh prefix, seconds to clone it back)."""
    use(client)
    url = s3.url()
    sync.init_bare(url)
    _set_url(repo, "bench", url)
    started = time.perf_counter()
    sync.push(repo, "bench")
    pushed = time.perf_counter() - started
    dst = fresh(WORK / f"clone-{client}")
    started = time.perf_counter()
    sync.clone(url, dst)
    cloned = time.perf_counter() - started
    assert Repo(dst).refs.all() == repo.refs.all()
    return pushed, cloned


def report(preset: str, stored: int, logical: int, times: dict[str, dict[str, list[float]]], runs: int) -> str:
    lines = [
        BEGIN,
        "## S3 through boto3 or obstore (`benchmarks/s3_clients.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, load {os.getloadavg()[0]:.1f}, commit "
        f"{_commit()}; median of {runs} runs, the two clients taking turns. The MiniLM family, {preset} "
        f"preset ({stored / MB:,.0f} MB stored, {logical / MB:,.0f} MB logical): its first push to an empty "
        "prefix and a clone of it, to moto's S3 server process on 127.0.0.1 (Python, in-memory: "
        "the server bounds both clients alike, so these figures compare clients, not AWS).",
        "",
        "| client | first push | clone | push, runs (s) | clone, runs (s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for client, t in times.items():
        push, clone = statistics.median(t["push"]), statistics.median(t["clone"])
        lines.append(
            f"| {client} | {push:.2f} s ({stored / MB / push:,.0f} MB/s) | {clone:.2f} s "
            f"({stored / MB / clone:,.0f} MB/s) | {', '.join(f'{x:.2f}' for x in t['push'])} "
            f"| {', '.join(f'{x:.2f}' for x in t['clone'])} |"
        )
    b, o = times["boto3"], times["obstore"]
    ratio_push = statistics.median(b["push"]) / statistics.median(o["push"])
    ratio_clone = statistics.median(b["clone"]) / statistics.median(o["clone"])
    lines += [
        "",
        f"obstore / boto3 speed: push {ratio_push:.2f}x, clone {ratio_clone:.2f}x (above 1: obstore faster).",
        "",
        END,
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    parser.add_argument("--preset", choices=["demo", "full"], default="demo")
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    repo = family_repo(args.preset)
    stored, logical = stored_bytes(repo), repo.du().logical_bytes
    print(f"minilm: {len(list(repo.store.ids()))} objects, {stored / MB:,.0f} MB stored", flush=True)
    s3 = S3()
    times: dict[str, dict[str, list[float]]] = {c: {"push": [], "clone": []} for c in ("boto3", "obstore")}
    try:
        for run in range(args.runs):
            for client in ("boto3", "obstore") if run % 2 == 0 else ("obstore", "boto3"):
                pushed, cloned = one_run(repo, s3, client)
                times[client]["push"].append(pushed)
                times[client]["clone"].append(cloned)
                print(f"run {run + 1} {client}: push {pushed:.2f} s, clone {cloned:.2f} s", flush=True)
    finally:
        use("boto3")
        s3.stop()
    section = report(args.preset, stored, logical, times, args.runs)
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
