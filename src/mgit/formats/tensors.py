"""In-memory tensors (numpy arrays, torch tensors) and PyTorch checkpoints as raw tensor bytes.

Everything MGit stores about a tensor is its safetensors dtype name, its shape and its raw
little-endian bytes. This module turns the other ways a user can hand us tensors into that,
loading PyTorch pickles only with `weights_only=True`: a checkpoint that needs anything more
is refused, never unpickled.
"""

from __future__ import annotations

import pickle
import re
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mgit.errors import InputError, MissingDependencyError
from mgit.formats.safetensors import DTYPES, element_count, itemsize

TORCH_SUFFIXES = (".bin", ".pt", ".pth")

_NUMPY_DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "int64": "I64",
    "uint64": "U64",
    "float64": "F64",
    "complex64": "C64",
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
    "float8_e8m0fnu": "F8_E8M0",
}

_TORCH_DTYPES = {
    "torch.bool": "BOOL",
    "torch.uint8": "U8",
    "torch.int8": "I8",
    "torch.int16": "I16",
    "torch.uint16": "U16",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.int32": "I32",
    "torch.uint32": "U32",
    "torch.float32": "F32",
    "torch.int64": "I64",
    "torch.uint64": "U64",
    "torch.float64": "F64",
    "torch.complex64": "C64",
    "torch.float8_e4m3fn": "F8_E4M3",
    "torch.float8_e5m2": "F8_E5M2",
    "torch.float8_e8m0fnu": "F8_E8M0",
}


@dataclass(frozen=True)
class RawTensor:
    """A tensor as MGit sees it: dtype name, shape, and its bytes as a flat uint8 array."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    def __post_init__(self) -> None:
        expected = element_count(self.shape) * itemsize(self.dtype)
        if self.data.nbytes != expected:
            raise ValueError(f"tensor {self.name!r}: {self.data.nbytes} bytes for {self.dtype}{list(self.shape)}")


def is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def raw_from_value(name: str, value: Any) -> RawTensor:
    """A numpy array or a torch tensor as a RawTensor (copied only when not contiguous)."""
    if is_torch_tensor(value):
        dtype = _TORCH_DTYPES.get(str(value.dtype))
        if dtype is None:
            raise InputError(name, f"unsupported tensor dtype {value.dtype}")
        t = value.detach().cpu().contiguous()
        data = t.reshape(-1).view(_torch().uint8).numpy() if t.numel() else np.empty(0, np.uint8)
        return RawTensor(name, dtype, tuple(t.shape), data)
    if isinstance(value, np.ndarray):
        dtype = _NUMPY_DTYPES.get(value.dtype.name)
        if dtype is None:
            raise InputError(name, f"unsupported array dtype {value.dtype}")
        arr = value
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        arr = np.ascontiguousarray(arr)
        return RawTensor(name, dtype, tuple(arr.shape), arr.reshape(-1).view(np.uint8))
    raise InputError(name, f"expected a numpy array or a torch tensor, got {type(value).__name__}")


def flatten_state_dict(state: Mapping[str, Any], where: str) -> Iterator[tuple[str, Any]]:
    """Yield (dotted name, tensor) from a possibly nested dict of tensors."""
    for key, value in state.items():
        if not isinstance(key, str):
            raise InputError(where, f"state dict key {key!r} is not a string")
        if isinstance(value, Mapping):
            for sub, tensor in flatten_state_dict(value, where):
                yield f"{key}.{sub}", tensor
        elif is_torch_tensor(value) or isinstance(value, np.ndarray):
            yield key, value
        else:
            raise InputError(
                where,
                f"entry {key!r} is not a tensor (it is of type {type(value).__name__})",
                hint="Store only the weights: save model.state_dict() (or checkpoint['state_dict']) on its own",
            )


def raw_tensors(state: Mapping[str, Any], where: str) -> list[RawTensor]:
    tensors = [raw_from_value(name, value) for name, value in flatten_state_dict(state, where)]
    if not tensors:
        raise InputError(where, "holds no tensors")
    return tensors


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        raise MissingDependencyError("torch", "Reading PyTorch checkpoints", "torch") from None
    return torch


# torch.save's zip archive, or a pickle (protocol 2-5: torch's legacy format and a bare pickle)
CHECKPOINT_MAGIC = (b"PK\x03\x04", b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _first_line(exc: BaseException) -> str:
    text = _ANSI.sub("", str(exc)).strip()
    return text.splitlines()[0][:160] if text else type(exc).__name__


def load_torch_checkpoint(path: Path) -> list[RawTensor]:
    """Load a PyTorch checkpoint with `weights_only=True`; anything else is refused."""
    torch = _torch()
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None
    if not magic.startswith(CHECKPOINT_MAGIC):
        raise InputError(
            str(path),
            "not a PyTorch checkpoint: neither the zip archive torch.save writes nor a pickle",
            hint="Add the folder that holds it: a folder keeps it byte for byte as a file",
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about old pickle protocols on stderr
            try:
                state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        text = _ANSI.sub("", str(exc))
        found = _GLOBAL.search(text)
        if found is None and "Weights only load failed" not in text:
            raise InputError(str(path), f"not a PyTorch checkpoint ({_first_line(exc)})") from None
        what = f"it references {found.group(1)}, which" if found else "it holds objects that"
        raise InputError(
            str(path),
            f"not a plain weights file: {what} only a full unpickler would load, and mgit never "
            "runs the code inside a pickle",
            hint="Re-save only the weights: torch.save(model.state_dict(), path), or save as safetensors",
        ) from None
    except OSError as exc:
        raise InputError(str(path), f"cannot read file ({exc.strerror or exc})") from None
    except Exception as exc:  # torch raises many types for a damaged archive
        detail = _first_line(exc) if not isinstance(exc, KeyError | IndexError) else "damaged or not a checkpoint"
        raise InputError(str(path), f"not a readable PyTorch checkpoint ({detail})") from None
    if is_torch_tensor(state):
        state = {"weight": state}
    if not isinstance(state, Mapping):
        raise InputError(str(path), f"holds a {type(state).__name__}, not a dict of tensors")
    return raw_tensors(state, str(path))


def torch_dtype_of(dtype: str) -> Any:
    """The torch dtype of a safetensors dtype name (InputError if this torch lacks it)."""
    torch = _torch()
    name = next(k for k, v in _TORCH_DTYPES.items() if v == dtype).removeprefix("torch.")
    if not hasattr(torch, name):
        raise InputError(dtype, f"this version of torch has no {name}")
    return getattr(torch, name)


def to_torch(data: np.ndarray, dtype: str, shape: tuple[int, ...], *, copy: bool = True) -> Any:
    """Raw tensor bytes as a torch tensor of its own dtype: a private, writable copy, or with
    `copy=False` a view of `data` itself (its memory shared, whatever numpy's write flag)."""
    torch = _torch()
    torch_dtype = torch_dtype_of(dtype)
    if data.nbytes == 0:
        return torch.empty(shape, dtype=torch_dtype)
    if copy:
        return torch.frombuffer(bytearray(data), dtype=torch_dtype).reshape(shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns of a buffer numpy marks read-only
        return torch.frombuffer(data, dtype=torch_dtype).reshape(shape)


assert set(_NUMPY_DTYPES.values()) <= set(DTYPES)
