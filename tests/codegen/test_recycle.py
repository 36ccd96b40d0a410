"""Output recycling (``codegen/c/recycle.py``): memory of results the caller dropped is handed out again, and
memory a caller still reaches (the array, a view, a torch tensor over it) never is."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch
from test_scan import lstm, lstm_args

import nnforge as nf
from nnforge.codegen.c.recycle import OutputPool

needs_cpu = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


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


@needs_cpu
def test_compiled_results_stay_correct_when_their_memory_is_recycled():
    """Also: results are freed as soon as the caller drops them (no reference cycle waiting for the collector,
    which is off here)."""
    gc.disable()
    try:
        _recycled_results_stay_correct()
    finally:
        gc.enable()


def _recycled_results_stay_correct() -> None:
    fn = nf.compile(lstm, backend="cpu")
    want = nf.compile(lstm, backend="reference")
    kept = []
    for seed in range(4):
        args = lstm_args(T=9, N=5, I=6, H=7, seed=seed)
        got = fn(*args)
        for g, w in zip(got, want(*args)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
        if seed % 2 == 0:
            kept.append((args, [g.copy() for g in got], got))  # hold these results: never overwritten
        del got
    for _args, copies, held in kept:
        for c, h in zip(copies, held):
            np.testing.assert_array_equal(c, h)
    (program,) = {id(p): p for p in fn._entries[0].programs.values()}.values()
    assert program.outputs.reused > 0


@needs_cpu
def test_concurrent_calls_get_their_own_outputs():
    fn = nf.compile(lstm, backend="cpu")
    ref = nf.compile(lstm, backend="reference")
    cases = [lstm_args(T=40, N=6, I=5, H=8, seed=s) for s in range(4)]
    wants = [ref(*a) for a in cases]
    fn(*cases[0])
    errors: list[str] = []

    def worker(k: int) -> None:
        for _ in range(15):
            got = fn(*cases[k])
            for g, w in zip(got, wants[k]):
                if not np.allclose(g, w, rtol=2e-5, atol=2e-5):
                    errors.append(f"thread {k}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@needs_cpu
def test_torch_results_keep_their_memory_while_held():
    """Torch in, torch out: a returned tensor shares the recycled buffer and holds it."""
    fn = nf.compile(lstm, backend="cpu")
    first = [torch.from_numpy(a) for a in lstm_args(T=8, N=4, I=5, H=6, seed=10)]
    held = fn(*first)
    copies = [t.clone() for t in held]
    for seed in range(11, 15):
        fn(*[torch.from_numpy(a) for a in lstm_args(T=8, N=4, I=5, H=6, seed=seed)])
    for c, h in zip(copies, held):
        assert torch.equal(c, h)
