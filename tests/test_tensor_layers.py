"""The one rule for a tensor's layer (mgit.formats.layers), pinned on the names real
checkpoints use, and the three counts read from it by diff, parent inference and merging."""

from __future__ import annotations

import numpy as np
import pytest

from mgit.diff import module_group
from mgit.formats.layers import layer_count, layer_counts, layer_of, layer_span
from mgit.lineage.sketch import Sketch
from mgit.merging.spec import layer_positions

BERT = [
    "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.LayerNorm.weight",
    *(f"bert.encoder.layer.{i}.{p}" for i in range(12) for p in ("attention.self.query.weight", "output.dense.bias")),
    "bert.pooler.dense.weight",
    "classifier.weight",
]
LLAMA = [
    "model.embed_tokens.weight",
    *(f"model.layers.{i}.{p}" for i in range(32) for p in ("self_attn.q_proj.weight", "mlp.experts.7.w1.weight")),
    "model.norm.weight",
    "lm_head.weight",
]
GPT2 = ["wte.weight", "wpe.weight", *(f"h.{i}.attn.c_attn.weight" for i in range(6)), "ln_f.weight"]
NO_LAYER = ["embed.weight", "lm_head.weight", "position_ids", "0.weight", "2.bias"]  # a bare nn.Sequential too
STUDENT = [f"h.{i}.mlp.c_fc.weight" for i in (0, 2, 4)]  # kept every other layer of a 6-layer teacher, unrenumbered

# names -> (layer_counts, layer_count, layer_span)
RULE = {
    "bert": (BERT, {"bert.encoder.layer": 12}, 12, 12),
    "llama": (LLAMA, {"model.layers": 32}, 32, 32),  # an expert's number is inside its layer
    "gpt2": (GPT2, {"h": 6}, 6, 6),
    "no layer": (NO_LAYER, {}, 0, 0),
    "student": (STUDENT, {"h": 3}, 3, 5),
    "bert and a head": (
        BERT + ["classifier.0.weight", "classifier.2.weight"],
        {"bert.encoder.layer": 12, "classifier": 2},
        12,
        12,
    ),
}


def test_the_layer_of_a_name() -> None:
    assert layer_of("model.layers.3.mlp.up_proj.weight") == ("model.layers", 3)
    assert layer_of("bert.encoder.layer.11.output.dense.bias") == ("bert.encoder.layer", 11)
    assert layer_of("h.0.attn.c_attn.weight") == ("h", 0) and layer_of("transformer.h.5.ln_1.weight") == (
        "transformer.h",
        5,
    )
    assert layer_of("model.norm.weight") is None and layer_of("0.weight") is None
    assert layer_of("h.\u00b2.weight") is None  # a digit to str.isdigit, not a number


@pytest.mark.parametrize("family", RULE)
def test_the_three_counts_on_real_names(family: str) -> None:
    names, counts, count, span = RULE[family]
    assert (layer_counts(names), layer_count(names), layer_span(names)) == (counts, count, span)


def sketch_of(names: list[str]) -> Sketch:
    n = len(names)
    empty = np.zeros((n, 4), np.float32)
    return Sketch(
        names, ["F32"] * n, [(4,)] * n, ["0" * 64] * n, np.zeros(n, np.int8), np.zeros(n, np.float32), empty, empty
    )


@pytest.mark.parametrize("family", RULE)
def test_diff_inference_and_merging_read_the_same_layers(family: str) -> None:
    names, counts, count, span = RULE[family]
    assert sketch_of(names).layers == count  # parent inference's depth of a model
    positions = layer_positions(names)  # merging: by index along the span
    for name in names:
        layer = layer_of(name)
        assert module_group(name) == (f"{layer[0]}.{layer[1]}" if layer else name.rpartition(".")[0] or name)
        assert positions[name] == ((layer[1] / (span - 1) if span > 1 else 1.0) if layer else 0.0)
    if family == "llama":
        assert positions["model.layers.31.mlp.experts.7.w1.weight"] == 1.0 and positions["lm_head.weight"] == 0.0
