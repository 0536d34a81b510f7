"""The merge recipe: model folders in, a merged model folder out, one tensor at a time.

`merge(parents, out_dir, **spec)` follows the recipe protocol (`fn(parents, out_dir,
**params)`), so a merged version records it as its recipe and `mgit cascade` runs it again
when an input gets a new version; `mgit merge` runs the same function. Its parameters are a
`MergeSpec` as JSON (see mgit.merging.spec), inputs named by their position among the parents.

Every input must hold the same safetensors files with the same tensors (names, shapes):
the first difference is refused, named, unless a `take` rule says which input that tensor
comes from unmerged. Tensors are read one at a time from each input (never a model whole)
and written in the first input's order into a safetensors file whose header is known in
advance; the other files (config, tokenizer) are the base's, else the first input's.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from mgit.errors import InputError
from mgit.formats.safetensors import (
    SafetensorsLayout,
    build_header,
    is_float,
    read_layout,
    to_float,
)
from mgit.merging.methods import merge_tensor
from mgit.merging.spec import MergeSpec

OUT_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def merge(parents: list[Path], out_dir: Path, **params: Any) -> None:
    """Merge the model folders `parents` into `out_dir` as `params` (a MergeSpec) says."""
    spec = MergeSpec.from_params(params)
    parents = [Path(p) for p in parents]
    if len(parents) != len(spec.inputs):
        raise InputError(str(out_dir), f"the merge has {len(spec.inputs)} inputs, {len(parents)} folders were given")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    first = parents[spec.base if spec.base is not None else 0]
    weights = sorted(p.relative_to(first).as_posix() for p in first.rglob("*.safetensors"))
    if not weights:
        raise InputError(str(first), "has no .safetensors file to merge")
    for rel in weights:
        layouts = [_layout(p / rel) for p in parents]
        _merge_file(spec, rel, parents, layouts, out_dir / rel)
    for f in sorted(first.rglob("*")):
        rel = f.relative_to(first).as_posix()
        if f.is_file() and rel not in weights and rel != "README.md":
            (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, out_dir / rel)


def _layout(path: Path) -> SafetensorsLayout:
    if not path.is_file():
        raise InputError(str(path), "is missing: every input must hold the same weight files")
    return read_layout(path)


def _merge_file(spec: MergeSpec, rel: str, parents: list[Path], layouts: list[SafetensorsLayout],
                out: Path) -> None:  # fmt: skip
    order = spec.base if spec.base is not None else 0
    names = [t.name for t in layouts[order].tensors if not spec.renamed(t.name)]
    known = set(names) | {t.name for lay in layouts for t in lay.tensors if spec.renamed(t.name)}
    for lay in layouts:  # tensors the base lacks, taken from the input a rule names (a task head)
        for t in lay.tensors:
            if t.name not in known and spec.taken_from(t.name) is not None:
                names.append(t.name)
                known.add(t.name)
    plan = []
    for name in names:
        spans = [{t.name: t for t in lay.tensors}.get(name) for lay in layouts]
        taken = spec.taken_from(name)
        if taken is not None:
            if spans[taken] is None:
                raise InputError(str(parents[taken] / rel), f"has no tensor {name!r} to take")
            plan.append((name, "take", taken, spans))
            continue
        missing = [i for i, s in enumerate(spans) if s is None]
        if missing:
            raise InputError(str(parents[missing[0]] / rel), f"has no tensor {name!r}",
                             hint=f"Say which input it comes from: --take '{name}=REF'")  # fmt: skip
        shapes = {s.shape for s in spans if s is not None}
        if len(shapes) > 1:
            raise InputError(name, f"has shapes {' and '.join(map(str, sorted(shapes)))} in the inputs: "
                                   "different architectures or task heads",
                             hint=f"Say which input it comes from: --take '{name}=REF'")  # fmt: skip
        plan.append((name, "merge", None, spans))
    for glob, position, prefix in spec.rename:  # kept apart, under a name of their own (both task heads)
        for t in layouts[position].tensors:
            if fnmatch.fnmatchcase(t.name, glob):
                spans = [None] * len(layouts)
                spans[position] = t
                plan.append((prefix + t.name, "take", position, spans))
    written = [name for name, *_ in plan]
    if len(set(written)) != len(written):
        clash = next(n for n in written if written.count(n) > 1)
        raise InputError(clash, "would be written twice", hint="Give each --rename its own prefix")
    extra = [t.name for lay in layouts for t in lay.tensors if t.name not in known]
    if extra:
        raise InputError(extra[0], "is only in some inputs", hint=f"Say which input it comes from: --take '{extra[0]}=REF'")
    header_tensors = []
    for name, action, taken, spans in plan:
        src = spans[taken if action == "take" else order]
        dtype = src.dtype if action == "take" or not is_float(src.dtype) or spec.dtype is None else OUT_DTYPES[spec.dtype]
        header_tensors.append((name, dtype, src.shape))
    header, out_spans = build_header(header_tensors, layouts[order].metadata)
    files = [open(p / rel, "rb") for p in parents]  # noqa: SIM115 - closed below
    try:
        with open(out, "wb") as fh:
            fh.write(header)
            for (name, action, taken, spans), target in zip(plan, out_spans, strict=True):
                fh.write(_tensor(spec, name, action, taken, spans, files, layouts, target.dtype).tobytes())
    finally:
        for f in files:
            f.close()


def _read(fh: Any, layout: SafetensorsLayout, span: Any) -> np.ndarray:
    fh.seek(layout.data_start + span.start)
    data = np.frombuffer(fh.read(span.nbytes), np.uint8)
    if data.size != span.nbytes:
        raise InputError(getattr(fh, "name", "?"), f"is truncated inside tensor {span.name!r}")
    return data


def _tensor(spec: MergeSpec, name: str, action: str, taken: int | None, spans: list[Any], files: list[Any],
            layouts: list[SafetensorsLayout], out_dtype: str) -> np.ndarray:  # fmt: skip
    if action == "take":
        assert taken is not None
        return _read(files[taken], layouts[taken], spans[taken])
    raws = [_read(f, lay, s) for f, lay, s in zip(files, layouts, spans, strict=True)]
    if not all(is_float(s.dtype) for s in spans):  # integers, bools: the same in every input, or refused
        if any(not np.array_equal(r, raws[0]) for r in raws[1:]):
            raise InputError(name, "is not a float tensor and differs between the inputs",
                             hint=f"Say which input it comes from: --take '{name}=REF'")  # fmt: skip
        return raws[spec.base if spec.base is not None else 0]
    values = [to_float(r, s.dtype, np.float32).reshape(s.shape) for r, s in zip(raws, spans, strict=True)]
    merged = merge_tensor(spec.method, name, values, spec.base, spec.inputs, spec.parameters, spec.seed)
    return _encode(np.asarray(merged, np.float32), out_dtype)


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as `dtype`'s little-endian bytes (bfloat16 rounded to nearest even)."""
    if dtype == "F32":
        return values.astype("<f4")
    if dtype == "F16":
        return values.astype("<f2")
    if dtype == "F64":
        return values.astype("<f8")
    if dtype == "BF16":
        bits = values.astype("<f4").view("<u4")
        rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
        out = (rounded >> np.uint32(16)).astype("<u2")
        nan = np.isnan(values)
        out[nan] = ((bits[nan] >> np.uint32(16)) | np.uint32(0x40)).astype("<u2")  # a quiet NaN stays NaN
        return out
    raise InputError(dtype, "is not a dtype a merge writes", hint="Use float32, float16 or bfloat16")
