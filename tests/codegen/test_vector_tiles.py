"""Fused GEMM tiles and elementwise kernels in vector form (``prelude.h``'s ``nf_v*`` helpers, a vector of float32
columns at a time: 8 with AVX2's tiles, 16 with AVX-512's, both checked on every machine; which index expressions
vectorize is ``test_index_expr``'s): the vector sigmoid/tanh/exp against float64 torch over the whole float range,
the recurrent step computed from its register tiles (the gates never stored), the scalar fallback for a tile body
with no vector form, row maxima in vector form (NaN kept), and masks: comparisons, ``where`` and bool buffers
loaded and stored a vector at a time."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from test_c_math import _grid
from test_gemm import _cpu
from test_scan import lstm

import nnforge as nf
from nnforge.codegen.c.gemm import GemmConfig

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")

# 64-byte vectors compile everywhere (two AVX2 halves without AVX-512): both widths are checked on every machine
VECTORS = {"avx2": GemmConfig(vector_bytes=32), "avx512": GemmConfig(vector_bytes=64)}


def _source(fn, *args, cfg: GemmConfig | None = None) -> str:
    """The generated kernels of ``fn`` (the program without its prelude of helpers)."""
    from nnforge.codegen.c import lower, prepare

    src = lower(prepare(nf.compile(fn).trace(*args), cfg), cfg).source()
    return src[src.index("#define NF_R64"):]


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("op", ["tanh", "sigmoid", "exp"])
def test_vector_transcendentals_in_a_gemm_epilogue(rng: np.random.Generator, op: str, vectors: str) -> None:
    """``op(a @ w + x)`` with ``a @ w`` exact in float32 (small integers times a power of two), so the epilogue
    sees exactly the float32 values numpy computes: the vector forms then meet the scalar forms' bounds (relative
    error < 4e-7 against float64 torch, NaN and infinities as torch has them) on every float magnitude. 37 columns:
    full tiles (vector) and one of 5 (scalar)."""
    cfg = VECTORS[vectors]
    x = _grid(rng)
    n = 37
    x = np.concatenate([x, rng.standard_normal((-len(x)) % n).astype(np.float32)]).reshape(-1, n)
    a = (rng.integers(-3, 4, (x.shape[0], 8)) * 2.0**-12).astype(np.float32)
    w = rng.integers(-3, 4, (8, n)).astype(np.float32)

    def fn(a, w, x):
        return getattr(nf, op)(a @ w + x)

    assert f"nf_v{op}f" in _source(fn, a, w, x, cfg=cfg)
    (got,) = _cpu(cfg, fn, a, w, x)
    z = (a @ w).astype(np.float32) + x
    want = getattr(torch, op)(torch.from_numpy(z).double()).numpy()
    rounded = want.astype(np.float32)  # exp past 88.72 overflows float32: inf, as torch's float32 exp
    normal = np.isfinite(rounded) & (np.abs(want) > 1e-37)
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() < 4e-7, (op, float(rel.max()), float(z[normal][rel.argmax()]))
    tiny = ~normal & np.isfinite(rounded)
    assert np.abs(got[tiny] - want[tiny]).max() < 1e-37
    assert np.array_equal(got[np.isinf(rounded)], rounded[np.isinf(rounded)])
    assert np.array_equal(np.isnan(got), np.isnan(want))


def _lstm_args(rng: np.random.Generator, H: int, T: int = 6, N: int = 7, I: int = 9):
    shapes = [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]
    return [(rng.standard_normal(s) * 0.5).astype(np.float32) for s in shapes]


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("H", [16, 24, 32, 40, 48])
def test_lstm_step_runs_on_its_register_tiles(rng: np.random.Generator, H: int, vectors: str) -> None:
    """The step kernel's gates come from the micro-kernel's tiles straight into the vector cell update (no
    store of the [N, 4H] gate matrix); a width that is not whole tiles adds a partial tile (scalar: H = 40 on
    either general tile, 16 and 24 on AVX-512's 32-column one), which whole tiles cannot have: their scalar form
    is not printed. Against the reference backend."""
    cfg = VECTORS[vectors]
    args = _lstm_args(rng, H)
    src = _source(lstm, *args, cfg=cfg)
    (_, mr, narrow), general = cfg.tiles()[0], cfg.tiles()[-1][2] // 4  # (max K, rows, row bytes) per tile
    narrow //= 4
    nr = narrow if H % narrow == 0 else general  # the narrow-K tile where H is whole tiles of it (K = H <= 256)
    step = src[src.index(f"nf_ukr{f'_{mr}x{nr}' if nr == narrow else ''}_f32(", src.index(" < S[0]; ")):]
    assert "nf_vsigmoidf" in step and "nf_vtanhf" in step
    assert ("nf_sigmoidf(" in step) == (H % nr != 0)
    assert not re.search(rf"\[\(\w+\) \* {4 * H} \+[^\]]*\] = ", step)  # no [N, 4H] gate matrix is stored
    want = nf.compile(lstm)(*args)
    for g, w in zip(_cpu(cfg, lstm, *args), want):
        np.testing.assert_allclose(g, w, rtol=3e-6, atol=3e-6)


def test_step_gemm_result_gets_no_buffer(rng: np.random.Generator) -> None:
    """The step's [N, 4H] GEMM result is consumed tile by tile: the workspace holds no buffer of its size."""
    from nnforge.codegen.c import lower, prepare

    args = _lstm_args(rng, 40, N=7)
    low = lower(prepare(nf.compile(lstm).trace(*args)))
    low.source()
    assert str(7 * 160 * 4) not in {size for _, _, size in low.allocs}
    assert str(7 * 40 * 4) in {size for _, _, size in low.allocs}  # h and c are there


def cos_gate_lstm(x, h0, c0, w_ih, w_hh, b):
    """An LSTM whose forget gate is a cosine (``cos`` has no vector form: the tile stays scalar)."""
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.cos(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


@pytest.mark.parametrize("vectors", VECTORS)
def test_tile_without_a_vector_form_stays_scalar(rng: np.random.Generator, vectors: str) -> None:
    cfg = VECTORS[vectors]
    args = _lstm_args(rng, 32)
    src = _source(cos_gate_lstm, *args, cfg=cfg)
    assert re.search(r"nf_ukr(_\d+x\d+)?_f32\(", src) and "cosf(" in src and "nf_vsigmoidf" not in src
    want = nf.compile(cos_gate_lstm)(*args)
    for g, w in zip(_cpu(cfg, cos_gate_lstm, *args), want):
        np.testing.assert_allclose(g, w, rtol=3e-6, atol=3e-6)


def layer_norm_gate(v, g, b):
    """Row statistics read by an elementwise kernel: the mean and the 1 / sqrt are the same for a whole row."""
    mu = v.mean(-1, keepdims=True)
    d = v - mu
    return nf.tanh(d / nf.sqrt((d * d).mean(-1, keepdims=True) + 1e-5) * g + b)


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("width", [8, 16, 45, 96])
def test_elementwise_kernel_in_vector_form(rng: np.random.Generator, width: int, vectors: str) -> None:
    """An elementwise kernel over rows of ``width``: vector columns (whole vectors), then a scalar remainder (all
    of a row narrower than a vector); a row's statistics computed once before its column loop (``sqrtf`` of the
    row, not a vector square root per column). Against torch in float64."""
    cfg = VECTORS[vectors]
    v, g, b = (rng.standard_normal(s).astype(np.float32) for s in [(13, width), (width,), (width,)])
    src = _source(layer_norm_gate, v, g, b, cfg=cfg)
    lanes = cfg.vector_width // 4
    assert ("nf_vtanhf(" in src) == (width >= lanes) and "nf_vsqrtf(" not in src and "sqrtf(" in src
    assert (f"+= {lanes}) {{" in src) == (width >= lanes)
    (got,) = _cpu(cfg, layer_norm_gate, v, g, b)
    t = [torch.from_numpy(a).double() for a in (v, g, b)]
    want = torch.tanh(torch.nn.functional.layer_norm(t[0], (width,), eps=1e-5) * t[1] + t[2]).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def relu_with_masks(x, y):
    """A ReLU's mask stored as bool (its gradient's reader), a where on a mask loaded back, comparisons with NaN,
    and or / and of masks."""
    mask = x <= 0.0
    kept = nf.where(mask, 0.0, y)
    either = (x < y) | (x != x)  # NaN compares false but for !=
    both = (x == y) & ~(y > 1.0)
    return mask, kept, nf.where(either, x, y * 2.0), both


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("width", [8, 37, 64])
def test_masks_in_vector_form(rng: np.random.Generator, width: int, vectors: str) -> None:
    """Bool values as masks of 32-bit lanes: loaded from and stored to their bytes (``nf_vld_b``, ``nf_vst_b``),
    made by comparisons, combined and used by ``where`` (``nf_vsel_f32``); a row's remainder in the scalar loop.
    Exactly numpy's results, NaN and equal values included."""
    cfg = VECTORS[vectors]
    x, y = (rng.standard_normal((11, width)).astype(np.float32) for _ in range(2))
    x[rng.random(x.shape) < 0.1] = np.nan
    y[:, ::5] = x[:, ::5]  # equal values, NaN with NaN among them
    src = _source(relu_with_masks, x, y, cfg=cfg)
    vector = width >= cfg.vector_width // 4
    assert all((f in src) == vector for f in ("nf_vst_b(", "nf_vld_b(", "nf_vsel_f32(", "nf_vbc_b("))
    got = _cpu(cfg, relu_with_masks, x, y)
    mask = x <= 0
    want = (mask, np.where(mask, 0, y), np.where((x < y) | np.isnan(x), x, y * 2), (x == y) & (y <= 1))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert {int(b) for m in (got[0], got[3]) for b in np.unique(m.view(np.uint8))} <= {0, 1}  # bools as bytes 0, 1


def test_generated_names_never_collide() -> None:
    """``fresh`` names from prefixes that end in a digit (``b1``) and from ones that do not (``b``) differ at
    every counter value (``b1`` + 238 was ``b`` + 1238: a C compile error in a long layer-norm LSTM)."""
    from nnforge.codegen.c.emit import Names

    made: dict[str, set[str]] = {}
    for prefix in ("b", "b1", "r0", "bp"):
        names = Names()
        made[prefix] = {names.fresh(prefix) for _ in range(3000)}
    for a in made:
        for b in made:
            assert a == b or not made[a] & made[b], (a, b, sorted(made[a] & made[b])[:3])


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("width", [7, 16, 45, 500])
def test_row_max_in_vector_form(rng: np.random.Generator, width: int, vectors: str) -> None:
    """A float32 max over the last axis reads vectors of columns (four at a time, then one, then the scalar rest)
    and keeps NaN as the scalar form does: rows with a NaN in the unrolled part, in the single vectors, in the
    scalar rest, rows of -inf and of +inf, against numpy; and a softmax's row max and exponentials in vector form."""
    cfg = VECTORS[vectors]
    x = rng.standard_normal((12, width)).astype(np.float32)
    for row, col in enumerate([0, width // 2, width - 1]):
        x[row, col] = np.nan
    x[3] = -np.inf
    x[4, width // 3] = np.inf
    src = _source(lambda a: (a.max(-1), nf.softmax(a, -1)), x, cfg=cfg)
    lanes = cfg.vector_bytes // 4
    assert ("nf_vmaxf(" in src and "nf_vexpf(" in src) == (width >= lanes)
    got_max, got_soft = _cpu(cfg, lambda a: (a.max(-1), nf.softmax(a, -1)), x)
    np.testing.assert_array_equal(got_max, x.max(-1))
    want = torch.softmax(torch.from_numpy(x).double(), -1).numpy()
    np.testing.assert_allclose(got_soft, want, rtol=2e-6, atol=1e-7)
