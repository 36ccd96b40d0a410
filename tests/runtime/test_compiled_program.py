"""The backend-neutral call path (``runtime/program.py``) on its own, without a C compiler: a fake backend whose
hook is numpy shows what every compiled backend gets — shapes planned from symbolic sizes, the size environment
read from the inputs, input checks, recycled outputs and a workspace reused across calls."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from nnforge.dtypes import float32, float64
from nnforge.errors import NNForgeError
from nnforge.ir.dims import sym
from nnforge.ir.node import Graph, Node
from nnforge.ir.ops import Op
from nnforge.runtime.program import CompiledProgram

T, N, I = sym("T", 9), sym("N", 2), sym("I", 4)  # I is fixed for the program: only T and N are run-time sizes
D = (T - 3) // 2 + 1  # a derived size: y[:T - 2:2], the output length of a stride-2 width-3 window


class NumpyProgram(CompiledProgram):
    """A backend that is only its hook: x * 2 staged through the workspace, y's strided rows times z, y's sum."""

    def __init__(self, graph: Graph):
        self.launches: list[tuple[list[int], int]] = []  # (sizes, workspace address) of each launch
        self.pause: Callable[[], None] | None = None  # called while the workspace holds this call's data
        self.fail = False
        super().__init__(graph, ["T", "N"])

    def workspace_need(self, sizes: list[int]) -> int:
        t, n = sizes
        return t * n * 4 * 4  # x doubled, as float32

    def launch(self, inputs: list[np.ndarray], outputs: list[np.ndarray], workspace: np.ndarray,
               sizes: list[int]) -> None:
        x, y, z = inputs
        t, n = sizes
        self.launches.append((list(sizes), workspace.ctypes.data))
        if self.fail:
            raise RuntimeError("launch failed")
        scratch = workspace[:t * n * 16].view(np.float32).reshape(t * n, 4)
        np.multiply(x.reshape(t * n, 4), 2, out=scratch)
        if self.pause is not None:
            self.pause()
        outputs[0][...] = scratch
        outputs[1][...] = y[:t - 2:2] * z[:, :1]
        outputs[2][...] = y.sum(0)


def _graph() -> Graph:
    def node(op: Op, srcs: tuple, shape: tuple, dtype, **attrs) -> Node:
        return Node(op, srcs, {**attrs, "shape": shape, "dtype": dtype} if op == Op.INPUT else attrs, shape, dtype)

    x = node(Op.INPUT, (), (T, N, I), float32, name="x")
    y = node(Op.INPUT, (), (T, 3), float64, name="y")
    z = node(Op.INPUT, (), (D, 2), float32, name="z")
    flat = node(Op.RESHAPE, (x,), (T * N, I), float32)
    rows = node(Op.SLICE, (y,), (D, 3), float64)
    total = node(Op.SUM, (y,), (3,), float64)
    return Graph([x, y, z], [flat, rows, total])


def _inputs(rng: np.random.Generator, t: int, n: int) -> list[np.ndarray]:
    d = (t - 3) // 2 + 1
    return [rng.standard_normal((t, n, 4)).astype(np.float32), rng.standard_normal((t, 3)),
            rng.standard_normal((d, 2)).astype(np.float32)]


def _want(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> list[np.ndarray]:
    return [2 * x.reshape(-1, 4), y[:len(y) - 2:2] * z[:, :1], y.sum(0)]


def _check(got: list[np.ndarray], inputs: list[np.ndarray]) -> None:
    for g, w in zip(got, _want(*inputs)):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


def test_shapes_follow_the_run_time_sizes(rng: np.random.Generator):
    program = NumpyProgram(_graph())
    for t, n in ((9, 2), (3, 5), (14, 1), (10, 3)):
        inputs = _inputs(rng, t, n)
        inputs[1] = inputs[1].astype(np.float32)  # converted to the graph's dtype
        got = program(inputs)
        assert [g.shape for g in got] == [(t * n, 4), ((t - 3) // 2 + 1, 3), (3,)]
        _check(got, [inputs[0], inputs[1].astype(np.float64), inputs[2]])
        assert program.launches[-1][0] == [t, n]


def test_what_the_shapes_decide_is_reworked_whenever_they_change(rng: np.random.Generator):
    """Calls of equal shapes reuse the sizes, output shapes and workspace bytes worked out for the first of them;
    any other shapes work them out again, and a wrong shape after a good call is still refused."""
    program = NumpyProgram(_graph())
    a, b = _inputs(rng, 9, 2), _inputs(rng, 14, 3)
    for inputs in (a, a, b, a, b, b):
        _check(program(inputs), inputs)
        assert program.launches[-1][0] == [len(inputs[0]), inputs[0].shape[1]]
    x, y, z = a
    with pytest.raises(NNForgeError, match=r"input 'z' has shape \[5, 2\], expected \[4, 2\]"):
        program([x, y, np.concatenate([z, z[:1]])])
    assert len(program.launches) == 6


def test_inputs_that_disagree_on_a_run_time_size_are_refused(rng: np.random.Generator):
    program = NumpyProgram(_graph())
    x, _, z = _inputs(rng, 9, 2)
    _, y, _ = _inputs(rng, 8, 2)
    with pytest.raises(NNForgeError, match="inputs disagree on size T: 9 vs 8"):
        program([x, y, z])
    assert not program.launches


def test_a_wrong_shape_is_refused_naming_the_input(rng: np.random.Generator):
    program = NumpyProgram(_graph())
    x, y, z = _inputs(rng, 9, 2)
    with pytest.raises(NNForgeError, match="takes 3 inputs, got 2"):
        program([x, y])
    with pytest.raises(NNForgeError, match=r"input 'z' has shape \[5, 2\], expected \[4, 2\]"):
        program([x, y, np.concatenate([z, z[:1]])])  # the derived size (T - 3) // 2 + 1 is 4 at T = 9
    wide = rng.standard_normal((9, 2, 5)).astype(np.float32)  # I is fixed at 4 for this program
    with pytest.raises(NNForgeError, match=r"input 'x' has shape \[9, 2, 5\], expected \[9, 2, 4\]"):
        program([wide, y, z])
    assert not program.launches
    _check(program([x, y, z]), [x, y, z])


def test_dropped_results_are_recycled_and_held_ones_never_are(rng: np.random.Generator):
    program = NumpyProgram(_graph())
    inputs = _inputs(rng, 9, 2)
    got = program(inputs)
    first = got[0].ctypes.data
    del got
    inputs = _inputs(rng, 9, 2)
    held = program(inputs)
    assert held[0].ctypes.data == first and program.outputs.reused >= 1
    copies = [h.copy() for h in held]
    for _ in range(3):
        again = program(_inputs(rng, 9, 2))
        assert again[0].ctypes.data != held[0].ctypes.data
    for c, h in zip(copies, held):
        np.testing.assert_array_equal(c, h)
    _check(held, inputs)


def test_the_workspace_is_reused_and_grows_with_the_sizes(rng: np.random.Generator):
    program = NumpyProgram(_graph())
    assert program.workspace_bytes({"T": 9, "N": 2}) == 9 * 2 * 16 and program.workspace_bytes() == 0
    addresses = []
    for t, n in ((9, 2), (9, 2), (14, 3), (3, 1)):
        inputs = _inputs(rng, t, n)
        _check(program(inputs), inputs)
        addresses.append(program.launches[-1][1])
    assert addresses[0] == addresses[1] and addresses[2] == addresses[3] and addresses[1] != addresses[2]
    assert all(a % 64 == 0 for a in addresses)
    program.fail = True
    with pytest.raises(RuntimeError, match="launch failed"):
        program(_inputs(rng, 4, 2))
    program.fail = False
    inputs = _inputs(rng, 5, 2)
    _check(program(inputs), inputs)
    assert program.launches[-1][1] == addresses[2]  # a failed launch gives the workspace back


def test_a_concurrent_call_gets_its_own_workspace(rng: np.random.Generator):
    program = NumpyProgram(_graph())
    first, second = _inputs(rng, 9, 2), _inputs(rng, 9, 2)
    started, resume = threading.Event(), threading.Event()
    results: list[list[np.ndarray]] = []

    def pause() -> None:
        program.pause = None  # only the first call waits, its data in the workspace
        started.set()
        assert resume.wait(10)

    program.pause = pause
    thread = threading.Thread(target=lambda: results.append(program(first)))
    thread.start()
    assert started.wait(10)
    try:
        got = program(second)  # runs to the end while the first call holds the workspace
    finally:
        resume.set()
        thread.join(10)
    held, other = [address for _, address in program.launches]
    assert held != other
    _check(got, second)
    _check(results[0], first)  # its scratch was not overwritten by the second call
    third = _inputs(rng, 9, 2)
    _check(program(third), third)
    assert program.launches[-1][1] == held
