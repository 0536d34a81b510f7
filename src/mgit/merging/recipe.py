"""The merge recipe: model folders in, a merged model folder out, one tensor at a time.

`merge(parents, out_dir, **spec)` follows the recipe protocol (`fn(parents, out_dir,
**params)`), so a merged version records it as its recipe and `mgit cascade` runs it again
when an input gets a new version; `mgit merge` runs the same function. Its parameters are a
`MergeSpec` as JSON (see mgit.merging.spec), inputs named by their position among the parents.

Every input must hold the same safetensors files with the same tensors (names, shapes): the
first difference is refused, named, unless a `take` rule says which input that tensor comes
from unmerged. A PyTorch checkpoint each of whose tensors is a storage of its own counts as
one (`pytorch_model.bin` merges into `model.safetensors`). Files pair by path, or whatever
they are called when every input's weights are one file (mgit.formats.pairing): the merged
file then takes the first input's name, or the spec's `file`. Tensors are read one at a
time from each input (never a model whole) and written in the first input's order into a
safetensors file whose header is known in advance; the other files (config, tokenizer) are
the base's, else the first input's.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from mgit.codecs import Codec, CodecContext
from mgit.codecs.buffers import scratch
from mgit.codecs.merged import from_float32
from mgit.errors import InputError, InvalidOptionError
from mgit.formats.folder import ModelSource, SourceFile, scan_file
from mgit.formats.pairing import paired_files, single_weight_files
from mgit.formats.safetensors import (
    SafetensorsLayout,
    TensorSpan,
    build_header,
    element_count,
    is_float,
    itemsize,
    parse_header,
    read_layout,
    to_float,
)
from mgit.formats.tensors import TORCH_SUFFIXES
from mgit.formats.torch_zip import each_tensor_its_storage, plain_checkpoint, read_torch_zip, safetensors_name
from mgit.merging.methods import merge_tensor, ties_selections
from mgit.merging.spec import OUT_DTYPES, MergeSpec, layer_positions
from mgit.store.base import ObjectStore
from mgit.store.cache import DecodedCache
from mgit.store.objectformat import file_expected
from mgit.store.objects import Manifest
from mgit.store.reader import tensor_bytes
from mgit.util.parallel import Progress

CHUNK = 256 << 10  # elements merged at once in an element-wise method: its float32 temporaries stay in cache
ELEMENTWISE = ("linear", "task_arithmetic", "ties")  # (ties after a whole-tensor pass choosing what it keeps)


class Tensor(NamedTuple):
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return element_count(self.shape) * itemsize(self.dtype)


class FolderInput:
    """A model folder on disk (what a cascade gives a recipe). Its files are read under the
    merged model's names: `paths` maps those that differ to its own."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.label = str(folder)
        self.paths: dict[str, str] = {}
        self._layouts: dict[str, Any] = {}  # (a SafetensorsLayout, or a TorchZipLayout shaped like one)
        self._spans: dict[str, dict[str, Any]] = {}
        self._listed: dict[str, tuple[list[Tensor], dict[str, str] | None]] = {}

    def weight_files(self) -> list[str]:
        found = [p for p in self.folder.rglob("*") if p.suffix == ".safetensors" or plain_checkpoint(p)]
        return sorted(p.relative_to(self.folder).as_posix() for p in found)

    def tensors(self, rel: str) -> tuple[list[Tensor], dict[str, str] | None]:
        rel = self.paths.get(rel, rel)
        if rel not in self._listed:  # (the first input is listed to plan the model, then each file)
            path = self.folder / rel
            if not path.is_file():
                raise InputError(str(path), "is missing: every input must hold the same weight files")
            layout = self._layouts[rel] = read_layout(path) if path.suffix == ".safetensors" else read_torch_zip(path)
            self._spans[rel] = {t.name: t for t in layout.tensors}
            self._listed[rel] = [Tensor(t.name, t.dtype, t.shape) for t in layout.tensors], layout.metadata
        return self._listed[rel]

    def raw(self, rel: str, name: str) -> np.ndarray:
        rel = self.paths.get(rel, rel)
        layout, span = self._layouts[rel], self._spans[rel][name]
        with open(self.folder / rel, "rb") as fh:
            fh.seek(layout.data_start + span.start)
            data = np.frombuffer(fh.read(span.nbytes), np.uint8)
        if data.size != span.nbytes:
            raise InputError(str(self.folder / rel), f"is truncated inside tensor {name!r}")
        return data

    def copy_others(self, out_dir: Path, skip: set[str]) -> None:
        for f in sorted(self.folder.rglob("*")):
            rel = f.relative_to(self.folder).as_posix()
            if f.is_file() and rel not in skip and rel != "README.md":
                (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(f, out_dir / rel)


class StoreInput:
    """A stored version, read tensor by tensor from its store (no checkout); `paths` as for
    a folder, `label` what an error calls it."""

    def __init__(
        self, store: ObjectStore, manifest: Manifest, reuse: DecodedCache | None = None, *, label: str = ""
    ) -> None:
        self.store, self.reuse = store, reuse
        self.label = label or "a stored version"
        self.paths: dict[str, str] = {}
        self.files = {f.path: f for f in manifest.files}
        self._entries: dict[str, dict[str, Any]] = {}
        self._metadata: dict[str, dict[str, str] | None] = {}

    def weight_files(self) -> list[str]:
        plain = {
            p for p, f in self.files.items() if f.type == "torch-zip" and each_tensor_its_storage(f.tensors, f.views)
        }
        return sorted(plain | {p for p, f in self.files.items() if f.type == "safetensors"})

    def tensors(self, rel: str) -> tuple[list[Tensor], dict[str, str] | None]:
        rel = self.paths.get(rel, rel)
        f = self.files.get(rel)
        if f is None or rel not in self.weight_files():
            raise InputError(rel, "is missing from an input: every input must hold the same weight files")
        if f.type == "torch-zip":  # (its storages are its tensors: each_tensor_its_storage)
            self._metadata[rel] = None
        if rel not in self._metadata:  # (the first input is listed to plan the model, then each file)
            self._metadata[rel] = parse_header(
                rel, self.store.get(f.object, expect=file_expected(f))[1].tobytes(), f.size
            ).metadata
        return [Tensor(t.name, t.dtype, t.shape) for t in f.tensors], self._metadata[rel]

    def raw(self, rel: str, name: str) -> np.ndarray:
        rel = self.paths.get(rel, rel)
        if rel not in self._entries:
            self._entries[rel] = {t.name: t for t in self.files[rel].tensors}
        return tensor_bytes(self.store, self._entries[rel][name], reuse=self.reuse)

    def copy_others(self, out_dir: Path, skip: set[str]) -> None:
        for rel, f in sorted(self.files.items()):
            if rel not in skip and rel != "README.md" and f.type == "blob":
                (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                (out_dir / rel).write_bytes(self.store.get(f.object, expect=file_expected(f))[1].tobytes())


Input = FolderInput | StoreInput


def take_hint(tensor: str, *, config: bool = False) -> str:
    """How to say which input a tensor found in only some inputs comes from: a --take option,
    or a `take:` entry of a mergekit config (where --take is refused)."""
    if config:
        return f"Say which model it comes from in the config: take: {{'{tensor}': MODEL}}"
    return f"Say which input it comes from: --take '{tensor}=REF'"


def merge(parents: list[Path], out_dir: Path, **params: Any) -> None:
    """Merge the model folders `parents` into `out_dir` as `params` (a MergeSpec) says."""
    merge_inputs([FolderInput(Path(p)) for p in parents], Path(out_dir), MergeSpec.from_params(params))


def merge_inputs(inputs: list[Input], out_dir: Path, spec: MergeSpec, tick: Progress | None = None) -> None:
    """Merge `inputs` (folders or stored versions, in the spec's order) into `out_dir`;
    `tick(nbytes)` after each tensor written."""
    if len(inputs) != len(spec.inputs):
        raise InputError(str(out_dir), f"the merge has {len(spec.inputs)} inputs, {len(inputs)} were given")
    out_dir.mkdir(parents=True, exist_ok=True)
    plans = _plan_model(spec, inputs, out_dir)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="mgit-merge") as pool:
        for rel, plan in plans.items():
            _merge_file(spec, plan, inputs, out_dir / rel, pool, tick or (lambda n: None))


@contextmanager
def streamed_source(
    inputs: list[Input], scratch: Path, spec: MergeSpec, exact: Mapping[str, Codec] | None = None
) -> Iterator[ModelSource]:
    """The merged model as an add reads a folder, its weight files merged tensor by tensor as
    the add reads them (once), the other files (config, tokenizer, a shards' index) written
    to `scratch`; in the order a folder is read, so that it stores as the recipe's folder
    does. `exact` as for `merged_tensors`."""
    plans = _plan_model(spec, inputs, scratch)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2, thread_name_prefix="mgit-merge") as pool:

        def stream(plan: FilePlan) -> Callable[[], Iterator[tuple[TensorSpan, np.ndarray]]]:
            return lambda: merged_tensors(spec, plan, inputs, pool, exact)

        files = [scan_file(p, p.relative_to(scratch).as_posix()) for p in scratch.rglob("*") if p.is_file()]
        files += [
            SourceFile(rel, layout=SafetensorsLayout(p.header, p.spans, p.metadata), size=p.size, stream=stream(p))
            for rel, p in plans.items()
        ]
        yield ModelSource(sorted(files, key=lambda f: walk_order(f.path)))


