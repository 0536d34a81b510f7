"""Hashing a tensor file as `add` reads it: one pass of memory feeding several hashers, and a
file's digest taken in file order while its tensors are read (mgit.repo.ingest's pool)."""

from __future__ import annotations

from typing import Any

import blake3
import numpy as np

from mgit.codecs import byte_array
from mgit.formats.safetensors import TensorSpan

HASH_PIECE = 1 << 20  # bytes hashed by one hasher, then the next, while they are in cache


def hash_pieces(data: np.ndarray, *hashers: Any) -> None:
    """Feed `data` to each hasher (None: skipped) piece by piece: one read of memory for all."""
    live = [h for h in hashers if h is not None]
    if len(live) == 1:
        live[0].update(data)
        return
    flat = byte_array(data)
    for start in range(0, flat.nbytes, HASH_PIECE):
        piece = flat[start : start + HASH_PIECE]
        for hasher in live:
            hasher.update(piece)


class FileDigest:
    """A tensor file's digest in file order (the skeleton's bytes between the tensors'). A tensor
    is taken as it is read when all before it are in and that touches no page early (one over a
    block, in one pass with its id; a SMALL one), else as it comes back (always in a lossy add:
    the digest covers its reconstruction)."""

    SMALL = 64 << 10

    def __init__(self, skeleton: bytes, data_start: int) -> None:
        self.hasher = blake3.blake3()
        self.skeleton, self.data_start = skeleton, data_start
        self.count = 0  # tensors taken
        self.at = self.taken = 0  # bytes of the file and of the skeleton taken

    def early(self, index: int, data: np.ndarray, large: bool) -> bool:
        return self.count == index and (large or data.nbytes <= self.SMALL)

    def take(self, span: TensorSpan, nbytes: int) -> Any:
        """The skeleton's bytes before this tensor in; the hasher returned takes the tensor's next."""
        gap = self.data_start + span.start - self.at
        self.hasher.update(self.skeleton[self.taken : self.taken + gap])
        self.at += gap + nbytes
        self.taken += gap
        self.count += 1
        return self.hasher
