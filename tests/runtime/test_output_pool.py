"""Output recycling (``runtime/recycle.py``): memory of results the caller dropped is handed out again, and
memory a caller still reaches (the array, a view, a torch tensor over it) never is."""

from __future__ import annotations

import numpy as np
import torch

from nnforge.runtime.recycle import OutputPool, aligned_bytes


def test_pool_reuses_only_unreferenced_buffers():
    pool = OutputPool(keep=4)
    a = pool.empty((5, 7), np.float32)
    assert a.shape == (5, 7) and a.dtype == np.float32 and a.ctypes.data % 64 == 0 and a.flags.c_contiguous
    first = a.ctypes.data
    view = a[2:]
    del a
    b = pool.empty((5, 7), np.float32)
    assert b.ctypes.data != first and pool.reused == 0  # the view still holds the first buffer
    del view
    c = pool.empty((5, 7), np.float32)
    assert c.ctypes.data == first and pool.reused == 1
    t = torch.from_numpy(c)
    del c
    d = pool.empty((5, 7), np.float32)
    assert d.ctypes.data not in (first, t.data_ptr())  # b is held, the tensor holds the first buffer
    del b, d, t
    e = pool.empty((4, 9), np.float64)  # any free buffer of a fitting size, whatever the shape and dtype
    assert e.nbytes == 288 and e.shape == (4, 9)
    big = pool.empty((1000,), np.float32)  # a much smaller buffer than asked for is never returned
    assert big.nbytes == 4000


def test_pool_keeps_at_most_keep_buffers_and_never_a_held_one():
    pool = OutputPool(keep=3)
    held = [pool.empty((8,), np.float32) for _ in range(10)]
    for k, h in enumerate(held):
        h[:] = k
    assert len(pool._bufs) == 3
    more = [pool.empty((8,), np.float32) for _ in range(5)]
    for m in more:
        m[:] = -1
    assert all((h == k).all() for k, h in enumerate(held))
    assert pool.empty((0, 3), np.float32).shape == (0, 3)


def test_aligned_bytes_start_on_a_cache_line():
    for n in (1, 63, 4097):
        b = aligned_bytes(n)
        assert b.shape == (n,) and b.dtype == np.uint8 and b.ctypes.data % 64 == 0
    assert aligned_bytes(0).shape == (0,)  # numpy keeps an empty view's address where it likes: nothing to align
