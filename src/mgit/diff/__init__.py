"""Model diff: what changed between two models, tensor by tensor, layer by layer, file by file.

A side is a stored version (a ref: `NAME`, `NAME@N`, `NAME@HEX`) or a model folder or file
that need not be added: an argument that exists on disk is a path, anything else a ref (a
`Path` object is always a path). Tensors are matched by name: only in A, only in B, shape
changed, dtype changed, identical (same bytes), changed. The work goes only where they differ:

- tensors with the same object id are identical without comparing anything (each is read once,
  one side only, for its share of ||A||); a folder tensor is hashed (blake3, GB/s) and its id
  compared before the stored tensor is decoded;
- a tensor stored as a delta against the other side's tensor (a fine-tune against its parent)
  takes that base from memory instead of decoding it a second time;
- pairs that differ are compared in parallel on a thread pool, each in chunks
  (`mgit.tensorstats`), so memory stays near the two tensors of each pair in flight.

A changed tensor (and a dtype change of the same shape, compared by value) gets ||B-A||/||A||,
max |B-A|, cosine similarity, the fraction of values that differ and, for a matrix, the rank
of B-A. A model's (and a group's) figures have one denominator, every value both sides share
(same name and shape, unchanged tensors included): the values that changed among them, and
||B-A|| / ||A|| over all of them. Tensors are grouped by module prefix (`module_group`); text
files (config.json, tokenizer files) are compared as unified diffs. Files pair by path, but
two models of one weight file each pair those files whatever they are called
(`mgit.formats.pairing`: a model added as `ft.safetensors` against one added as `base.safetensors`).

`sides` reads a side, `comparison` compares two, `files` compares their files, `results` holds
what a diff returns; every name is here too, where it has always been imported from.
"""

from mgit.diff.comparison import diff_models, diff_paths, module_group
from mgit.diff.files import MAX_TEXT_BYTES, file_diffs, text_diff
from mgit.diff.results import STATUSES, DiffResult, DiffSide, DiffSummary, FileDiff, GroupDiff, TensorDiff
from mgit.diff.sides import FileRef, ModelSide, Resolver, TensorRef, folder_side, open_side, stored_side
from mgit.formats.layers import layer_counts
from mgit.tensorstats import TensorStats

__all__ = [
    "MAX_TEXT_BYTES",
    "STATUSES",
    "DiffResult",
    "DiffSide",
    "DiffSummary",
    "FileDiff",
    "FileRef",
    "GroupDiff",
    "ModelSide",
    "Resolver",
    "TensorDiff",
    "TensorRef",
    "TensorStats",
    "diff_models",
    "diff_paths",
    "file_diffs",
    "folder_side",
    "layer_counts",
    "module_group",
    "open_side",
    "stored_side",
    "text_diff",
]