def _plan_model(spec: MergeSpec, inputs: list[Input], out_dir: Path) -> dict[str, FilePlan]:
    """Every weight file of the merged model planned (each tensor placed by its position
    along the layers of the whole model, every shard), and the other files (config,
    tokenizer, a shards' index as the merged shards are) written to `out_dir`."""
    first = inputs[spec.base if spec.base is not None else 0]
    weights = _paired_weights(spec, inputs, out_dir)
    positions = layer_positions(t.name for rel in weights for t in first.tensors(rel)[0])
    plans = {rel: plan_file(spec, rel, inputs, positions) for rel in weights}
    first.copy_others(out_dir, set(first.weight_files()))
    for index in sorted(out_dir.rglob("*.safetensors.index.json")):
        _rewrite_index(index, out_dir, plans)
    return plans


def _paired_weights(spec: MergeSpec, inputs: list[Input], out_dir: Path) -> list[str]:
    """The merged model's weight files, named as it writes them: the base's (else the first
    input's) paired with every input's (mgit.formats.pairing), each input told which of its
    own files each is. A file an input lacks is refused, named with the input."""
    listed = [i.weight_files() for i in inputs]
    order = spec.base if spec.base is not None else 0
    if not listed[order]:
        raise InputError(str(out_dir), "the inputs have no .safetensors file to merge")
    singles = single_weight_files(listed)
    if spec.file is not None and singles is None:
        k = next(k for k, w in enumerate(listed) if len(w) != 1)
        raise InvalidOptionError(
            f"--file names the merged file of inputs of one weight file each; {inputs[k].label} holds "
            f"{len(listed[k])} weight files",
            hint="Leave out --file: files of several are paired, and named, by path",
        )
    names = []
    for row in paired_files(listed, listed):
        own = row[order]
        if own is None:
            continue
        missing = next((k for k, path in enumerate(row) if path is None), None)
        if missing is not None:
            raise InputError(
                own,
                f"is missing from input {missing + 1} ({inputs[missing].label}): every input must hold the same "
                "weight files",
                hint="Inputs of one weight file each are paired whatever it is called; others are paired by path",
            )
        name = (spec.file or row[0] or own) if singles is not None else own
        if name.endswith(TORCH_SUFFIXES):  # a merge writes safetensors
            if singles is None:
                raise InputError(
                    own, "is a shard of a PyTorch checkpoint: a merge pairs .bin weights only as a single file"
                )
            name = safetensors_name(name)
        for i, path in zip(inputs, row, strict=True):
            if path is not None and path != name:
                i.paths[name] = path
        names.append(name)
    return names


