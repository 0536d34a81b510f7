"""Buffers for decoded blocks, reused instead of allocated afresh.

Decoding a 4 MiB block makes several block-sized arrays (zstd's output, the byte planes put
back, pcodec's numbers, a frame read from disk). Allocated anew, each is fresh zeroed pages
that the kernel faults in one by one: on a delta checkout of 1 GB that is most of the system
time (hundreds of thousands of page faults). `scratch(n)` hands out a uint8 array of n bytes
backed by one of this thread's buffers that nothing else refers to any more, and allocates
only when none is free.

A buffer is free when the only references to it are this pool's: every array or memoryview
made from it (a slice, a view as another dtype, a cache entry, an array a caller still holds)
keeps a reference to it, so a buffer in use is never handed out twice. This is why it is
safe without any release call, and why it works across threads (a block decoded by a worker
and hashed by the main thread is free once the main thread drops it).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

POOLED_MIN, POOLED_MAX = 256 << 10, 8 << 20  # other sizes are allocated as usual (small ones cheaply)
SHARED_MAX = 512 << 20  # bytes of larger buffers kept while `large_buffers` is open
PER_THREAD = 12  # buffers a thread keeps
_FREE_REFS = 3  # the pool's list, the loop variable, getrefcount's argument

_local = threading.local()


def scratch(nbytes: int) -> np.ndarray:
    """A writable uint8 array of `nbytes` (contents undefined), from a reused buffer when
    one of this thread's is free and large enough."""
    if nbytes < POOLED_MIN or getattr(_local, "unpooled", False):
        return np.empty(nbytes, np.uint8)
    if nbytes > POOLED_MAX:
        return _large(nbytes) if _shared.users else np.empty(nbytes, np.uint8)
    pool: list[np.ndarray] | None = getattr(_local, "pool", None)
    if pool is None:
        pool = _local.pool = []
    for buf in pool:
        if buf.nbytes >= nbytes and sys.getrefcount(buf) <= _FREE_REFS:
            return buf[:nbytes]
    buf = np.empty(-(-nbytes // (1 << 20)) << 20, np.uint8)  # whole MiB: a larger block fits next time
    if len(pool) < PER_THREAD:
        pool.append(buf)
    else:  # in place of a free buffer smaller than this one, if any
        for i in range(len(pool)):
            old = pool[i]
            if old.nbytes < buf.nbytes and sys.getrefcount(old) <= _FREE_REFS:
                pool[i] = buf
                break
            del old
    return buf[:nbytes]


@contextmanager
def unpooled() -> Iterator[None]:
    """In this thread, `scratch` allocates arrays of their own size: for decoded tensors a
    caller keeps (a loaded state dict), which a reused, larger buffer would make hold more."""
    before = getattr(_local, "unpooled", False)
    _local.unpooled = True
    try:
        yield
    finally:
        _local.unpooled = before


class _SharedPool:
    """Buffers over POOLED_MAX, shared by every thread, kept only while some `large_buffers`
    context is open (whole tensors: a long-lived process should not keep them)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.buffers: list[np.ndarray] = []


_shared = _SharedPool()


def _large(nbytes: int) -> np.ndarray:
    with _shared.lock:
        best = -1
        for i in range(len(_shared.buffers)):  # (by index: no other reference to count)
            buf = _shared.buffers[i]
            if (
                nbytes <= buf.nbytes <= 2 * nbytes
                and sys.getrefcount(buf) <= _FREE_REFS
                and (best < 0 or buf.nbytes < _shared.buffers[best].nbytes)
            ):
                best = i
            del buf
        if best >= 0:
            return _shared.buffers[best][:nbytes]
        buf = np.empty(-(-nbytes // (1 << 20)) << 20, np.uint8)
        if sum(b.nbytes for b in _shared.buffers) + buf.nbytes <= SHARED_MAX:
            _shared.buffers.append(buf)
        return buf[:nbytes]


@contextmanager
def large_buffers() -> Iterator[None]:
    """While open, `scratch` also reuses buffers of whole large tensors, in every thread.
    A verb that decodes and makes many large tensors one after the other (a merge) opens
    it: each fresh buffer is pages the kernel must zero, which cost a third of such a merge
    on this machine's huge pages. Buffers are released when the last context closes."""
    with _shared.lock:
        _shared.users += 1
    try:
        yield
    finally:
        with _shared.lock:
            _shared.users -= 1
            if not _shared.users:
                _shared.buffers.clear()
