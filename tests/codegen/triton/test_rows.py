"""Kernels over the same rows as one Triton kernel of whole rows (``Target.row_programs``, ``Rows``), under the
interpreter: which kernels join (asserted on the schedule's records), that a row is loaded once and only results
are stored (asserted on the kernel's parsed source), and every result against the reference interpreter —
layer norms and softmaxes forward and trained, NaN and infinite rows, integers, half precision, leading axes of
size 1 and of a run-time length."""

from __future__ import annotations

import ast
import dataclasses
import os
import re

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (by the backend, lazily)

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("triton")

from lstm_cells import gate_row_norm_lstm, layer_norm_lstm  # this folder: shared with test_triton_render.py

import nnforge as nf
import nnforge.nn.functional as F
from nnforge.codegen.triton import TritonBackend, lower, prepare, triton_target
from nnforge.codegen.triton.target import Tiles
from nnforge.schedule import Elementwise, Gemm, Loop, Reduce, Rows

pytestmark = [pytest.mark.triton,
              pytest.mark.filterwarnings("ignore::RuntimeWarning"),  # masked-off lanes compute garbage in numpy
              pytest.mark.skipif(not TritonBackend().available, reason="TRITON_INTERPRET=0 and no CUDA device")]


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) * 2.0).astype(np.float32)


def layer_norm(x, g, b):
    return F.layer_norm(x, x.shape[-1:], g, b)


def softmax(x):
    return x.softmax(-1)


def _built(fn, args, target=None, tiles: Tiles | None = None):
    """(the schedule, the rendered module, the outputs) of ``fn`` on Triton, checked against the reference."""
    target = target or triton_target()
    graph = prepare(nf.compile(fn).trace(*args), target)
    program, rendered = lower(graph, tiles, target)
    got = TritonBackend(target=target, tiles=tiles or Tiles())(nf.compile(fn).trace(*args))(list(args))
    want = nf.compile(fn)(*args)
    want = list(want) if isinstance(want, tuple | list) else [want]
    assert len(got) == len(want)
    for a, w in zip(got, want):
        w = np.asarray(w)
        tol = 2e-3 if w.dtype == np.float16 else 2e-5
        np.testing.assert_allclose(np.asarray(a, dtype=np.float64), w.astype(np.float64), rtol=tol, atol=tol)
    return program, rendered, got


def _rows(program) -> list[Rows]:
    return [k for k in program.kernels() if isinstance(k, Rows)]


def _calls(source: str, kernel: str, name: str) -> int:
    """How many times kernel ``kernel`` of a module's source calls ``name`` (``tl.load``, ``tl.store``)."""
    fn = next(f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef) and f.name == kernel)
    return sum(isinstance(n, ast.Call) and ast.unparse(n.func) == name for n in ast.walk(fn))


@pytest.mark.parametrize("shape", [(3, 5, 48), (40, 384), (1, 6, 100), (6, 1, 7)], ids=str)
@pytest.mark.parametrize("fn", [layer_norm, softmax])
def test_a_layer_norm_or_softmax_is_one_kernel_that_reads_each_row_once(fn, shape, rng: np.random.Generator):
    """A layer norm (two row sums and the normalization) and a softmax (a row max, the exponentials, their sum,
    the division) are one kernel of whole rows: it loads each input once and stores only the result — the
    statistics and the exponentials stay where they were computed. Widths not a power of two (48, 100, 7),
    leading axes of size 1, rows more than one program takes (40 rows of 384: 8 a program)."""
    args = [_f32(rng, *shape)] + ([_f32(rng, shape[-1]), _f32(rng, shape[-1])] if fn is layer_norm else [])
    program, rendered, _ = _built(fn, args)
    (rows,) = _rows(program)
    assert [type(m) for m in rows.members] == ([Reduce, Reduce, Elementwise] if fn is layer_norm
                                               else [Reduce, Elementwise, Reduce, Elementwise])
    assert rows.stores[-1] and not any(rows.stores[:-1])
    (kernel,) = rendered.kernels
    assert _calls(rendered.source, kernel, "tl.load") == len(args)  # x, and a layer norm's gain and bias
    assert _calls(rendered.source, kernel, "tl.store") == 1


