"""What `mgit add` reads: a model folder, a single file, or an in-memory state dict, turned
into a list of `SourceFile`s, every one parsed and validated before anything is written.

Inside a folder every file is kept byte for byte (a link as the file it points to, and only
when that is inside the folder): `.safetensors` files are split into their header and
tensors, PyTorch checkpoints (`.bin`, `.pt`, `.pth`) into their skeleton and storages
(`mgit.formats.torch_zip`, which executes nothing; one it cannot map to tensors, such as a
legacy file or an optimizer's state, stays opaque with the reason in a note), `.gguf` files
into their skeleton and tensors (`mgit.formats.gguf`; one that is not valid GGUF, such as a
Git LFS pointer, stays opaque with the reason in a note; given on its own it is an error),
everything else
(config, tokenizer, README) is an opaque file. A single PyTorch checkpoint given on its own is
loaded with `weights_only=True` and stored as tensors; checkout rebuilds it as safetensors.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mgit.errors import GgufFormatError, InputError
from mgit.formats.gguf import GgufLayout, read_gguf
from mgit.formats.paths import SIGNATURE_FILE, folder_clash, path_problem
from mgit.formats.safetensors import SafetensorsLayout, TensorSpan, build_header, read_layout
from mgit.formats.tensors import TORCH_SUFFIXES, RawTensor, load_torch_checkpoint, raw_tensors
from mgit.formats.torch_zip import NotTorchZip, TorchZipLayout, read_torch_zip

SKIPPED_DIRS = {".git", ".mgit", "__pycache__"}
SKIPPED_FILES = {".DS_Store", "Thumbs.db", "desktop.ini"}  # a file manager's, never the model's
# huggingface_hub's download metadata in a local_dir (its .lock and .metadata files)
SKIPPED_PATHS = (".cache/huggingface/",)


@dataclass
class SourceFile:
    """One file of the model as it will be checked out (`path` is relative, '/'-separated).
    Exactly one of `disk` (read it from there), `tensors` (already in memory) or `stream`
    (a safetensors file whose tensors are made as they are read, once: a merge's) is set."""

    path: str
    layout: SafetensorsLayout | TorchZipLayout | GgufLayout | None = None
    disk: Path | None = None
    tensors: list[RawTensor] | None = None
    converted_from: str | None = None
    size: int = 0
    stream: Callable[[], Iterable[tuple[TensorSpan, np.ndarray]]] | None = None
    _mapping: mmap.mmap | None = field(default=None, repr=False)

    @property
    def is_safetensors(self) -> bool:
        return self.layout is not None

    @property
    def kind(self) -> str:
        """What its manifest entry will be: "safetensors", "torch-zip", "gguf" or "blob"."""
        if isinstance(self.layout, TorchZipLayout):
            return "torch-zip"
        if isinstance(self.layout, GgufLayout):
            return "gguf"
        return "blob" if self.layout is None else "safetensors"

    @property
    def replayable(self) -> bool:
        """Whether its tensors can be read more than once (a streamed file's cannot)."""
        return self.stream is None

    def tensor_data(self) -> Iterable[tuple[TensorSpan, np.ndarray]]:
        """Each tensor's span and bytes (memory-mapped from disk when read from a file)."""
        assert self.layout is not None
        if self.stream is not None:
            return self.stream()
        if self.tensors is not None:
            return [(span, t.data) for span, t in zip(self.layout.tensors, self.tensors, strict=True)]
        mapped = self.blob_data()
        base = self.layout.data_start
        return [(s, mapped[base + s.start : base + s.end]) for s in self.layout.tensors]

    def blob_data(self) -> np.ndarray:
        if self._mapping is None:
            self._mapping = _map(self.disk, self.size)
        return np.frombuffer(self._mapping, np.uint8) if self.size else np.empty(0, np.uint8)

    def release(self, span: TensorSpan) -> None:
        """Drop a stored tensor's pages from this process's memory (they stay in the page
        cache), so that the resident size of an add does not grow to the model's size."""
        if self._mapping is None or self.layout is None or span.nbytes < mmap.PAGESIZE:
            return
        start = self.layout.data_start + span.start
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # whole pages inside the span only
        last = (start + span.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            self._mapping.madvise(mmap.MADV_DONTNEED, first, last - first)


@dataclass
class ModelSource:
    """The files of a model to add, their paths checked as a manifest's are (`mgit.formats.paths`)
    before anything is written: every source (a folder, a file, a state dict, a merge) makes one."""

    files: list[SourceFile]
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for f in self.files:
            for name in (f.path, f.converted_from):
                if name is not None and (why := path_problem(name)) is not None:
                    raise InputError(repr(name), f"{why}, so it cannot be a file of a model", hint="Rename it")
        if (clash := folder_clash(f.path for f in self.files)) is not None:
            raise InputError(repr(clash[0]), f"is inside {clash[1]!r}, which is a file too")

    @property
    def logical_bytes(self) -> int:
        return sum(f.size for f in self.files)


def _map(path: Path | None, size: int) -> mmap.mmap | None:
    assert path is not None
    if size == 0:
        return None
    try:
        with open(path, "rb") as fh:
            mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as exc:
        raise InputError(str(path), f"cannot read file ({exc})") from None
    if len(mapping) != size:
        raise InputError(str(path), "the file changed size while it was read")
    return mapping


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None


def _check_readable(path: Path) -> None:
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None


def from_tensors(
    tensors: list[RawTensor], file_name: str, *, converted_from: str | None, metadata: dict[str, str] | None = None
) -> SourceFile:
    header, spans = build_header([(t.name, t.dtype, t.shape) for t in tensors], metadata)
    layout = SafetensorsLayout(header=header, tensors=spans, metadata=metadata)
    size = len(header) + sum(s.nbytes for s in spans)
    return SourceFile(file_name, layout=layout, tensors=tensors, converted_from=converted_from, size=size)


def scan_state_dict(state: Mapping[str, Any]) -> ModelSource:
    tensors = raw_tensors(state, "state dict")
    return ModelSource([from_tensors(tensors, "model.safetensors", converted_from="state dict")])


def scan_file(path: Path, rel: str) -> SourceFile:
    """A file inside a model folder: safetensors parsed, anything else opaque."""
    size = _file_size(path)
    if path.suffix == ".safetensors":
        return SourceFile(rel, layout=read_layout(path), disk=path, size=size)
    if path.suffix == ".gguf":
        layout = read_gguf(path)
        if len(layout.header) + sum(s.nbytes for s in layout.tensors) != size:
            raise InputError(str(path), "the file changed size while it was read")
        return SourceFile(rel, layout=layout, disk=path, size=size)
    _check_readable(path)
    return SourceFile(rel, disk=path, size=size)


def scan_checkpoint(path: Path, rel: str) -> tuple[SourceFile, str | None]:
    """A PyTorch checkpoint inside a folder: split into skeleton and storages, or opaque with
    the reason it could not be (never an error: the file is kept either way)."""
    f = scan_file(path, rel)
    try:
        layout = read_torch_zip(path)
    except NotTorchZip as exc:
        return f, str(exc)
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None
    if sum(s.nbytes for s in layout.tensors) + len(layout.header) != f.size:
        return f, "the file changed size while it was read"
    return SourceFile(rel, layout=layout, disk=path, size=f.size), None


def scan_path(path: Path) -> ModelSource:
    """Everything `mgit add PATH` will store, validated, with notes on conversions."""
    if not path.exists():
        raise InputError(str(path), "no such file or folder")
    if path.is_dir():
        return _scan_folder(path, links_allowed_under(path))
    if path.suffix in (".safetensors", ".gguf"):
        return ModelSource([scan_file(path, path.name)])
    if path.suffix in TORCH_SUFFIXES:
        tensors = load_torch_checkpoint(path)
        target = "model.safetensors" if path.stem == "pytorch_model" else f"{path.stem}.safetensors"
        note = (
            f"{path.name} is a PyTorch checkpoint: stored as {len(tensors)} tensor{'s' if len(tensors) != 1 else ''}; "
            f"checkout rebuilds it as {target} (the pickle itself is not kept)"
        )
        return ModelSource([from_tensors(tensors, target, converted_from=path.name, metadata={"format": "pt"})], [note])
    raise InputError(
        str(path),
        "not a model: expected a folder, a .safetensors or .gguf file or a PyTorch checkpoint (.bin, .pt, .pth)",
    )


def _unreadable(exc: OSError) -> None:
    """os.walk skips a folder it cannot list unless told otherwise: an add would then store
    part of the model and say nothing."""
    raise InputError(str(exc.filename), f"cannot read folder ({exc.strerror or exc})") from None


def links_allowed_under(root: Path) -> Path:
    """Where a folder's links may point: inside the folder, or for a Hugging Face cache
    snapshot (`HUB/models--ORG--NAME/snapshots/REV`, whose files link to `../../blobs/`, which
    may link on to the cache's shared `HUB/blobs/`) inside the cache."""
    real = Path(os.path.realpath(root))
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        return real.parent.parent.parent
    return real


def _linked_inside(root: Path, link: Path, allowed: Path) -> str:
    """Where a link among a model's files points, relative to the folder: a link out of the
    folder is refused (checkout would write, and a push send, a file that is not the model's:
    `passwd -> /etc/passwd`)."""
    target = Path(os.path.realpath(link))
    try:
        target.relative_to(allowed)
    except ValueError:
        raise InputError(
            str(link),
            f"is a link to {target}, outside the model folder: mgit stores no file from outside the folder it adds",
            hint="Copy the file into the folder if it belongs to the model, or remove the link",
        ) from None
    try:
        return target.relative_to(Path(os.path.realpath(root))).as_posix()
    except ValueError:
        return str(target)


def _scan_folder(root: Path, links_under: Path) -> ModelSource:
    files, notes, not_model = [], [], []
    for dirpath, dirs, names in os.walk(root, onerror=_unreadable):
        here = Path(dirpath)
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS)
        for d in list(dirs):
            if (here / d).is_symlink():
                dirs.remove(d)
                notes.append(f"skipped {(here / d).relative_to(root)}: a link to a folder")
        for name in sorted(names):
            full = here / name
            rel = full.relative_to(root).as_posix()
            if rel == SIGNATURE_FILE:
                continue
            if name in SKIPPED_FILES or rel.startswith(SKIPPED_PATHS):
                not_model.append(rel)
                continue
            if not full.is_file():
                notes.append(f"skipped {rel}: not a regular file")
                continue
            if full.is_symlink():
                target = _linked_inside(root, full, links_under)
                notes.append(f"{rel} is a link to {target}: stored as the file it points to")
            if full.suffix == ".gguf":
                try:
                    files.append(scan_file(full, rel))
                except GgufFormatError as exc:  # (a Git LFS pointer, a partial download ...)
                    notes.append(f"{rel} kept byte for byte as an opaque file: {exc.message.partition(': ')[2]}")
                    files.append(SourceFile(rel, disk=full, size=_file_size(full)))
                continue
            if full.suffix in TORCH_SUFFIXES:
                found, why = scan_checkpoint(full, rel)
                if why is not None:
                    notes.append(f"{rel} kept byte for byte as an opaque file: {why}")
                files.append(found)
                continue
            files.append(scan_file(full, rel))
    if not files:
        raise InputError(str(root), "the folder holds no files")
    if not_model:
        shown = ", ".join(not_model[:3]) + (f" and {len(not_model) - 3} more" if len(not_model) > 3 else "")
        notes.append(
            f"skipped {len(not_model)} file{'s' if len(not_model) != 1 else ''} that are not part of a model: {shown}"
        )
    return ModelSource(files, notes)
