"""A llama GGUF's q and k projections against its Hugging Face parent: llama.cpp's convert
script permutes their rows (`LlamaModel.permute`, Hugging Face's rotary halves to ggml's
interleaved pairs), so they are no cast or quantization of the parent's tensors as they are.
They are offered the parent's tensor permuted the same way, then quantized or cast to the
file's type (`ggml_requantize` with `heads`), beside the usual encodings.

Only the `llama` architecture, whose convert path permutes with `llama.attention.head_count`
(q) and `head_count_kv` (k); a float GGUF parent holds the permuted tensors already and needs
nothing of this."""

from __future__ import annotations

from collections.abc import Sequence

from mgit.codecs import Codec, RequantizeCodec, ZstdCodec
from mgit.codecs.requantize import FLOAT_BASES, TARGETS, available
from mgit.formats.dtypes import value_shape
from mgit.formats.folder import ModelSource
from mgit.formats.gguf import gguf_names, permuted_heads
from mgit.store.objects import Manifest


def permuted_chains(source: ModelSource, parents: Sequence[Manifest]) -> dict[str, list[Codec]]:
    """By tensor name: the chain that predicts a llama GGUF's q or k projection from its
    Hugging Face parent's (the first parent that has it)."""
    out: dict[str, list[Codec]] = {}
    if not available():
        return out
    for f in source.files:
        if f.kind != "gguf" or f.layout is None or f.layout.metadata.get("general.architecture") != "llama":
            continue
        heads = permuted_heads(f.layout.metadata)
        spans = {s.name: s for s in f.layout.tensors}
        for manifest in parents:
            tensors = {t.name: t for t in manifest.tensors()}
            for old, new in gguf_names("llama", list(tensors)).items():
                suffix = new.rpartition(".")[0].rpartition(".")[2] + ".weight"
                span, parent = spans.get(new), tensors[old]
                if new in out or span is None or not heads.get(suffix) or len(parent.shape) != 2:
                    continue
                if span.dtype not in TARGETS or parent.dtype not in FLOAT_BASES:
                    continue
                if value_shape(span.dtype, span.shape) != parent.shape or parent.shape[1] % TARGETS[span.dtype][0]:
                    continue
                if parent.shape[0] % (2 * heads[suffix]):
                    continue
                codec = RequantizeCodec(parent.object, parent.dtype, span.dtype, parent.shape[1], heads[suffix])
                out[new] = [codec, ZstdCodec(level=1)]
    return out
