"""One side of a diff: a stored version or a model folder or file on disk, its tensors by
name and its files by path; `open_side` tells which an argument is.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import numpy as np

from mgit.diff.results import DiffSide
from mgit.errors import InputError, MgitError, UnknownRefError
from mgit.formats.folder import SourceFile, scan_path
from mgit.formats.safetensors import DTYPES, element_count
from mgit.formats.tensors import TORCH_SUFFIXES
from mgit.store.base import ObjectStore
from mgit.store.cache import DecodedCache
from mgit.store.objectformat import file_expected
from mgit.store.objects import Manifest, TensorEntry, object_id, tensor_meta
from mgit.store.reader import tensor_bytes


@dataclass(frozen=True)
class TensorRef:
    """One tensor of a side: stored (`entry` in `store`) or from disk (`data`, raw bytes)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    entry: TensorEntry | None = None
    store: ObjectStore | None = None
    data: np.ndarray | None = None
    derive: Callable[[DecodedCache | None], np.ndarray] | None = None  # computed from others: a dequantized layer

    @property
    def nbytes(self) -> int:
        return element_count(self.shape) * DTYPES[self.dtype][0]

    def object_id(self) -> str:
        """The stored id, or what the id of this content would be (a hash of its bytes)."""
        if self.entry is not None:
            return self.entry.object
        return object_id("tensor", tensor_meta(self.dtype, self.shape), self.raw(None))

    def raw(self, cache: DecodedCache | None) -> np.ndarray:
        """The tensor's bytes: computed, read from disk, or decoded (kept in `cache`)."""
        if self.derive is not None:
            return self.derive(cache)
        if self.data is not None:
            return self.data
        assert self.store is not None and self.entry is not None
        return tensor_bytes(self.store, self.entry, reuse=cache)


@dataclass(frozen=True)
class FileRef:
    path: str
    type: str
    size: int
    digest: Callable[[], str]  # blake3 of the file as checkout would write it
    content: Callable[[], bytes]


@dataclass
class ModelSide:
    side: DiffSide
    tensors: dict[str, TensorRef]
    files: dict[str, FileRef]
    notes: list[str] = field(default_factory=list)


Resolver = Callable[[str], tuple[str, str, Manifest]]  # ref -> (label, version id, manifest)


def open_side(
    arg: str | os.PathLike[str], *, store: ObjectStore | None = None, resolve: Resolver | None = None
) -> ModelSide:
    """One side of a diff: an existing file or folder is read from disk; anything else is a
    ref, resolved by `resolve` in `store` (without them, only paths can be compared)."""
    text = os.fspath(arg)
    if isinstance(arg, os.PathLike) or os.path.lexists(text):
        try:
            side = folder_side(Path(text))
        except InputError as exc:
            exc.hint = exc.hint or "mgit diff compares model folders, .safetensors files, PyTorch checkpoints or refs"
            raise
        if resolve is not None and not _looks_like_path(text):
            try:
                label = resolve(text)[0]
                side.notes.append(
                    f"{text!r} is a path here and also a model; the path was compared "
                    f"(name a version, such as {label}, to compare the model)"
                )
            except MgitError:
                pass
        return side
    if resolve is None or store is None:
        raise InputError(
            text,
            "no such file or folder (and no repository here to look it up as a ref)",
            hint="Run inside a repository (mgit init) to compare refs",
        )
    try:
        label, vid, manifest = resolve(text)
    except UnknownRefError:
        if _looks_like_path(text):
            raise InputError(
                text,
                "no such file or folder, and no model has that name",
                hint="Check the path; refs are NAME, NAME@N or NAME@HEX (see: mgit ls)",
            ) from None
        raise
    return stored_side(store, DiffSide(label, "ref", vid), manifest)


def _looks_like_path(text: str) -> bool:
    """Written as a path rather than a model name: it starts like one, ends like a model file,
    or has more than the one '/' a name may have."""
    return (
        text.startswith((".", "~", "/"))
        or text.count("/") > 1
        or (os.sep != "/" and os.sep in text)
        or Path(text).suffix in (".safetensors", *TORCH_SUFFIXES)
    )


def stored_side(store: ObjectStore, side: DiffSide, manifest: Manifest) -> ModelSide:
    tensors = [TensorRef(t.name, t.dtype, t.shape, entry=t, store=store) for t in manifest.tensors()]
    files = [
        FileRef(
            f.path,
            f.type,
            f.size,
            lambda f=f: f.digest,
            lambda f=f: store.get(f.object, expect=file_expected(f))[1].tobytes(),
        )
        for f in manifest.files
    ]
    return _side(side, tensors, files)


def folder_side(path: Path) -> ModelSide:
    source = scan_path(path)
    tensors = [
        TensorRef(span.name, span.dtype, span.shape, data=data)
        for f in source.files
        if f.is_safetensors
        for span, data in f.tensor_data()
    ]
    files = [
        FileRef(
            f.path,
            f.kind,
            f.size,
            lambda f=f: _file_digest(f),
            lambda f=f: f.blob_data().tobytes(),
        )
        for f in source.files
    ]
    return _side(DiffSide(str(path), "path"), tensors, files, source.notes)


def _side(side: DiffSide, tensors: list[TensorRef], files: list[FileRef], notes: Iterable[str] = ()) -> ModelSide:
    """A side whose tensor names are unique and which holds at least one tensor."""
    by_name = {t.name: t for t in tensors}
    if len(by_name) < len(tensors):
        twice = Counter(t.name for t in tensors).most_common(1)[0][0]
        raise InputError(side.label, f"tensor {twice!r} appears in two files", hint="Compare the files one by one")
    if not by_name:
        pickles = [f.path for f in files if Path(f.path).suffix in TORCH_SUFFIXES]
        hint = (
            f"Its PyTorch checkpoint is not one a folder's reader maps to tensors: give the file itself ({pickles[0]})"
            if pickles
            else "Compare model folders, .safetensors files, PyTorch checkpoints or refs"
        )
        raise InputError(side.label, "holds no tensors, so it is not a model to compare", hint=hint)
    return ModelSide(side, by_name, {f.path: f for f in files}, list(notes))


def _file_digest(f: SourceFile) -> str:
    hasher = blake3.blake3()
    if f.tensors is not None and f.layout is not None:  # a converted checkpoint, as it would be stored
        hasher.update(f.layout.header)
        for _, data in f.tensor_data():
            hasher.update(data)
    else:
        hasher.update(f.blob_data())
    return hasher.hexdigest()
