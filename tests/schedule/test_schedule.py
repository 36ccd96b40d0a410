"""``schedule(graph, target) -> Program``: the decisions past the passes are taken from the target and recorded,
the printed program shows them, and the C backend renders exactly the program it was given."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c import _shown_config, lower, prepare
from nnforge.codegen.c.cexpr import Sizes
from nnforge.codegen.c.lower import Lowering
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.triton.target import triton_target
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.schedule import Copy, Elementwise, Gemm, Random, Reduce, SlicedGemm, Unsupported, schedule

sys.path.insert(0, str(Path(__file__).parents[1] / "codegen"))
from test_c_row_split import _lstm_args, ln_lstm, lstm


def _program(fn, args, target=None):
    return schedule(prepare(nf.compile(fn).trace(*args)), target or cpu_target())


def test_an_lstm_layer_prints_its_decisions(rng: np.random.Generator) -> None:
    """Row split, row block, the chunked input projection and the resident recurrent weight, in the text a user
    reads (``nf.show(..., stage="scheduled")``)."""
    args = _lstm_args(rng, 150, 16, 5, 8)
    text = nf.show(nf.compile(lstm), *args, stage="scheduled")
    lines = text.splitlines()
    assert lines[0] == "program for target cpu"
    wide = _shown_config().vector_bytes == 64  # H = 8: the general tile and its vectors, by the compiler's
    rows, lanes = (12, 16) if wide else (6, 8)
    assert lines[1].startswith(f"  scan over T steps, rows split among workers (batch 16, {rows} rows per pass) -> (")
    assert lines[2] == (f"    every 64 steps, input 0: gemm+add -> b0: f32[1024, 32]  [B resident across steps; tiles "
                        f"{lanes} columns at a time]")
    assert lines[3].startswith("    gemm+add+sigmoid+mul+tanh -> out1: f32[16, 8], out0: f32[16, 8] (and out2)  "
                               "[column tiles of 4 slices at ")
    assert lines[4] == "  }" and len(lines) == 5


def test_the_renderer_walks_the_program_the_scheduler_made(rng: np.random.Generator) -> None:
    g = prepare(nf.compile(ln_lstm).trace(*_lstm_args(rng, 6, 12, 5, 8)))
    low = lower(g)
    assert low.program == schedule(g, cpu_target())
    assert low.program is not schedule(g, cpu_target())  # equal records, not a cached object


def test_the_target_decides(rng: np.random.Generator) -> None:
    args = _lstm_args(rng, 150, 16, 5, 8)
    (split,) = _program(lstm, args).loops()
    assert split.parallel is not None and split.chunked[0].steps == 64
    (shared,) = _program(lstm, args, replace(cpu_target(), row_split=False)).loops()
    assert shared.parallel is None and not shared.chunked  # chunks only in a loop without barriers
    (small,) = _program(lstm, args, replace(cpu_target(), max_chunk_steps=5)).loops()
    assert small.chunked[0].steps == 5 and small.chunked[0].gemm.out.shape == (5 * 16, 32)
    (whole,) = _program(lstm, args, replace(cpu_target(), row_block=0)).loops()
    assert whole.parallel is not None and whole.row_block == 0


def test_kernel_forms_and_where_results_go(rng: np.random.Generator) -> None:
    """A reduction with its epilogue, an elementwise kernel storing into a result, a result that is an input
    (copied), and a GEMM whose result is the graph's."""

    def fn(x, w):
        y = x @ w
        return (y * y).sum(-1, keepdims=True) * 0.5, nf.tanh(x) + 1.0, x, y

    x, w = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    block = _program(fn, (x, w)).block
    kinds = {type(k): k for k in block.kernels}
    assert kinds[Gemm].out.output == 3 and kinds[Gemm].epilogue is None and not kinds[Gemm].b_resident
    assert kinds[Reduce].kind == "sum+mul" and kinds[Reduce].out.output == 0
    assert kinds[Elementwise].kind == "tanh+add" and kinds[Elementwise].out.output == 1
    (copy,) = block.copies
    assert isinstance(copy, Copy) and copy.out.output == 2 and copy.kind == "copy"


