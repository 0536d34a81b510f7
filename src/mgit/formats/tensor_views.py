"""A tensor that views part of a storage: what a PyTorch checkpoint holds for each name of its
state dict (`torch._utils._rebuild_tensor_v2(storage, offset, shape, stride)`). Several names
may view one storage (tied weights), at an offset, with any strides (a transpose). Kept apart
from the parser so that the records that hold views (`mgit.store.objects`) need no numpy."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

MAX_DIMS = 64


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides (in elements) of a row-major tensor of this shape."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class TensorView:
    """Name `name` is `shape` elements of storage number `storage` (of its file), starting at
    element `offset`, dimension i stepping `stride[i]` elements."""

    name: str
    storage: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def span(self) -> tuple[int, int]:
        """The elements of its storage it reads: [first, last + 1), or (offset, offset) when empty."""
        if any(d == 0 for d in self.shape):
            return self.offset, self.offset
        last = self.offset + sum((d - 1) * s for d, s in zip(self.shape, self.stride, strict=True))
        return self.offset, last + 1

    def is_whole(self, numel: int) -> bool:
        """Whether it is its whole storage, row-major: the storage is this tensor."""
        return (
            self.offset == 0
            and math.prod(self.shape) == numel
            and all(
                d == 1 or s == c
                for d, s, c in zip(self.shape, self.stride, contiguous_strides(self.shape), strict=True)
            )
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "storage": self.storage,
            "offset": self.offset,
            "shape": list(self.shape),
            "stride": list(self.stride),
        }

    @classmethod
    def from_json(cls, d: Any, numels: list[int]) -> TensorView:
        """A view as a manifest holds it, checked against its file's storages (their element
        counts): it must read only elements of its storage. Raises ValueError."""
        if not isinstance(d, dict) or set(d) != {"name", "storage", "offset", "shape", "stride"}:
            raise ValueError("a tensor view is not {name, storage, offset, shape, stride}")
        name, storage, offset = d["name"], _count(d["storage"], "storage"), _count(d["offset"], "offset")
        if not isinstance(name, str) or not name:
            raise ValueError("a tensor view's name is not a string")
        shape, stride = d["shape"], d["stride"]
        if not isinstance(shape, list) or not isinstance(stride, list) or len(shape) != len(stride):
            raise ValueError(f"view {name!r}: shape and stride are not lists of one length")
        if len(shape) > MAX_DIMS:
            raise ValueError(f"view {name!r} has more than {MAX_DIMS} dimensions")
        if storage >= len(numels):
            raise ValueError(f"view {name!r} names storage {storage} of {len(numels)}")
        view = cls(
            name,
            storage,
            offset,
            tuple(_count(x, "dimension") for x in shape),
            tuple(_count(x, "stride") for x in stride),
        )
        if view.span()[1] > numels[storage]:
            raise ValueError(f"view {name!r} reads beyond its storage ({numels[storage]} elements)")
        return view


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
        raise ValueError(f"a tensor view's {what} is not a count")
    return value


def check_storages(offsets: Any, sizes: list[int], file_size: int) -> tuple[int, ...]:
    """Where a file's storages lie (their byte offsets in the file, in file order), checked
    against their sizes and the file's: in order, no overlap, inside the file. Raises ValueError."""
    if not isinstance(offsets, list) or len(offsets) != len(sizes):
        raise ValueError("storage_offsets is not one offset per tensor")
    cursor = 0
    for at, size in zip(offsets, sizes, strict=True):
        _count(at, "storage offset")
        if at < cursor:
            raise ValueError(f"a storage at byte {at} overlaps the one before it")
        cursor = at + size
    if cursor > file_size:
        raise ValueError(f"a storage ends at byte {cursor}, beyond the file ({file_size} bytes)")
    return tuple(offsets)


def storages_and_views(
    d: dict[str, Any], kind: str, numels: list[int], sizes: list[int], file_size: int
) -> tuple[tuple[int, ...], tuple[TensorView, ...]]:
    """A manifest file entry's `storage_offsets` and `views` (a torch-zip file's; a gguf
    file's tensors have offsets and no views; no other file has either), checked against its
    storages' element counts and sizes and the file's size. Raises ValueError."""
    if kind == "gguf":
        if "views" in d:
            raise ValueError("only a torch-zip file has views")
        return check_storages(d.get("storage_offsets"), sizes, file_size), ()
    if kind != "torch-zip":
        if {"storage_offsets", "views"} & set(d):
            raise ValueError("only a torch-zip file has views")
        return (), ()
    views = d.get("views")
    if not isinstance(views, list):
        raise ValueError("views is not a list")
    offsets = check_storages(d.get("storage_offsets"), sizes, file_size)
    parsed = tuple(TensorView.from_json(v, numels) for v in views)
    if len({v.name for v in parsed}) != len(parsed):
        raise ValueError("a view name is listed twice")
    return offsets, parsed