def test_the_rows_kernel_trains_a_layer_norm(rng: np.random.Generator):
    """A layer norm's gradient: its backward's row sums (of dy * xhat, of dy) and the input gradient join the
    forward's statistics in whole-row kernels; the gain and bias gradients, sums over the rows, do not (they
    reduce the other axis). Every gradient agrees with the reference."""
    x, g, b, dy = _f32(rng, 12, 48), _f32(rng, 48), _f32(rng, 48), _f32(rng, 12, 48)

    def loss(x, g, b):
        return (layer_norm(x, g, b) * dy).sum()

    program, _, _ = _built(nf.grad(loss, argnums=(0, 1, 2)), [x, g, b])
    rows = _rows(program)
    assert rows and sum(isinstance(m, Reduce) for r in rows for m in r.members) >= 4


def test_nan_and_infinite_rows_are_what_the_reference_makes_of_them(rng: np.random.Generator):
    """A softmax over rows holding a NaN, +inf, only -inf, and the largest float32: NaN propagates through the
    row max as in the reduction kernels (which only a GPU run tells apart: the interpreter's max is numpy's,
    NaN-propagating by itself), inf - inf is NaN, an all -inf row is NaN."""
    x = _f32(rng, 6, 24)
    x[1, 3] = np.nan
    x[2, 5] = np.inf
    x[3, :] = -np.inf
    x[4, 7] = np.finfo(np.float32).max
    _, _, (got,) = _built(softmax, [x])
    assert np.isnan(got[1]).all() and np.isnan(got[3]).all() and not np.isnan(got[[0, 4, 5]]).any()


def test_integer_rows(rng: np.random.Generator):
    """Integer row maxima and sums (int32 and int64) with the elementwise kernels on them, one kernel each."""
    x = rng.integers(-50, 50, (7, 20)).astype(np.int32)
    y = rng.integers(-2**40, 2**40, (7, 20)).astype(np.int64)

    def f(x, y):
        return x - x.max(-1, keepdims=True) + x.sum(-1, keepdims=True), y * 2 - y.max(-1, keepdims=True)

    program, _, _ = _built(f, [x, y])
    assert len(_rows(program)) >= 1


def test_half_precision_rows(rng: np.random.Generator):
    """float16 rows: the statistics summed in float32 and rounded where the reference rounds them."""
    x = _f32(rng, 9, 96).astype(np.float16)
    program, _, _ = _built(lambda x: layer_norm(x, x[0], x[1]), [x])
    assert len(_rows(program)) == 1


def test_rows_of_a_run_time_length(rng: np.random.Generator):
    """A scan's stacked outputs [T, N, H] (T a run-time length) normalized over H: the rows' count is a run-time
    size, one compiled program serves every T."""
    w = _f32(rng, 16, 16) * 0.2

    def f(x, h0):
        _, ys = nf.scan(lambda h, x_t: (nf.tanh(x_t + h @ w), nf.tanh(x_t + h @ w)), h0, x)
        return softmax(ys)

    for T in (3, 5):
        program, _, _ = _built(f, [_f32(rng, T, 4, 16), _f32(rng, 4, 16)])
        assert len(_rows(program)) == 1


def test_a_kernel_reading_an_earlier_one_elsewhere_starts_a_new_group(rng: np.random.Generator):
    """``e`` read reversed along the row (another thread's element) cannot come from the program's registers:
    the kernel reading it so is not in ``e``'s group, which stores ``e`` for it."""
    def f(x):
        e = nf.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True) + e[:, ::-1]

    program, _, _ = _built(f, [_f32(rng, 5, 24)])
    (rows,) = _rows(program)
    assert isinstance(rows.members[-1], Reduce) and rows.stores[1], rows  # e stored: read after the group


