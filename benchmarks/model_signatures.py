"""The cost of OpenSSF model signatures on the MiniLM demo family: `checkout --model-signature`
beside a plain checkout, and `add` of a folder carrying `model.sig` (checked by model-signing's
verifier against `verify.allowed-signers`) beside the add of the same files unsigned.

    python benchmarks/model_signatures.py              # 5 runs; writes the model-signing section
    python benchmarks/model_signatures.py --runs 3 --no-doc

The family is `minilm_family.build_family(preset="demo")`, cached under `.cache/demo-family/`
(shared with storage.py and the demo). Each run, for every member in turn: a plain checkout and
a signed one, each into an empty folder; then the add of each checked-out folder into a fresh
repository, the plain folders into one and the signed ones into another, so that the two adds
write the same objects. The key is an ECDSA P-256 OpenSSH key made for the run. Times are
wall clock, summed over the family, median of the runs (min-max beside it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import machine, mb, table, write_doc  # noqa: E402
from minilm_family import build_family  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.repo.model_signature import verify_folder  # noqa: E402

FAMILY_DIR = ROOT / ".cache" / "demo-family"
BEGIN, END = "<!-- model_signatures:begin -->", "<!-- model_signatures:end -->"


def make_key(folder: Path) -> tuple[Path, Path]:
    """An ECDSA P-256 OpenSSH private key and an allowed-signers file that trusts it."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private = folder / "id_ecdsa"
    private.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    line = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    allowed = folder / "allowed_signers"
    allowed.write_text(f"bench@example.com {line.decode()}\n")
    return private, allowed


def configure(repo: Repo, **settings: str) -> Repo:
    """Settings in config.json, as `mgit config` keeps them."""
    path = repo.dir / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "settings": settings}))
    return Repo(repo.root)


def fresh_repo(path: Path, key: Path, allowed: Path) -> Repo:
    shutil.rmtree(path, ignore_errors=True)
    return configure(Repo.init(path), **{"signing.key": str(key), "verify.allowed-signers": str(allowed)})


def timed(fn: object, *args: object, **kwargs: object) -> float:
    started = time.perf_counter()
    fn(*args, **kwargs)  # type: ignore[operator]
    return time.perf_counter() - started


def one_run(members: list, work: Path, key: Path, allowed: Path) -> dict[str, float]:
    """Seconds, summed over the family, of each timed step of one run."""
    source = fresh_repo(work / "source", key, allowed)
    for m in members:
        source.add(m.path, name=m.name)
    t = dict.fromkeys(("checkout", "checkout_signed", "add", "add_signed", "verify"), 0.0)
    for m in members:
        plain, signed = work / "plain" / m.name, work / "signed" / m.name
        t["checkout"] += timed(source.checkout, m.name, plain)
        t["checkout_signed"] += timed(source.checkout, m.name, signed, model_signature=signed / "model.sig")
    os.sync()
    unsigned_repo = fresh_repo(work / "a", key, allowed)
    signed_repo = fresh_repo(work / "b", key, allowed)
    for m in members:
        plain, signed = work / "plain" / m.name, work / "signed" / m.name
        t["add"] += timed(unsigned_repo.add, plain, name=m.name)
        t["add_signed"] += timed(signed_repo.add, signed, name=m.name)
        t["verify"] += timed(verify_folder, signed, signed_repo.config, signed_repo.root)
    for sub in ("plain", "signed", "a", "b", "source"):
        shutil.rmtree(work / sub, ignore_errors=True)
    return t


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def report(members: list, runs: list[dict[str, float]]) -> str:
    logical = sum(f.stat().st_size for m in members for f in m.path.rglob("*") if f.is_file())
    col = {k: [r[k] for r in runs] for k in runs[0]}

    def overhead(base: str, signed: str) -> str:
        extra = statistics.median(col[signed]) - statistics.median(col[base])
        return f"+{extra:.2f} s ({100 * extra / statistics.median(col[base]):+.0f}%)"

    rows = [
        ["checkout", cell(col["checkout"]), cell(col["checkout_signed"]), overhead("checkout", "checkout_signed")],
        ["add", cell(col["add"]), cell(col["add_signed"]), overhead("add", "add_signed")],
    ]
    load = os.getloadavg()[0]
    return "\n".join(
        [
            BEGIN,
            "## OpenSSF model signatures (`benchmarks/model_signatures.py`)",
            "",
            f"Measured {time.strftime('%Y-%m-%d')} on {machine()}. One-minute load average {load:.2f} at the end "
            "of the run (other processes shared the CPUs).",
            "",
            "Reproduce: `.venv/bin/python benchmarks/model_signatures.py` (needs the `signing` extra).",
            "",
            f"The MiniLM demo family: {len(members)} models, {mb(logical)} of files. Each time is summed over the "
            f"family, the median of {len(runs)} runs (min-max). *checkout*: `repo.checkout` into an empty folder; "
            "*signed*: the same with `model_signature=DIR/model.sig` (sha256 of every file, one ECDSA P-256 "
            "signature). *add*: `repo.add` of the plain checked-out folders into a fresh repository; *signed*: of "
            "the signed folders into another (model-signing's verifier hashes every file again, against the key "
            "of `verify.allowed-signers`).",
            "",
            *table(["verb", "plain", "signed", "cost of the signature"], rows),
            "",
            f"The check alone (`verify_folder`, model-signing's verifier): {cell(col['verify'])} for the family.",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-doc", action="store_true", help="print the section, do not write docs/benchmarks.md")
    args = parser.parse_args()
    members = build_family(FAMILY_DIR, preset="demo")
    with tempfile.TemporaryDirectory(prefix="mgit-bench-sig-", dir=ROOT / ".cache") as tmp:
        work = Path(tmp)
        key, allowed = make_key(work)
        one_run(members, work, key, allowed)  # untimed: page cache, imports (model_signing takes seconds)
        runs = [one_run(members, work, key, allowed) for _ in range(args.runs)]
    section = report(members, runs)
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
