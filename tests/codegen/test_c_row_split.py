"""Row-split scans on the CPU backend: each thread runs every time step on its own batch rows (no barrier per step).
Checked against the reference interpreter for cells with reductions, several outputs, per-row invariants, reverse
scans, uneven splits and other thread counts; and that the split happens exactly where it should."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_gemm import ln_lstm as ln_lstm_forward
from test_gemm import ln_lstm_step
from test_scan import lstm

import nnforge as nf
from nnforge.codegen.c.gemm import GemmConfig
from nnforge.schedule import Block, Elementwise, Gemm, Loop, schedule

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")
ROWS = GemmConfig().mr  # rows per pass: one 6 x 16 tile (these widths are not whole 24-column tiles)


def ln_lstm(x, h0, c0, w_ih, w_hh, b):
    """test_gemm's layer-norm LSTM, run in reverse, with a step output wider than the carries."""

    def cell(carry, x_t):
        h, c = ln_lstm_step(*carry, x_t, w_ih, w_hh, b)
        return (h, c), nf.concat([h, c], axis=-1)

    (h, c), ys = nf.scan(cell, (h0, c0), x, reverse=True)
    return ys, h, c


def gru_masked(x, h0, w_ih, w_hh, b, mask):
    """A GRU whose reset gate multiplies h before the recurrent matmul, a per-row mask (a loop-invariant [N, H]),
    and a carry that is passed through unchanged."""

    def cell(carry, x_t):
        h, k = carry
        xr, xz, xn = (x_t @ w_ih.T + b).chunk(3, axis=-1)
        hr, hz, _ = (h @ w_hh.T).chunk(3, axis=-1)
        r, z = nf.sigmoid(xr + hr), nf.sigmoid(xz + hz)
        n = nf.tanh(xn + (r * h) @ w_hh[2 * h.shape[1]:].T)
        h = ((1.0 - z) * n + z * h) * mask
        return (h, k), h.sum(-1, keepdims=True)

    (h, k), ys = nf.scan(cell, (h0, h0 * 2.0), x)
    return ys, h, k


def _lstm_args(rng: np.random.Generator, T, N, I, H, dt=np.float32):
    shapes = [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]
    return [(rng.standard_normal(s) * 0.5).astype(dt) for s in shapes]


def _gru_args(rng: np.random.Generator, T, N, I, H, dt=np.float32):
    shapes = [(T, N, I), (N, H), (3 * H, I), (3 * H, H), (3 * H,)]
    args = [(rng.standard_normal(s) * 0.5).astype(dt) for s in shapes]
    return [*args, (rng.random((N, H)) > 0.3).astype(dt)]