def test_a_value_read_after_the_group_is_stored(rng: np.random.Generator):
    """The row max is read again by a kernel after the group (a count over the rows, through the same broadcast
    the softmax reads it by): its member stores it; the exponentials, read by no one else, stay unstored."""
    def f(x):
        top = x.max(-1, keepdims=True)
        e = nf.exp(x - top)
        return e / e.sum(-1, keepdims=True), (x == top).astype(np.float32).sum(0)

    program, _, _ = _built(f, [_f32(rng, 9, 24)])
    (rows,) = _rows(program)
    assert rows.stores == (True, False, False, True), rows.stores


def test_rows_wider_than_the_target_takes_are_kernels_of_their_own(rng: np.random.Generator):
    """``row_programs``: rows wider than it, and a target without it (0), keep one kernel per reduction."""
    x = _f32(rng, 4, 48)
    for widest in (32, 0):
        target = dataclasses.replace(triton_target(), row_programs=widest)
        program, rendered, _ = _built(softmax, [x], target)
        assert not _rows(program) and len(rendered.kernels) >= 3
    program, _, _ = _built(softmax, [x], dataclasses.replace(triton_target(), row_programs=48))
    assert len(_rows(program)) == 1


@pytest.mark.parametrize(("elements", "rows", "dtype", "block"), [
    (64, 70, np.float32, 1), (4096, 70, np.float32, 64), (4096, 70, np.float64, 32), (4096, 6, np.float32, 8)])
def test_a_program_takes_as_many_rows_as_its_tile_holds(elements: int, rows: int, dtype, block: int,
                                                        rng: np.random.Generator):
    """``Tiles.row_elements``: values of 4 bytes a program takes, rows of 48 padded to 64 — 64 values a program
    is one row, 4096 are 64 rows, or 32 of float64 values (as many registers); never more rows than there are
    (6 rows: 8 a program, not 64). The same results."""
    _, rendered, _ = _built(softmax, [_f32(rng, rows, 48).astype(dtype)], tiles=Tiles(row_elements=elements))
    assert f"BR={block}," in rendered.source


@pytest.mark.parametrize("resident", [False, True], ids=["host-loop", "resident"])
def test_a_step_the_host_runs_takes_its_rows_whole(resident: bool, rng: np.random.Generator):
    """A loop stepped by the host (not split by rows, as a wide layer's is), forward and trained: its body's
    layer norms are kernels of whole rows too, launched each step or run as stages of the loop's resident
    programs (``resident_steps``); a row-split loop's body is one kernel already and has none. Against the
    reference at T = 4."""
    T, N, H = 4, 6, 8
    args = [_f32(rng, T, N, 5), _f32(rng, N, H), _f32(rng, N, H), _f32(rng, 4 * H, 5) * 0.3,
            _f32(rng, 4 * H, H) * 0.3, _f32(rng, 4 * H)]

    def loss(*a):
        ys, h, c = gate_row_norm_lstm(*a)
        return (ys * ys).sum() + (h * c).sum()

    target = dataclasses.replace(triton_target(), row_split=False, resident_steps=resident)
    for fn in (gate_row_norm_lstm, nf.grad(loss, argnums=(0, 1, 2, 3, 4, 5))):
        program, _, _ = _built(fn, args, target)
        bodies = [k for loop in program.loops() for k in loop.body.kernels if isinstance(k, Rows)]
        assert bodies and all(loop.resident == resident for loop in program.loops())
    split, _, _ = _built(gate_row_norm_lstm, args)
    assert [loop.parallel is not None for loop in split.loops()] == [True]
    assert not any(isinstance(k, Rows) for k in split.loops()[0].body.kernels)


def projected_norm(x, w, b0, g, b):
    """A projection and the layer norm of its rows (a transformer's output projection and norm)."""
    return layer_norm(x @ w + b0, g, b)


