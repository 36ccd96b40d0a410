"""The first slice of the Triton renderer under the interpreter (``TRITON_INTERPRET=1``, CPU tensors): each
kernel form against the reference interpreter, persistent scan kernels for LSTM / GRU layers (forward and
reverse), one compile for every sequence length, and ``Unsupported`` for what the slice does not render.
Structure is asserted on the schedule's records and the kernel list, never on substrings of kernel bodies.

With ``TRITON_INTERPRET=0`` set before the run and a CUDA device, the same tests compile and launch real kernels
(and the ``gpu`` test counts the compiles)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import warnings

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (by the backend, lazily)

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from lstm_cells import layer_norm_lstm  # this folder: shared with test_rows.py

import nnforge as nf
from nnforge.codegen.triton import TritonBackend, TritonProgram, Unsupported, lower, prepare, triton_target
from nnforge.codegen.triton.scan import tile_pieces
from nnforge.codegen.triton.target import DOT_PROMOTE_K, FP_FUSION, Tiles
from nnforge.passes.fuse import CHEAP
from nnforge.schedule import Gemm, Loop, SlicedGemm, format_program

pytestmark = [pytest.mark.triton,
              pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # masked-off lanes compute garbage in numpy
              pytest.mark.skipif(not TritonBackend().available, reason="TRITON_INTERPRET=0 and no CUDA device")]

TOL = dict(rtol=2e-5, atol=2e-5)


def _f32(rng: np.random.Generator, *shape: int, scale: float = 0.5) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _check(fn, *args, backend: TritonBackend | None = None):
    """Build ``fn`` for Triton at ``args``, run it and compare with the reference interpreter element-wise;
    returns the program."""
    program = (backend or TritonBackend())(nf.compile(fn).trace(*args))
    _agree(program, fn, args)
    return program


def _agree(program, fn, args) -> None:
    want = nf.compile(fn)(*args)
    want = list(want) if isinstance(want, tuple | list) else [want]
    got = program(list(args))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), **TOL)


def _scheduled(fn, *args):
    return lower(prepare(nf.compile(fn).trace(*args)))


# ---- kernels outside loops ------------------------------------------------------------------------------------


def test_elementwise_chains_with_broadcasts_permutes_and_slices(rng: np.random.Generator):
    def f(x, y, b):
        z = nf.sigmoid(x * 2.0 + y.transpose(1, 0)) - nf.tanh(x[:, ::-1, 1:5]).sum(-1, keepdims=True)
        w = nf.where(x > 0, x, b) * (x.maximum(b) - (-x).exp())
        return z, w, z.reshape(2, 35)[:, 3:30:2], x.abs().sqrt() + b.sign()

    _check(f, _f32(rng, 2, 7, 5), _f32(rng, 5, 7), _f32(rng, 5))


def test_reduction_with_epilogue_and_over_leading_axes(rng: np.random.Generator):
    def f(x, y):
        m = x.max(axis=-1, keepdims=True)
        e = (x - m).exp()
        return e / e.sum(axis=-1, keepdims=True), y.sum(axis=(0, 1)), nf.sqrt(y.max(axis=(1, 2)) + 4.0)

    _check(f, _f32(rng, 6, 33), _f32(rng, 5, 3, 130))


def test_a_captured_constant_runs_without_a_warning(rng: np.random.Generator):
    """An array the function captures is frozen by the trace (read-only); the program copies it once rather than
    have torch warn, at its first call, that it shares memory it may not write."""
    w = _f32(rng, 6)

    def scaled(x):
        return x * nf.tensor(w)

    x = _f32(rng, 3, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        got = nf.compile(scaled, backend="triton")(x)
    np.testing.assert_allclose(got, x * w, **TOL)


def test_gemm_with_bias_and_activation_epilogue(rng: np.random.Generator):
    def f(x, w, b, u, v):
        return nf.tanh(x @ w.T + b), u @ v

    program = _check(f, _f32(rng, 37, 20), _f32(rng, 18, 20), _f32(rng, 18), _f32(rng, 3, 5, 9), _f32(rng, 3, 9, 4))
    assert program.kernels[0].startswith("k0_gemm_add_tanh")


def test_a_batch_of_products_takes_its_tiles_from_one_grid_axis(rng: np.random.Generator):
    """CUDA caps a grid's second and third axes at 65535 programs, which a batch of products passes (attention at
    batch 8448 with 8 heads), so every kernel numbers its programs on the first axis alone: a GEMM splits its id
    into row tile, column tile and batch index (here 2 x 3 tiles of 32 x 32 in each of 6 products, against the
    reference; a wrong split fails it)."""
    def f(u, v, x, w):
        return u @ v, nf.sigmoid(x @ w.T)

    program = _check(f, _f32(rng, 2, 3, 40, 20), _f32(rng, 2, 3, 20, 70), _f32(rng, 33, 8), _f32(rng, 65, 8))
    assert "tl.program_id(0)" in program.source
    assert "tl.program_id(1)" not in program.source and "tl.program_id(2)" not in program.source


def test_a_batch_of_products_adds_a_value_per_product_in_its_epilogue(rng: np.random.Generator):
    """``u @ v + c`` with one c per product (broadcast over its rows and columns): the epilogue loads c at the
    program's product index alone, a scalar address that Triton takes without a block mask (the fuzzer's
    ``matmul`` of a summed, negated operand hit it once epilogues could read views)."""
    def f(u, v, c):
        return u @ v + c

    program = _check(f, _f32(rng, 2, 3, 5, 4), _f32(rng, 2, 3, 4, 6), _f32(rng, 2, 3, 1, 1))
    assert len(program.kernels) == 1 and program.kernels[0].startswith("k0_gemm_add")


@pytest.mark.parametrize("k,blocks", [(64, False), (DOT_PROMOTE_K + 904, True)])
def test_a_long_half_precision_product_adds_its_blocks_in_float32(k: int, blocks: bool, rng: np.random.Generator):
    """A weight gradient's K (steps x batch) runs to millions, and the tensor cores' accumulation does not round
    to nearest: a half-precision product longer than ``DOT_PROMOTE_K`` sums each block of K apart and adds the
    blocks in float32 (the last one partial here); a short one keeps one loop. Against float64 on the same
    float16 values, to the rounding of the float16 output."""
    x, y = (rng.standard_normal((k, n)).astype(np.float16) for n in (16, 24))
    program = TritonBackend()(nf.compile(lambda a, b: a.T @ b).trace(x, y))
    assert ("for k1 in range(" in program.source) == blocks
    (got,) = program([x, y])
    want = x.T.astype(np.float64) @ y.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())


def test_blocks_past_the_edge_are_zero_for_products_and_sums(rng: np.random.Generator):
    """A block past the edge of a tensor is masked: a load there gives 0, and goes to ``tl.dot`` or the sum as it
    is (a half-precision operand then reaches the tensor cores from its pipelined copy in shared memory without a
    pass through registers: built for sm_90, a weight gradient's K step 141 -> 85 instructions); a value computed
    from it is selected, since exp(0) = 1 would add a term. Shapes leaving partial blocks everywhere, against the
    reference; the selects are counted in each kernel (the two sums kernels of their own: ``row_programs`` 0)."""
    def f(a, b, x):
        return a @ b, x.sum(-1), nf.exp(x).sum(-1)

    backend = TritonBackend(target=dataclasses.replace(triton_target(), row_programs=0))
    program = _check(f, _f32(rng, 37, 21), _f32(rng, 21, 19), _f32(rng, 5, 33), backend=backend)
    kernels = program.source.split("@triton.jit")[1:]
    selects = {k.split("def ", 1)[1].split("(", 1)[0]: k.count("tl.where(") for k in kernels
               if "def nf_" not in k}
    assert selects == {"k0_gemm": 0, "k1_sum": 0, "k2_sum": 1}, selects


def _k_parts_target(least: int) -> object:
    """The GPU target with GEMMs of fewer than 4096 results summed in parts of ``least`` (a multiple of it)."""
    return dataclasses.replace(triton_target(), split_k_outputs=4096, split_k_min=least)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("K", [0, 1, 127, 128, 129, 1000])
def test_a_long_product_with_few_results_sums_its_k_in_parts(K: int, dtype, rng: np.random.Generator):
    """A weight gradient has few results and a K of millions, which one program per tile of results loops over
    alone: with fewer results than ``split_k_outputs`` a GEMM sums its K in parts side by side (40 x 24 results
    here: at most ceil(4096 / 960) = 5 parts of at least 64), the parts added after, in order, with the
    epilogue. K too short for two parts stays one sum. Against float64 (float64 products sum float64 parts;
    float16 is rounded from float32 sums: to its rounding)."""
    x, y = _f32(rng, K, 40).astype(dtype), _f32(rng, K, 24).astype(dtype)
    target = _k_parts_target(64)

    def f(a, b):
        return nf.tanh(a.T @ b) + 1.0

    program, rendered = lower(prepare(nf.compile(f).trace(x, y), target), target=target)
    (gemm,) = [k for k in program.kernels() if isinstance(k, Gemm)]
    assert gemm.k_parts == (min(5, K // 64) if K >= 128 else 1)
    assert (gemm.partials is not None) == (gemm.k_parts > 1)
    if gemm.partials is not None:
        assert gemm.partials.dtype == (nf.float64 if dtype == np.float64 else nf.float32)
    assert rendered.kernels == (["k0_gemm_parts", "k1_parts_gemm_tanh_add"] if gemm.k_parts > 1 else
                                ["k0_gemm_tanh_add"])
    (got,) = TritonBackend(target=target)(nf.compile(f).trace(x, y))([x, y])
    want = np.tanh(x.T.astype(np.float64) @ y.astype(np.float64)) + 1.0
    tol = {np.float64: 1e-12, np.float32: 2e-5, np.float16: 2e-3}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


def test_parts_of_k_cover_it_once_in_whole_multiples(rng: np.random.Generator):
    """``nf_k_parts`` (run time: K is often steps x batch), from a program's module: at most the scheduled parts,
    each a multiple of the least part, together covering K, none of them empty but an empty K's one."""
    k_parts = TritonBackend()(nf.compile(lambda a: a * 2.0).trace(_f32(rng, 3))).module.nf_k_parts
    for k in range(0, 400):
        for most in (1, 2, 3, 7):
            for least in (1, 8, 64):
                chunk, parts = k_parts(k, most, least)
                assert chunk % least == 0 and 1 <= parts <= most and chunk * parts >= k
                assert k == 0 or chunk * (parts - 1) < k


def test_a_float32_product_takes_tiles_of_its_own_rows(rng: np.random.Generator):
    """A float32 GEMM multiplies on the CUDA cores and spills registers at the 64 rows a float16 one takes for
    the tensor cores (ptxas, sm_90, 4 warps: 180 bytes): it takes ``Tiles.gemm_m_f32`` rows."""
    x, w = _f32(rng, 40, 24), _f32(rng, 24, 48)
    for dtype, rows in ((np.float32, Tiles().gemm_m_f32), (np.float16, Tiles().gemm_m)):
        program = TritonBackend()(nf.compile(lambda a, b: nf.tanh(a @ b)).trace(x.astype(dtype), w.astype(dtype)))
        (launch,) = [line for line in program.source.splitlines() if "launch(k" in line and "gemm" in line]
        assert f"BM={rows}," in launch, launch
    assert Tiles().gemm_m_f32 < Tiles().gemm_m


def test_every_launch_says_whether_multiply_adds_contract(rng: np.random.Generator):
    """Triton 3.9 contracts a * b + c to FMA unless told otherwise and warns that 3.10 will not: each launch
    passes the target's choice, so a Triton upgrade alone changes neither results nor speed."""
    program = _check(lambda x, w: nf.tanh(x @ w.T) * 2.0 + 1.0, _f32(rng, 5, 8), _f32(rng, 6, 8))
    launches = [line for line in program.source.splitlines() if line.strip().startswith("launch(")]
    assert launches and all(line.endswith(f"enable_fp_fusion={FP_FUSION})") for line in launches)


def test_concat_and_pad(rng: np.random.Generator):
    def f(x, y):
        c = nf.concat([nf.sigmoid(x), y * 2.0], axis=1)
        return c, nf.pad(x, ((1, 0), (2, 3)), value=-1.0)

    _check(f, _f32(rng, 4, 3), _f32(rng, 4, 6))


# ---- persistent scan kernels ----------------------------------------------------------------------------------


def lstm(x, h0, c0, w_ih, w_hh, b, reverse=False):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x, reverse=reverse)
    return ys, h, c


