"""Stacks a scan stores twice: ``carries_read_from_outputs`` (the carries autodiff stacks for a weight gradient
are read from the scan's own stacked output of that carry, one step shifted) and ``stacked_parts_read_as_views``
(a stacked output that is columns of another is read as a view of it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_row_split import lstm

import nnforge as nf
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.reference import ReferenceProgram
from nnforge.codegen.triton.target import triton_target
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.scans import carries_read_from_outputs, first_steps, stacked_carry, stacked_parts_read_as_views


def _torch_lstm(x, h0, c0, w_ih, w_hh, b, reverse=False):
    h, c, ys = h0, c0, [None] * x.shape[0]
    for t in (reversed(range(x.shape[0])) if reverse else range(x.shape[0])):
        i, f, g, o = (x[t] @ w_ih.T + h @ w_hh.T + b).chunk(4, dim=-1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        ys[t] = h
    return torch.stack(ys) if ys else x.new_zeros((0, *h0.shape))


def _args(rng: np.random.Generator, T: int, N: int = 16, H: int = 5, dtype=np.float64) -> list[np.ndarray]:
    return [(rng.standard_normal(s) * 0.5).astype(dtype)
            for s in ((T, N, H), (N, H), (N, H), (4 * H, H), (4 * H, H), (4 * H,))]


def _loss(reverse: bool):
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys = lstm(x, h0, c0, w_ih, w_hh, b, reverse=reverse)[1]
        return (ys * ys).sum()

    return nf.grad(loss, argnums=(1, 3, 4, 5))


def _stacked_carries(graph) -> list:
    """The stacks of incoming carries that the scan also stacks as an output."""
    return [n for n in graph.order if stacked_carry(n) is not None]


@pytest.mark.parametrize("target", [cpu_target, triton_target])
@pytest.mark.parametrize("reverse", [False, True])
def test_an_lstm_training_step_stores_h_once(rng: np.random.Generator, reverse: bool, target) -> None:
    """The forward scan of an LSTM's training step stacked ``h`` twice — its output and the carry each step
    starts from, read only by ``dW_hh``'s GEMM (hoisted out of the backward loop: on the CPU at a batch the rows
    split) — and after the pass only its output (the stack of ``c`` stays: ``c`` is no output); the gradients
    are the unoptimized graph's in float64, both directions."""
    args = _args(rng, 6)
    graph = nf.compile(_loss(reverse)).trace(*args)
    before = run_pipeline(graph, [p for p in pipeline(target()) if p[0] != "carries_read_from_outputs"])
    after = run_pipeline(graph, pipeline(target()))
    assert len(_stacked_carries(before)) == 1 and not _stacked_carries(after)
    assert not [n for n in after.order if n.op == Op.CONCAT]  # the stack's product split by its rows
    (scan,) = [n for n in after.order if n.op == Op.SCAN and n.attrs["reverse"] == reverse]  # the forward
    assert len(scan.types) == 5  # h, c, ys, the step's c, the gate sums: no second stack of h
    want = ReferenceProgram(graph)(args)
    for got, w in zip(ReferenceProgram(after)(args), want):
        np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("reverse", [False, True])
def test_gradients_match_torch_at_every_length(backend: str, rng: np.random.Generator, reverse: bool) -> None:
    """One compiled training step called at T = 5, 1 and 0 (a symbolic length: the split's first step is
    ``min(T, 1)`` steps, so no steps multiply nothing), forward and reverse, against torch's autograd on the same
    cell (float32: 2e-5 relative over K = T * N terms)."""
    step = nf.compile(_loss(reverse), backend=backend)
    for T in (5, 1, 0):
        args = _args(rng, T, dtype=np.float32)
        got = step(*args)
        ts = [torch.from_numpy(a).requires_grad_() for a in args]
        loss = (_torch_lstm(*ts, reverse=reverse) ** 2).sum()
        if T:  # no steps: nothing reads the parameters, whose gradients are 0
            loss.backward()
        for g, i in zip(got, (1, 3, 4, 5)):
            want = ts[i].grad.numpy() if ts[i].grad is not None else np.zeros_like(args[i])
            np.testing.assert_allclose(np.asarray(g), want, rtol=2e-5, atol=2e-5, err_msg=f"T={T}, argument {i}")


