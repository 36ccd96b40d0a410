"""The packed GEMM and the sliced-epilogue step kernel: odd sizes against numpy, RNN cells (LSTM, GRU, layer-norm
LSTM) forward and backward against the reference backend, and the kernel structure of a recurrent step."""

from __future__ import annotations

import numpy as np
import pytest
from test_scan import lstm

import nnforge as nf
from nnforge.codegen.c.gemm import GemmConfig
from nnforge.ir.dims import symbol_name
from nnforge.schedule import Gemm, Loop, SlicedGemm

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")

SIZES = [(1, 1, 1), (1, 7, 1), (5, 1, 3), (7, 17, 13), (6, 16, 16), (13, 33, 31), (64, 1, 50), (97, 130, 200),
         (200, 96, 40), (9, 21, 19), (14, 12, 9), (16, 40, 24), (11, 5, 47), (4, 300, 30), (1, 9, 24), (7, 17, 48),
         (13, 5, 72), (22, 256, 24), (5, 257, 48)]
# every row remainder of the 6-row kernel, and of the 4-row one on its 4 x 24 tile (widths of whole 24-column
# tiles, K up to narrow_k = 256); K on both sides of it
TILES = {"avx2": GemmConfig(vector_bytes=32), "6x16": GemmConfig(vector_bytes=32, narrow_k=0),
         "avx512": GemmConfig(vector_bytes=64), "12x32": GemmConfig(vector_bytes=64, narrow_k=0)}
# 64-byte vectors compile everywhere (two AVX2 halves without AVX-512): every tile is checked on every machine


def _cpu(cfg: GemmConfig, fn, *args):
    """``fn`` built by the C backend with these tiles (not a tuned configuration from the cache)."""
    from nnforge.codegen.c import CpuBackend

    be = CpuBackend(gemm=cfg)
    be._gemm_for = lambda _g: cfg
    return be(nf.compile(fn).trace(*args))(list(args))


@pytest.mark.parametrize("tiles", TILES)
@pytest.mark.parametrize("dt", [np.float32, np.float64])
@pytest.mark.parametrize("m,k,n", SIZES)
def test_gemm_odd_sizes(m, k, n, dt, tiles):
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b, c = (rng.standard_normal(s).astype(dt) for s in [(m, k), (k, n), (n, k)])
    got = _cpu(TILES[tiles], lambda x, y, z: (x @ y, x @ z.T, (x @ y) * 2.0 + 1.0), a, b, c)
    tol = 2e-5 if dt == np.float32 else 1e-12
    for g, w in zip(got, (a @ b, a @ c.T, (a @ b) * 2 + 1)):
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * np.sqrt(k))


def test_gemm_transposed_a_batched_and_k_zero():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((3, 9, 5)).astype(np.float32), rng.standard_normal((3, 9, 20)).astype(np.float32)
    got = nf.compile(lambda x, y: x.permute(0, 2, 1) @ y, backend="cpu")(a, b)
    np.testing.assert_allclose(got, a.transpose(0, 2, 1) @ b, rtol=1e-5, atol=1e-5)
    z = np.zeros((4, 0), np.float32), np.zeros((0, 3), np.float32)
    np.testing.assert_array_equal(nf.compile(lambda x, y: x @ y, backend="cpu")(*z), np.zeros((4, 3)))


