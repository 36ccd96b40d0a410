"""Which row-split bodies a target that keeps step values in registers accepts (``schedule.registers``): the same
scan is split for the CPU and kept a host loop for Triton exactly when its body reads a value of the step at
another element, and the reason names the op and the user's line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c import prepare
from nnforge.codegen.c.target import cpu_target
from nnforge.schedule import schedule

N, H, T = 16, 8, 5


def _cell_scan(cell):
    def f(h0, x, w):
        return nf.scan(lambda h, x_t: cell(h, x_t, w), h0, x)
    return f


def _elementwise(h, x_t, w):
    h = nf.tanh(h @ w + x_t)
    return h, h


def _shifted(h, x_t, w):
    h = nf.tanh(h @ w + x_t + nf.concat([h[:, :1], h[:, :-1]], axis=1))  # the carry one column over
    return h, h


def _transposed(h, x_t, w):
    s = h.reshape(N, 2, H // 2).transpose(1, 2).reshape(N, H)  # the carry's columns reordered
    h = nf.tanh(s @ w + x_t)
    return h, h


def _loop(cell, rng: np.random.Generator, steps_in_registers: bool):
    args = (rng.standard_normal((N, H)).astype(np.float32), rng.standard_normal((T, N, H)).astype(np.float32),
            rng.standard_normal((H, H)).astype(np.float32) * 0.3)
    target = dataclasses.replace(cpu_target(), min_split_rows=1, steps_in_registers=steps_in_registers)
    program = schedule(prepare(nf.compile(_cell_scan(cell)).trace(*args)), target)
    (loop,) = program.loops()
    return loop


@pytest.mark.parametrize("cell", [_shifted, _transposed])
def test_off_element_reads_of_the_step_keep_the_loop_out_of_registers(cell, rng: np.random.Generator,
                                                                      caplog: pytest.LogCaptureFixture):
    assert _loop(cell, rng, steps_in_registers=False).parallel is not None
    with caplog.at_level("DEBUG", logger="nnforge.schedule"):
        assert _loop(cell, rng, steps_in_registers=True).parallel is None
    assert "reads a value of the step at another element" in caplog.text and "test_registers.py" in caplog.text


def test_element_by_element_bodies_stay_split(rng: np.random.Generator):
    assert _loop(_elementwise, rng, steps_in_registers=True).parallel is not None



def _joined_product(h, x_t, w):
    z = nf.concat([nf.tanh(h), nf.sigmoid(h)], axis=1)  # [N, 2H], stored as a step output
    return z @ nf.concat([w, w], axis=0) + x_t, z


def _joined_elementwise(h, x_t, w):
    z = nf.concat([nf.tanh(h), nf.sigmoid(h)], axis=1)
    return z @ nf.concat([w, w], axis=0) + x_t, z * 2.0  # also read element by element


@pytest.mark.parametrize("cell,split", [(_joined_product, True), (_joined_elementwise, False)])
def test_a_stored_concat_stays_tiles_only_where_products_read_it(cell, split: bool, rng: np.random.Generator,
                                                                  caplog: pytest.LogCaptureFixture):
    """An LSTM's backward step joins its gate gradients and multiplies them by W_hh: kept as tiles, one dot each.
    Read element by element it would need its columns moved: a host loop, and the log says why."""
    with caplog.at_level("DEBUG", logger="nnforge.schedule"):
        assert (_loop(cell, rng, steps_in_registers=True).parallel is not None) == split
    if not split:
        assert "stored concat that is read by mul" in caplog.text and "test_registers.py" in caplog.text


def _gates_of_a_product(h, x_t, w):
    """As a GRU with its reset gate before the matmul: one half of ``h @ [w w]`` feeds the second product's
    epilogue, so the halves are no sliced GEMM's gates."""
    a, b = (h @ nf.concat([w, w], axis=1)).chunk(2, axis=-1)
    h = nf.tanh((nf.sigmoid(a) * h) @ w + b + x_t)
    return h, h


def _gates_and_the_whole_product(h, x_t, w):
    p = h @ nf.concat([w, w], axis=1)
    a, b = p.chunk(2, axis=-1)
    h = nf.tanh((nf.sigmoid(a) * h) @ w + b + x_t + p @ nf.concat([w, w], axis=0))  # p whole, as an operand
    return h, h


@pytest.mark.parametrize("cell", [_gates_of_a_product, _gates_and_the_whole_product])
def test_a_product_read_through_column_slices_is_computed_slice_by_slice(cell, rng: np.random.Generator):
    """Its slices one dot each; read whole as a product's operand, one dot per slice against B's rows, summed."""
    assert _loop(cell, rng, steps_in_registers=True).parallel is not None


def _normalized_gates(h, x_t, w):
    p = h @ nf.concat([w, w], axis=1)  # [N, 2H], normalized over its whole row, then cut in two
    d = p - p.mean(-1, keepdims=True)
    a, b = (d / nf.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)).chunk(2, axis=-1)
    h = nf.sigmoid(a + x_t) * nf.tanh(b)
    return h, h