@pytest.mark.parametrize(("M", "K", "N", "dtype"), [(10, 6, 48, np.float32), (40, 32, 384, np.float32),
                                                      (5, 20, 7, np.float32), (3, 100, 512, np.float32),
                                                      (33, 24, 96, np.float16)], ids=str)
def test_a_projection_leads_the_rows_of_its_layer_norm(M: int, K: int, N: int, dtype, rng: np.random.Generator):
    """A GEMM whose rows are at most ``Target.gemm_row_programs`` values leads the kernel of the layer norm after
    it: each program computes whole rows of the product (all N columns, the bias added on the accumulator) and
    normalizes them where they are, so the product is neither stored nor read back — one kernel, its loads x, w,
    the projection's bias, the norm's gain and bias, one store. Widths not a power of two (48, 7: padded to the
    16 columns ``tl.dot`` takes at least), rows over several programs (40 of 384: 16 a program), float16."""
    args = [_f32(rng, M, K).astype(dtype) * 0.3, _f32(rng, K, N).astype(dtype) * 0.3, _f32(rng, N).astype(dtype),
            _f32(rng, N).astype(dtype), _f32(rng, N).astype(dtype)]
    program, rendered, _ = _built(projected_norm, args)
    (rows,) = _rows(program)
    assert type(rows.members[0]) is Gemm and sum(isinstance(m, Reduce) for m in rows.members) == 2
    assert rows.stores[-1] and not any(rows.stores[:-1])
    (kernel,) = rendered.kernels
    assert _calls(rendered.source, kernel, "tl.load") == 5
    assert _calls(rendered.source, kernel, "tl.store") == 1
    assert _calls(rendered.source, kernel, "tl.dot") == 1
    # tl.dot takes tiles of 16 rows and columns at least (a GPU build refuses fewer; the interpreter does not)
    assert min(map(int, re.findall(r"tl\.arange\(0, (\d+)\)", rendered.source))) >= 16
    block = int(re.search(r"\bBR=(\d+)", rendered.source).group(1))
    assert block >= 16 and f"triton.cdiv({M}, {block})" in rendered.source  # as many programs as that takes


def test_a_projection_read_with_its_leading_axis_split_leads_its_rows(rng: np.random.Generator):
    """An input projection over all steps ``[T * N, 4H]``, normalized as ``[T, N, 4H]`` (the layer-norm LSTM's
    with ``hoist_step_work``): the same rows, read through the reshape from the accumulator — one kernel, and
    in the LSTM one kernel before the scan where there were a GEMM and a whole-row kernel."""
    T, N, H = 4, 6, 8
    x, w, g, b = _f32(rng, T * N, 5), _f32(rng, 5, 4 * H), _f32(rng, 4 * H), _f32(rng, 4 * H)
    program, rendered, _ = _built(lambda x, w, g, b: layer_norm((x @ w).reshape(T, N, 4 * H), g, b), [x, w, g, b])
    (rows,) = _rows(program)
    assert type(rows.members[0]) is Gemm and not rows.stores[0] and len(rendered.kernels) == 1
    args = [_f32(rng, T, N, 5), _f32(rng, N, H), _f32(rng, N, H), _f32(rng, 4 * H, 5) * 0.3,
            _f32(rng, 4 * H, H) * 0.3, _f32(rng, 4 * H)]
    hoisted = dataclasses.replace(triton_target(), hoist_step_work=True)
    program, _, _ = _built(layer_norm_lstm, args, hoisted)
    before = [k for k in program.block.kernels if not isinstance(k, Loop)]
    assert len(before) == 1 and isinstance(before[0], Rows) and type(before[0].members[0]) is Gemm