def test_a_result_returned_reshaped_is_stored_in_place(rng: np.random.Generator) -> None:
    """A GEMM's product returned as another shape (a sunk ``[T * N, P]`` product returned as ``[T, N, P]``) is
    stored by the GEMM into the result, not stored and then copied; the same value returned twice, reshaped and
    not, is stored into both; a reshaped input is still copied."""

    def fn(x, w):
        y = x @ w
        return y.reshape(2, 3, 4), x.reshape(3, 2, 3), nf.tanh(y).reshape(24), y

    x, w = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    block = _program(fn, (x, w)).block
    gemm = next(k for k in block.kernels if isinstance(k, Gemm))
    tanh = next(k for k in block.kernels if isinstance(k, Elementwise))
    assert gemm.out.output == 0 and gemm.also == (3,) and tanh.out.output == 2
    assert [c.out.output for c in block.copies] == [1]  # the input's reshape only
    for backend in nf.available_backends():
        got = nf.compile(fn, backend=backend)(x, w)
        wants = ((x @ w).reshape(2, 3, 4), x.reshape(3, 2, 3), np.tanh(x @ w).reshape(24), x @ w)
        assert len(got) == len(wants)
        for g, want in zip(got, wants):
            np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6, err_msg=backend)


def test_training_sums_weight_gradients_over_leading_axes(rng: np.random.Generator) -> None:
    def loss(*a):
        return (lstm(*a)[0] ** 2).sum()

    prog = _program(nf.grad(loss, argnums=(3, 4, 5)), _lstm_args(rng, 7, 16, 5, 8))
    assert any(isinstance(k, Reduce) and k.leading for k in prog.kernels())  # db: the sum over T and N
    forward, backward = prog.loops()
    assert forward.chunked  # the backward pass reads the stacked gate sums, not the projection
    assert backward.parallel is not None  # rows split
    assert not backward.chunked  # the gates are not recomputed: the forward step stored their sums
    sliced = [k for k in forward.body.kernels if isinstance(k, SlicedGemm)]
    assert len(sliced) == 1 and sliced[0].product is not None and sliced[0].returns_root
    assert sliced[0].returned.op == Op.ADD


def test_random_numbers_are_scheduled_only_where_the_target_draws_them(rng: np.random.Generator) -> None:
    def fn(x):
        return x + nf.rand(*x.shape) * nf.randn(*x.shape)

    g = prepare(nf.compile(fn).trace(rng.standard_normal((3, 4)).astype(np.float32)))
    draws = [k for k in schedule(g, cpu_target()).kernels() if isinstance(k, Random)]
    assert sorted(k.draw for k in draws) == [0, 1] and sorted(k.dist for k in draws) == ["normal", "uniform"]
    with pytest.raises(Unsupported, match="rand runs on the reference backend"):
        schedule(g, replace(cpu_target(), random=False))


def test_loops_nest_in_the_program(rng: np.random.Generator) -> None:
    def fn(x, h0):
        def outer(h, x_t):
            def inner(g, _):
                return nf.tanh(g * 0.5 + x_t), g

            g, _ = nf.scan(inner, h, nf.stack([x_t, x_t]))
            return g, g

        return nf.scan(outer, h0, x)

    x, h0 = rng.standard_normal((3, 4, 5)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)
    outer, inner = _program(fn, (x, h0)).loops()
    assert inner in outer.body.kernels and inner.length == 2
    assert outer.parallel is None and inner.parallel is None  # batch 4: too few rows; never inside a loop


def test_weight_gradient_gemms_pack_a_in_k_slices(rng: np.random.Generator) -> None:
    """dW_ih = xᵀ g over all steps: A read down its columns, K = T * N = 640 rows of x; packed per worker and
    sliced along K (256 at a time on the CPU target) — and not at all when the target never packs A."""

    def loss(*a):
        return (lstm(*a)[0] ** 2).sum()

    hoist = replace(cpu_target(), reduction_hoist_bytes=0)  # the weight-gradient sums leave the backward scan
    g = run_pipeline(nf.compile(nf.grad(loss, argnums=(3, 4, 5))).trace(*_lstm_args(rng, 40, 16, 5, 8)),
                     pipeline(hoist))
    packed = [k for k in schedule(g, hoist).kernels() if isinstance(k, Gemm) and k.pack_a]
    assert packed and all(k.k_split for k in packed)
    assert all(int(k.node.srcs[0].shape[-1]) >= 512 for k in packed)
    never = schedule(g, replace(hoist, pack_a_min_k=None)).kernels()
    assert not any(isinstance(k, Gemm) and k.pack_a for k in never)
    whole = schedule(g, replace(hoist, k_slice=0)).kernels()
    assert any(isinstance(k, Gemm) and k.pack_a and not k.k_split for k in whole)


