"""Scans and their gradients on every backend; trip counts change without a rebuild; the disk cache."""

from __future__ import annotations

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen import BACKENDS
from nnforge.schedule import Gemm, Loop, SlicedGemm

needs_cpu = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def lstm(x, h0, c0, w_ih, w_hh, b):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


def lstm_args(T=6, N=3, I=5, H=4, dt=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]
    return [(rng.standard_normal(s) * 0.5).astype(dt) for s in shapes]


def _close(a, b, dt):
    tol = 2e-5 if dt == np.float32 else 1e-11
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_lstm_forward(backend, dt):
    args = lstm_args(dt=dt)
    want = nf.compile(lstm)(*args)
    for g, w in zip(nf.compile(lstm, backend=backend)(*args), want):
        _close(g, w, dt)


def test_lstm_gradients_float64(backend):
    def loss(*args):
        ys, h, c = lstm(*args)
        return (ys * ys).sum() + (h * c).mean()

    args = lstm_args(dt=np.float64)
    g = nf.grad(loss, argnums=tuple(range(6)))
    want = nf.compile(g)(*args)
    for a, b in zip(nf.compile(g, backend=backend)(*args), want):
        _close(a, b, np.float64)


def test_scan_variants(backend):
    def f(x, s0):
        def step(c, x_t):
            a, k = c
            a = a * 0.5 + x_t.sum(-1)
            return (a, k + 1), (a * 2, x_t[:, ::-1])

        (a, k), (ys, zs) = nf.scan(step, (s0, nf.zeros((), dtype=nf.int64)), x, reverse=True)
        (p,), qs = nf.scan(lambda c, _: ((c[0] * 2,), c[0]), (s0,), length=3)
        return a, k, ys, zs, p, qs

    x = np.random.default_rng(4).standard_normal((5, 2, 3)).astype(np.float32)
    s0 = np.ones(2, np.float32)
    want = nf.compile(f)(x, s0)
    for g, w in zip(nf.compile(f, backend=backend)(x, s0), want):
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_checkpointed_scan_gradient(backend):
    def loss(x, w):
        def step(h, x_t):
            h = nf.tanh(h @ w + x_t)
            return h, h

        h, ys = nf.scan(step, nf.zeros(3, dtype=nf.float64), x, checkpoint_every=2)
        return ys.sum() + h.sum()

    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((5, 3)), rng.standard_normal((3, 3)) * 0.5
    g = nf.grad(loss, argnums=(0, 1))
    want = nf.compile(g)(x, w)
    for a, b in zip(nf.compile(g, backend=backend)(x, w), want):
        _close(a, b, np.float64)


def test_zero_length_scan(backend):
    args = lstm_args(T=0)
    want = nf.compile(lstm)(*args)
    for g, w in zip(nf.compile(lstm, backend=backend)(*args), want):
        np.testing.assert_array_equal(g, w)


@needs_cpu
def test_new_length_does_not_rebuild():
    cf = nf.compile(lstm, backend="cpu")
    toolchain = BACKENDS["cpu"].toolchain
    cf(*lstm_args(T=4))
    before = (cf.trace_count, toolchain.compiles, len(toolchain.loaded))
    for T in (1, 9, 17):
        args = lstm_args(T=T, seed=T)
        for g, w in zip(cf(*args), nf.compile(lstm)(*args)):
            _close(g, w, np.float32)
    assert (cf.trace_count, toolchain.compiles, len(toolchain.loaded)) == before


@needs_cpu
def test_corrupt_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    from nnforge.codegen.c.toolchain import Toolchain, find_compiler

    monkeypatch.setenv("NNFORGE_CACHE_DIR", str(tmp_path))
    src = "#include <stdint.h>\nvoid nf_main(void** a, const int64_t* S) { ((float*)a[0])[0] = 42.0f; }\n"
    tc = Toolchain(find_compiler())
    _, key = tc.load(src)
    assert tc.compiles == 1
    so = tmp_path / "c" / f"{key}.so"
    so.unlink()  # a new file, as another process would leave it; the loaded mapping stays intact
    so.write_bytes(b"garbage")
    fresh = Toolchain(find_compiler())
    _lib, key2 = fresh.load(src)
    assert key2 == key and fresh.compiles == 1
    again = Toolchain(find_compiler())
    again.load(src)
    assert again.compiles == 0  # the rebuilt entry validates


@needs_cpu
def test_lstm_structure_one_hoisted_gemm_and_fused_step():
    from nnforge.codegen.c import lower, prepare

    low = lower(prepare(nf.compile(lstm).trace(*lstm_args())))
    block = low.program.block
    (gemm, loop) = block.kernels
    assert isinstance(gemm, Gemm) and gemm.kind == "gemm+add"    # x @ W_ih + b for all steps: one GEMM
    assert isinstance(loop, Loop) and loop.parallel is None      # batch 3: too few rows to split
    (step,) = loop.body.kernels  # h @ W_hh + premul_t and the whole cell update: one kernel
    assert isinstance(step, SlicedGemm) and len(step.group.offsets) == 4 and step.b_resident
    assert [b.output for b in step.outs] == [1, 0] and step.also_of == ((), (2,))  # c; h also into ys
    assert not loop.body.copies
    (scan,) = [k for k in low.listing if k.kind == "scan"]
    assert "for tt" in scan.note and "S[0]" in scan.note          # rendered as a real loop, run-time trip count


def lstm_with_products(x, h0, c0, w_ih, w_hh, b):
    """An LSTM whose steps also return ``h @ W_hh.T`` (what a training forward stacks for its backward)."""
    def cell(carry, x_t):
        h, c = carry
        p = h @ w_hh.T
        i, f, g, o = (x_t @ w_ih.T + p + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), (h, p)

    (h, c), (ys, ps) = nf.scan(cell, (h0, c0), x)
    return ys, ps, h, c


@pytest.mark.parametrize("N", [3, 16])  # 16: rows split among workers (a persistent kernel on a GPU)
def test_a_returned_step_product_is_stored_by_the_fused_step(backend, N):
    args = lstm_args(T=5, N=N, I=5, H=8, seed=N)
    want = nf.compile(lstm_with_products)(*args)
    assert np.abs(want[1]).max() > 0
    for g, w in zip(nf.compile(lstm_with_products, backend=backend)(*args), want):
        _close(g, w, np.float32)
    if backend == "cpu":
        from nnforge.codegen.c import lower, prepare

        loop = next(k for k in lower(prepare(nf.compile(lstm_with_products).trace(*args))).program.block.kernels
                    if isinstance(k, Loop))
        (step,) = [k for k in loop.body.kernels if isinstance(k, SlicedGemm)]  # still one kernel per step
        assert step.product is not None and step.product.output == 3


def test_a_returned_product_read_through_slices_outside_a_loop(backend):
    def gate(h, w, b):
        p = h @ w.T
        i, g = (p + b).chunk(2, axis=-1)
        return nf.sigmoid(i) * nf.tanh(g), p

    rng = np.random.default_rng(7)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(6, 5), (16, 5), (16,)]]
    want = nf.compile(gate)(*args)
    for g, w in zip(nf.compile(gate, backend=backend)(*args), want):
        _close(g, w, np.float32)


def test_show_fused_listing(capsys):
    text = nf.show(nf.compile(lstm), *lstm_args(), stage="fused")
    assert "gemm+add+sigmoid" in text and "scan" in text and "reads" in text
