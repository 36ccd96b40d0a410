"""The C program's call path (``CProgram`` on ``runtime.program.CompiledProgram``): sizes read from the inputs per
call (shapes planned once), its checks, outputs whose shape is an expression of a run-time size, results whose
memory is recycled and concurrent calls (``nf_main`` runs without the GIL)."""

from __future__ import annotations

import gc
import threading

import numpy as np
import pytest
import torch
from test_scan import lstm, lstm_args

import nnforge as nf
from nnforge.errors import NNForgeError

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def _program(fn, *args):
    from nnforge.codegen.c import CpuBackend

    return CpuBackend()(nf.compile(fn).trace(*args))


def flat_ys(*args):
    ys, h, c = lstm(*args)
    return ys.reshape(-1, ys.shape[-1]), h + c  # [T * N, H]: an expression of the trip count


def test_one_program_serves_every_trip_count_and_checks_its_inputs():
    args = lstm_args(T=5, N=3, I=4, H=6)
    program = _program(flat_ys, *args)
    ref = nf.compile(flat_ys, backend="reference")
    for T in (5, 1, 17):
        a = lstm_args(T=T, N=3, I=4, H=6, seed=T)
        got = program(a)
        assert got[0].shape == (T * 3, 6) and got[1].shape == (3, 6)
        for g, w in zip(got, ref(*a)):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    with pytest.raises(NNForgeError, match="takes 6 inputs, got 5"):
        program(args[:5])
    bad = list(args)
    bad[1] = np.zeros((4, 6), np.float32)  # batch 4 where the program was built for 3
    with pytest.raises(NNForgeError, match=r"has shape \[4, 6\], expected \[3, 6\]"):
        program(bad)


def test_inputs_that_disagree_on_a_run_time_size_are_refused(rng: np.random.Generator):
    """Two sequences of one scan must have the same length; the error names the input."""
    def two_sequences(x, y, h0, w):
        def cell(h, xy):
            a, b = xy
            return nf.tanh(a + b + h @ w), h

        return nf.scan(cell, h0, (x, y))

    x, y = rng.standard_normal((5, 2, 3)).astype(np.float32), rng.standard_normal((5, 2, 3)).astype(np.float32)
    h0, w = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((3, 3)).astype(np.float32)
    program = _program(two_sequences, x, y, h0, w)
    assert program([x, y, h0, w])[1].shape == (5, 2, 3)
    with pytest.raises(NNForgeError, match=r"disagree on size|'arg1' has shape \[4, 2, 3\], expected \[5, 2, 3\]"):
        program([x, y[:4], h0, w])


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