def walk_order(rel: str) -> tuple[tuple[int, str], ...]:
    """A sort key putting paths in the order a folder is read (each folder's files by name,
    then its folders by name, depth first)."""
    *folders, name = rel.split("/")
    return (*((1, d) for d in folders), (0, name))


def _rewrite_index(index: Path, out_dir: Path, plans: dict[str, FilePlan]) -> None:
    """A sharded checkpoint's index, as the merged shards are: every tensor written (renamed
    heads too) mapped to its shard, and their total size (a --dtype changes it)."""
    try:
        data = json.loads(index.read_text())
    except ValueError:
        raise InputError(str(index), "is not a JSON index of shards") from None
    folder = index.parent.relative_to(out_dir).as_posix()
    shards = {
        rel: plan.spans for rel, plan in plans.items() if (Path(rel).parent.as_posix() if "/" in rel else ".") == folder
    }
    metadata = dict(data.get("metadata") or {}) if isinstance(data, dict) else {}
    metadata["total_size"] = sum(t.nbytes for spans in shards.values() for t in spans)
    weight_map = {t.name: Path(rel).name for rel, spans in shards.items() for t in spans}
    index.write_text(json.dumps({"metadata": metadata, "weight_map": weight_map}, indent=2) + "\n")


@dataclass
class FilePlan:
    """What one merged safetensors file holds, known before any tensor is merged: its
    header, and for each tensor in file order where it comes from (merged, or one input's
    taken as it is) and its span in the output."""

    rel: str
    header: bytes
    rows: list[tuple[str, str, int | None, list[Tensor | None]]]  # (name, "merge"|"take", input, each input's)
    spans: tuple[TensorSpan, ...]
    metadata: dict[str, str] | None
    positions: dict[str, float]  # along the layers, for gradients (spec.layer_positions)

    @property
    def size(self) -> int:
        return len(self.header) + sum(s.nbytes for s in self.spans)


