"""Parallel work over tensors: a thread pool (blake3, zstd, pcodec and numpy release the GIL)
fed in order with a bounded window of bytes in flight, so memory stays near a few tensors
whatever the size of the model."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, suppress
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:  # (concurrent.futures loads logging: a command that runs no pool does without it)
    from concurrent.futures import Future, ThreadPoolExecutor

T = TypeVar("T")
Progress = Callable[[int], None]  # called with the units (bytes, objects) just done
# What a verb's `progress=` takes: called once with the work's total units, it returns the
# Progress to call as they are done, or None.
StartProgress = Callable[[int], Progress | None]
READ_AHEAD_BYTES = 64 << 20


class TransferProgress(Protocol):
    """A transfer's progress (push, fetch): called with the bytes just moved, and with
    `objects=1` as each object is done (a large object reports its bytes part by part)."""

    def __call__(self, nbytes: int, objects: int = 0) -> None: ...


# What push and fetch take as `progress=`: called once with the total bytes and objects, it
# returns the TransferProgress to call as they move, or None.
StartTransfer = Callable[[int, int], TransferProgress | None]


def default_jobs() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def ordered_map(
    pool: ThreadPoolExecutor,
    fn: Callable[..., T],
    items: Iterable[tuple[Any, ...]],
    *,
    jobs: int,
    size: Callable[[tuple[Any, ...]], int],
) -> Iterator[T]:
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


class ChunkQueue:
    """Chunks handed from one thread to a writer in another, in order: the writer iterates
    (`write_record(oid, queue)`, run by `start`) while the producer `put`s, then `close`s,
    or `fail`s, which makes the writer raise (and so drop its temporary file). Bounded: a
    producer faster than the disk waits, and one whose writer has failed gets its error."""

    _END = object()

    def __init__(self, maxsize: int = 32) -> None:
        import queue

        self._queue: queue.Queue[Any] = queue.Queue(maxsize)
        self.writer: Future[Any] | None = None

    def start(self, pool: ThreadPoolExecutor, write: Callable[[Iterable[Any]], T]) -> Future[T]:
        self.writer = pool.submit(write, self)
        return self.writer

    def _offer(self, item: Any) -> None:
        import queue

        while True:
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                if self.writer is not None and self.writer.done():
                    self.writer.result()  # the writer's error, if it stopped on one
                    return

    def put(self, chunk: Any) -> None:
        self._offer(chunk)

    def close(self) -> None:
        self._offer(self._END)

    def fail(self, exc: BaseException) -> None:
        with suppress(BaseException):  # the writer failed too: the caller raises the first error
            self._offer(_Failure(exc))

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self._queue.get()
            if item is self._END:
                return
            if isinstance(item, _Failure):
                raise item.exc
            yield item


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
