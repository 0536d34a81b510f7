"""Reading a stored version's tensors: checked against their manifest entries, one at a time,
as raw bytes, numpy arrays or torch tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from mgit.cache import DecodedCache
from mgit.errors import CorruptObjectError, InvalidOptionError, MgitError
from mgit.formats.safetensors import numpy_view
from mgit.formats.tensors import to_torch
from mgit.objects import Manifest, TensorEntry
from mgit.store import ObjectStore

FRAMEWORKS = ("np", "pt")


def tensor_bytes(store: ObjectStore, entry: TensorEntry, *, reuse: DecodedCache | None = None) -> np.ndarray:
    """A stored tensor's bytes, checked against its entry (see `ObjectStore.get` for `reuse`)."""
    header, data = store.get(entry.object, reuse=reuse)
    if header.kind != "tensor" or header.meta != {"dtype": entry.dtype, "shape": list(entry.shape)}:
        raise CorruptObjectError(entry.object, f"is not the {entry.dtype}{list(entry.shape)} tensor {entry.name!r}")
    return data


def as_array(store: ObjectStore, entry: TensorEntry, *, reuse: DecodedCache | None = None) -> np.ndarray:
    """A tensor as a numpy array of its own dtype and shape (writable: a cached one is copied)."""
    data = tensor_bytes(store, entry, reuse=reuse)
    return numpy_view(data if data.flags.writeable else data.copy(), entry.dtype, entry.shape)


def as_torch(store: ObjectStore, entry: TensorEntry, *, reuse: DecodedCache | None = None) -> Any:
    return to_torch(tensor_bytes(store, entry, reuse=reuse), entry.dtype, entry.shape)


class AmbiguousTensorError(MgitError):
    def __init__(self, name: str) -> None:
        super().__init__(f"tensor {name!r} appears in two files of this version",
                         hint="Read it per file with repo.manifest(ref)")  # fmt: skip
        self.name = name


class ModelReader(Mapping[str, Any]):
    """Lazy access to the tensors of one version: `reader[name]` decodes just that tensor
    (a numpy array); `reader.get(name, framework="pt")` gives a torch tensor."""

    def __init__(self, store: ObjectStore, manifest: Manifest, vid: str, *,
                 explained: Callable[[], AbstractContextManager[Any]] = nullcontext,
                 reuse: DecodedCache | None = None) -> None:  # fmt: skip
        self.store = store
        self.version_id = vid
        self.manifest = manifest
        self.explained = explained
        self.reuse = reuse
        self.entries: dict[str, TensorEntry] = {}
        for f in self.manifest.files:
            for t in f.tensors:
                if t.name in self.entries:
                    raise AmbiguousTensorError(t.name)
                self.entries[t.name] = t

    def __getitem__(self, name: str) -> Any:
        if name not in self.entries:
            raise KeyError(name)
        return self.get(name)

    def get(self, name: str, default: Any = None, *, framework: str = "np") -> Any:  # type: ignore[override]
        """The tensor `name` (decoded and verified), or `default` if the version has none."""
        if framework not in FRAMEWORKS:
            raise InvalidOptionError(f"unknown framework {framework!r}", hint="Use 'np' or 'pt'")
        entry = self.entries.get(name)
        if entry is None:
            return default
        with self.explained():
            if framework == "pt":
                return as_torch(self.store, entry, reuse=self.reuse)
            return as_array(self.store, entry, reuse=self.reuse)

    def __contains__(self, name: object) -> bool:
        return name in self.entries  # without decoding anything

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
