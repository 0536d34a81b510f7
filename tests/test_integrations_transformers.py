"""transformers' Trainer saving into MGit (`mgit.integrations.transformers`): each save a
version with its step, logged metrics and arguments (no hub token), the folder given back byte
for byte, and a run resumed from an MGit checkpoint reaching the same losses and weights as one
resumed from the Trainer's own folder. A tiny BERT on a synthetic task, on CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import fsck_ok, run_cli, sha256_tree
from hf_family import TINY

from mgit import Repo

pytestmark = pytest.mark.slow


def dataset(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, TINY["vocab_size"], (n, 16), generator=g)
    return [{"input_ids": row, "attention_mask": torch.ones(16, dtype=torch.long), "labels": row[0] % 2} for row in ids]


def trainer(model_dir: Path, out: Path, callbacks: list[Any] | None = None) -> Any:
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    model = AutoModelForSequenceClassification.from_pretrained(model_dir)
    args = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=8,
        max_steps=6,
        save_strategy="steps",
        save_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        logging_steps=1,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        seed=0,
        remove_unused_columns=False,
        hub_token="hf_do_not_keep_me",
        disable_tqdm=True,
    )
    return Trainer(
        model=model, args=args, train_dataset=dataset(64, 1), eval_dataset=dataset(16, 2), callbacks=callbacks
    )


def losses(t: Any) -> dict[int, float]:
    return {e["step"]: e["loss"] for e in t.state.log_history if "loss" in e}


def test_a_trainer_commits_each_save_and_resumes_from_mgit_as_from_its_folder(tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, BertConfig

    from mgit.integrations.transformers import MgitCallback, checkpoint_folder

    torch.manual_seed(0)
    base_dir = tmp_path / "base"
    AutoModelForSequenceClassification.from_config(BertConfig(**TINY, num_labels=2)).save_pretrained(base_dir)
    repo = Repo.init(tmp_path / "repo")
    base = repo.add(base_dir, name="base")

    callback = MgitCallback(repo, model="ft", parent="base", run="sst-like")
    first = trainer(base_dir, tmp_path / "a", [callback])
    first.train()
    assert [c.seq for c in callback.commits] == [1, 2, 3]

    log = repo.log("ft")
    assert [v.run["step"] for v in log] == [6, 4, 2] and {v.run["id"] for v in log} == {"sst-like"}
    assert log[-1].parents[0].version == base.version
    metrics = log[1].run["metrics"]
    assert metrics["loss"] == pytest.approx(losses(first)[4]) and "eval_loss" in metrics
    shown = repo.show("ft@2").training_args
    assert shown["learning_rate"] == 1e-3 and shown["save_steps"] == 2
    assert not [k for k in shown if "token" in k]
    assert "hf_do_not_keep_me" not in json.dumps(repo.version("ft@2").run)
    code, out, err = run_cli("show", "ft@2", cwd=repo.root)
    assert code == 0 and "step:    4  " in out and "trained: " in out and "learning_rate=0.001" in out, err

    # the folder the Trainer wrote, byte for byte, but for its pickled arguments
    folder = checkpoint_folder(repo, "ft@2", tmp_path / "resume")
    saved = sha256_tree(tmp_path / "a" / "checkpoint-4")
    assert saved.pop("training_args.bin")
    assert sha256_tree(Path(folder)) == saved and {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(saved)

    from_folder = trainer(base_dir, tmp_path / "b")
    from_folder.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-4"))
    from_mgit = trainer(base_dir, tmp_path / "c")
    from_mgit.train(resume_from_checkpoint=folder)
    assert set(losses(from_mgit)) >= {5, 6}
    assert losses(from_mgit) == losses(from_folder)
    for (name, a), (_, b) in zip(
        from_folder.model.state_dict().items(), from_mgit.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    fsck_ok(repo.root)


def test_importing_mgit_or_its_integrations_imports_no_framework() -> None:
    probe = "import json, sys, mgit, mgit.integrations, mgit.repo; print(json.dumps('transformers' in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert json.loads(done.stdout) is False


def test_lossy_moments_from_a_trainer_resume_to_the_losses_of_its_own_folder(tmp_path: Path) -> None:
    from transformers import AutoModelForSequenceClassification, BertConfig

    from mgit.integrations.transformers import MgitCallback, checkpoint_folder

    torch.manual_seed(0)
    base_dir = tmp_path / "base"
    AutoModelForSequenceClassification.from_config(BertConfig(**TINY, num_labels=2)).save_pretrained(base_dir)
    repo = Repo.init(tmp_path / "repo")
    repo.add(base_dir, name="base")
    callback = MgitCallback(repo, model="ft", parent="base", lossy_optimizer=0.05)
    assert not callback.wait  # committed in the background by default
    first = trainer(base_dir, tmp_path / "a", [callback])
    first.train()
    assert all(p.done() for p in callback.pending)  # on_train_end waited for the last
    assert [c.seq for c in callback.commits] == [1, 2, 3]
    lossy = repo.version("ft@2").lossy
    assert lossy is not None and lossy["scope"] == "optimizer." and lossy["rel"] == 0.05
    assert "optimizer.pt" not in {f.path for f in repo.manifest("ft@2").files}

    folder = checkpoint_folder(repo, "ft@2", tmp_path / "resume")
    saved = sha256_tree(tmp_path / "a" / "checkpoint-4")
    back = sha256_tree(Path(folder))
    for name in ("model.safetensors", "scheduler.pt", "rng_state.pth", "trainer_state.json"):
        assert back[name] == saved[name], name  # all but the optimizer byte for byte
    assert "optimizer.pt" in back
    from_folder = trainer(base_dir, tmp_path / "b")
    from_folder.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-4"))
    from_mgit = trainer(base_dir, tmp_path / "c")
    from_mgit.train(resume_from_checkpoint=folder)
    exact, approx = losses(from_folder), losses(from_mgit)
    assert set(approx) >= {5, 6}
    assert approx[5] == exact[5]  # the weights are exact: the first loss after the resume is the same
    # the next one follows an update made with the lossy moments: 1.8% off when measured (the
    # bound holds on each moment; Adam divides the first by the root of the second, so a
    # parameter whose second moment is near zero feels the error most: docs, "Training runs")
    assert approx[6] == pytest.approx(exact[6], rel=0.03)
    fsck_ok(repo.root)