def _normalized_gates_and_a_product_of_the_row(h, x_t, w):
    p = h @ nf.concat([w, w], axis=1)
    d = p - p.mean(-1, keepdims=True)
    a, b = (d / nf.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)).chunk(2, axis=-1)
    h = nf.sigmoid(a + x_t) * nf.tanh(b) + (d * d) @ nf.concat([w, w], axis=0)  # the row whole, as an operand
    return h, h


def _normalized_gates_and_the_row_reversed(h, x_t, w):
    p = h @ nf.concat([w, w], axis=1)
    d = p - p.mean(-1, keepdims=True)
    a, b = (d / nf.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)).chunk(2, axis=-1)
    h = nf.sigmoid(a + x_t) * nf.tanh(b) + d[:, ::-1] @ nf.concat([w, w], axis=0)  # its columns reversed
    return h, h


def _halves_of_the_carry(h, x_t, w):
    a, b = h.chunk(2, axis=-1)
    h = nf.tanh(nf.concat([b, a], axis=1) @ w + x_t)
    return h, h


@pytest.mark.parametrize("cell,split", [
    (_normalized_gates, True), (_normalized_gates_and_a_product_of_the_row, True), (_halves_of_the_carry, True),
    (_normalized_gates_and_the_row_reversed, False)])
def test_a_row_cut_into_gates_is_held_one_tile_per_gate(cell, split: bool, rng: np.random.Generator,
                                                        caplog: pytest.LogCaptureFixture):
    """A layer-norm LSTM normalizes its gate row as a whole, then cuts it: held one tile per gate, and so is what
    is computed from it at its width (a product of the row: one dot per tile) and a carry cut into the same
    ranges (its halves rejoined in another order are its tiles, read where they are). A read of the row at
    other columns (reversed) keeps the loop a host loop, with the reason."""
    with caplog.at_level("DEBUG", logger="nnforge.schedule"):
        assert (_loop(cell, rng, steps_in_registers=True).parallel is not None) == split
    if not split:
        assert "reads a value of the step at another element" in caplog.text



def _row_cut_and_carried(h, x_t, w):
    p = h @ w
    d = p - p.mean(-1, keepdims=True) + x_t  # a whole row, cut in halves below
    a, b = d.chunk(2, axis=-1)
    return d, a * b  # and carried to the next step: a carry is one tile


def test_a_carry_computed_by_ranges_is_held_by_ranges(rng: np.random.Generator):
    assert _loop(_row_cut_and_carried, rng, steps_in_registers=True).parallel is not None


@pytest.mark.parametrize("cell", [_gates_and_the_whole_product, _normalized_gates_and_a_product_of_the_row,
                                  _halves_of_the_carry, _row_cut_and_carried, _normalized_gates_and_the_row_reversed])
def test_rows_held_by_ranges_agree_with_the_interpreter(cell, backend: str, rng: np.random.Generator):
    """The cells above run on every backend (on Triton as persistent kernels, their rows one tile per range) and
    match the reference per element: 20 rows, two programs, the second partly masked."""
    rows = 20
    args = (rng.standard_normal((rows, H)).astype(np.float32) * 0.5,
            rng.standard_normal((T, rows, H)).astype(np.float32) * 0.5,
            rng.standard_normal((H, H)).astype(np.float32) * 0.3)
    want = nf.compile(_cell_scan(cell), backend="reference")(*args)
    got = nf.compile(_cell_scan(cell), backend=backend)(*args)
    for g, w in zip(got, want, strict=True):  # float32 sums in another order: errors scale with the largest value
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=max(2e-5, 2e-6 * float(np.abs(w).max())))


def _run_time_width(xs, zs, h0):
    """A second scan whose step multiplies its carry by a matrix as wide as the first scan is long (``T1``, a
    size known only at run time)."""
    s, _ = nf.scan(lambda c, x: (c + x, c), nf.zeros_like(xs[0]), xs)
    a = xs.T * s[0]  # [2, T1]

    def step(h, z):
        h = nf.tanh((h @ a) @ a.T + z)
        return h, h

    return nf.scan(step, h0, zs)


def test_a_run_time_width_keeps_the_loop_out_of_registers(backend: str, rng: np.random.Generator,
                                                          caplog: pytest.LogCaptureFixture):
    """A register tile's width is fixed when compiling: a step value or product of a run-time width keeps the loop
    stepped by the host on a target that holds steps in registers (the fuzzer found the Triton renderer refusing
    such a loop the scheduler had split), and every backend agrees with the reference, at two lengths."""
    for T1 in (3, 5):
        xs, zs, h0 = (rng.standard_normal(s).astype(np.float32) * 0.5 for s in ((T1, 2), (4, 3, 2), (3, 2)))
        got = nf.compile(_run_time_width, backend=backend)(xs, zs, h0)
        for a, b in zip(got, nf.compile(_run_time_width)(xs, zs, h0)):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    target = dataclasses.replace(cpu_target(), min_split_rows=1, steps_in_registers=True)
    with caplog.at_level("DEBUG", logger="nnforge.schedule"):
        program = schedule(prepare(nf.compile(_run_time_width).trace(xs, zs, h0)), target)
    assert [loop.parallel is not None for loop in program.loops()][-1] is False
    assert "a size known only at run time" in caplog.text
