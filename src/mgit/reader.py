"""Reading a stored version's tensors one at a time, as numpy arrays or torch tensors."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from mgit.errors import MgitError
from mgit.objects import Manifest, TensorEntry
from mgit.snapshot import as_array, as_torch
from mgit.store import ObjectStore


class ModelReader(Mapping[str, Any]):
    """Lazy access to the tensors of one version: `reader[name]` decodes just that tensor."""

    def __init__(self, store: ObjectStore, manifest: Manifest, vid: str,
                 explained: Callable[[], AbstractContextManager[None]] = nullcontext) -> None:  # fmt: skip
        self.store = store
        self.version_id = vid
        self.manifest = manifest
        self._explained = explained
        self.entries: dict[str, TensorEntry] = {}
        for f in self.manifest.files:
            for t in f.tensors:
                if t.name in self.entries:
                    raise MgitError(f"tensor {t.name!r} appears in two files of this version",
                                    hint="Read it per file with repo.manifest(ref)")  # fmt: skip
                self.entries[t.name] = t

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def get(self, name: str, default: Any = None, *, framework: str = "np") -> Any:  # type: ignore[override]
        entry = self.entries.get(name)
        if entry is None:
            if default is not None:
                return default
            raise KeyError(name)
        with self._explained():
            if framework == "pt":
                return as_torch(self.store, entry)
            if framework != "np":
                raise MgitError(f"unknown framework {framework!r}", hint="Use 'np' or 'pt'")
            return as_array(self.store, entry)

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)
