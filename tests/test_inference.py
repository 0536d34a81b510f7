"""Parent inference from weights: a real (small) torch family, with distractors from other
random initialisations and another architecture. Each derived model must get its parent and
relation first, distractors must rank low, --auto-parent must take a confident parent and
refuse an unrelated model, and sketches must survive a catalog rebuild."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from conftest import make_model, run_cli

torch = pytest.importorskip("torch", reason="needs torch (pip install 'mgit-models[torch]')")
from safetensors.torch import save_file  # noqa: E402

from mgit import InputError, MgitError, Repo  # noqa: E402
from mgit.lineage.sketch import QUANTIZED, SCALE, Sketch, element_values, round_to  # noqa: E402

VOCAB, WIDTH, LAYERS, CLASSES = 120, 32, 4, 4
State = dict[str, torch.Tensor]


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.fc1 = torch.nn.Linear(width, 2 * width)
        self.fc2 = torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    """Token embedding, residual MLP blocks, mean pooling, a classifier head."""

    def __init__(self, layers: int = LAYERS, width: int = WIDTH, vocab: int = VOCAB) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.layers = torch.nn.ModuleList(Block(width) for _ in range(layers))
        self.head = torch.nn.Linear(width, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.layers:
            x = block(x)
        return self.head(x.mean(1))


def init(seed: int, **shape: int) -> State:
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in Net(**shape).state_dict().items()}


def train(state: State, task: int, steps: int, *, seed: int = 0, layers: int = LAYERS, lr: float = 2e-3) -> State:
    """Real Adam steps on a generated task (label = a function of the tokens). Adam is written
    out: torch.optim's first step imports its compiler, which costs seconds."""
    torch.manual_seed(1000 + seed)
    net = Net(layers=layers)
    net.load_state_dict(state)
    params = list(net.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    for t in range(1, steps + 1):
        tokens = torch.randint(0, VOCAB, (32, 8))
        labels = (tokens[:, task % 8] + task) % CLASSES
        torch.nn.functional.cross_entropy(net(tokens), labels).backward()
        with torch.no_grad():
            for p, (m, v) in zip(params, moments, strict=True):
                m.mul_(0.9).add_(p.grad, alpha=0.1)
                v.mul_(0.999).addcmul_(p.grad, p.grad, value=0.001)
                p -= lr * (m / (1 - 0.9**t)) / ((v / (1 - 0.999**t)).sqrt() + 1e-8)
                p.grad = None
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def quantize(state: State) -> State:
    """Per-row symmetric int8 of every matrix, with its fp32 scales beside it."""
    out = {}
    for k, w in state.items():
        if w.ndim == 2:
            scale = w.abs().amax(1) / 127
            out[k] = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
            out[k + "_scale"] = scale
        else:
            out[k] = w
    return out


def prune(state: State, sparsity: float = 0.5) -> State:
    out = {}
    for k, w in state.items():
        if w.ndim == 2:
            w = w.clone()
            w.view(-1)[w.abs().view(-1).argsort()[: int(w.numel() * sparsity)]] = 0.0
        out[k] = w
    return out


def with_adapter(state: State, rank: int = 2) -> State:
    """The parent's tensors untouched plus small LoRA matrices on every fc1."""
    torch.manual_seed(7)
    out = dict(state)
    for i in range(LAYERS):
        out[f"layers.{i}.fc1.lora_A.weight"] = torch.randn(rank, WIDTH) * 0.01
        out[f"layers.{i}.fc1.lora_B.weight"] = torch.randn(2 * WIDTH, rank) * 0.01
    return out


def distill(teacher: State) -> State:
    """A student keeping every other layer of its teacher (renumbered), then trained a little."""
    student = {k: v for k, v in teacher.items() if not k.startswith("layers.")}
    for new, old in enumerate(range(0, LAYERS, 2)):
        for k, v in teacher.items():
            if k.startswith(f"layers.{old}."):
                student[k.replace(f"layers.{old}.", f"layers.{new}.", 1)] = v
    return train(student, task=1, steps=5, seed=3, layers=LAYERS // 2)


# name -> (state, parents, relation); parents first.
Family = dict[str, tuple[State, tuple[str, ...], str | None]]


@pytest.fixture(scope="module")
def trained() -> Family:
    """The torch family, trained once per module: each name's state, true parents, relation."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: threads only contend (seconds instead of milliseconds)
    try:
        return train_family()
    finally:
        torch.set_num_threads(threads)


def train_family() -> Family:
    base = init(0)
    ft_a, ft_b = train(base, task=1, steps=15, seed=1), train(base, task=2, steps=15, seed=2)
    other = init(99)
    return {
        "base": (base, (), None),
        "ft-a": (ft_a, ("base",), "finetune"),
        "ft-b": (ft_b, ("base",), "finetune"),
        "ft-a-int8": (quantize(ft_a), ("ft-a",), "quantize"),
        "ft-a-pruned": (prune(ft_a), ("ft-a",), "prune"),
        "ft-a-bf16": ({k: v.to(torch.bfloat16) for k, v in ft_a.items()}, ("ft-a",), "quantize"),
        "base-adapter": (with_adapter(base), ("base",), "adapter"),
        "merge-ab": ({k: (ft_a[k] + ft_b[k]) / 2 for k in ft_a}, ("ft-a", "ft-b"), "merge"),
        "student": (distill(ft_a), ("ft-a",), "distill"),
        # distractors: another random initialisation and its fine-tune, another architecture
        "other": (other, (), None),
        "other-ft": (train(other, task=1, steps=15, seed=1), ("other",), "finetune"),
        "wide": (init(5, width=48, layers=3), (), None),
    }


@pytest.fixture(scope="module")
def everything(trained: Family, tmp_path_factory: pytest.TempPathFactory) -> Repo:
    repo = Repo.init(tmp_path_factory.mktemp("family"))
    for name, (state, parents, relation) in trained.items():
        repo.add(state, name=name, parent=list(parents) or None, relation=relation)
    return repo


DERIVED = ["ft-a", "ft-b", "ft-a-int8", "ft-a-pruned", "ft-a-bf16", "base-adapter", "merge-ab", "student", "other-ft"]


@pytest.mark.parametrize("name", DERIVED)
def test_each_derived_model_gets_its_parent_and_relation_first(trained: Family, everything: Repo, name: str) -> None:
    state, parents, relation = trained[name]
    result = everything.suggest_parents(state, exclude={name})  # leave one out: everything else is stored
    best = result.candidates[0]
    assert best.model in parents and best.relation == relation, [
        (c.ref, c.relation, c.score) for c in result.candidates
    ]
    assert result.parents and {everything.model_of(p) for p in result.parents} == set(parents)
    assert best.confidence >= result.min_confidence and best.direction != "query -> candidate"
    if relation == "merge":
        assert best.merge_with is not None and everything.model_of(best.merge_with) in parents
    # Showing one candidate does not change the choice (a merge's partner may rank below it).
    assert everything.suggest_parents(state, exclude={name}, limit=1).parents == result.parents
    unrelated = {"wide"} | (
        {"other", "other-ft"} if name != "other-ft" else {n for n in trained if n not in ("other", "wide")}
    )
    assert all(c.score < 0.1 for c in result.candidates if c.model in unrelated)


def test_the_evidence_says_why(trained: Family, everything: Repo) -> None:
    result = everything.suggest_parents(trained["ft-a-int8"][0], exclude={"ft-a-int8"})
    best = result.candidates[0]
    assert best.model == "ft-a" and best.exact == 1.0  # re-quantizing the parent gives every sample exactly
    assert best.structure == 1.0 and 0 < best.identical < 1  # biases and norms are shared bit for bit
    pruned = everything.suggest_parents(trained["ft-a-pruned"][0], exclude={"ft-a-pruned"}).candidates[0]
    assert pruned.distance == 0.0 and any("more exact zeros" in r for r in pruned.reasons)
    adapter = everything.suggest_parents(trained["base-adapter"][0], exclude={"base-adapter"}).candidates[0]
    assert adapter.identical > 0.7 and adapter.structure < 1


def test_a_child_in_the_repository_is_not_taken_for_the_parent(trained: Family, everything: Repo) -> None:
    """ft-a's int8, pruned and bf16 copies and its merge with ft-b are all closer to it than
    base is; each is recognised as derived from ft-a."""
    result = everything.suggest_parents(trained["ft-a"][0], exclude={"ft-a"}, limit=8)
    by_model = {c.model: c for c in result.candidates}
    assert result.candidates[0].model == "base"
    for child in ("ft-a-int8", "ft-a-pruned", "ft-a-bf16", "merge-ab"):
        if child in by_model:
            assert by_model[child].direction == "query -> candidate", by_model[child]


def test_an_unrelated_model_has_no_confident_parent(trained: Family, everything: Repo) -> None:
    fresh = init(1234)
    result = everything.suggest_parents(fresh)
    assert not result.parents and "confidence" in result.verdict
    assert all(c.score < 0.1 for c in result.candidates)
    other_arch = everything.suggest_parents(init(3, width=24, layers=2))
    assert not other_arch.parents


def test_auto_parent_takes_a_confident_parent(trained: Family, tmp_path: Path) -> None:
    repo = Repo.init(tmp_path)
    for name in ("base", "ft-a", "other", "wide"):
        state, parents, relation = trained[name]
        repo.add(state, name=name, parent=list(parents) or None, relation=relation)
    added = repo.add(trained["ft-a-int8"][0], name="int8", auto_parent=True)
    assert [(p.model, p.relation) for p in added.parents] == [("ft-a", "quantize")]
    assert added.auto_parent is not None and added.auto_parent.parents == [repo.resolve("ft-a")]
    assert any(n.startswith("auto-parent: chose ft-a@1 (quantize)") for n in added.notes)
    # a relation given by the user wins over the guessed one
    merged = repo.add(trained["ft-a-pruned"][0], name="pruned", auto_parent=True, relation="other")
    assert [(p.model, p.relation) for p in merged.parents] == [("ft-a", "other")]


def test_auto_parent_refuses_below_the_threshold(trained: Family, tmp_path: Path) -> None:
    repo = Repo.init(tmp_path)
    for name in ("base", "ft-a"):
        repo.add(trained[name][0], name=name, parent=list(trained[name][1]) or None)
    added = repo.add(trained["other"][0], name="other", auto_parent=True)
    assert added.parents == [] and added.auto_parent is not None and added.auto_parent.parents == []
    assert any(n.startswith("auto-parent: no parent:") for n in added.notes)
    # versions of the model itself are its history, not candidate parents
    again = repo.add(trained["other-ft"][0], name="other", auto_parent=True)
    assert again.parents == [] and again.seq == 2


def test_auto_parent_with_a_given_parent_is_refused(trained: Family, repo: Repo) -> None:
    repo.add(trained["base"][0], name="base")
    with pytest.raises(MgitError, match="cannot be combined"):
        repo.add(trained["ft-a"][0], name="ft", parent="base", auto_parent=True)


def test_sketches_survive_a_catalog_rebuild(trained: Family, repo: Repo) -> None:
    for name in ("base", "ft-a", "ft-a-int8", "other"):
        state, parents, relation = trained[name]
        repo.add(state, name=name, parent=list(parents) or None, relation=relation)
    before = {v: blob for v, _, _, blob in repo.catalog.sketches()[0]}
    assert len(before) == 4
    first = repo.suggest_parents(trained["ft-a-pruned"][0])
    repo.rebuild_catalog()
    assert repo.catalog.sketches() == ([], sorted(before, key=lambda v: list(before).index(v)))
    second = repo.suggest_parents(trained["ft-a-pruned"][0])  # computed again from the stored tensors
    assert [(c.ref, c.score, c.relation) for c in second.candidates] == [
        (c.ref, c.score, c.relation) for c in first.candidates
    ]
    after = {v: blob for v, _, _, blob in repo.catalog.sketches()[0]}
    assert after == before  # the sketch made from the source at add time is the one made from the store


def test_a_damaged_sketch_is_made_again(trained: Family, repo: Repo) -> None:
    repo.add(trained["base"][0], name="base")
    vid = repo.resolve("base")
    good = repo.catalog.sketches()[0][0][3]
    repo.catalog.put_sketch(vid, good[:100])
    assert repo.suggest_parents(trained["ft-a"][0]).candidates[0].model == "base"
    assert repo.catalog.sketches()[0][0][3] == good


def test_bad_input_is_one_line(repo: Repo, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        repo.suggest_parents(tmp_path / "nope")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("hello")
    with pytest.raises(InputError, match="holds no tensors"):
        repo.suggest_parents(tmp_path / "notes")
    for path in ("nope", "notes"):
        code, out, err = run_cli("lineage", "suggest", str(tmp_path / path), cwd=repo.root)
        assert code == 1 and out == "" and err.startswith("Error: ") and err.count("\n") == 1, err


def test_cli_suggest_and_add_auto_parent(trained: Family, repo: Repo, tmp_path: Path) -> None:
    repo.add(trained["ft-a"][0], name="ft-a")
    repo.add(trained["other"][0], name="other")
    save_file({k: v.contiguous() for k, v in quantize(trained["ft-a"][0]).items()}, str(tmp_path / "int8.safetensors"))
    code, out, err = run_cli("lineage", "suggest", str(tmp_path / "int8.safetensors"), cwd=repo.root)
    assert code == 0, err
    assert "ft-a@1" in out and "quantize" in out and "Most likely parent: ft-a@1 (quantize)" in out
    code, out, _ = run_cli("lineage", "suggest", str(tmp_path / "int8.safetensors"), "--json", "-n", "1", cwd=repo.root)
    data = json.loads(out)
    assert len(data["candidates"]) == 1 and data["relation"] == "quantize" and data["compared"] == 2
    code, out, err = run_cli(
        "add", str(tmp_path / "int8.safetensors"), "--name", "int8", "--auto-parent", cwd=repo.root
    )
    assert code == 0 and "parents: ft-a@1 (quantize)" in out and "auto-parent: chose ft-a@1" in err
    code, out, _ = run_cli("lineage", "suggest", "--help", cwd=repo.root)
    assert "Example" in out and "mgit lineage suggest" in out


# --- sketches ------------------------------------------------------------------------------------


def test_decoding_and_rounding_match_torch() -> None:
    x = torch.randn(4096) * torch.logspace(-6, 4, 4096)
    for dtype, name in (
        (torch.bfloat16, "BF16"),
        (torch.float16, "F16"),
        (torch.float8_e4m3fn, "F8_E4M3"),
        (torch.float8_e5m2, "F8_E5M2"),
    ):
        narrow = x.clamp(-400, 400).to(dtype) if name.startswith("F8") else x.to(dtype)
        raw = (
            narrow.view(torch.uint8).numpy()
            if narrow.element_size() == 1
            else narrow.view(torch.int16).numpy().view(np.uint8)
        )
        assert np.array_equal(element_values(raw, name), narrow.float().numpy(), equal_nan=True), name
        if name in ("BF16", "F16"):
            assert np.array_equal(round_to(x.numpy(), name), narrow.float().numpy()), name


def test_a_quantized_tensor_is_sketched_dequantized_with_its_scale(trained: Family, repo: Repo) -> None:
    repo.add(trained["ft-a-int8"][0], name="q")
    sketch = Sketch.from_bytes(repo.catalog.sketches()[0][0][3])
    i = sketch.index["layers.0.fc1.weight"]
    assert sketch.roles[i] == QUANTIZED and sketch.roles[sketch.index["layers.0.fc1.weight_scale"]] == SCALE
    dense = trained["ft-a"][0]["layers.0.fc1.weight"].numpy().reshape(-1)
    from mgit.lineage.sketch import positions

    pos = positions((2 * WIDTH, WIDTH))
    assert np.allclose(sketch.values[i], dense[pos], atol=float(np.abs(dense).max()) / 127)
    zeros = float(np.mean(trained["ft-a-int8"][0]["layers.0.fc1.weight"].numpy() == 0))
    assert math.isclose(float(sketch.zeros[i]), zeros, abs_tol=1e-6)


def test_sketching_an_added_model_releases_each_tensor_it_sampled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample strided across a memory-mapped tensor faults in most of its pages: each
    tensor's pages are released once it is sampled (and once more after the object ids are
    hashed for --auto-parent), so an add's resident size does not grow to the model's."""
    from mgit.formats.folder import SourceFile

    rng = np.random.default_rng(0)
    state = {f"layer.{i}.weight": rng.standard_normal((256, 256)).astype(np.float32) for i in range(4)}
    make_model(tmp_path / "m", state=state)
    released: list[str] = []
    original = SourceFile.release
    monkeypatch.setattr(SourceFile, "release", lambda self, span: released.append(span.name) or original(self, span))
    repo = Repo.init(tmp_path / "repo")
    repo.add(tmp_path / "m", name="m")
    assert sorted(released) == sorted(2 * list(state))  # once when stored, once when sketched
    released.clear()
    repo.add(tmp_path / "m", name="m2", auto_parent=True)
    assert sorted(released) == sorted(3 * list(state))  # hashed for the ranking, stored, sketched