def test_a_product_read_after_its_rows_is_stored_and_a_wide_one_is_apart(rng: np.random.Generator):
    """A product the function also returns is stored by the kernel that leads its rows (once, from the
    accumulator); one wider than ``gemm_row_programs`` (or with it 0) is a GEMM of its own before them, trained
    too: the backward's products are not led (they read whole rows, not rows of their own), all against the
    reference."""
    x, w, g, b = _f32(rng, 9, 12), _f32(rng, 12, 40), _f32(rng, 40), _f32(rng, 40)

    def both(x, w, g, b):
        y = x @ w
        return y, layer_norm(y, g, b)

    program, rendered, _ = _built(both, [x, w, g, b])
    (rows,) = _rows(program)
    assert type(rows.members[0]) is Gemm and rows.stores[0] and len(rendered.kernels) == 1
    assert _calls(rendered.source, rendered.kernels[0], "tl.store") == 2
    for widest in (32, 0):
        target = dataclasses.replace(triton_target(), gemm_row_programs=widest)
        program, _, _ = _built(both, [x, w, g, b], target)
        assert isinstance(program.block.kernels[0], Gemm)
        assert [type(m) for m in _rows(program)[0].members] == [Reduce, Reduce, Elementwise]

    def loss(x, w, g, b):
        return (layer_norm(x @ w, g, b) * x[:, :1]).sum()

    program, _, _ = _built(nf.grad(loss, argnums=(0, 1, 2, 3)), [x, w, g, b])
    assert any(type(r.members[0]) is Gemm for r in _rows(program))


def test_a_linear_layer_on_a_sequence_leads_its_residual_layer_norm(rng: np.random.Generator):
    """A transformer's output projection, residual add and norm, ``layer_norm(x + linear(x))`` on a [T, N, d] x:
    the bias is added on the product's rows before the reshape (``passes.reshapes``), inlined where the
    residual add reads it through the reshape, and the whole is one kernel led by the GEMM, nothing stored but
    the result."""
    x, w, b0 = _f32(rng, 5, 3, 24), _f32(rng, 24, 24) * 0.2, _f32(rng, 24)
    g, b = _f32(rng, 24), _f32(rng, 24)

    def block(x, w, b0, g, b):
        return layer_norm(x + F.linear(x, w, b0), g, b)

    program, rendered, _ = _built(block, [x, w, b0, g, b])
    (rows,) = _rows(program)
    assert type(rows.members[0]) is Gemm and rows.stores[-1] and not any(rows.stores[:-1])
    assert len(rendered.kernels) == 1


@pytest.mark.parametrize(("T", "S"), [(10, 12), (33, 40)], ids=str)
def test_attention_scores_lead_their_softmax(T: int, S: int, rng: np.random.Generator):
    """A batch of products leads the rows after it: an attention's scores ``q @ k.T * scale`` over [batch, heads]
    and their softmax are one kernel whose programs each take rows of one product (they share its k) — T query
    rows per product, not a multiple of the 16 a program takes, so the last program of each product is partly
    masked. Each head has a temperature of its own (one value per product: a scalar load in the program). The
    scores are not stored; against the reference, trained too."""
    q, kk, c = _f32(rng, 2, 3, T, 8) * 0.3, _f32(rng, 2, 3, S, 8) * 0.3, _f32(rng, 2, 3, 1, 1)

    def scores(q, kk, c):
        return (q @ kk.transpose(-1, -2) * c).softmax(-1)

    program, rendered, _ = _built(scores, [q, kk, c])
    (rows,) = _rows(program)
    assert type(rows.members[0]) is Gemm and not any(rows.stores[:-1]) and len(rendered.kernels) == 1
    # a program's rows past its product's T are masked: unmasked, they would store into the next product's rows,
    # which its own programs write too (in an order the interpreter fixes and a GPU does not)
    assert "pid_b = pid // tiles" in rendered.source and f"mr = rm < {T}" in rendered.source

    def loss(q, kk, c):
        return (scores(q, kk, c) * q[..., :1]).sum()

    _built(nf.grad(loss, argnums=(0, 1, 2)), [q, kk, c])
