"""Parallel work over tensors: a thread pool (blake3, zstd, pcodec and numpy release the GIL)
fed in order with a bounded window of bytes in flight, so memory stays near a few tensors
whatever the size of the model."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any, TypeVar

T = TypeVar("T")
Progress = Callable[[int], None]  # called with a number of bytes just processed
READ_AHEAD_BYTES = 64 << 20


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def ordered_map(pool: ThreadPoolExecutor, fn: Callable[..., T], items: Iterable[tuple[Any, ...]], *, jobs: int,
                size: Callable[[tuple[Any, ...]], int]) -> Iterator[T]:  # fmt: skip
    """`pool.map` in order, bounded: every worker gets work, and more is queued only while
    the queued items stay under READ_AHEAD_BYTES (so memory is a few tensors, whatever the
    model, and a large tensor does not leave the other workers idle)."""
    pending: deque[tuple[Future[T], int]] = deque()
    in_flight = 0
    for item in items:
        n = size(item)
        while pending and len(pending) >= jobs and in_flight + n > READ_AHEAD_BYTES:
            future, done = pending.popleft()
            in_flight -= done
            yield future.result()
        pending.append((pool.submit(fn, *item), n))
        in_flight += n
    while pending:
        yield pending.popleft()[0].result()


def one_blas_thread() -> AbstractContextManager[Any]:
    """For a pool that already runs one task per core: BLAS threads inside each (a low-rank
    factorization, a rank estimate) would oversubscribe the cores, and OpenBLAS's threads
    spin while they wait (measured: 10x the CPU time of the work on a busy 2-core machine)."""
    from threadpoolctl import (
        threadpool_limits,  # (it inspects the loaded libraries: only when needed)
    )

    return threadpool_limits(1, "blas")