def test_few_results_over_a_long_k_sum_it_in_parts_where_the_target_says(rng: np.random.Generator) -> None:
    """``target.split_k_outputs``: a GEMM outside loops with fewer results sums its K in parts (``Gemm.k_parts``,
    float32 partial sums for a float16 product). A weight gradient's K = T * N is known only at run time: parts
    enough for the results (32 x 5: ceil(4096 / 160) = 26); a K known when compiling bounds them (K // least);
    not the input projection (T * N rows), not a GEMM of a loop's body, not on the CPU target (whose renderer
    refuses the form); the printed program names the partial sums."""

    def loss(*a):
        return (lstm(*a)[0] ** 2).sum()

    parts = replace(triton_target(), split_k_outputs=4096, split_k_min=16)
    args = [a.astype(np.float16) for a in _lstm_args(rng, 40, 16, 5, 8)]
    graph = run_pipeline(nf.compile(nf.grad(loss, argnums=(3, 4, 5))).trace(*args), pipeline(parts))
    program = schedule(graph, parts)
    split = {tuple(k.node.shape): k for k in program.kernels() if isinstance(k, Gemm) and k.k_parts > 1}
    assert {s: k.k_parts for s, k in split.items()} == {(32, 5): 26, (32, 8): 16}
    # one sum: the projection and the step's product (rows known at run time) and the first step's term of
    # W_hh's gradient, h0 (K = min(T, 1) x N: short however long the sequence)
    assert sorted(k.k_parts for k in program.kernels() if isinstance(k, Gemm)) == [1, 1, 1, 16, 26]
    assert all(k.partials.shape == (k.k_parts, *k.node.shape) and k.partials.dtype == nf.float32
               for k in split.values())
    assert any(isinstance(k, Gemm) and k.k_parts == 1 for k in program.kernels())  # T * N rows: many results
    assert not any(isinstance(k, Gemm) and k.k_parts > 1 for loop in program.loops() for k in loop.body.kernels)
    assert "[K in at most 26 parts -> b" in str(program)
    on_cpu = prepare(nf.compile(nf.grad(loss, argnums=(3, 4, 5))).trace(*args))
    assert not any(isinstance(k, Gemm) and k.k_parts > 1 for k in schedule(on_cpu, cpu_target()).kernels())
    x, w = rng.standard_normal((640, 8)).astype(np.float32), rng.standard_normal((640, 4)).astype(np.float32)
    fixed = prepare(nf.compile(lambda a, b: a.T @ b).trace(x, w))
    assert [k.k_parts for k in schedule(fixed, parts).kernels() if isinstance(k, Gemm)] == [640 // 16]
    with pytest.raises(Unsupported, match="sum K in parts"):  # the C renderer refuses what it cannot spell
        Lowering(schedule(fixed, replace(cpu_target(), split_k_outputs=4096, split_k_min=16)), Sizes([]),
                 None).source()


def test_elementwise_kernels_take_vector_lanes_where_every_read_allows(rng: np.random.Generator) -> None:
    """8 float32 lanes on the CPU target: contiguous and broadcast reads along the last axis vectorize, and a pad
    along it on the columns where the read is inside its source; a transposed read, a cast, a pad across rows or
    a width below one vector keep the element-by-element loop; float64 has no vector form here. (Each kernel's
    tanh keeps it an elementwise kernel rather than a copy.)"""
    x, y = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    cases = {
        "contiguous": (lambda x, y, b: nf.tanh(x * 2.0), 8),
        "broadcast row": (lambda x, y, b: nf.tanh(x + b), 8),
        "broadcast column": (lambda x, y, b: nf.tanh(x + x.sum(-1, keepdims=True)), 8),
        "transposed": (lambda x, y, b: nf.tanh(y.T + 1.0), 1),
        "cast": (lambda x, y, b: nf.tanh((x > 0).cast(nf.float32)), 1),
        "pad": (lambda x, y, b: nf.tanh(x.pad(((0, 0), (1, 0)))), 8),
        "pad across rows": (lambda x, y, b: nf.tanh(x.pad(((1, 0), (0, 0)))), 1),
        "narrow": (lambda x, y, b: nf.tanh(x[:, :5]), 1),
    }
    for name, (fn, lanes) in cases.items():
        (k,) = [k for k in _program(fn, (x, y, b)).kernels() if isinstance(k, Elementwise) and "tanh" in k.fuses]
        assert k.lanes == lanes, name
        assert k.columns == ((1, 17) if name == "pad" else None), name
        got = nf.compile(fn, backend="cpu")(x, y, b)  # and the C renders what was chosen, with the same values
        np.testing.assert_allclose(got, nf.compile(fn)(x, y, b), rtol=2e-6, atol=2e-6)
    (k,) = [k for k in _program(lambda x: nf.tanh(x * 2.0), (x.astype(np.float64),)).kernels()
            if isinstance(k, Elementwise)]
    assert k.lanes == 1


def test_row_sums_read_vectors_where_the_row_is_contiguous(rng: np.random.Generator) -> None:
    y = rng.standard_normal((16, 24)).astype(np.float32)
    for fn, lanes in ((lambda y: (y * y).sum(-1), 8), (lambda y: (y.T * 2.0).sum(-1), 1),
                      (lambda y: y.sum(0), 1)):
        (k,) = [k for k in _program(fn, (y,)).kernels() if isinstance(k, Reduce)]
        assert k.lanes == lanes
        np.testing.assert_allclose(nf.compile(fn, backend="cpu")(y), nf.compile(fn)(y), rtol=1e-5, atol=1e-5)


def test_gemm_tiles_take_vector_lanes_where_the_epilogue_allows(rng: np.random.Generator) -> None:
    """A GEMM's tile runs 8 float32 columns at a time when its epilogue vectorizes along the columns (a plain
    product, a bias); a transposed read in the epilogue, float64, or packed-A loops keep it element by element.
    An LSTM step's sliced GEMM runs its cell update on vectors of the tiles."""
    x, w = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    b, y = rng.standard_normal(16).astype(np.float32), rng.standard_normal((16, 6)).astype(np.float32)
    cases = {
        "plain": (lambda x, w, b, y: x @ w, 8),
        "bias": (lambda x, w, b, y: nf.tanh(x @ w + b), 8),
        "transposed": (lambda x, w, b, y: nf.tanh(x @ w + y.T), 1),
    }
    for name, (fn, lanes) in cases.items():
        (k,) = [k for k in _program(fn, (x, w, b, y)).kernels() if isinstance(k, Gemm)]
        assert k.lanes == lanes, name
        np.testing.assert_allclose(nf.compile(fn, backend="cpu")(x, w, b, y), nf.compile(fn)(x, w, b, y),
                                   rtol=2e-5, atol=2e-5)
    (k,) = [k for k in _program(lambda x, w: x @ w, (x.astype(np.float64), w.astype(np.float64))).kernels()
            if isinstance(k, Gemm)]
    assert k.lanes == 1
    packed = replace(cpu_target(), pack_a_min_m=1)
    (k,) = [k for k in _program(lambda x, w: x @ w, (x, w), packed).kernels() if isinstance(k, Gemm)]
    assert k.pack_a and k.lanes == 1
    (k,) = [k for k in _program(lstm, _lstm_args(rng, 5, 16, 5, 8)).kernels() if isinstance(k, SlicedGemm)]
    assert k.lanes == 8


def test_the_c_renderer_refuses_a_gemm_tile_vector_form_it_cannot_spell(rng: np.random.Generator) -> None:
    """Told to run a transposed epilogue read 8 columns at a time, the renderer raises instead of falling back."""
    from nnforge.codegen.c.cexpr import Sizes
    from nnforge.codegen.c.lower import Lowering
    from nnforge.errors import NNForgeError

    x, w = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((16, 16)).astype(np.float32)
    y = rng.standard_normal((16, 6)).astype(np.float32)
    g = prepare(nf.compile(lambda x, w, y: nf.tanh(x @ w + y.T)).trace(x, w, y))
    p = schedule(g, cpu_target())
    forced = replace(p, block=replace(p.block, kernels=tuple(replace(k, lanes=8) if isinstance(k, Gemm) else k
                                                             for k in p.block.kernels)))
    with pytest.raises(NNForgeError, match="no vector form"):
        Lowering(forced, Sizes([])).source()


def test_a_row_split_pass_is_whole_tiles_of_its_gemms(rng: np.random.Generator) -> None:
    """An H = 24 step runs on the 4 x 24 tile (K = 24, whole 24-column slices), so its passes are 4 rows (6 would
    leave 2 rows of each pass to the remainder tile); at H = 8, on the 6 x 16 tile, 6 rows; a target that names no
    tiles keeps its ``row_block``, and a tile list must end with one for any K."""
    (narrow,) = _program(lstm, _lstm_args(rng, 20, 16, 5, 24)).loops()
    assert narrow.parallel is not None and narrow.row_block == 4
    (wide,) = _program(lstm, _lstm_args(rng, 20, 16, 5, 8)).loops()
    assert wide.parallel is not None and wide.row_block == 6
    (untiled,) = _program(lstm, _lstm_args(rng, 20, 16, 5, 24), replace(cpu_target(), gemm_tiles=())).loops()
    assert untiled.row_block == 6
    with pytest.raises(ValueError, match="max K 0"):
        replace(cpu_target(), gemm_tiles=((96, 4, 96),))
