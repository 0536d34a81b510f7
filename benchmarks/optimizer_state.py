"""What MGit's codecs make of Adam's state between two consecutive checkpoints, per tensor kind.

    .venv/bin/python benchmarks/optimizer_state.py            # after benchmarks/checkpoints.py
    .venv/bin/python benchmarks/optimizer_state.py --no-doc   # print only

Reads the last two checkpoints of the loop run `benchmarks/checkpoints.py` leaves under
`.cache/bench/checkpoints/loop/repo` (a Llama-shaped model, bf16 weights, fp32 masters, AdamW)
and codes every tensor of the later one against its namesake in the earlier one with each
lossless chain the writer may pick (`mgit.store.codec_policy`: byte planes + zstd on its own,
XOR + byte planes + zstd, zig-zag difference + pcodec) and with a candidate for the
second moment, which is positive and changes smoothly:

- *scaled XOR*: XOR against the earlier moment times one scalar c (the median ratio of the
  two; between checkpoints k steps apart v shrinks by about beta2^k where gradients are
  small), rounded to float32: bit-exact, since the prediction is recomputed from the base;

and beside them, not a coder but a bound for coders of this kind: *order-0 floor*, the
entropy of the residual (the integer difference of the bit patterns) under the better of two
predictions, the earlier tensor and the earlier tensor times c (fp32 only), as bytes. A coder
that predicts each element from its namesake in the earlier checkpoint and codes residuals
independently stores no less on average. It is estimated from the histogram of residual >> k,
plus k bits, for the smallest k that leaves at least 32 samples a bin (an unbinned histogram of
2^20 samples over millions of possible values would read low); tensors of fewer than 4,096
elements count 0, so the figure stays a lower bound.

Each tensor is measured on its first SAMPLE elements (2^20; the machine is shared and
pcodec is slow). Every chain is decoded back and compared before its size counts. Bytes are summed per kind:
weights (bf16), masters (fp32), exp_avg, exp_avg_sq (fp32).
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import CACHE, table, write_doc  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.codecs import (  # noqa: E402
    ByteplanesCodec,
    CodecContext,
    PcoCodec,
    SubDeltaCodec,
    XorDeltaCodec,
    ZstdCodec,
    decode_chain,
    encode_chain,
)
from mgit.store.reader import as_array  # noqa: E402

BEGIN, END = "<!-- optimizer-state:begin -->", "<!-- optimizer-state:end -->"
BASE = "0" * 64
MB = 1e6
SAMPLE = 1 << 20


def kind(file: str, name: str) -> str:
    if file == "master.safetensors":
        return "master (fp32)"
    if name.endswith(".exp_avg_sq"):
        return "exp_avg_sq"
    if name.endswith(".exp_avg"):
        return "exp_avg"
    if file == "optimizer.safetensors":
        return "other optimizer"
    return "weights (bf16)"


def chains(size: int) -> dict[str, list]:
    planes = [ByteplanesCodec(itemsize=size), ZstdCodec(level=1)]
    out = {
        "zstd -3": [ZstdCodec(level=3)],
        "byteplanes+zstd": planes,
        "xor+byteplanes+zstd": [XorDeltaCodec(base=BASE), *planes],
    }
    if size > 1:
        out["sub+pco"] = [SubDeltaCodec(base=BASE, itemsize=size), PcoCodec(dtype=f"<u{size}")]
    return out


def coded(chain: list, data: np.ndarray, base: np.ndarray) -> int:
    ctx = CodecContext(size=data.nbytes, load_object=lambda oid: base.tobytes())
    blob = encode_chain(chain, data.reshape(-1).view(np.uint8), ctx)
    back = decode_chain(chain, blob, ctx)
    if bytes(memoryview(back).cast("B")) != data.tobytes():
        raise SystemExit("a chain did not give back its input")
    return len(blob)


def scaled_xor(data: np.ndarray, base: np.ndarray) -> int:
    """XOR against float32(c * base), c the median ratio, then byte planes + zstd; 4 bytes for c."""
    x, b = data.reshape(-1).astype(np.float32), base.reshape(-1).astype(np.float32)
    ok = (b > 0) & (x > 0)
    c = np.float32(np.median(x[ok] / b[ok])) if ok.any() else np.float32(1)
    pred = (b * c).astype(np.float32)
    planes = [ByteplanesCodec(itemsize=4), ZstdCodec(level=1)]
    ctx = CodecContext(size=x.nbytes)
    diff = x.view(np.uint32) ^ pred.view(np.uint32)
    blob = encode_chain(planes, diff.view(np.uint8), ctx)
    back = np.frombuffer(bytes(memoryview(decode_chain(planes, blob, ctx)).cast("B")), np.uint32)
    if not np.array_equal(back ^ (b * c).astype(np.float32).view(np.uint32), x.view(np.uint32)):
        raise SystemExit("scaled XOR did not give back its input")
    return len(blob) + 4


def entropy_bits(residual: np.ndarray) -> float:
    """Bits an element of `residual` (int64) needs at order 0, binned as the docstring says."""
    n = residual.size
    for k in range(64):
        _, counts = np.unique(residual >> k, return_counts=True)
        if counts.size <= max(1, n // 32):
            p = counts / n
            return float(-(p * np.log2(p)).sum()) + k
    return 64.0


def floor_bytes(data: np.ndarray, base: np.ndarray) -> int:
    """The order-0 floor of `data` predicted from `base` (module docstring), in bytes."""
    it = f"<u{data.dtype.itemsize}"
    x = data.reshape(-1).view(it).astype(np.int64)
    preds = [base.reshape(-1).view(it).astype(np.int64)]
    if data.dtype == np.float32:
        d, b = data.reshape(-1), base.reshape(-1)
        ok = (b != 0) & np.isfinite(d) & np.isfinite(b)
        c = np.float32(np.median(d[ok] / b[ok])) if ok.any() else np.float32(1)
        preds.append((b * c).astype(np.float32).view("<u4").astype(np.int64))
    return round(min(entropy_bits(x - p) for p in preds) * x.size / 8)


def measure(repo: Repo) -> tuple[dict[str, dict[str, int]], dict[str, int], tuple[int, int]]:
    log = repo.log("llama")
    new, old = log[0], log[1]
    manifests = [repo.store.get_manifest(repo.store.get_version(v.id).manifest) for v in (old, new)]
    before = {(f.path, t.name): t for f in manifests[0].files for t in f.tensors}
    sizes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    raw: dict[str, int] = defaultdict(int)
    for f in manifests[1].files:
        for t in f.tensors:
            k = kind(f.path, t.name)
            data = as_array(repo.store, t).reshape(-1)[:SAMPLE]
            base = as_array(repo.store, before[(f.path, t.name)]).reshape(-1)[:SAMPLE]
            u = data.view(f"<u{data.dtype.itemsize}") if data.dtype.itemsize > 1 else data.view(np.uint8)
            ub = base.view(u.dtype)
            raw[k] += data.nbytes
            for label, chain in chains(data.dtype.itemsize).items():
                sizes[k][label] += coded(chain, u, ub)
            if k == "exp_avg_sq":
                sizes[k]["scaled xor+byteplanes+zstd"] += scaled_xor(data, base)
            if data.dtype.itemsize > 1 and data.size >= 1 << 12:  # small ones count 0: still a bound
                sizes[k]["order-0 floor"] += floor_bytes(data, base)
    steps = (repo.version(old.id).run["step"], repo.version(new.id).run["step"])
    return sizes, raw, steps


def report(sizes: dict[str, dict[str, int]], raw: dict[str, int], steps: tuple[int, int]) -> str:
    labels = sorted({label for s in sizes.values() for label in s}, key=str)
    rows = []
    for k, s in sizes.items():
        rows.append([k, f"{raw[k] / MB:,.1f}"] + [f"{s[x] / raw[k]:.3f}" if x in s else "-" for x in labels])
    return "\n".join(
        [
            BEGIN,
            "## Training runs: Adam's state under each codec (`benchmarks/optimizer_state.py`)",
            "",
            f"Checkpoint at step {steps[1]} coded against the one at step {steps[0]} (the loop run of "
            "`benchmarks/checkpoints.py`); stored bytes as a share of the tensors' bytes, every chain "
            "decoded back and compared; each tensor's first 2^20 elements.",
            "",
            *table(["kind", "MB", *labels], rows),
            "",
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", default=str(CACHE / "checkpoints" / "loop" / "repo"))
    parser.add_argument("--no-doc", action="store_true")
    a = parser.parse_args()
    text = report(*measure(Repo(a.repo)))
    print(text)
    if not a.no_doc:
        write_doc(text, BEGIN, END)


if __name__ == "__main__":
    main()