def _check(fn, args, dt=np.float32) -> None:
    tol = 3e-5 if dt == np.float32 else 1e-11
    want = nf.compile(fn)(*args)
    got = nf.compile(fn, backend="cpu")(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def _loops(fn, args) -> list[Loop]:
    """The scans of ``fn``'s program as the CPU target schedules it (outer first)."""
    from nnforge.codegen.c import prepare
    from nnforge.codegen.c.target import cpu_target

    return schedule(prepare(nf.compile(fn).trace(*args)), cpu_target()).loops()


def _split(loop: Loop) -> bool:
    return loop.parallel is not None


@pytest.mark.parametrize("N", [12, 13, 37, 64])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_lstm_rows(rng: np.random.Generator, N: int, dt) -> None:
    args = _lstm_args(rng, 5, N, 7, 9, dt)
    (loop,) = _loops(lstm, args)
    assert _split(loop) and loop.row_block == ROWS  # the sliced GEMM's c and h: two kernels, a 6-row tile each pass
    _check(lstm, args, dt)


@pytest.mark.parametrize("N", [12, 29])
def test_layer_norm_lstm_reverse_and_wide_outputs(rng: np.random.Generator, N: int) -> None:
    args = _lstm_args(rng, 6, N, 5, 8)
    (loop,) = _loops(ln_lstm, args)
    assert _split(loop) and loop.row_block == ROWS and loop.reverse
    _check(ln_lstm, args)


@pytest.mark.parametrize("N", [12, 31])
def test_gru_with_per_row_mask_and_passed_through_carry(rng: np.random.Generator, N: int) -> None:
    args = _gru_args(rng, 4, N, 6, 10)
    (loop,) = _loops(gru_masked, args)
    assert _split(loop) and loop.row_block == ROWS and loop.parallel.per_row  # the mask is read row by row
    _check(gru_masked, args)


def test_small_batches_and_row_mixing_bodies_stay_work_shared(rng: np.random.Generator) -> None:
    assert not _split(_loops(lstm, _lstm_args(rng, 4, 3, 5, 6))[0])  # too few rows to split

    def batch_norm_rnn(x, h0, w):
        def cell(h, x_t):
            z = h @ w + x_t
            h = nf.tanh(z - z.mean(0, keepdims=True))  # couples the rows
            return h, h

        return nf.scan(cell, h0, x)

    args = [rng.standard_normal(s).astype(np.float32) for s in ((5, 24, 8), (24, 8), (8, 8))]
    assert not _split(_loops(batch_norm_rnn, args)[0])
    _check(batch_norm_rnn, args)


@pytest.mark.parametrize("T,N,H", [(4, 14, 6), (70, 12, 6), (3, 16, 100)])
def test_gradients_through_a_row_split_scan_float64(rng: np.random.Generator, T: int, N: int, H: int) -> None:
    """Both scans of the gradient split by rows (the backward one's weight-gradient sums hoisted); the backward
    one reads the forward's input projection and its stacked ``h_{t-1} @ W_hhᵀ``, buffers that must live until
    the loop ends (the projection's memory was handed to the next buffer once, and the bias was added twice:
    float64 values against the reference catch either)."""
    from nnforge.codegen.c import prepare
    from nnforge.codegen.c.target import cpu_target

    def loss(*args):
        ys, h, c = lstm(*args)
        return (ys * ys).sum() + (h * c).mean()

    args = _lstm_args(rng, T, N, 5, H, np.float64)
    g = nf.grad(loss, argnums=tuple(range(6)))
    program = schedule(prepare(nf.compile(g).trace(*args)), cpu_target())
    forward, backward = program.loops()
    assert _split(forward) and _split(backward) and backward.reverse and not backward.chunked
    _check(g, args, np.float64)


CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    sys.path.insert(0, {tests!r})
    import nnforge as nf
    from test_c_row_split import lstm, _lstm_args
    out = {{}}
    rng = np.random.default_rng({seed})
    for N, T in ((12, 3), (13, 3), (19, 3), (13, 150), (12, 70)):
        args = _lstm_args(rng, T, N, 4, 5)
        want = nf.compile(lstm)(*args)
        got = nf.compile(lstm, backend="cpu")(*args)
        out[f"{{N}},{{T}}"] = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
    print(json.dumps(out))
""")


@pytest.mark.parametrize("threads", [1, 3, 5])
def test_other_thread_counts(rng: np.random.Generator, threads: int) -> None:
    """Rows are split in whole 6-row blocks among however many threads OpenMP starts: more threads than blocks
    leaves some with no rows, one thread takes them all; over 70 or 150 steps each thread also projects its
    rows of the input chunk by chunk (none where it has no rows)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    code = CHILD.format(tests=os.path.dirname(__file__), seed=int(rng.integers(1 << 31)))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    errs = json.loads(res.stdout.strip().splitlines()[-1])
    assert all(e < 3e-5 for e in errs.values()), errs


def test_wide_weights_stay_work_shared(rng: np.random.Generator, caplog: pytest.LogCaptureFixture) -> None:
    """W_hh of H = 384 (2.3 MB in f32) does not fit half of L2: each thread would stream all of it every step."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="nnforge.schedule"):
        (loop,) = _loops(lstm, _lstm_args(rng, 2, 16, 4, 384))
    assert not _split(loop)
    assert any("exceed 512 KB" in r.getMessage() for r in caplog.records)
    assert _split(_loops(lstm, _lstm_args(rng, 2, 16, 4, 128))[0])  # W_hh 256 KB


@pytest.mark.parametrize("fn,T,dt", [(lstm, 150, np.float32), (ln_lstm, 70, np.float64)])
def test_input_projection_computed_chunk_by_chunk(rng: np.random.Generator, fn, T: int, dt) -> None:
    """A long sequence: the hoisted input projection of a row-split scan is computed 64 steps at a time inside the
    loop (N = 16, 4H = 32 values per row) — several chunks and a partial last one, forward and (the layer-norm
    LSTM) in reverse. The layer-norm LSTM runs in float64: over 70 steps its normalisations amplify float32
    rounding past any fixed float32 tolerance now and then (a rare 4e-5 difference was seen), which says nothing
    about the chunking; in float64 the two backends must agree to 1e-11."""
    args = _lstm_args(rng, T, 16, 5, 8, dt)
    (loop,) = _loops(fn, args)
    (chunk,) = loop.chunked
    assert chunk.k == 0 and chunk.steps == 64 and chunk.gemm.b_resident, loop
    assert chunk.gemm.out.shape == (64 * 16, 32)
    _check(fn, args, dt)


def test_each_thread_projects_its_own_rows_without_a_barrier(rng: np.random.Generator) -> None:
    """A chunk of the projection is computed by each thread for its own rows, step by step: from the time loop's
    start to the barrier after it there is no OpenMP construct (no barrier around the chunk, no work sharing);
    uneven splits (37 rows) and odd thread counts are ``test_other_thread_counts``' and ``test_lstm_rows``'."""
    from nnforge.codegen.c import lower, prepare

    args = _lstm_args(rng, 150, 16, 5, 8)
    src = lower(prepare(nf.compile(lstm).trace(*args))).source()
    start = re.search(r"for \(int64_t (\w+) = 0; \1 < S\[\d+\]; \1\+\+\) \{", src).start()
    loop = src[start:src.index("#pragma omp barrier", start)]
    assert "% 64 == 0" in loop and "nf_ukr" in loop and "#pragma omp" not in loop
    _check(lstm, args)


def test_training_chunks_the_projection_and_saves_gate_sums(rng: np.random.Generator) -> None:
    """In a training step the forward stacks each step's gate pre-activations (projection + bias + ``h @
    W_hhᵀ``) for the backward step, which then reads neither the projection nor anything to recompute: the
    forward computes the projection chunk by chunk as inference does, and the row-split backward loop reads its
    one stacked input per step."""

    def loss(*args):
        return (lstm(*args)[0] ** 2).sum()

    args = _lstm_args(rng, 70, 16, 5, 8)
    g = nf.grad(loss, argnums=(3, 4, 5))
    forward, backward = _loops(g, args)
    assert forward.chunked and _split(backward) and not backward.chunked
    _check(g, args)


def _body(fn, args) -> Block:
    (loop,) = _loops(fn, args)
    return loop.body


@pytest.mark.parametrize("N", [12, 64])
def test_step_output_that_is_also_a_carry_is_stored_once_per_buffer(rng: np.random.Generator, N: int) -> None:
    """The layer-norm LSTM's h is the next carry and this step's row of ys: the elementwise kernel computing it
    stores it to both (two stores in one loop), instead of a second kernel copying it over (row-split or not).
    The only copies left are the two initial carries."""
    args = _lstm_args(rng, 5, N, 7, 16)
    body = _body(ln_lstm_forward, args)
    (h_kernel,) = [k for k in body.kernels if k.also]
    assert isinstance(h_kernel, Elementwise) and "tanh" in h_kernel.fuses
    assert (h_kernel.out.output, h_kernel.also) == (0, (2,))  # the next h, and this step's row of ys
    assert not body.copies
    _check(ln_lstm_forward, args)


def gru_cho(x, h0, w_ih, w_hrz, w_hn, b):
    """A GRU with the reset gate applied before its second matmul: h is that GEMM's epilogue."""

    def cell(h, x_t):
        xr, xz, xn = (x_t @ w_ih.T + b).chunk(3, axis=-1)
        hr, hz = (h @ w_hrz.T).chunk(2, axis=-1)
        r, z = nf.sigmoid(xr + hr), nf.sigmoid(xz + hz)
        h = (1.0 - z) * nf.tanh(xn + (r * h) @ w_hn.T) + z * h
        return h, h

    h, ys = nf.scan(cell, h0, x)
    return ys, h


