"""Merge benchmark: `mgit merge` of two fine-tunes of a 1.08 GB bf16 LLM-shaped model, beside
mergekit on the same folders.

    .venv/bin/python benchmarks/merge.py                                   # writes docs/benchmarks.md (merge section)
    .venv/bin/python benchmarks/merge.py --mergekit /tmp/mkenv/bin/mergekit-yaml --no-doc

Data: the generated family of `llm_family.py` (a base, a fine-tune of it and a fine-tune of
that, 1.08 GB each, bf16, two shards), added once to a repository under .cache/bench/merge/.
Each row is one `mgit` process, as a user runs it (wall time, peak RSS and CPU by GNU time),
after the page cache is emptied and the repository's files read once: linear (the two
fine-tunes), task arithmetic and TIES (density 0.5) on the base. Throughput is the merged
model's bytes per second. The stored size of each merged version is what it added to the
repository. With --mergekit, mergekit-yaml (CPU, lazy unpickle) runs the same configs on the
same folders (mergekit cannot be installed beside MGit: give its own environment's script).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llm_family  # noqa: E402
from core import machine, write_doc  # noqa: E402
from llm_scale import Row, mgit_command, settle, timed  # noqa: E402

WORK = ROOT / ".cache" / "bench" / "merge"
BEGIN, END = "<!-- merge:begin -->", "<!-- merge:end -->"
MB = 1e6
TARGET = 200.0  # MB/s of output
CASES = {  # label: (mgit merge arguments, mergekit config body)
    "linear": (
        ["ft1", "ft2", "--method", "linear"],
        "models:\n  - model: {ft1}\n    parameters: {{weight: 0.5}}\n  - model: {ft2}\n"
        "    parameters: {{weight: 0.5}}\nmerge_method: linear\ndtype: bfloat16\n",
    ),
    "task_arithmetic": (
        ["ft1", "ft2", "--method", "task_arithmetic", "--base", "base", "--weight", "ft1=0.5", "--weight", "ft2=0.5"],
        "models:\n  - model: {ft1}\n    parameters: {{weight: 0.5}}\n  - model: {ft2}\n"
        "    parameters: {{weight: 0.5}}\nmerge_method: task_arithmetic\nbase_model: {base}\n"
        "dtype: bfloat16\n",
    ),
    "ties": (
        ["ft1", "ft2", "--method", "ties", "--base", "base", "--density", "0.5"],
        "models:\n  - model: {ft1}\n    parameters: {{weight: 1.0, density: 0.5}}\n  - model: {ft2}\n"
        "    parameters: {{weight: 1.0, density: 0.5}}\nmerge_method: ties\nbase_model: {base}\n"
        "dtype: bfloat16\n",
    ),
}


def repository() -> tuple[Path, list[Path]]:
    folders = llm_family.build(generations=2)
    repo = WORK / "repo"
    if not (WORK / ".built").exists():
        shutil.rmtree(repo, ignore_errors=True)
        repo.mkdir(parents=True)
        for args in (
            ["init"],
            ["add", str(folders[0]), "--name", "base"],
            ["add", str(folders[1]), "--name", "ft1", "--parent", "base"],
            ["add", str(folders[2]), "--name", "ft2", "--parent", "base"],
        ):
            subprocess.run([*mgit_command(), *args], cwd=repo, check=True, capture_output=True)
        (WORK / ".built").write_text("ok\n")
    return repo, folders


def for_mergekit(folder: Path, view: Path) -> Path:
    """The folder as mergekit takes it: the same weight files (linked), and a config naming
    the architecture (the generated config says only the shape)."""
    view.mkdir()
    for f in folder.iterdir():
        if f.name != "config.json":
            (view / f.name).symlink_to(f)
    config = json.loads((folder / "config.json").read_text())
    config.update(
        {
            "architectures": ["LlamaForCausalLM"],
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
        }
    )
    (view / "config.json").write_text(json.dumps(config))
    return view


def stored(repo: Path, name: str) -> int:
    shown = subprocess.run(
        [*mgit_command(), "show", name, "--json"], cwd=repo, capture_output=True, text=True, check=True
    )
    return int(json.loads(shown.stdout)["version"]["new_bytes"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-doc", action="store_true", help="print only, leave docs/ alone")
    parser.add_argument("--mergekit", type=Path, default=None, help="mergekit-yaml of an environment of its own")
    opts = parser.parse_args()
    repo, folders = repository()
    size = llm_family.folder_bytes(folders[1])
    rows: list[tuple[str, Row, int | None, float | None]] = []
    stamp = time.strftime("%H%M%S")
    scratch = WORK / "scratch"
    for label, (args, config) in CASES.items():
        name = f"{label.replace('_', '-')}-{stamp}"
        shutil.rmtree(scratch, ignore_errors=True)  # each merge into a copy: what it stores is what it adds
        shutil.copytree(repo, scratch, symlinks=True)
        settle([scratch / ".mgit"])
        row = Row(f"mgit merge --method {label}", size)
        row.runs.append(timed([*mgit_command(), "-C", str(scratch), "merge", *args, "--name", name]))
        theirs = None
        if opts.mergekit is not None:
            with tempfile.TemporaryDirectory(dir=WORK) as tmp:
                inputs = [for_mergekit(f, Path(tmp) / f.name) for f in folders]
                yml = Path(tmp) / "merge.yml"
                yml.write_text(config.format(base=inputs[0], ft1=inputs[1], ft2=inputs[2]))
                settle(folders)
                started = time.perf_counter()
                subprocess.run(
                    [
                        str(opts.mergekit),
                        str(yml),
                        str(Path(tmp) / "out"),
                        "--no-copy-tokenizer",
                        "--allow-crimes",
                        "--lazy-unpickle",
                    ],
                    check=True,
                    capture_output=True,
                )
                theirs = time.perf_counter() - started
        rows.append((label, row, stored(scratch, name), theirs))
        print(
            f"{label}: {row.rate:.0f} MB/s, peak RSS {row.rss / MB:.0f} MB, stored {rows[-1][2] / MB:.1f} MB"
            + (f"; mergekit {theirs:.1f} s" if theirs else ""),
            flush=True,
        )
    lines = [
        BEGIN,
        "## Merging (`benchmarks/merge.py`, issue 15)",
        "",
        f"Measured {time.strftime('%Y-%m-%d')} on {machine()}, load {os.getloadavg()[0]:.1f}. One run of each "
        f"(page cache emptied, the repository read once before it). Inputs: two fine-tunes (and their base) of "
        f"the generated {size / 1e9:.2f} GB bf16 model of `llm_family.py`, each merge into a fresh copy of the "
        f"repository (stored: what the merged version added). Target: {TARGET:.0f} MB/s of output.",
        "",
        "| merge | wall (s) | MB/s of output | peak RSS (MB) | CPU (s) | stored (MB) | mergekit (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, row, new, theirs in rows:
        lines.append(
            f"| {label} | {row.median:.1f} | {row.rate:.0f} | {row.rss / MB:.0f} | {row.cpu:.1f} | "
            f"{(new or 0) / MB:.1f} | {f'{theirs:.1f}' if theirs else '-'} |"
        )
    delta = stored(repo, "ft2")
    lines += [
        "",
        f"For scale: the fine-tune ft2 itself is stored in {delta / MB:.1f} MB (its delta against the base).",
        "",
        "Reproduce: `.venv/bin/python benchmarks/merge.py [--mergekit PATH/TO/mergekit-yaml]`.",
        END,
    ]
    section = "\n".join(lines)
    print(section)
    if not opts.no_doc:
        write_doc(section, BEGIN, END)


if __name__ == "__main__":
    main()