def _merge_file(
    spec: MergeSpec, plan: FilePlan, inputs: list[Input], out: Path, pool: ThreadPoolExecutor, tick: Progress
) -> None:
    """Merge one planned safetensors file into `out`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as fh:
        fh.write(plan.header)
        for span, data in merged_tensors(spec, plan, inputs, pool):
            fh.write(data)
            tick(span.nbytes)


def plan_file(spec: MergeSpec, rel: str, inputs: list[Input], positions: dict[str, float]) -> FilePlan:
    """Check that the inputs' tensors of `rel` can be merged as the spec says (the first
    that cannot is refused, named) and lay out the merged file."""
    order = spec.base if spec.base is not None else 0
    listed = [i.tensors(rel) for i in inputs]
    tables = [{t.name: t for t in ts} for ts, _ in listed]
    names = [t.name for t in listed[order][0] if not spec.renamed(t.name)]
    known = set(names) | {n for table in tables for n in table if spec.renamed(n)}
    for table in tables:  # tensors the base lacks, taken from the input a rule names (a task head)
        for n in table:
            if n not in known and spec.taken_from(n) is not None:
                names.append(n)
                known.add(n)
    plan: list[tuple[str, str, int | None, list[Tensor | None]]] = []
    for name in names:
        found = [table.get(name) for table in tables]
        taken = spec.taken_from(name)
        if taken is not None:
            if found[taken] is None:
                raise InputError(name, f"is not in input {taken + 1}, which --take names for it")
            plan.append((name, "take", taken, found))
            continue
        missing = [i for i, t in enumerate(found) if t is None]
        if missing:
            raise InputError(name, "is only in some inputs", hint=take_hint(name))
        shapes = {t.shape for t in found if t is not None}
        if len(shapes) > 1:
            raise InputError(
                name,
                f"has shapes {' and '.join(map(str, sorted(shapes)))} in the inputs: "
                "different architectures or task heads",
                hint=take_hint(name),
            )
        plan.append((name, "merge", None, found))
    for glob, position, prefix in spec.rename:  # kept apart, under a name of their own (both task heads)
        for t in listed[position][0]:
            if fnmatch.fnmatchcase(t.name, glob):
                found = [None] * len(inputs)
                found[position] = t
                plan.append((prefix + t.name, "take", position, found))
    written = [name for name, *_ in plan]
    if len(set(written)) != len(written):
        clash = next(n for n in written if written.count(n) > 1)
        raise InputError(clash, "would be written twice", hint="Give each --rename its own prefix")
    extra = [n for table in tables for n in table if n not in known]
    if extra:
        raise InputError(extra[0], "is only in some inputs", hint=take_hint(extra[0]))
    header_tensors = []
    for name, action, taken, found in plan:
        src = found[taken if action == "take" else order]
        assert src is not None
        cast = is_float(src.dtype) and spec.dtype is not None  # every float tensor in the configured dtype
        header_tensors.append((name, OUT_DTYPES[spec.dtype] if cast else src.dtype, src.shape))  # type: ignore[index]
    header, spans = build_header(header_tensors, listed[order][1])
    return FilePlan(rel, header, plan, tuple(spans), listed[order][1], positions)


def merged_tensors(
    spec: MergeSpec,
    plan: FilePlan,
    inputs: list[Input],
    pool: ThreadPoolExecutor,
    exact: Mapping[str, Codec] | None = None,
) -> Iterator[tuple[TensorSpan, np.ndarray]]:
    """Each tensor of a planned file, merged (or taken), in file order, as its span and
    bytes. A tensor `exact` names is made as that codec predicts it from the inputs' tensors
    (the same arithmetic: a linear or task-arithmetic merge's weighted sum), so that it is
    stored as that prediction with nothing to check again. The inputs' tensors are read on
    the pool's threads, the next tensor's while this one is merged."""

    def read(row: tuple[str, str, int | None, list[Tensor | None]]) -> list[Future[np.ndarray]]:
        return [pool.submit(i.raw, plan.rel, row[0]) for i in inputs]

    merging = [k for k, row in enumerate(plan.rows) if row[1] == "merge"]
    ahead = {k: n for k, n in zip(merging, merging[1:], strict=False)}  # the next tensor to merge, read meanwhile
    reads: dict[int, list[Future[np.ndarray]]] = {merging[0]: read(plan.rows[merging[0]])} if merging else {}
    for k, ((name, action, taken, found), target) in enumerate(zip(plan.rows, plan.spans, strict=True)):
        if action == "take":
            src = found[taken]  # type: ignore[index]
            assert src is not None
            raw = inputs[taken].raw(plan.rel, src.name)  # type: ignore[index]
            same = target.dtype == src.dtype
            yield target, raw if same else _flat(encode_floats(to_float(raw, src.dtype, np.float32), target.dtype))
            continue
        if k in ahead:
            reads[ahead[k]] = read(plan.rows[ahead[k]])
        raws = [f.result() for f in reads.pop(k)]
        codec = (exact or {}).get(name)
        if codec is not None:
            by_object = dict(zip(codec.bases, raws, strict=True))  # type: ignore[attr-defined]
            ctx = CodecContext(target.nbytes, load_object=by_object.__getitem__)
            yield target, codec.predict(ctx, target.nbytes)  # type: ignore[attr-defined]
        else:
            yield (
                target,
                _flat(
                    _merged(
                        spec,
                        name,
                        raws,
                        found,
                        target.dtype,
                        pool,  # type: ignore[arg-type]
                        plan.positions.get(name, 0.0),
                    )
                ),
            )


def _flat(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).reshape(-1).view(np.uint8)


def _merged(
    spec: MergeSpec,
    name: str,
    raws: list[np.ndarray],
    found: list[Tensor],
    out_dtype: str,
    pool: ThreadPoolExecutor,
    position: float,
) -> np.ndarray:
    """The merged tensor's bytes, with the parameters it has at its `position` along the
    layers. Element-wise methods go a chunk at a time on the pool's threads (the same bits:
    every element is computed alone), the others whole."""
    if not all(is_float(t.dtype) for t in found):  # integers, bools: the same in every input, or refused
        if any(not np.array_equal(r, raws[0]) for r in raws[1:]):
            raise InputError(name, "is not a float tensor and differs between the inputs", hint=take_hint(name))
        return raws[spec.base if spec.base is not None else 0]
    count = element_count(found[0].shape)
    inputs, params = spec.resolve(name, position)
    selections = {}
    if spec.method == "ties" and count > CHUNK:
        assert spec.base is not None
        dtypes, densities = [t.dtype for t in found], [float(p.get("density", 1.0)) for p in inputs]
        selections = ties_selections(raws, dtypes, spec.base, densities, name, chunk=CHUNK, pmap=pool.map)

    def part(lo: int, hi: int, shape: tuple[int, ...]) -> np.ndarray:
        values = [
            to_float(r[lo * itemsize(t.dtype) : hi * itemsize(t.dtype)], t.dtype, np.float32).reshape(shape)
            for r, t in zip(raws, found, strict=True)
        ]
        merged = merge_tensor(
            spec.method, name, values, spec.base, inputs, params, spec.seed, selections=selections, offset=lo
        )
        return encode_floats(np.asarray(merged, np.float32), out_dtype).reshape(-1).view(np.uint8)

    chunked = spec.method in ELEMENTWISE and not (spec.method == "ties" and params["rescale"])
    if not chunked or count <= CHUNK:
        return part(0, count, found[0].shape)
    width = itemsize(out_dtype)
    out = scratch(count * width)  # (a reused buffer in a merge: fresh pages cost their zeroing)

    def fill(lo: int) -> None:
        hi = min(lo + CHUNK, count)
        out[lo * width : hi * width] = part(lo, hi, (hi - lo,))

    list(pool.map(fill, range(0, count, CHUNK)))
    return out


def encode_floats(values: np.ndarray, dtype: str) -> np.ndarray:
    """float32 values as `dtype`'s little-endian bytes (bfloat16 rounded to nearest even)."""
    if dtype == "F64":
        return values.astype("<f8")
    try:
        return from_float32(values, dtype)
    except ValueError:
        raise InputError(dtype, "is not a dtype a merge writes", hint="Use float32, float16 or bfloat16") from None
