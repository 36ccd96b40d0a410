"""Host memory a compiled program hands out: output buffers recycled once the caller has let go of them, and
64-byte-aligned scratch bytes.

Why: a call's outputs are large (an LSTM layer's ``ys`` at T = 2000, N = 64, H = 96 is 49 MB) and fresh memory
costs the kernel a page fault and a page clear per page on first touch, every call. On the 2-core Zen 3 VM
(2026-11-22) an LSTM layer at 2000,64,96,96 took 187-200 ms per call with fresh output memory (4 KB pages, or
huge pages when the kernel had to compact memory to find them: numpy asks for huge pages on large arrays and
transparent huge pages are in ``madvise`` mode there) and 140 ms with recycled memory (docs/benchmarks.md).
In the common loop ``for chunk in reads: y = f(chunk); use(y)`` each result is dropped
before the next call, so its memory can be handed out again, already mapped and warm.

A buffer is reused only when nothing outside the pool refers to it: every array made from it (the returned
array, its views, ``torch.from_numpy`` of it) keeps a reference to the buffer, so its reference count says
whether the caller still holds any of them. Memory a caller reaches only through a raw pointer
(``arr.ctypes.data``) after dropping the array is not protected, as with any numpy array. The pool holds at
most ``keep`` buffers (the newest): results a caller keeps are never recycled, and the pool pins at most
``keep`` buffers' worth of memory once they are dropped.
"""

from __future__ import annotations

import math
import sys
import threading
from collections import deque

import numpy as np

ALIGN = 64


class OutputPool:
    """Hands out 64-byte-aligned arrays, reusing the memory of earlier ones the caller no longer references."""

    def __init__(self, keep: int):
        self.keep = max(1, keep)
        self._bufs: deque[np.ndarray] = deque()
        self._lock = threading.Lock()  # a concurrent call must not claim the same free buffer
        self.reused = 0  # how many arrays came from recycled memory (for tests and NNFORGE_DEBUG)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialized array of ``shape`` and ``dtype`` (recycled memory when a free buffer fits)."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes == 0:
            return np.empty(shape, dtype)
        with self._lock:
            for buf in self._bufs:
                # free when its only references are the deque, this loop's ``buf`` and getrefcount's argument
                if nbytes <= buf.nbytes - ALIGN <= 2 * nbytes and sys.getrefcount(buf) <= 3:
                    self.reused += 1
                    return _view(buf, shape, dtype, nbytes)
            buf = np.empty(nbytes + ALIGN, np.uint8)
            self._bufs.append(buf)
            while len(self._bufs) > self.keep:
                self._bufs.popleft()
            return _view(buf, shape, dtype, nbytes)


def aligned_bytes(nbytes: int) -> np.ndarray:
    """``nbytes`` uninitialized bytes from a 64-byte-aligned address (vector loads and cache lines want it; an
    empty array's address is numpy's to choose)."""
    return _view(np.empty(nbytes + ALIGN, np.uint8), (nbytes,), np.dtype(np.uint8), nbytes)


def _view(buf: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
    """``shape``/``dtype`` array over ``buf`` from its first 64-byte-aligned byte (its base is ``buf``)."""
    start = -buf.ctypes.data % ALIGN
    return buf[start:start + nbytes].view(dtype).reshape(shape)