@pytest.mark.parametrize("N,H", [(12, 16), (13, 20), (4, 20)])
def test_step_output_computed_by_a_gemm_epilogue_is_stored_by_it(rng: np.random.Generator, N: int, H: int) -> None:
    """The GRU's h (next carry and row of ys) is stored to both by the GEMM whose epilogue computes it — row-split
    or work-shared, full and partial column tiles (H = 20: the scalar tail); the one copy left is the initial h."""
    shapes = [(5, N, 7), (N, H), (3 * H, 7), (2 * H, H), (H, H), (3 * H,)]
    args = [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in shapes]
    body = _body(gru_cho, args)
    (h_kernel,) = [k for k in body.kernels if k.also]
    assert isinstance(h_kernel, Gemm) and h_kernel.epilogue is not None and "tanh" in h_kernel.fuses
    assert (h_kernel.out.output, h_kernel.also) == (0, (1,)) and h_kernel.b_resident
    assert not body.copies
    _check(gru_cho, args)


def _separate(a: np.ndarray, b: np.ndarray) -> None:
    np.testing.assert_array_equal(a, b)
    a.flat[0] += 1.0
    assert b.flat[0] != a.flat[0]


def test_value_returned_twice_gets_two_buffers(rng: np.random.Generator) -> None:
    """A value returned twice is stored by its kernel to both outputs, which stay separate arrays: an elementwise
    kernel, a GEMM, a GEMM's epilogue, and the packed-A GEMM that keeps partial sums over K in its output (the
    second output gets the final sums, not the first slice's)."""
    v = rng.standard_normal((5, 19)).astype(np.float32)
    a, b = nf.compile(lambda x: (nf.tanh(x) * 2.0,) * 2, backend="cpu")(v)
    np.testing.assert_allclose(a, np.tanh(v) * 2.0, rtol=1e-6, atol=1e-6)
    _separate(a, b)
    x, w = rng.standard_normal((600, 13)), rng.standard_normal((600, 21))
    for fn, want in [(lambda p, q: (p.T @ q,) * 2, x.T @ w), (lambda p, q: (nf.tanh(p.T @ q),) * 2, np.tanh(x.T @ w)),
                     (lambda p, q: (p[:9] @ q[:13],) * 2, x[:9] @ w[:13])]:
        a, b = nf.compile(fn, backend="cpu")(x, w)
        np.testing.assert_allclose(a, want, rtol=1e-11, atol=1e-11)
        _separate(a, b)
