"""Row separability of scan bodies (``passes.rows``): which bodies may have their batch rows split among threads,
why the others may not, and the rewritten body (batch axis -> the symbol ``ROWS``)."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c.target import cpu_target
from nnforge.ir.dims import Dim
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.rows import ROWS, NotSeparable, RowSplit, row_split, step_weight_bytes, worth_splitting


def _scan_of(fn, *args, cpu: bool = True):
    graph = nf.compile(fn).trace(*args)
    if cpu:
        graph = run_pipeline(graph, pipeline(cpu_target()))
    (scan,) = [n for n in graph.order if n.op == Op.SCAN]
    return scan


def _rows(d) -> bool:
    return isinstance(d, Dim) and d.expr[:2] == ("sym", ROWS)


def _ln(v):
    mu = v.mean(-1, keepdims=True)
    d = v - mu
    return d / nf.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


def lstm(x, h0, c0, w_ih, w_hh, b, norm=False, reverse=False):
    def cell(carry, x_t):
        h, c = carry
        z = x_t @ w_ih.T + h @ w_hh.T + b
        i, f, g, o = (_ln(z) if norm else z).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(_ln(c) if norm else c)
        return (h, c), h

    return nf.scan(cell, (h0, c0), x, reverse=reverse)


def _args(rng: np.random.Generator, T=4, N=16, I=5, H=6):
    shapes = [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("norm", [False, True])
@pytest.mark.parametrize("cpu", [False, True])
def test_lstm_and_layer_norm_lstm_are_row_separable(rng: np.random.Generator, norm: bool, cpu: bool) -> None:
    """The norm reduces over features, not the batch: still one thread's rows are independent of the others'."""
    scan = _scan_of(lambda *a: lstm(*a, norm=norm), *_args(rng), cpu=cpu)
    split = row_split(scan)
    assert isinstance(split, RowSplit), split
    assert split.batch == 16
    body = split.body
    nc, nx = scan.attrs["n_carry"], scan.attrs["n_xs"]
    assert all(_rows(i.shape[0]) for i in body.inputs[:nc + nx])
    assert all(_rows(o.shape[0]) for o in body.outputs)
    # weights keep their sizes: only the batch axis became the symbol
    assert not any(_rows(d) for i in body.inputs[nc + nx:] if i.attrs["shape"] and int(i.attrs["shape"][0]) != 16
                   for d in i.attrs["shape"])
    assert [tuple(map(int, o.shape)) for o in body.outputs] == [tuple(map(int, o.shape)) for o in
                                                                 scan.attrs["body"].outputs]


def _reason(fn, *args) -> str:
    split = row_split(_scan_of(fn, *args, cpu=False))
    assert isinstance(split, NotSeparable), "expected the body to mix batch rows"
    return str(split)


def test_bodies_that_mix_rows_are_refused_with_the_reason(rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 8, 4)).astype(np.float32)
    h0 = rng.standard_normal((8, 4)).astype(np.float32)

    def batch_norm(h0, x):  # the mean over the batch couples every row
        return nf.scan(lambda h, x_t: ((h + x_t) - (h + x_t).mean(0, keepdims=True),) * 2, h0, x)

    assert "reduces over the batch axis" in _reason(batch_norm, h0, x)

    w = rng.standard_normal((8, 8)).astype(np.float32)

    def mix(h0, x, w):  # w @ h contracts the batch axis
        return nf.scan(lambda h, x_t: (w @ h + x_t,) * 2, h0, x)

    assert "contracts the batch axis" in _reason(mix, h0, x, w)

    def gram(h0, x):  # h.T moves the batch axis
        return nf.scan(lambda h, x_t: (h + x_t @ (h.T @ h),) * 2, h0, x)

    assert "moves the batch axis" in _reason(gram, h0, x)

    def roll(h0, x):  # row b reads row b+1
        return nf.scan(lambda h, x_t: (nf.concat([h[1:], h[:1]], axis=0) + x_t,) * 2, h0, x)

    assert "batch axis" in _reason(roll, h0, x)

    def flip(h0, x):  # the batch axis moves
        return nf.scan(lambda h, x_t: ((h + x_t).T.T * 1.0, (h + x_t).T), h0, x)

    assert "batch axis" in _reason(flip, h0, x)


def test_invariant_with_batch_axis_is_given_per_row(rng: np.random.Generator) -> None:
    """A loop-invariant [N, H] read element by element (a mask, an expanded bias) is split with the rows."""
    x = rng.standard_normal((3, 8, 4)).astype(np.float32)
    h0 = rng.standard_normal((8, 4)).astype(np.float32)
    mask = (rng.random((8, 4)) > 0.5).astype(np.float32)

    def masked(h0, x, mask):
        return nf.scan(lambda h, x_t: (nf.tanh(h + x_t) * mask,) * 2, h0, x)

    scan = _scan_of(masked, h0, x, mask, cpu=False)
    split = row_split(scan)
    assert isinstance(split, RowSplit), split
    (k,) = split.per_row
    assert scan.srcs[k].shape == (8, 4) and _rows(split.body.inputs[k].shape[0])

    def whole(h0, x, mask):  # the same invariant also read whole (as a matmul operand): not splittable
        return nf.scan(lambda h, x_t: (nf.tanh(h + x_t) * mask + h @ mask * 0.1,) * 2, h0, x)

    sq = rng.standard_normal((8, 8)).astype(np.float32)
    split = row_split(_scan_of(whole, sq, x.repeat(2, axis=2), sq, cpu=False))
    assert isinstance(split, NotSeparable) and "read both per row and whole" in str(split)


def test_step_weights_count_only_what_the_loop_reads_each_step(rng: np.random.Generator) -> None:
    """h @ W_hh counts, x_t @ W_ih does not (hoisting takes it out): same answer before and after the CPU passes."""
    args = _args(rng, N=16, I=5, H=6)
    for cpu in (False, True):
        assert step_weight_bytes(_scan_of(lstm, *args, cpu=cpu)) == 4 * 6 * 6 * 4
        # a GPU program holds W_hh.T (6 x 24) as an 8 x 32 block
        assert step_weight_bytes(_scan_of(lstm, *args, cpu=cpu), pow2=True) == 8 * 32 * 4


@pytest.mark.parametrize("N,split", [(16, True), (3, False)])
def test_hoist_leaves_elementwise_work_in_a_loop_split_by_rows(rng: np.random.Generator, N: int, split: bool) -> None:
    """A scan split by rows keeps the tanh of its carry-free projection ``tanh(x_t @ W_u)`` in the loop (fused
    into its per-row-block kernels) and hoists only the GEMM; one that is not split (a batch of 3) gets the tanh
    hoisted as a [T, N, H] array, since in the loop each kernel would cost a barrier per step."""

    def gated(x, h0, w_u, w_hh):
        def cell(h, x_t):
            h = nf.tanh(h @ w_hh.T) * nf.tanh(x_t @ w_u.T)
            return h, h

        return nf.scan(cell, h0, x)

    T, I, H = 3, 8, 128
    args = [rng.standard_normal(s).astype(np.float32) for s in [(T, N, I), (N, H), (H, I), (H, H)]]
    g = run_pipeline(nf.compile(gated).trace(*args), pipeline(cpu_target()))
    top = {n.op for n in g.order}
    (scan,) = [n for n in g.order if n.op == Op.SCAN]
    assert isinstance(worth_splitting(scan, cpu_target()), RowSplit) == split
    assert (Op.TANH in top) == (not split)
    assert Op.MATMUL in top  # the projection's GEMM is hoisted either way