def test_a_stack_read_otherwise_stays(rng: np.random.Generator) -> None:
    """A user's scan stacking each step's incoming carry beside its output: the stack read only by a product is
    split as autodiff's is, and one also returned (or multiplied as a left operand) stays."""
    x, h0, u, d = (rng.standard_normal(s) for s in ((4, 2, 3), (2, 3), (3, 3), (4, 2, 3)))

    def stacks(x, h0, u):
        def cell(h, x_t):
            h2 = (x_t + h @ u).tanh()
            return h2, (h2, h)

        return nf.scan(cell, h0, x)[1]

    def product(x, h0, u, d):
        ys, hs = stacks(x, h0, u)
        return d.reshape(8, 3).T @ hs.reshape(8, 3), ys

    def also_returned(x, h0, u, d):
        ys, hs = stacks(x, h0, u)
        return d.reshape(8, 3).T @ hs.reshape(8, 3), ys, hs

    def as_left_operand(x, h0, u, d):
        ys, hs = stacks(x, h0, u)
        return hs.reshape(8, 3) @ d.reshape(8, 3).T, ys

    for f in (also_returned, as_left_operand):
        kept = nf.compile(f).trace(x, h0, u, d)
        assert carries_read_from_outputs(kept) is kept, f.__name__
    graph = nf.compile(product).trace(x, h0, u, d)
    split = carries_read_from_outputs(graph)
    assert _stacked_carries(graph) and not [n for n in split.order if n.op == Op.PROJ and n.attrs["index"] == 2]
    ys, hs = (np.asarray(a) for a in nf.compile(stacks)(x, h0, u))
    np.testing.assert_allclose(hs, np.concatenate([h0[None], ys[:-1]]))  # what the split relies on
    got = ReferenceProgram(split)([x, h0, u, d])[0]
    np.testing.assert_allclose(got, d.reshape(8, 3).T @ hs.reshape(8, 3), rtol=1e-12, atol=1e-12)


def test_first_steps_is_min_of_one() -> None:
    assert [first_steps(T) for T in range(6)] == [0, 1, 1, 1, 1, 1]


def test_stacked_runs_of_columns_are_read_from_the_whole(backend: str, rng: np.random.Generator) -> None:
    """A scan stacking ``concat(a, b, c)``, ``concat(a, b)``, ``c`` and ``concat(a, c)`` per step (a GRU's backward
    stacks its gate gradients so): the second and third are columns of the first and read as views of it, the
    fourth (not consecutive columns) stays; products of all four, their sums and the stacks themselves agree with
    the reference on every backend."""
    x, h0, u, d = (rng.standard_normal(s).astype(np.float32) for s in ((5, 4, 3), (4, 3), (3, 3), (5, 4, 2)))

    def f(x, h0, u, d):
        def cell(h, x_t):
            a, b_, c = (x_t @ u).tanh(), h * x_t, (h - x_t).sigmoid()
            h = (a + b_ * c).tanh()
            return h, (nf.concat([a, b_, c], axis=1), nf.concat([a, b_], axis=1), c, nf.concat([a, c], axis=1))

        _, (abc, ab, c, ac) = nf.scan(cell, h0, x)
        dd = d.reshape(20, 2)
        return (dd.T @ abc.reshape(20, 9), dd.T @ ab.reshape(20, 6), dd.T @ c.reshape(20, 3), dd.T @ ac.reshape(20, 6),
                ab.sum(0), c * 2.0)

    graph = nf.compile(f).trace(x, h0, u, d)
    after = stacked_parts_read_as_views(graph)
    (scan,) = [n for n in run_pipeline(after, pipeline(triton_target())).order if n.op == Op.SCAN]
    assert [t[0][-1] for t in scan.types[1:]] == [9, 6]  # the carry, then abc and ac: ab and c are views
    want = ReferenceProgram(graph)([x, h0, u, d])
    for got, w in zip(nf.compile(f, backend=backend)(x, h0, u, d), want):
        np.testing.assert_allclose(np.asarray(got), w, rtol=2e-5, atol=2e-5)


def test_a_scan_reading_such_a_view_is_rebuilt_once(rng: np.random.Generator) -> None:
    """The second of two scans steps over the first's ``concat(a, b)`` stack (a view after the pass) and stacks
    columns of its own: it is rebuilt on the view and its own view reads the rebuilt scan — two scans, not the
    old second one kept alive beside the new (a recurrence computed twice)."""
    x, h0, u = (rng.standard_normal(s) for s in ((5, 4, 3), (4, 3), (3, 3)))

    def layer(h0, x, u):
        def cell(h, x_t):
            a, b_ = (x_t[:, :3] @ u).tanh(), h * x_t[:, :3]
            h = (a + b_).tanh()
            return h, (nf.concat([a, b_, h], axis=1), nf.concat([a, b_], axis=1))

        return nf.scan(cell, h0, x)[1]

    def f(x, h0, u):
        abh, ab = layer(h0, x, u)
        abh2, ab2 = layer(h0, ab, u)
        return abh.sum(), ab2.sum(0), abh2 * 2.0

    graph = nf.compile(f).trace(x, h0, u)
    after = stacked_parts_read_as_views(graph)
    assert [n.op for n in after.order].count(Op.SCAN) == 2
    for got, want in zip(ReferenceProgram(after)([x, h0, u]), ReferenceProgram(graph)([x, h0, u])):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
