"""Reading a stored version's tensors: checked against their manifest entries, one at a time,
as raw bytes, numpy arrays or torch tensors; or every tensor of some versions at once
(`state_dicts`: what `Repo.load_state_dict` and `mgit.load`/`load_many` return). A PyTorch
checkpoint's tensors are views of its stored storages: a view that is its whole storage is
that tensor (two names of one storage are one tensor, tied), any other is made with its
offset and strides."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np

from mgit.codecs.buffers import unpooled
from mgit.errors import AmbiguousTensorError, InvalidOptionError, MissingDependencyError
from mgit.formats.safetensors import is_float, numpy_view
from mgit.formats.tensor_views import TensorView
from mgit.formats.tensors import to_torch
from mgit.store.base import ObjectStore
from mgit.store.cache import CHECKOUT_BASES, UNBOUNDED, DecodedCache
from mgit.store.objectformat import tensor_expected
from mgit.store.objects import Manifest, TensorEntry
from mgit.util.parallel import default_jobs

FRAMEWORKS = {"np": "np", "numpy": "np", "pt": "pt", "torch": "pt"}  # (each framework's two names)


def tensor_bytes(store: ObjectStore, entry: TensorEntry, *, reuse: DecodedCache | None = None) -> np.ndarray:
    """A stored tensor's bytes, checked against its entry (see `ObjectStore.get` for `reuse`)."""
    return store.get(entry.object, reuse=reuse, expect=tensor_expected(entry))[1]


def as_array(store: ObjectStore, entry: TensorEntry, *, reuse: DecodedCache | None = None) -> np.ndarray:
    """A tensor as a numpy array of its own dtype and shape (writable: a cached one is copied)."""
    data = tensor_bytes(store, entry, reuse=reuse)
    return numpy_view(data if data.flags.writeable else data.copy(), entry.dtype, entry.shape)


def as_torch(store: ObjectStore, entry: TensorEntry, *, reuse: DecodedCache | None = None) -> Any:
    return to_torch(tensor_bytes(store, entry, reuse=reuse), entry.dtype, entry.shape)


class ModelReader(Mapping[str, Any]):
    """Lazy access to the tensors of one version: `reader[name]` decodes just that tensor
    (a numpy array); `reader.get(name, framework="pt")` gives a torch tensor."""

    def __init__(
        self,
        store: ObjectStore,
        manifest: Manifest,
        vid: str,
        *,
        explained: Callable[[], AbstractContextManager[Any]] = nullcontext,
        reuse: DecodedCache | None = None,
    ) -> None:
        self.store = store
        self.version_id = vid
        self.manifest = manifest
        self.explained = explained
        self.reuse = reuse
        self.views = named_tensors(manifest)
        self.entries: dict[str, TensorEntry] = {name: t for name, (t, _) in self.views.items()}

    def __getitem__(self, name: str) -> Any:
        if name not in self.entries:
            raise KeyError(name)
        return self.get(name)

    def get(self, name: str, default: Any = None, *, framework: str = "np") -> Any:  # type: ignore[override]
        """The tensor `name` (decoded and verified), or `default` if the version has none."""
        if framework not in FRAMEWORKS:
            raise InvalidOptionError(f"unknown framework {framework!r}", hint="Use 'np' (numpy) or 'pt' (torch)")
        entry, view = self.views.get(name, (None, None))
        if entry is None:
            return default
        with self.explained():
            if FRAMEWORKS[framework] == "pt":
                return _viewed(as_torch(self.store, entry, reuse=self.reuse), view)
            return _viewed(as_array(self.store, entry, reuse=self.reuse), view)

    def __contains__(self, name: object) -> bool:
        return name in self.entries  # without decoding anything

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)


def named_tensors(manifest: Manifest) -> dict[str, tuple[TensorEntry, TensorView | None]]:
    """Every tensor of a version by name: a stored tensor, or a view of one (None: the stored
    tensor itself). A name in two files is ambiguous."""
    out: dict[str, tuple[TensorEntry, TensorView | None]] = {}
    for f in manifest.files:
        pairs: list[tuple[str, TensorEntry, TensorView | None]] = [(t.name, t, None) for t in f.tensors]
        if f.type == "torch-zip":
            pairs = [(v.name, f.tensors[v.storage], v) for v in f.views]
            pairs = [(n, t, None if v.is_whole(t.params) and v.shape == t.shape else v) for n, t, v in pairs]
        for name, t, view in pairs:
            if name in out:
                raise AmbiguousTensorError(name)
            out[name] = (t, view)
    return out