@pytest.mark.parametrize("n", [40, 48])
@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_plain_product_tiles_are_stored_in_place(rng: np.random.Generator, dt, n: int):
    """A product with no epilogue: its full tiles (every column of the panel, and a row count some micro-kernel
    computes exactly: 2, 4 or 6 rows on the 6 x 16 tile of 40 columns, 2 or 4 on the 4 x 24 tile of 48) are written
    by the micro-kernel straight into the result, row stride N; the other tiles (1, 3, 5 rows; the partial last
    panel of 8 columns) go through the register tile. Batched, 20 and 17 rows (every remainder of both tiles),
    against numpy; an epilogue keeps the register tile."""
    from test_vector_tiles import _source

    b = rng.standard_normal((9, n)).astype(dt)
    src = _source(lambda x, y: x @ y, rng.standard_normal((3, 20, 9)).astype(dt), b)
    mr, ukr = (6, "nf_ukr_f") if n == 40 else (4, "nf_ukr_4x")
    exact = " || ".join(f"mr_ == {m}" for m in (2, 4, 6) if m <= mr)
    assert f"({exact})) {{ {ukr}" in src and f", {n}); continue; }}" in src
    assert "continue; }" not in _source(lambda x, y: (x @ y) * 2.0, rng.standard_normal((20, 9)).astype(dt), b)
    tol = 2e-5 if dt == np.float32 else 1e-12
    for m in (20, 17):
        a = rng.standard_normal((3, m, 9)).astype(dt)
        np.testing.assert_allclose(nf.compile(lambda x, y: x @ y, backend="cpu")(a, b), a @ b, rtol=tol, atol=tol)


def gru(x, h0, w_ih, w_hh, b_ih, b_hh):
    def cell(h, x_t):
        xr, xz, xn = (x_t @ w_ih.T + b_ih).chunk(3, axis=-1)
        hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, axis=-1)
        r, z = nf.sigmoid(xr + hr), nf.sigmoid(xz + hz)
        n = nf.tanh(xn + r * hn)
        h = (1.0 - z) * n + z * h
        return h, h

    h, ys = nf.scan(cell, h0, x)
    return ys, h


def _ln(v, eps=1e-5):
    mu = v.mean(-1, keepdims=True)
    d = v - mu
    return d / nf.sqrt((d * d).mean(-1, keepdims=True) + eps)


def ln_lstm_step(h, c, x_t, w_ih, w_hh, b):
    """One step of the layer-norm LSTM: the new (h, c)."""
    i, f, g, o = (_ln(x_t @ w_ih.T) + _ln(h @ w_hh.T) + b).chunk(4, axis=-1)
    c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
    return nf.sigmoid(o) * nf.tanh(_ln(c)), c


def ln_lstm(x, h0, c0, w_ih, w_hh, b):
    def cell(carry, x_t):
        h, c = ln_lstm_step(*carry, x_t, w_ih, w_hh, b)
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