def reverse_lstm(*args):
    return lstm(*args, reverse=True)


def lstm_args(rng: np.random.Generator, T: int, N: int = 3, I: int = 5, H: int = 8) -> list[np.ndarray]:
    return [_f32(rng, *s) for s in [(T, N, I), (N, H), (N, H), (4 * H, I), (4 * H, H), (4 * H,)]]


def gru(x, h0, w_ih, w_hh, b_ih, b_hh):
    """A GRU layer as a user writes it (torch's gate order, ``b_hn`` inside the reset product)."""
    def cell(h, x_t):
        ir, iz, i_n = (x_t @ w_ih.T + b_ih).chunk(3, axis=-1)
        hr, hz, h_n = (h @ w_hh.T + b_hh).chunk(3, axis=-1)
        r, z = nf.sigmoid(ir + hr), nf.sigmoid(iz + hz)
        n = nf.tanh(i_n + r * h_n)
        h = (1.0 - z) * n + z * h
        return h, h

    h, ys = nf.scan(cell, h0, x)
    return ys, h


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
def test_lstm_layer_is_one_persistent_kernel(fn, rng: np.random.Generator):
    """N = 20 rows: two programs of 16 rows, the second partly masked; the input projection of all 13 steps is
    one GEMM before the loop (the GPU target chunks nothing)."""
    args = lstm_args(rng, T=13, N=20)
    program, rendered = _scheduled(fn, *args)
    (loop,) = program.loops()
    assert loop.parallel is not None and loop.reverse == (fn is reverse_lstm) and loop.chunked == ()
    assert [type(k) for k in loop.body.kernels] == [SlicedGemm]
    assert rendered.kernels == ["k0_gemm_add", "k1_scan_gemm_add_sigmoid_mul_tanh"]
    _check(fn, *args)


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
def test_lstm_backward_through_time_is_a_persistent_kernel_too(fn, rng: np.random.Generator):
    """The gradient's reversed scan joins the four gate gradients (a concat read only by ``@ W_hh`` and stored for
    the weight-gradient GEMM after the loop): kept as four tiles, one dot each, so the backward loop is split by
    rows like the forward one. N = 20: two programs, the second partly masked."""
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = fn(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (h * c).sum()

    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    args = lstm_args(rng, T=7, N=20)
    program, _ = _scheduled(grads, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True, True]
    _check(grads, *args)


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
def test_weight_gradients_in_parts_at_every_length_from_one_program(fn, rng: np.random.Generator):
    """An LSTM's weight gradients ``dgates.T @ [x | h]`` over K = T x N, which is known only at run time: one
    program, K in parts of 8 (at most 26 and 16 here), at T = 0, 1 (one part), 7 (three) and 16 (six); against
    the reference."""
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = fn(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (h * c).sum()

    grads = nf.grad(loss, argnums=(3, 4, 5))
    target = _k_parts_target(8)
    args = lstm_args(rng, T=7)
    program, _ = lower(prepare(nf.compile(grads).trace(*args), target), target=target)
    parts = {tuple(k.node.shape): k.k_parts for k in program.kernels() if isinstance(k, Gemm) and k.k_parts > 1}
    assert parts == {(32, 5): -(-4096 // (32 * 5)), (32, 8): 4096 // (32 * 8)}  # the weights' gradients
    backend = TritonBackend(target=target)
    compiled = _check(grads, *args, backend=backend)
    for T in (0, 1, 16):
        _agree(compiled, grads, lstm_args(rng, T=T))
    assert backend.loads == 1


@pytest.mark.parametrize("rows", [8, 16])
def test_a_persistent_scan_of_eight_or_sixteen_rows_per_program(rows: int, rng: np.random.Generator):
    """``Tiles.scan_rows`` 8 (the default; Triton pads the step's ``tl.dot`` to 16 rows) or 16: a training step of
    20 rows is three or two programs per scan, the last partly masked, and agrees with the reference; fewer than
    8 rows per program is refused when the tiles are made."""
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = lstm(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (h * c).sum()

    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    program = _check(grads, *lstm_args(rng, T=5, N=20), backend=TritonBackend(tiles=Tiles(scan_rows=rows)))
    scans = [line for line in program.source.splitlines() if "launch(k" in line and "_scan_" in line]
    assert len(scans) == 2, scans
    assert all(f"triton.cdiv(20, {rows})" in line and f"ROWS={rows}" in line for line in scans), scans
    with pytest.raises(ValueError, match="scan_rows must be 8 at least"):
        Tiles(scan_rows=4)


def _scan_kernels(source: str) -> list[ast.FunctionDef]:
    """The persistent scan kernels of a program's source, parsed."""
    return [fn for fn in ast.parse(source).body if isinstance(fn, ast.FunctionDef) and "_scan_" in fn.name]


def _time_loop(kernel: ast.FunctionDef) -> ast.For:
    """A persistent scan kernel's time loop (its first statement at the top level that is a loop)."""
    return next(st for st in kernel.body if isinstance(st, ast.For))


def _time_loops(source: str) -> list[tuple[str, int | None]]:
    """For each persistent scan kernel of a program's source: how its time loop iterates (``range`` or
    ``tl.range``) and the ``num_stages`` it asks of Triton's pipeliner (None: not asked)."""
    loops = []
    for fn in _scan_kernels(source):
        call = _time_loop(fn).iter
        loops.append((ast.unparse(call.func), {k.arg: k.value.value for k in call.keywords}.get("num_stages")))
    return loops


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
@pytest.mark.parametrize("T", [0, 1, 2, 6])
def test_a_persistent_scan_has_its_step_inputs_pipelined(fn, T: int, rng: np.random.Generator):
    """``Tiles.scan_stages`` (2 by default) is the ``num_stages`` of the persistent kernels' time loops, a
    ``tl.range`` (Triton's pipeliner then copies each step's input tiles into shared memory a step ahead; the
    interpreter runs it as a plain loop: ``test_sm90.py`` checks the copies on a sm_90 build), 1 a plain
    ``range``; a training step agrees with the reference either way, forward and in reverse, at 0, 1, 2 and 6
    steps. A loop reading a chunk buffer that it writes itself every few steps is never pipelined."""
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = fn(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (h * c).sum()

    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    args = lstm_args(rng, T=T, N=10)
    for stages, want in ((2, ("tl.range", 2)), (3, ("tl.range", 3)), (1, ("range", None))):
        program = _check(grads, *args, backend=TritonBackend(tiles=Tiles(scan_stages=stages)))
        assert _time_loops(program.source) == [want, want]
    with pytest.raises(ValueError, match="scan_stages must be 1 at least"):
        Tiles(scan_stages=0)
    if T == 6 and fn is lstm:
        chunked = TritonBackend(target=dataclasses.replace(triton_target(), chunk_bytes=1 << 16))
        program = _check(lstm, *args, backend=chunked)
        assert _time_loops(program.source) == [("range", None)]
        assert "cstart" in {n.id for n in ast.walk(ast.parse(program.source)) if isinstance(n, ast.Name)}  # chunked


def test_a_host_loop_step_recomputes_what_its_kernels_share(rng: np.random.Generator):
    """An LSTM's backward step stepped by the host (a target that splits no rows, as for weights too large for one
    program): each of its kernels recomputes the gate derivatives it reads from the saved gate sums
    (``Target.step_recompute``), so a step is three launches — the joined gate gradients, their product with
    W_hh (the gradient of h), the next cell-state gradient — where the shared recompute rule launched ten; the
    gradient of x is one GEMM after the loop (``passes.sinks``); the values agree."""
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = lstm(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (h * c).sum()

    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    args = lstm_args(rng, T=6, N=5, H=16)
    target = dataclasses.replace(triton_target(), row_split=False)
    steps, launched = {}, {}
    for name, t in (("stepped", target), ("shared", dataclasses.replace(target, step_recompute=CHEAP))):
        program, rendered = lower(prepare(nf.compile(grads).trace(*args), t), target=t)
        forward, backward = program.loops()
        assert forward.parallel is None and backward.parallel is None and backward.reverse
        steps[name] = [type(k).__name__ for k in backward.body.kernels]
        launched[name] = rendered.kernels
    assert sorted(steps["stepped"]) == ["Concat", "Elementwise", "Gemm"], steps
    assert len(steps["shared"]) == 10, steps
    # copies of one shape share a launch: each loop's initial carries and the forward step's two saved carries:
    # three copy kernels, not six; results returned reshaped (the sunk dx, db) are stored in place, not copied
    assert sum("_copy" in k for k in launched["stepped"]) == 3, launched["stepped"]
    _check(grads, *args, backend=TritonBackend(target=target))


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
def test_a_float16_persistent_scan_keeps_its_step_in_float32(fn, rng: np.random.Generator):
    """A half-precision persistent kernel computes each step in float32 and rounds only what it stores (its
    carries, the cell state above all, keep their bits from step to step): over 32 steps it lands closer to the
    float64 result on the same float16 inputs than the reference backend, which rounds every op to float16: its
    root-mean-square error under 0.7 of the reference's (0.27-0.59 measured for ys, h and c over 12 seeds and
    both directions; about 1 when the kernel rounded every op too), and within float16 tolerance of it."""
    args = [a.astype(np.float16) for a in lstm_args(rng, T=32, N=4, I=16, H=16)]
    program, _ = _scheduled(fn, *args)
    assert program.loops()[0].parallel is not None
    exact = nf.compile(fn)(*(a.astype(np.float64) for a in args))
    rounded_each_op = nf.compile(fn)(*args)
    got = TritonBackend()(nf.compile(fn).trace(*args))(list(args))
    for g, r, e in zip(got, rounded_each_op, exact):
        err, ref_err = (np.sqrt(np.mean((v.astype(np.float64) - e) ** 2)) for v in (g, r))
        assert err < 0.7 * ref_err, (err, ref_err)
        np.testing.assert_allclose(g.astype(np.float32), r.astype(np.float32), rtol=5e-3, atol=5e-3)


@pytest.mark.parametrize("dtype,split", [("float16", True), ("float32", False)])
def test_recurrent_weights_split_by_rows_only_where_they_fit_shared_memory(rng: np.random.Generator, dtype: str,
                                                                          split: bool):
    """H = 96: W_hh.T (96 x 384) is held as a 128 x 512 block, 128 KiB in float16 (a persistent kernel) and 256 KiB
    in float32, over the GPU target's budget: a host loop of per-step launches."""
    args = [a.astype(dtype) for a in lstm_args(rng, T=2, N=4, I=8, H=96)]
    program, _ = _scheduled(lstm, *args)
    assert (program.loops()[0].parallel is not None) == split


def test_gru_cell_through_the_persistent_scan(rng: np.random.Generator):
    H, I, N = 8, 4, 5
    args = [_f32(rng, *s) for s in [(11, N, I), (N, H), (3 * H, I), (3 * H, H), (3 * H,), (3 * H,)]]
    program, rendered = _scheduled(gru, *args)
    assert [type(k) for k in program.block.kernels] == [Gemm, Loop] and len(rendered.kernels) == 2
    _check(gru, *args)


def gru_reset_before_matmul(x, h0, w_ih, w_hrz, w_hn, b):
    """A GRU whose reset gate scales h before its matmul: ``h @ W_hrz`` is split into two gates by column slices
    that are not a sliced GEMM's (the update gate feeds the second product's epilogue)."""
    def cell(h, x_t):
        xr, xz, xn = (x_t @ w_ih.T + b).chunk(3, axis=-1)
        hr, hz = (h @ w_hrz.T).chunk(2, axis=-1)
        r, z = nf.sigmoid(xr + hr), nf.sigmoid(xz + hz)
        n = nf.tanh(xn + (r * h) @ w_hn.T)
        h = (1.0 - z) * n + z * h
        return h, h

    h, ys = nf.scan(cell, h0, x)
    return ys, h


def test_a_product_read_through_column_slices_stays_in_the_persistent_kernel(rng: np.random.Generator):
    H, I, N = 8, 4, 20
    args = [_f32(rng, *s) for s in [(9, N, I), (N, H), (3 * H, I), (2 * H, H), (H, H), (3 * H,)]]
    program, _ = _scheduled(gru_reset_before_matmul, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True]
    _check(gru_reset_before_matmul, *args)


def test_a_gru_training_step_runs_both_loops_in_persistent_kernels(rng: np.random.Generator):
    """The GRU above, trained: its backward joins the input projection's gate gradients as ``concat(dr, 0, dn) +
    pad(dz)``, which simplify makes one concat, and sums ``(r * h)ᵀ @ dn`` after the loop; so the backward step
    holds its rows in registers like the forward one (it was a host loop), and the gradients agree."""
    H, I, N = 8, 4, 20
    args = [_f32(rng, *s) for s in [(9, N, I), (N, H), (3 * H, I), (2 * H, H), (H, H), (3 * H,)]]

    def loss(*a):
        ys, h = gru_reset_before_matmul(*a)
        return (ys * ys).sum() + h.sum()

    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    program, _ = _scheduled(grads, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True, True]
    _check(grads, *args)


def _scan_calls(source: str, name: str, step: bool = False) -> list[int]:
    """How many times each persistent scan kernel of a program's source (with ``step``, its time loop) calls
    ``name`` (``tl.store``, or a prelude function such as ``nf_max``)."""
    return [sum(isinstance(n, ast.Call) and ast.unparse(n.func) == name
                for n in ast.walk(_time_loop(fn) if step else fn))
            for fn in _scan_kernels(source)]


def max_centred_lstm(x, h0, c0, w_ih, w_hh, b):
    """An LSTM whose gate row is centred on its largest value, then cut into gates: a row max over the tiles."""
    def cell(carry, x_t):
        h, c = carry
        v = x_t @ w_ih.T + h @ w_hh.T + b
        i, f, g, o = (v - v.max(-1, keepdims=True) + v.mean(-1, keepdims=True)).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        return (nf.sigmoid(o) * nf.tanh(c), c), nf.sigmoid(o) * nf.tanh(c)

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


@pytest.mark.parametrize(("fn", "op", "per_row"), [(layer_norm_lstm, "sum", 6), (max_centred_lstm, "max", 1)])
@pytest.mark.parametrize(("H", "transposed"), [(8, False), (48, False), (48, True)],
                         ids=["one-tile", "tiles-of-32-and-16", "transposed"])
def test_a_row_held_one_tile_per_gate_is_reduced_once(fn, op: str, per_row: int, H: int, transposed: bool,
                                                       rng: np.random.Generator):
    """A sum or max over a row held one tile per gate combines the gate tiles element by element and reduces
    once (a reduction across a program's warps exchanges through shared memory between barriers), not once per
    tile: the layer-norm LSTM's step makes six row sums (two per normalized row: the gate rows of x and h, and
    the cell state), the max-centred one a single row max. At H = 48 each gate is a tile of 32 and one of 16: the
    32-wide tiles fold to 16 (their halves combined) and join the 16-wide ones, still one reduction a statistic,
    in ``[ROWS, width]`` tiles and transposed; all agree with the reference."""
    args = lstm_args(rng, T=4, N=10, I=6, H=H)
    tiles = Tiles(scan_transposed=transposed)
    program, _ = _scheduled(fn, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True]
    built = _check(fn, *args, backend=TritonBackend(tiles=tiles))
    assert _scan_calls(built.source, {"sum": "tl.sum", "max": "nf_max"}[op]) == [per_row]
    folds = [sum(isinstance(n, ast.Call) and ast.unparse(n.func) == f"nf_fold_{op}" for n in ast.walk(k))
             for k in _scan_kernels(built.source)]
    assert folds == [per_row if H == 48 else 0], folds


def test_a_row_max_in_a_scan_keeps_nan(rng: np.random.Generator):
    """A NaN in one batch row's input makes that row's max, and so its outputs from that step on, NaN, as in the
    reference; the other rows stay numbers. The scan reduces with ``nf_max`` (compiled for a GPU, ``tl.max``
    takes the larger of a number and NaN to be the number; the interpreter's is numpy's, NaN-keeping either
    way), at H = 48 after the fold of 32-wide tiles to 16."""
    args = lstm_args(rng, T=4, N=10, I=6, H=48)
    args[0][1, 3, 2] = np.nan
    built = _check(max_centred_lstm, *args)
    assert _scan_calls(built.source, "nf_max") == [1] and _scan_calls(built.source, "tl.max") == [0]
    ys = built(list(args))[0]
    assert np.isnan(ys[1:, 3]).all() and not np.isnan(ys[0]).any() and not np.isnan(np.delete(ys, 3, axis=1)).any()


def test_a_layer_norm_lstm_holds_its_gate_row_one_tile_per_gate(rng: np.random.Generator):
    """The gate row is normalized as a whole, then cut into gates: the persistent kernel computes it one tile per
    gate (four dots, the row sums added over the tiles). Its gradient's scan is one too: the four gate gradients
    joined into a row are those tiles, normalized backwards tile by tile (row sums over the tiles), multiplied by
    W_hh one dot per tile, and summed over the steps in a carry held one tile per gate (the bias gradient). Both
    agree with the reference. N = 20: two programs, the second partly masked."""
    args = lstm_args(rng, T=5, N=20, I=6)
    program, _ = _scheduled(layer_norm_lstm, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True]
    _check(layer_norm_lstm, *args)

    def loss(*a):
        ys, h, c = layer_norm_lstm(*a)
        return (ys * ys).sum() + (h * c).sum()

    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    program, rendered = _scheduled(grads, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True, True]
    assert sum("_scan_" in k for k in rendered.kernels) == 2, rendered.kernels
    _check(grads, *args)


@pytest.mark.parametrize(("width", "pieces"), [
    (96, ((0, 64), (64, 32))), (48, ((0, 32), (32, 16))), (384, ((0, 256), (256, 128))), (40, ((0, 32), (32, 8))),
    (100, ((0, 64), (64, 32), (96, 4))), (128, ((0, 128),)), (24, ((0, 24),)), (97, ((0, 97),)), (1, ((0, 1),)),
    (0, ((0, 0),))])
def test_a_row_is_held_in_the_power_of_two_tiles_that_pad_it_least(width: int, pieces: tuple):
    """96 as 64 + 32 (one tile would be 128 wide); 40 as 32 + 8, the 8 in a tile of 16 (48 columns, not 64); one
    tile where pieces pad as much (24: 16 + 8 is 32 as well) or one would be a single column (97)."""
    assert tile_pieces(width) == pieces


def _tile_widths(source: str) -> set[int]:
    """The widths of the register tiles a program's persistent scan kernels make (``tl.arange(0, width)``)."""
    return {n.args[1].value for fn in _scan_kernels(source) for n in ast.walk(fn)
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.arange" and isinstance(n.args[1], ast.Constant)}


def _trained(fn):
    def loss(*a):
        ys, *carries = fn(*a)
        return (ys * ys).sum() + sum(c.sum() for c in carries)

    return nf.grad(loss, argnums=tuple(range(6)))


def _gru_args(rng: np.random.Generator, H: int) -> list[np.ndarray]:
    return [_f32(rng, *s) for s in [(3, 10, 4), (10, H), (3 * H, 4), (2 * H, H), (H, H), (3 * H,)]]


# the scans of a row-split body at H = 48, forward and trained: LSTMs either way, a layer norm, a GRU
SCAN_MODELS = pytest.mark.parametrize(("fn", "make"), [
    (lstm, lstm_args), (reverse_lstm, lstm_args), (layer_norm_lstm, lstm_args), (max_centred_lstm, lstm_args),
    (gru_reset_before_matmul, _gru_args), (_trained(lstm), lstm_args), (_trained(reverse_lstm), lstm_args),
    (_trained(layer_norm_lstm), lstm_args), (_trained(gru_reset_before_matmul), _gru_args)],
    ids=["lstm", "reverse", "layer-norm", "max-centred", "gru", "lstm-grad", "reverse-grad", "layer-norm-grad",
         "gru-grad"])


@SCAN_MODELS
def test_a_persistent_scan_holds_rows_of_48_as_tiles_of_32_and_16(fn, make, rng: np.random.Generator):
    """H = 48 (``Tiles.scan_pieces``, the default): every row of 48 values — carries, gate tiles, a layer-norm
    LSTM's gate row held gate by gate, the backward's joined gate gradients — is two register tiles of 32 and 16
    columns, each step's product one ``tl.dot`` per pair of A and B tiles, and no tile is 64 wide; padded to 64
    instead, the kernels' widest tile is 64. Both agree with the reference, forward and trained, at T = 3 with N =
    10 (two programs, the second partly masked)."""
    args = make(rng, T=3, N=10, H=48) if make is lstm_args else make(rng, H=48)
    widths = {}
    for pieces in (True, False):
        program = _check(fn, *args, backend=TritonBackend(tiles=Tiles(scan_pieces=pieces)))
        widths[pieces] = _tile_widths(program.source)
    assert {16, 32} <= widths[True] and max(widths[True]) == 32, widths
    assert 64 in widths[False], widths


@SCAN_MODELS
@pytest.mark.parametrize("pieces", [True, False], ids=["tiles-of-32-and-16", "padded"])
def test_a_transposed_scan_holds_rows_on_the_inner_axis(fn, make, pieces: bool, rng: np.random.Generator):
    """``Tiles.scan_transposed``: every step value a ``[width, ROWS]`` tile and each product ``W @ hᵀ`` — the
    carries' tiles made ``(width, ROWS)``, the weights loaded as the dot's left operand, a layer norm's row sums
    over axis 0 — agrees with the reference, forward and trained, in pieces and padded, at H = 48, T = 3, N =
    10 (two programs of 8 rows, the second partly masked)."""
    args = make(rng, T=3, N=10, H=48) if make is lstm_args else make(rng, H=48)
    program = _check(fn, *args, backend=TritonBackend(tiles=Tiles(scan_pieces=pieces, scan_transposed=True)))
    src = program.source
    assert "tl.arange(0, ROWS)[None, :]" in src and "ROWS)[:, None]" not in src
    assert re.search(r"tl\.broadcast_to\([^\n]*, \(\d+, ROWS\)\)", src), "carries held as [width, ROWS] tiles"


def test_a_float16_scan_in_tiles_of_32_and_16_agrees_with_the_padded_one(rng: np.random.Generator):
    """H = 48 in float16, a training step: the tiles' dot operands are rounded to float16 piece by piece; the
    gradients agree with the padded kernel's to float16 rounding (the sums differ only in order)."""
    args = [a.astype(np.float16) for a in lstm_args(rng, T=4, N=10, H=48)]
    fn = _trained(lstm)
    got = {p: TritonBackend(tiles=Tiles(scan_pieces=p))(nf.compile(fn).trace(*args))(list(args)) for p in (True, False)}
    want = nf.compile(fn)(*args)
    for a, b, w in zip(got[True], got[False], want):
        np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(a.astype(np.float32), np.asarray(w).astype(np.float32), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("pieces", [True, False], ids=["tiles-of-32-and-16", "padded"])
def test_a_step_stores_its_tiles_of_one_width_at_once(pieces: bool, rng: np.random.Generator):
    """An LSTM's training step at H = 48: the forward step stores its four gate sums for the backward, and the
    backward step its four joined gate gradients for the weight gradients after the loop — each row's tiles of
    one width joined (``tl.join``) and stored at once, so each is two stores (a width of 32 and one of 16) or,
    padded, one, where it was eight or four; the forward's other rows (ys, and c as each step begins, for the
    backward; h as it begins is ys a step earlier: ``carries_read_from_outputs``), one tile of each width, are
    stored tile by tile. A GRU's three gates (no power of two) are stored one by one. The values agree with the
    reference."""
    tiles = Tiles(scan_pieces=pieces)
    program = _check(_trained(lstm), *lstm_args(rng, T=3, N=10, H=48), backend=TritonBackend(tiles=tiles))
    widths = 2 if pieces else 1
    assert _scan_calls(program.source, "tl.join", step=True) == [3 * widths, 3 * widths], program.source
    assert _scan_calls(program.source, "tl.store", step=True) == [3 * widths, widths], program.source
    gru_step = _check(_trained(gru), *[_f32(rng, *s) for s in [(3, 10, 4), (10, 48), (144, 4), (144, 48), (144,),
                                                                (144,)]], backend=TritonBackend(tiles=tiles))
    assert 0 in _scan_calls(gru_step.source, "tl.join", step=True), gru_step.source


def test_a_row_held_by_gates_is_stored_gate_by_gate_as_a_step_output(rng: np.random.Generator):
    """``h @ W`` cut into two gates (the second feeding the next product's epilogue) and also stacked as the
    scan's output: held one tile per gate, stored into its columns of each step's row."""
    def f(x, h0, w, v):
        def cell(h, x_t):
            p = h @ w
            a, b = p.chunk(2, axis=-1)
            return nf.tanh((nf.sigmoid(a) * h) @ v + b + x_t), p

        return nf.scan(cell, h0, x)

    H, N = 8, 20
    args = [_f32(rng, *s) for s in [(6, N, H), (N, H), (H, 2 * H), (H, H)]]
    program, _ = _scheduled(f, *args)
    assert [loop.parallel is not None for loop in program.loops()] == [True]
    _check(f, *args)


def test_alike_layers_share_their_kernels(rng: np.random.Generator):
    """Four LSTM layers of one width, alternating direction: eight launches of two kernels (the input
    projection's GEMM and the scan, its direction an argument), each compiled once; parameters are named by
    position, so the layers differ only in the buffers they are handed."""
    def stack(x, h0, c0, *ws):
        for k in range(4):
            x = lstm(x, h0, c0, *ws[3 * k:3 * k + 3], reverse=k % 2 == 1)[0]
        return x

    H, N = 8, 20
    args = [_f32(rng, *s) for s in [(5, N, H), (N, H), (N, H)] + [(4 * H, H), (4 * H, H), (4 * H,)] * 4]
    _, rendered = _scheduled(stack, *args)
    assert len(rendered.kernels) == 8 and len(set(rendered.kernels)) == 2
    assert rendered.source.count("@triton.jit(") == 2  # the prelude's helpers are plain @triton.jit
    _check(stack, *args)


def test_the_same_update_of_tensors_of_any_size_is_one_kernel(rng: np.random.Generator):
    """An optimizer's step updates every parameter alike: an elementwise kernel that reads and writes only at its
    flat offset takes its element count as an argument, so the updates of a 5 x 3, a 7 and a 4 x 2 x 9 tensor are
    one kernel launched three times (a model's parameters compile once, not once per shape); one that indexes by
    the shape (a broadcast) keeps it."""
    def f(a, b, c, v):
        return a * 0.9 + a.exp(), b * 0.9 + b.exp(), c * 0.9 + c.exp(), v * 0.9 + v.exp().sum(0)

    _, rendered = _scheduled(f, _f32(rng, 5, 3), _f32(rng, 7), _f32(rng, 4, 2, 9), _f32(rng, 6, 3))
    updates = [k for k in rendered.kernels if k.endswith("_mul_exp_add")]
    assert len(updates) == 3 and len(set(updates)) == 1, rendered.kernels
    assert "m = offs < n0" in rendered.source and "m = offs < 18" in rendered.source  # the broadcast: 6 x 3
    _check(f, _f32(rng, 5, 3), _f32(rng, 7), _f32(rng, 4, 2, 9), _f32(rng, 6, 3))


def test_two_sequence_lengths_share_one_compile(rng: np.random.Generator):
    """One program serves T = 3, 16 and 0; a trace at another T renders the same source, which the backend does
    not load again: T is a run-time argument of the kernel, not a constexpr, and never specialized on."""
    backend = TritonBackend()
    program = _check(lstm, *lstm_args(rng, T=3), backend=backend)
    for T in (16, 0):
        _agree(program, lstm, lstm_args(rng, T=T))
    again = backend(nf.compile(lstm).trace(*lstm_args(rng, T=9)))
    assert backend.loads == 1 and again.source == program.source and again.module is program.module
    kernel = getattr(program.module, program.kernels[0])
    signature = inspect.signature(getattr(kernel, "fn", kernel))
    assert signature.parameters["S0"].annotation is inspect.Parameter.empty
    params = getattr(kernel, "params", None)  # a compiling JITFunction; the interpreter keeps jit's arguments
    if params is not None:
        assert any(p.name == "S0" and p.do_not_specialize and not p.is_constexpr for p in params)
    else:
        assert "S0" in kernel.kwargs["do_not_specialize"]


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
def test_chunked_input_projection_crosses_chunks(fn, rng: np.random.Generator):
    """A target with 4-step chunks (not the GPU's default, which chunks nothing): T = 11 runs chunks of 4, 4 and 3
    steps, in the scan's direction."""
    backend = TritonBackend(target=dataclasses.replace(triton_target(), chunk_bytes=256 * 1024, max_chunk_steps=4))
    args = lstm_args(rng, T=11, N=4)
    program, _ = lower(prepare(nf.compile(fn).trace(*args), backend.target), target=backend.target)
    assert [c.steps for c in program.loops()[0].chunked] == [4]
    _check(fn, *args, backend=backend)


def test_a_scan_whose_rows_depend_on_each_other_runs_one_launch_per_step(rng: np.random.Generator):
    """Not split by rows (a sum over the batch each step): a host loop launching the body's kernels per step,
    forward and backward, one compiled module for every sequence length."""
    def batch_mixing_scan(x, h0, w):
        def cell(h, x_t):
            h = nf.tanh(h @ w + x_t + h.sum(axis=0, keepdims=True))
            return h, h

        return nf.scan(cell, h0, x)

    args = (_f32(rng, 4, 3, 5), _f32(rng, 3, 5), _f32(rng, 5, 5))
    program, _ = _scheduled(batch_mixing_scan, *args)
    assert [loop.parallel for loop in program.loops()] == [None]
    backend = TritonBackend()
    compiled = _check(batch_mixing_scan, *args, backend=backend)
    _agree(compiled, batch_mixing_scan, (_f32(rng, 7, 3, 5), *args[1:]))
    assert backend.loads == 1

    def loss(x, h0, w):
        h, ys = batch_mixing_scan(x, h0, w)
        return (ys * ys).sum() + h.sum()

    _check(nf.grad(loss, argnums=(0, 1, 2)), *args)


def test_torch_tensors_on_the_device_go_in_and_come_out_as_tensors(rng: np.random.Generator,
                                                                    monkeypatch: pytest.MonkeyPatch):
    """Tensors on the program's device (CPU tensors under the interpreter, CUDA tensors on a GPU) skip numpy both
    ways: the numpy call path is never taken, results stay on the device; a scan takes a new length too."""
    import torch

    device = TritonBackend().device
    f = nf.compile(lambda x, w: (nf.sigmoid(x @ w), x.sum()), backend="triton")
    g = nf.compile(lstm, backend="triton")

    def numpy_path(*_a, **_k):
        raise AssertionError("the numpy call path was taken")

    monkeypatch.setattr(TritonProgram, "__call__", numpy_path)
    x, w = _f32(rng, 5, 3), _f32(rng, 3, 4)
    y, s = f(torch.tensor(x, device=device), torch.tensor(w, device=device))
    assert isinstance(y, torch.Tensor) and y.device.type == device and s.shape == ()
    np.testing.assert_allclose(y.cpu().numpy(), 1 / (1 + np.exp(-(x @ w))), **TOL)
    np.testing.assert_allclose(float(s), x.sum(), rtol=1e-5)
    for T in (4, 7):
        args = lstm_args(rng, T=T)
        got = g(*(torch.tensor(a, device=device) for a in args))
        want = nf.compile(lstm)(*args)
        for a, b in zip(got, want):
            assert a.device.type == device
            np.testing.assert_allclose(a.cpu().numpy(), np.asarray(b), **TOL)
    assert g.trace_count == 1


def test_what_the_renderer_cannot_spell_raises_unsupported(rng: np.random.Generator):
    def scatter(x, i):
        return nf.scatter_add(nf.zeros((4, 3), dtype=nf.float16), 0, i, x)

    x = _f32(rng, 2, 3).astype(np.float16)
    with pytest.raises(Unsupported, match=r"scatter_add .* in float16"):
        TritonBackend()(nf.compile(scatter).trace(x, np.array([[0, 1, 3], [3, 2, 0]])))


@pytest.mark.gpu
@pytest.mark.skipif(TritonBackend().device != "cuda", reason="needs a CUDA device (TRITON_INTERPRET=0)")
def test_new_sequence_lengths_do_not_recompile_on_the_gpu(rng: np.random.Generator):
    """Compiled for real: the persistent kernel is compiled once for T = 3, 7, 16 and 40."""
    program = _check(lstm, *lstm_args(rng, T=3))
    for T in (7, 16, 40):
        _agree(program, lstm, lstm_args(rng, T=T))
    kernel = getattr(program.module, program.kernels[0])
    assert sum(len(cache[0]) for cache in kernel.device_caches.values()) == 1


@pytest.mark.parametrize("group", [0, 1, 3, 8])
def test_gemm_programs_cover_every_tile_once_in_groups_of_row_tiles(group: int):
    """``tile_ids``'s order, evaluated in Python for a grid of ``tiles_m`` x ``tiles_n`` tiles times a batch: every
    tile once; with a group G the programs of each run of G x ``tiles_n`` take at most G row tiles (A's tiles read
    while in cache), the last group short where G does not divide the row tiles; with 0 the row tiles run fastest."""
    from types import SimpleNamespace

    from nnforge.codegen.triton.texpr import tile_ids

    lines = [line.replace(".to(tl.int64)", "") for line in tile_ids("M", "N", group)
             if not line.startswith(("rm =", "rn ="))]
    for M, N, BM, BN, batch in ((643, 97, 64, 32, 2), (64, 32, 64, 32, 1), (64 * 16, 40, 64, 32, 3)):
        tiles_m, tiles_n = -(-M // BM), -(-N // BN)
        seen = []
        for pid in range(tiles_m * tiles_n * batch):
            tl = SimpleNamespace(program_id=lambda axis, pid=pid: pid, cast=lambda v, dtype: v, int32=None,
                                 minimum=min)
            env = {"tl": tl, "M": M, "N": N, "BM": BM, "BN": BN}
            for line in lines:
                exec(line, env)
            seen.append((env["pid_b"], env["pid_m"], env["pid_n"]))
        assert sorted(seen) == [(b, m, n) for b in range(batch) for m in range(tiles_m) for n in range(tiles_n)]
        if group == 0:
            assert [m for _, m, _ in seen[:tiles_m]] == list(range(tiles_m))
            continue
        run, tiles = group * tiles_n, tiles_m * tiles_n
        for b in range(batch):
            ours = seen[b * tiles:(b + 1) * tiles]
            assert {pid_b for pid_b, _, _ in ours} == {b}
            for start in range(0, tiles, run):
                assert len({m for _, m, _ in ours[start:start + run]}) == min(group, tiles_m - start // tiles_n)


@pytest.mark.parametrize("group", [0, 3, 8])
def test_gemms_in_groups_of_row_tiles_agree_with_the_reference(rng: np.random.Generator, group: int):
    """A product of 11 x 4 tiles (the last group of 3 or 8 row tiles short), a batched one and an RNN's sliced
    step in each order."""
    tiles = Tiles(gemm_m=16, gemm_n=16, gemm_group=group)
    backend = TritonBackend(tiles=tiles)
    _check(lambda a, b: nf.tanh(a @ b), _f32(rng, 171, 24), _f32(rng, 24, 61), backend=backend)
    _check(lambda a, b: a @ b, _f32(rng, 3, 40, 16), _f32(rng, 3, 16, 35), backend=backend)
    host_loop = dataclasses.replace(triton_target(), max_split_weight_bytes=0)
    args = lstm_args(rng, T=3, N=40, H=24)
    _check(lstm, *args, backend=TritonBackend(tiles=tiles, target=host_loop))
    program, _ = lower(prepare(nf.compile(lstm).trace(*args), host_loop), tiles, host_loop)
    assert any(isinstance(k, SlicedGemm) for loop in program.loops() for k in loop.body.kernels)
    with pytest.raises(ValueError, match="gemm_group"):
        Tiles(gemm_group=-1)


@pytest.mark.parametrize("trained", [False, True], ids=["forward", "grad"])
def test_a_layer_norm_of_the_input_projection_may_leave_the_persistent_scan(rng: np.random.Generator,
                                                                             trained: bool):
    """``Target.hoist_step_work``: the layer norm of ``x_t @ W_ih`` (carry-free) is computed for all steps before
    the persistent scan — the loop keeps 4 of its 6 row sums a step (those of ``h @ W_hh`` and of ``c``) — and
    the layer-norm LSTM agrees with the reference, forward and trained."""
    from nnforge.schedule.program import Reduce

    fn = _trained(layer_norm_lstm) if trained else layer_norm_lstm
    args = lstm_args(rng, T=3, N=10, H=16)
    sums = {}
    for whole in (False, True):
        target = dataclasses.replace(triton_target(), hoist_step_work=whole)
        _check(fn, *args, backend=TritonBackend(target=target))
        program, _ = lower(prepare(nf.compile(fn).trace(*args), target), None, target)
        forward = program.loops()[0]
        assert forward.parallel is not None
        sums[whole] = sum(isinstance(k, Reduce) for k in forward.body.kernels)
    assert sums == {False: 6, True: 4}


def test_large_half_precision_products_take_the_large_tile():
    """``Tiles.gemm_block`` at the shapes of an LSTM layer: the large tile for a half-precision product wide and
    deep enough on every side that still makes ``gemm_big_programs`` programs (a size known only at run time, a
    sequence's steps, counts as long); the small one for float32 (no tensor cores), a side narrower than the tile
    (H = 96: the projection's K, its gradients' 96 columns), few programs, or ``gemm_big_programs`` 0."""
    from nnforge.codegen.triton.target import GemmBlock

    t = Tiles()
    big = GemmBlock(t.gemm_big_m, t.gemm_big_n, t.gemm_big_k, t.gemm_big_warps)
    small = GemmBlock(t.gemm_m, t.gemm_n, t.gemm_k, t.gemm_warps)
    assert big.consts() == {"BM": 128, "BN": 128, "BK": 64} and big.warps == 8
    assert t.gemm_block(None, 4096, 1024, half=True) == big  # H = 1024: x @ W_ih.T over T x N rows
    assert t.gemm_block(4096, 1024, None, half=True) == big  # its weight gradient, K = T x N
    assert t.gemm_block(None, 4096, 1024, half=False) == GemmBlock(t.gemm_m_f32, t.gemm_n, t.gemm_k, t.gemm_warps)
    assert t.gemm_block(None, 384, 96, half=True) == small  # H = 96: K of 96 is under four K steps of 64
    assert t.gemm_block(None, 96, 384, half=True) == small  # 96 columns are under the tile's 128
    assert t.gemm_block(1024, 1024, 4096, half=True) == small  # 8 x 8 = 64 programs
    assert t.gemm_block(512, 512, 512, half=True, copies=8) == big  # 4 x 4 x 8 = 128
    assert t.gemm_block(512, 512, 512, half=True, copies=None) == big
    # an LSTM step at batch 1024: four accumulators of 128 x 64 each; H = 1024 makes 8 x 16 programs, 384 8 x 6
    assert t.gemm_block(1024, 1024, 1024, half=True, sliced=True) == GemmBlock(128, t.gemm_big_slice_n, 64, 8)
    assert t.gemm_block(1024, 384, 384, half=True, sliced=True) == small
    assert Tiles(gemm_big_programs=0).gemm_block(None, 4096, 1024, half=True) == small
    with pytest.raises(ValueError, match="gemm_big_programs"):
        Tiles(gemm_big_programs=-1)
    with pytest.raises(ValueError, match="power of two"):
        Tiles(gemm_big_n=96)


def _blocks(program) -> set[str]:
    """The ``BM``, ``BN``, ``BK`` of each GEMM launch in a program's host code."""
    return {m.group(0) for m in re.finditer(r"BM=\d+, BN=\d+, BK=\d+", program.source)}


def test_products_in_the_large_tile_agree_with_float64(rng: np.random.Generator):
    """The large tile made small enough for the interpreter (32 x 32, K steps of 16, slices of 16, from 2
    programs) in float16: a product with an epilogue, a batch of products, a weight gradient summed over K in
    parts, and an LSTM training step as a host loop (its step's sliced product, the backward's products, the
    weight gradients over a run-time K), each against float64 on the same float16 values to float16's rounding;
    each takes the large tile (its launches say so). At 40 rows and 9 programs at least, the step's product (2 x
    4 programs) takes the small tile, the input projection over a run-time count of rows the large one."""
    tiles = Tiles(gemm_big_m=32, gemm_big_n=32, gemm_big_slice_n=16, gemm_big_k=16, gemm_big_programs=2)
    big, slices = "BM=32, BN=32, BK=16", "BM=32, BN=16, BK=16"

    def near(program, fn, args):
        exact = nf.compile(fn)(*(a.astype(np.float64) for a in args))
        exact = list(exact) if isinstance(exact, tuple | list) else [exact]
        got = program(list(args))
        for g, e in zip(got, exact, strict=True):
            e = np.asarray(e)
            np.testing.assert_allclose(g.astype(np.float64), e, rtol=4e-3, atol=4e-3 * max(1.0, np.abs(e).max()))

    def build(fn, args, target=None):
        program = TritonBackend(tiles=tiles, target=target or triton_target())(nf.compile(fn).trace(*args))
        near(program, fn, args)
        return program

    def half(*shape: int) -> np.ndarray:
        return _f32(rng, *shape).astype(np.float16)

    assert _blocks(build(lambda a, b: nf.tanh(a @ b), [half(70, 80), half(80, 48)])) == {big}
    assert _blocks(build(lambda a, b: a @ b, [half(3, 40, 64), half(3, 64, 33)])) == {big}
    parts = build(lambda a, b: a.T @ b + 1.0, [half(1000, 40), half(1000, 48)], _k_parts_target(64))
    assert _blocks(parts) == {big} and "parts" in parts.kernels[0]

    def loss(*a):
        ys, h, c = lstm(*a)
        return (ys * ys).sum() + (h * c).sum()

    host_loop = dataclasses.replace(triton_target(), max_split_weight_bytes=0)
    args = [a.astype(np.float16) for a in lstm_args(rng, T=3, N=64, I=64, H=64)]
    trained = build(nf.grad(loss, argnums=(0, 3, 4, 5)), args, host_loop)
    assert {big, slices} <= _blocks(trained)
    few = TritonBackend(tiles=dataclasses.replace(tiles, gemm_big_programs=9), target=host_loop)
    args = [a.astype(np.float16) for a in lstm_args(rng, T=3, N=40, I=64, H=64)]
    step = few(nf.compile(lstm).trace(*args))
    near(step, lstm, args)
    assert _blocks(step) == {big, f"BM={Tiles().gemm_m}, BN={Tiles().gemm_n}, BK={Tiles().gemm_k}"}


# a resident loop's step of one tile, holding its weights in one chunk of K or in chunks of 16; in 16 x 16 tiles,
# more than the interpreter's one program, reading them each step
RESIDENT_TILES = [Tiles(), Tiles(held_k=16), Tiles(gemm_m_f32=16, gemm_n=16)]


def _resident(**changes) -> object:
    """The GPU target stepping every loop on the host (no row split), each such loop's steps in one launch of
    resident programs (``Target.resident_steps``)."""
    return dataclasses.replace(triton_target(), row_split=False, resident_steps=True, **changes)


@pytest.mark.parametrize("fn", [lstm, reverse_lstm])
@pytest.mark.parametrize("tiles", RESIDENT_TILES, ids=["held", "held-in-chunks", "read"])
def test_a_resident_loop_runs_every_step_in_one_launch(fn, tiles: Tiles, rng: np.random.Generator):
    """An LSTM layer not split by rows (a wide layer's weights do not fit one program) with ``resident_steps``:
    its loop is one kernel, launched once, whose programs run each step's fused GEMM + cell kernel and wait for
    each other (under the interpreter one program runs them all); the program has no host loop left (nothing for
    a CUDA graph to replay), and a later call at T = 0, 1 (the final carries in the first buffers or the second)
    and 6 builds nothing. With the default tiles the step is one tile, which the one program holds the weights of
    across steps (its tile of W_hh loaded before the first: K = 32 as one chunk, or as two of ``held_k`` 16); in
    16 x 16 tiles it is 2 x 2 tiles, more than the launch's programs, so each step reads its weights again.
    Against the reference."""
    args = lstm_args(rng, T=5, N=20, H=32)
    target = _resident()
    program, rendered = lower(prepare(nf.compile(fn).trace(*args), target), tiles, target=target)
    (loop,) = program.loops()
    assert loop.parallel is None and loop.resident
    assert [name.split("_", 1)[1] for name in rendered.kernels] == ["gemm_add", "copy", "resident_scan"]
    assert "steps in one launch of resident programs" in format_program(program)
    backend = TritonBackend(tiles=tiles, target=target)
    compiled = _check(fn, *args, backend=backend)
    assert compiled.module.HOST_LOOPS == 0
    launch = next(line for line in compiled.source.splitlines() if "launch(k" in line and "_resident_" in line)
    grid = re.search(r"H0=\((.*)\) <= np", launch)[1]  # the step's programs: held where the launch has as many
    assert eval(grid, {"triton": __import__("triton")}) == (4 if tiles.gemm_n == 16 else 1), launch
    for T in (0, 1, 6):
        _agree(compiled, fn, lstm_args(rng, T=T, N=20, H=32))
    assert backend.loads == 1


@pytest.mark.parametrize("tiles", RESIDENT_TILES, ids=["held", "held-in-chunks", "read"])
def test_a_resident_training_step_waits_between_the_kernels_of_each_step(tiles: Tiles, rng: np.random.Generator):
    """A training step of the LSTM and of the GRU, each loop resident: the forward step saves its carries for
    the backward (a second kernel), the backward step is three kernels (the joined gate gradients, their product
    with W_hh, the next cell-state gradient), each stage reading what the one before it stored in that step;
    the forward's step and the backward's product with W_hh hold their weights (in one chunk of K or several)
    where they are one tile, or read them each step in smaller tiles. Against the reference, at odd and even
    T."""
    def loss(x, h0, c0, w_ih, w_hh, b):
        ys, h, c = lstm(x, h0, c0, w_ih, w_hh, b)
        return (ys * ys).sum() + (h * c).sum()

    def gru_loss(*a):
        ys, h = gru(*a)
        return (ys * ys).sum() + h.sum()

    target = _resident()
    grads = nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))
    args = lstm_args(rng, T=5, N=20, H=32)
    program, rendered = lower(prepare(nf.compile(grads).trace(*args), target), tiles, target=target)
    forward, backward = program.loops()
    assert forward.resident and backward.resident and len(backward.body.kernels) == 3
    assert len([name for name in rendered.kernels if "_resident_scan" in name]) == 2
    held = re.findall(r"\bH\d+=", rendered.source)
    assert len(held) == 2, held  # the forward's step, the backward's product with W_hh
    compiled = _check(grads, *args, backend=TritonBackend(tiles=tiles, target=target))
    _agree(compiled, grads, lstm_args(rng, T=4, N=20, H=32))
    H, I, N = 8, 4, 20
    gru_args = [_f32(rng, *s) for s in [(7, N, I), (N, H), (3 * H, I), (3 * H, H), (3 * H,), (3 * H,)]]
    gru_grads = nf.grad(gru_loss, argnums=(0, 1, 2, 3, 4, 5))
    assert all(loop.resident for loop in lower(prepare(nf.compile(gru_grads).trace(*gru_args), target),
                                               target=target)[0].loops())
    _check(gru_grads, *gru_args, backend=TritonBackend(tiles=tiles, target=target))


def test_a_loop_whose_host_decides_per_step_stays_a_host_loop(rng: np.random.Generator):
    """What a launch decides on the host each step cannot be decided in a resident loop: a random draw's key (a
    dropout inside the cell), so such a loop is stepped by the host, and a row-split loop keeps its persistent
    kernel; the same target otherwise makes the loop resident."""
    from nnforge.nn.functional import dropout

    args = lstm_args(rng, T=3, N=4, H=8)

    def dropped(x, h0, c0, w_ih, w_hh, b):
        def cell(carry, x_t):
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + dropout(h, 0.5) @ w_hh.T + b).chunk(4, axis=-1)
            c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
            h = nf.sigmoid(o) * nf.tanh(c)
            return (h, c), h

        return nf.scan(cell, (h0, c0), x)[1]

    target = _resident()
    (loop,) = lower(prepare(nf.compile(dropped).trace(*args), target), target=target)[0].loops()
    assert loop.parallel is None and not loop.resident
    (split,) = lower(prepare(nf.compile(lstm).trace(*args), dataclasses.replace(target, row_split=True)),
                     target=dataclasses.replace(target, row_split=True))[0].loops()
    assert split.parallel is not None and not split.resident


def test_alike_resident_loops_share_their_kernel(rng: np.random.Generator):
    """Two stacked LSTM layers of one width, each loop resident: one resident kernel serves both (compiled once,
    as alike kernels of a host loop are), each launch with its own layer's buffers; against the reference."""
    def two_layers(x, h0, c0, w_ih, w_hh, b, h1, c1, v_ih, v_hh, d):
        ys = lstm(x, h0, c0, w_ih, w_hh, b)[0]
        return lstm(ys, h1, c1, v_ih, v_hh, d)[0]

    args = lstm_args(rng, T=5, N=20, I=16, H=16) + lstm_args(rng, T=1, N=20, I=16, H=16)[1:]
    program = _check(two_layers, *args, backend=TritonBackend(target=_resident()))
    resident = [name for name in program.kernels if "_resident_" in name]
    assert len(resident) == 2 and len(set(resident)) == 1, program.kernels


@pytest.mark.parametrize(("sms", "programs", "held"), [(132, 6, True), (4, 4, False)])
def test_a_resident_launch_has_no_more_programs_than_a_step_has_tiles(sms: int, programs: int, held: bool,
                                                                      rng: np.random.Generator):
    """The launch's programs are the GPU's SMs, but no more than the widest kernel of a step has tiles (each
    program arrives at every barrier): an LSTM step of 3 x 2 tiles launches 6 programs on a 132-SM part, each
    holding its tile of the weights, and 4 on a 4-SM one, reading them each step. The launches are recorded, not
    run (a barrier among several programs waits forever under the interpreter)."""
    import torch

    args = lstm_args(rng, T=3, N=40, H=32)
    tiles = Tiles(gemm_m_f32=16, gemm_n=16)
    program = TritonBackend(tiles=tiles, target=_resident())(nf.compile(lstm).trace(*args))
    module = program.module
    launches = []
    original, module.nf_resident_programs = module.nf_resident_programs, lambda dev: sms
    try:
        outs = [torch.empty(np.asarray(w).shape) for w in nf.compile(lstm)(*args)]
        module.run([torch.from_numpy(a) for a in args], [], outs, [3], "cpu",
                   launch=lambda kernel, grid, *a, **meta: launches.append((grid, meta)))
    finally:
        module.nf_resident_programs = original
    (resident,) = [(grid, meta) for grid, meta in launches if "H0" in meta]
    assert resident == ((programs,), resident[1]) and resident[1]["H0"] is held, resident