def _viewed(tensor: Any, view: TensorView | None) -> Any:
    """A stored tensor, or the view of it a checkpoint names (a torch view or a numpy array
    that shares its memory; numpy strides are in bytes)."""
    if view is None:
        return tensor
    if isinstance(tensor, np.ndarray):
        flat = tensor.reshape(-1)
        size = flat.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[view.offset :], view.shape, [s * size for s in view.stride], writeable=flat.flags.writeable
        )
    return tensor.reshape(-1).as_strided(view.shape, view.stride, view.offset)


def state_dicts(
    store: ObjectStore,
    versions: list[tuple[str, Manifest]],
    *,
    framework: str = "np",
    device: Any = None,
    dtype: Any = None,
    jobs: int | None = None,
    shared: bool = False,
    reuse: DecodedCache | None = None,
) -> list[dict[str, Any]]:
    """Every tensor of these versions (id, manifest), one dict by name per version: numpy
    arrays (`framework` "np"/"numpy") or torch tensors ("pt"/"torch", on `device`), floating
    ones converted to `dtype` if given. Distinct tensors are decoded once each on a thread
    pool, into memory of their own size that they are returned in (no copy unless a cache
    holds the bytes for others). With `shared`, one cache keeps every object decoded, so a
    delta base also asked for is decoded once and a tensor several versions hold is one
    object in all their dicts (numpy arrays then read-only); `reuse` is a session's cache."""
    kind = FRAMEWORKS.get(framework)
    if kind is None:
        raise InvalidOptionError(f"unknown framework {framework!r}", hint="Use 'np' (numpy) or 'pt' (torch)")
    if kind == "np" and device is not None:
        raise InvalidOptionError("a device is for torch tensors", hint="Drop device, or use framework='torch'")
    convert = _converter(kind, device, dtype)
    tables = [named_tensors(manifest) for _, manifest in versions]
    distinct = {e.object: e for table in tables for e, _ in table.values()}
    cache = reuse or (DecodedCache(UNBOUNDED, keep_all=True) if shared else DecodedCache(CHECKOUT_BASES))

    def one(entry: TensorEntry) -> Any:
        with unpooled():  # the dicts keep what is decoded: in arrays of its own size
            data = tensor_bytes(store, entry, reuse=cache)
        return convert(data, entry, shared=shared)

    with ThreadPoolExecutor(max_workers=jobs or default_jobs(), thread_name_prefix="mgit-load") as pool:
        loaded = dict(zip(distinct, pool.map(one, distinct.values()), strict=True))
    return [{name: _viewed(loaded[e.object], view) for name, (e, view) in table.items()} for table in tables]


def _converter(kind: str, device: Any, dtype: Any) -> Callable[..., Any]:
    """How decoded bytes become what the caller asked for: viewed where they can be (bytes
    decoded for this tensor alone, or shared ones: read-only to numpy), copied where a cache
    holds them for others, converted (new memory anyway) when a dtype or device says so."""
    if kind == "np":
        target = None if dtype is None else _numpy_dtype(dtype)

        def as_numpy(data: np.ndarray, entry: TensorEntry, *, shared: bool) -> Any:
            arr = numpy_view(data, entry.dtype, entry.shape)
            if target is not None and is_float(entry.dtype) and arr.dtype != target:
                return arr.astype(target)
            if shared:
                arr.flags.writeable = False
                return arr
            return arr if arr.flags.writeable else np.array(arr)

        return as_numpy

    target = None if dtype is None else _torch_dtype(dtype)

    def as_torch_tensor(data: np.ndarray, entry: TensorEntry, *, shared: bool) -> Any:
        t = to_torch(data, entry.dtype, entry.shape, copy=not shared and not data.flags.writeable)
        if target is not None and is_float(entry.dtype):
            t = t.to(target)
        return t.to(device) if device is not None else t

    return as_torch_tensor


def _numpy_dtype(dtype: Any) -> Any:
    if str(dtype) == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise MissingDependencyError("ml_dtypes", "bfloat16 numpy arrays", "torch") from None
        return np.dtype(ml_dtypes.bfloat16)
    try:
        return np.dtype(str(dtype).removeprefix("torch."))
    except TypeError:
        raise InvalidOptionError(f"unknown dtype {dtype!r}", hint="Use float32, float16 or bfloat16") from None


def _torch_dtype(dtype: Any) -> Any:
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        raise MissingDependencyError("torch", "Loading tensors into torch", "torch") from None
    if isinstance(dtype, torch.dtype):
        return dtype
    found = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(found, torch.dtype):
        raise InvalidOptionError(f"unknown dtype {dtype!r}", hint="Use float32, float16 or bfloat16")
    return found
