"""`mgit verify --lineage` on one signed chain: what verifying costs per version, and how much
work it repeats (a small, quick companion of signing.py, which needs the 5,000-version repository).

    python benchmarks/verify_chain.py                 # 150 versions, 7 runs; writes its section
    python benchmarks/verify_chain.py --versions 50 --runs 3 --no-doc

A repository in a temporary folder: one model with N versions (4x4 tensors), each signed
with an ed25519 key (signing.always) that its allowed-signers file trusts. Measured:

- in-process, `repo.verify(model, lineage=True)` on a fresh Repo: median (min-max) of the
  runs, and in the last run how many records were read and hashed (`get_record`) and how
  many SSH public keys were parsed into cryptography's form;
- `Repo.log(..)` then the signatures of every version as `log --show-signature` judges them:
  how many times the allowed-signers file was read;
- fresh processes, as a user runs them: `mgit verify m --lineage` beside `mgit log m`.

The mgit measured is the one on PYTHONPATH (run it with the src of two checkouts to compare).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from core import machine, write_doc  # noqa: E402

BEGIN, END = "<!-- verify-chain:begin -->", "<!-- verify-chain:end -->"


def build(root: Path, versions: int) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    from mgit import Repo

    Repo.init(root)
    key = ed25519.Ed25519PrivateKey.generate()
    private = serialization.PrivateFormat.OpenSSH
    (root / "id").write_bytes(key.private_bytes(serialization.Encoding.PEM, private, serialization.NoEncryption()))
    public = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    (root / "allowed").write_text(f"alice@example.com {public.decode()}\n")
    config = root / ".mgit" / "config.json"
    settings = {
        "signing.key": str(root / "id"),
        "verify.allowed-signers": str(root / "allowed"),
        "signing.always": True,
    }
    config.write_text(json.dumps({**json.loads(config.read_text()), "settings": settings}))
    repo, rng = Repo(root), np.random.default_rng(0)
    for i in range(versions):
        repo.add({"w": rng.standard_normal((4, 4)).astype(np.float32), "b": np.full(4, i, np.float32)}, name="m")


class Counter:
    """Counts the calls of `owner.name` (a function, a method or a classmethod) for the time
    of a `with`."""

    def __init__(self, owner: object, name: str) -> None:
        self.owner, self.name, self.calls = owner, name, 0

    def __enter__(self) -> Counter:
        self.saved = inspect.getattr_static(self.owner, self.name)
        real = getattr(self.owner, self.name)

        def counting(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return real(*args, **kwargs)

        setattr(self.owner, self.name, counting)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(self.owner, self.name, self.saved)


def in_process(root: Path, runs: int) -> dict[str, object]:
    import cryptography.hazmat.primitives.serialization as serialization

    from mgit import Repo
    from mgit.signing.allowed import AllowedSigners
    from mgit.store.base import ObjectStore

    times = []
    for _ in range(runs):
        repo = Repo(root)
        started = time.perf_counter()
        result = repo.verify("m", lineage=True)
        times.append(time.perf_counter() - started)
    assert result.ok and len(result.versions) == len(repo.log("m"))
    repo = Repo(root)
    with Counter(ObjectStore, "get_record") as records, Counter(serialization, "load_ssh_public_key") as keys:
        repo.verify("m", lineage=True)
    try:
        from mgit.signing.policy import signature_checks
    except ImportError:  # an mgit from before the signing policy held it
        from mgit.repo.signatures import signature_checks

    ids = [v.id for v in Repo(root).log("m")]
    with Counter(AllowedSigners, "load") as loads:
        try:
            checks = list(signature_checks(repo.signatures, repo.config, ids).values())
        except (TypeError, ValueError):  # an mgit from before it judged many versions at once
            checks = [signature_checks(repo.signatures, repo.config, v) for v in ids]
    assert all(c and c[0].trusted for c in checks)
    return {
        "versions": len(result.versions),
        "median": statistics.median(times),
        "min": min(times),
        "max": max(times),
        "records": records.calls,
        "keys": keys.calls,
        "loads": loads.calls,
    }


def cli(root: Path, runs: int) -> tuple[list[float], list[float]]:
    env = {**os.environ, "NO_COLOR": "1"}
    verify, log = [], []
    for _ in range(runs):  # alternating, so a change of the machine's load falls on both
        for args, into in ((["verify", "m", "--lineage"], verify), (["log", "m"], log)):
            started = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "mgit.cli.main", *args], cwd=root, env=env, check=True, capture_output=True
            )
            into.append(time.perf_counter() - started)
    return verify, log


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=150)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--no-doc", action="store_true", help="print the results, leave docs/ alone")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mgit-verify-chain-") as tmp:
        root = Path(tmp) / "chain"
        build(root, args.versions)
        found = in_process(root, args.runs)
        verify, log = cli(root, args.runs)
    n = found["versions"]
    section = "\n".join(
        [
            BEGIN,
            "## Verifying a signed chain (`benchmarks/verify_chain.py`)",
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, load {os.getloadavg()[0]:.1f}; "
            f"median of {args.runs} runs (min-max). One model of {n} versions, each signed (ed25519) by a key "
            "its allowed-signers file trusts.",
            "",
            "| what | figure |",
            "| --- | --- |",
            f"| `repo.verify(m, lineage=True)`, in-process ({n} versions) | {found['median'] * 1000:.0f} ms "
            f"({found['min'] * 1000:.0f}-{found['max'] * 1000:.0f}) |",
            f"| records read and hashed by it | {found['records']} ({found['records'] / n:.0f} per version) |",
            f"| SSH public keys parsed by it | {found['keys']} |",
            f"| allowed-signers files read to judge {n} versions' signatures (log --show-signature) | "
            f"{found['loads']} |",
            f"| `mgit verify m --lineage`, a fresh process | {spread(verify)} |",
            f"| `mgit log m`, a fresh process | {spread(log)} |",
            END,
        ]
    )
    print(section)
    if not args.no_doc:
        write_doc(section + "\n", BEGIN, END)


if __name__ == "__main__":
    main()