def _args(kind, T=5, N=3, I=5, H=20, dt=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    G = 3 if kind == "gru" else 4
    shapes = [(T, N, I), (N, H)] + ([] if kind == "gru" else [(N, H)]) + [(G * H, I), (G * H, H), (G * H,)]
    shapes += [(G * H,)] if kind == "gru" else []
    return [(rng.standard_normal(s) * 0.5).astype(dt) for s in shapes]


CELLS = {"lstm": lstm, "gru": gru, "ln_lstm": ln_lstm}


@pytest.mark.parametrize("H", [4, 20, 33])
@pytest.mark.parametrize("kind", sorted(CELLS))
def test_cells_forward_match_reference(kind, H):
    args = _args(kind, H=H)
    want = nf.compile(CELLS[kind])(*args)
    for g, w in zip(nf.compile(CELLS[kind], backend="cpu")(*args), want):
        np.testing.assert_allclose(g, w, rtol=3e-5, atol=3e-5)


@pytest.mark.parametrize("kind", sorted(CELLS))
def test_cells_backward_match_reference(kind):
    fn = CELLS[kind]

    def loss(*args):
        out = fn(*args)
        return (out[0] * out[0]).sum() + out[1].mean()

    args = _args(kind, H=18, dt=np.float64)
    g = nf.grad(loss, argnums=tuple(range(len(args))))
    want = nf.compile(g)(*args)
    for a, b in zip(nf.compile(g, backend="cpu")(*args), want):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_step_is_one_fused_kernel(kind):
    from nnforge.codegen.c import lower, prepare

    low = lower(prepare(nf.compile(CELLS[kind]).trace(*_args(kind, H=40))))
    block = low.program.block
    (loop,) = [k for k in block.kernels if isinstance(k, Loop)]
    (gemm,) = [k for k in block.kernels if isinstance(k, Gemm)]
    assert gemm.epilogue is not None                              # x @ W_ih + b for all steps: one hoisted GEMM
    (step,) = loop.body.kernels                                   # GEMM + whole cell update: one kernel per step
    assert isinstance(step, SlicedGemm) and step.b_resident and "sigmoid" in step.fuses and "tanh" in step.fuses
    assert symbol_name(loop.length) is not None                   # a real loop with a run-time trip count
    (scan,) = [k for k in low.listing if k.kind == "scan"]
    assert "for tt" in scan.note and "S[0]" in scan.note          # rendered as one C loop, no unrolling


def test_each_gemm_gets_the_tile_of_its_k(rng: np.random.Generator) -> None:
    """K up to ``narrow_k`` over whole 24-column tiles (a recurrent step at H = 96) runs on the 4 x 24 tile; a
    larger or run-time K, or a width of partial 24-column tiles, on the 6 x 16 one; ``narrow_k=0`` keeps every GEMM
    on 6 x 16. The source holds the micro-kernels of the tiles its GEMMs use and no others (an elementwise
    program none)."""
    from test_vector_tiles import _source

    from nnforge.codegen.c import cpu_target
    from nnforge.schedule import gemm_tile

    t = cpu_target()
    assert gemm_tile(t, nf.float32, 96, 384) == (4, 24) and gemm_tile(t, nf.float64, 256, 36) == (4, 12)
    wide = [(nf.float32, 257, 96), (nf.float32, None, 96), (nf.float32, 96, 64), (nf.float32, 96, None)]
    assert [gemm_tile(t, *w) for w in wide] == [(6, 16)] * 4 and gemm_tile(t, nf.float64, 300, 5) == (6, 8)
    assert gemm_tile(cpu_target(GemmConfig(narrow_k=0)), nf.float32, 96, 96) == (6, 16)
    zmm = cpu_target(GemmConfig(vector_bytes=64))  # AVX-512: 8 x 48 for narrow K over whole tiles, else 12 x 32
    assert [gemm_tile(zmm, nf.float32, *kw) for kw in [(96, 96), (96, 384), (96, 72), (300, 96)]] == \
        [(8, 48), (8, 48), (12, 32), (12, 32)]
    assert gemm_tile(zmm, nf.float64, 96, 48) == (8, 24)
    a, small, large = (rng.standard_normal(s).astype(np.float32) for s in [(8, 300), (96, 48), (300, 96)])
    src = _source(lambda x, w, v: (x[:, :96] @ w, x @ v, x[:, :96] @ w[:, :32]), a, small, large)
    assert "nf_ukr_4x24_f32(96," in src and "nf_ukr_f32(300," in src and "nf_ukr_f32(96," in src
    assert "_f64(" not in src
    from nnforge.codegen.c import lower, prepare

    whole = lower(prepare(nf.compile(lambda x: nf.tanh(x) * 2.0).trace(a))).source()
    assert "nf_ukr" not in whole and "nf_pack" not in whole


@pytest.mark.parametrize("H", [48, 40])
def test_an_lstm_step_on_avx512_tiles(rng: np.random.Generator, H: int) -> None:
    """With 64-byte vectors an LSTM step runs on 8 x 48 tiles (H = 48) or 12 x 32 ones (H = 40: a partial
    tile), its remainder rows (N = 13: 8 + 4 + 1 per thread's block) on the 2-, 4- and 8-row kernels; values and
    the carry against the reference backend, float32 and float64."""
    from nnforge.codegen.c import CpuBackend, lower, prepare

    cfg = GemmConfig(vector_bytes=64)
    for dt, tol in ((np.float32, 3e-6), (np.float64, 1e-12)):
        args = [(rng.standard_normal(s) * 0.5).astype(dt)
                for s in [(6, 13, 9), (13, H), (13, H), (4 * H, 9), (4 * H, H), (4 * H,)]]
        trace = nf.compile(lstm).trace(*args)
        src = lower(prepare(trace, cfg), cfg).source()
        assert ("nf_v16f32" if dt == np.float32 else "nf_v8f64") in src.split("nf_ukr", 1)[1]
        be = CpuBackend(gemm=cfg)
        for got, want in zip(be(trace)(list(args)), nf.compile(lstm)(*args)):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
