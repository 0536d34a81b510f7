"""The codec contract and registry.

A codec turns bytes into bytes and back. It is a frozen dataclass whose fields are its
configuration, so a chain of codecs round-trips to plain data
(`[{"name": "byteplanes", "configuration": {"itemsize": 4}}, {"name": "zstd", ...}]`) that is
stored in the header of every object it produced: decoding needs nothing but the object.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from mgit.errors import CodecError

Buffer = bytes | bytearray | memoryview | np.ndarray


OID_RE = re.compile(r"^[0-9a-f]{64}\Z")  # an object id (the codecs sit below mgit.store.objects)


def check_oid(value: object) -> None:
    """Configuration check for codecs that name a base object."""
    if not isinstance(value, str) or not OID_RE.match(value):
        raise ValueError(f"base must be an object id, not {value!r}")


def check_int_width(itemsize: object) -> None:
    """Configuration check for codecs that view items as unsigned integers."""
    if itemsize not in (1, 2, 4, 8) or isinstance(itemsize, bool):
        raise ValueError(f"itemsize must be 1, 2, 4 or 8, not {itemsize!r}")


def load_base(name: str, base: str, ctx: CodecContext) -> np.ndarray:
    """The decoded bytes of the base object a codec is encoded against."""
    if ctx.load_object is None:
        raise CodecError(f"{name} needs its base object {base[:16]}, and none can be loaded here")
    return byte_array(ctx.load_object(base))


def zigzag(signed: np.ndarray) -> np.ndarray:
    """Signed integers -> unsigned of the same width, small magnitudes to small numbers
    (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...)."""
    bits = 8 * signed.dtype.itemsize
    return ((signed << 1) ^ (signed >> (bits - 1))).view(signed.dtype.str.replace("i", "u"))


def unzigzag(unsigned: np.ndarray) -> np.ndarray:
    """The inverse of `zigzag`, as signed integers of the same width."""
    return ((unsigned >> 1) ^ (np.zeros_like(unsigned) - (unsigned & 1))).view(unsigned.dtype.str.replace("u", "i"))


def byte_array(data: Buffer) -> np.ndarray:
    """Any buffer as a flat uint8 array (no copy when it is contiguous)."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, np.uint8)


def writable(data: Buffer) -> np.ndarray:
    """`data` as a flat uint8 array a decoder may change in place: itself when it is a
    writable array (decode_chain hands each codec the output of the one after it, which
    nothing else holds), else a copy (a read-only payload, bytes)."""
    arr = byte_array(data)
    return arr if arr.flags.writeable else arr.copy()


def byte_view(data: Buffer) -> memoryview:
    """Any buffer as a flat view of bytes (no copy for contiguous data, empty ones included)."""
    if isinstance(data, np.ndarray):
        return memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


@dataclass(frozen=True)
class CodecContext:
    """What a codec may need beyond its configuration: the logical size it must produce and,
    for codecs that encode against another object (deltas), a way to load that object."""

    size: int
    load_object: Callable[[str], bytes] | None = None


class Codec:
    """Base class: subclasses are frozen dataclasses with a class-level `name`, and say
    what they are with three more class attributes (one place to read, nothing to keep in
    step elsewhere):

    - `storage`: how a tensor whose chain starts with this codec counts in `du` and `show`:
      `standalone` (coded on its own), `delta` (the difference from a base object) or
      `derived` (a transform of a base object plus a residual);
    - `predictive`: it codes the content against a prediction, which writers check by
      decoding before they keep it (exact deltas are bijections and need no such check);
    - `ends_family`: it may be coded against a base at the delta-depth bound, one link past
      it (a cast, quantized, pruned or transposed copy: nothing is ever coded against it);
    - `blockwise`: it may code content in independent blocks: what it makes of bytes
      [a, b) of the content depends only on those bytes and on bytes [a, b) of its base, so
      a large object can be coded and decoded block by block (docs/format.md, "Blocks").
    """

    name: ClassVar[str]
    storage: ClassVar[str] = "standalone"
    predictive: ClassVar[bool] = False
    ends_family: ClassVar[bool] = False
    blockwise: ClassVar[bool] = False

    def encode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        raise NotImplementedError

    def decode(self, data: Buffer, ctx: CodecContext) -> Buffer:
        """The inverse of `encode`. It may change `data` in place when it is a writable
        array (see `writable`); `encode` never changes its input (a user's tensor)."""
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "configuration": dataclasses.asdict(self)}  # type: ignore[call-overload]

    def max_decoded(self, n: int) -> int:
        """The most bytes `decode` can make of `n` bytes (most codecs keep the size; the
        compressors say how far they expand). Readers bound a declared size by it before
        they allocate anything."""
        return n


_REGISTRY: dict[str, type[Codec]] = {}


def register(cls: type[Codec]) -> type[Codec]:
    """Class decorator: make a codec known by its name."""
    _REGISTRY[cls.name] = cls
    return cls


def codec_class(name: str) -> type[Codec] | None:
    """The registered codec class of a name, or None."""
    return _REGISTRY.get(name)


def storage_of(codec_names: str) -> str:
    """`standalone`, `delta` or `derived`: how an object whose chain is recorded as
    `a+b+c` (or `raw`) is stored, judged by its first codec."""
    cls = _REGISTRY.get(codec_names.split("+")[0])
    return cls.storage if cls is not None else "standalone"


def codec_from_dict(spec: Any) -> Codec:
    """Rebuild one codec from its stored form, refusing unknown names and bad configuration."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise CodecError(f"malformed codec entry {spec!r}")
    cls = _REGISTRY.get(spec["name"])
    if cls is None:
        raise CodecError(
            f"unknown codec {spec['name']!r}",
            hint="The object was written by a newer mgit; upgrade mgit to read it",
        )
    config = spec.get("configuration", {})
    if not isinstance(config, dict):
        raise CodecError(f"malformed configuration for codec {spec['name']!r}")
    try:
        return cls(**config)
    except (TypeError, ValueError) as exc:
        raise CodecError(f"bad configuration for codec {spec['name']!r}: {exc}") from None


def chain_from_list(specs: Any) -> list[Codec]:
    if not isinstance(specs, list):
        raise CodecError(f"malformed codec chain {specs!r}")
    return [codec_from_dict(s) for s in specs]


def chain_to_list(chain: Sequence[Codec]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in chain]


def encode_chain(chain: Sequence[Codec], data: Buffer, ctx: CodecContext) -> bytes:
    for codec in chain:
        data = codec.encode(data, ctx)
    return data if isinstance(data, bytes) else bytes(byte_view(data))


def decoded_bound(chain: Sequence[Codec], n: int) -> int:
    """The most bytes a chain can decode `n` stored bytes into."""
    for codec in reversed(chain):
        n = codec.max_decoded(n)
    return n


def blockwise(chain: Sequence[Codec]) -> bool:
    """Whether a chain may code content in independent blocks (every codec in it may)."""
    return all(c.blockwise for c in chain)


def decode_chain(chain: Sequence[Codec], data: Buffer, ctx: CodecContext) -> Buffer:
    """Undo a chain, last codec first. The result must be exactly `ctx.size` bytes long."""
    for codec in reversed(chain):
        data = codec.decode(data, ctx)
    if byte_view(data).nbytes != ctx.size:
        raise CodecError(f"decoded {byte_view(data).nbytes} bytes where {ctx.size} were expected")
    return data
