"""``split_long_sums``: a reduction with few results over a long leading axis runs over that axis first."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch

import nnforge as nf
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.reference import ReferenceProgram
from nnforge.codegen.triton.target import triton_target
from nnforge.dtypes import DType
from nnforge.ir.ops import REDUCE, Op
from nnforge.passes.sums import split_long_sums


def _target(outputs: int):
    return dataclasses.replace(triton_target(), split_sum_outputs=outputs)


def _reductions(graph) -> list:
    return [n for n in graph.order if n.op in REDUCE]


def _loss(x, y):
    return (x * y).sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_loss_over_a_sequence_is_summed_over_time_first(rng: np.random.Generator, dtype) -> None:
    """A training step's loss, ``(ys * cot).sum()`` over [T, N, H]: one result, so one program summed all of it;
    split, the first sum has a result per (batch row, feature), in float32 for half-precision products (a
    reduction accumulates in float32: rounding the partial sums to half would add an error), the second sums
    those, and the result is rounded once. Evaluated on the reference interpreter as the unsplit graph is."""
    x, y = (rng.standard_normal((7, 8, 16)).astype(dtype) for _ in range(2))
    graph = nf.compile(_loss).trace(x, y)
    split = split_long_sums(graph, _target(64))
    first, second = _reductions(split)
    assert first.attrs["axes"] == (0,) and tuple(first.shape) == (8, 16) and first.dtype == DType.float32
    assert second.attrs["axes"] == (0, 1) and second.srcs[0] is first and second.shape == ()
    assert split.outputs[0].dtype == graph.outputs[0].dtype
    got, want = ReferenceProgram(split)([x, y])[0], ReferenceProgram(graph)([x, y])[0]
    np.testing.assert_allclose(np.float64(got), np.float64(want), rtol=np.finfo(dtype).eps * 2)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_some_axes_kept_and_keepdims(rng: np.random.Generator, op: str, keepdims: bool) -> None:
    """Over axes (0, 2) of [T, N, H]: the leading axis first, then axis 1 of what is left (2 with keepdims); a
    max stays in its dtype and gives the unsplit max exactly."""
    x = rng.standard_normal((9, 3, 32)).astype(np.float16)

    def f(x):
        return getattr(x, op)(axis=(0, 2), keepdims=keepdims)

    graph = nf.compile(f).trace(x)
    split = split_long_sums(graph, _target(16))
    first, second = _reductions(split)
    assert first.attrs["axes"] == (0,) and second.attrs["axes"] == ((2,) if keepdims else (1,))
    assert first.dtype == (DType.float32 if op == "sum" else DType.float16)
    got, want = ReferenceProgram(split)([x])[0], ReferenceProgram(graph)([x])[0]
    assert got.shape == want.shape == ((1, 3, 1) if keepdims else (3,))
    if op == "max":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(np.float64(got), np.float64(want), rtol=2e-3)


def test_reductions_that_run_in_parallel_already_stay(rng: np.random.Generator) -> None:
    """Left as written: the leading axis kept (its results are the parallel work), the leading axis alone
    reduced, as many results as the threshold, fewer partial sums than it, a leading axis of 1, integers, and a
    target that never splits (the CPU's)."""
    x = rng.standard_normal((5, 8, 16)).astype(np.float32)
    cases = [(lambda x: x.sum(axis=(1, 2)), x), (lambda x: x.sum(axis=0), x), (lambda x: x.sum(axis=(0, 1)), x),
             (lambda x: x.sum(), x[:, :2, :4]), (lambda x: x.sum(), x[:1]), (lambda x: x.max(), x.astype(np.int32))]
    for i, (f, a) in enumerate(cases):
        graph = nf.compile(f).trace(a)
        assert split_long_sums(graph, _target(16)) is graph, i
    graph = nf.compile(_loss).trace(x, x)
    assert split_long_sums(graph, _target(128)) is not graph
    assert split_long_sums(graph, cpu_target()) is graph and cpu_target().split_sum_outputs == 0


def test_the_triton_pipeline_splits_a_loss(rng: np.random.Generator) -> None:
    """The Triton target's threshold (4096 results) applies to a loss over [T, 64, 64]: its compiled graph sums
    over time first."""
    from nnforge.passes import pipeline, run_pipeline

    x = rng.standard_normal((3, 64, 64)).astype(np.float16)
    graph = run_pipeline(nf.compile(_loss).trace(x, x), pipeline(triton_target()))
    assert [n.attrs["axes"] for n in _reductions(graph)] == [(0,), (0, 1)]
    assert any(n.op == Op.CAST for n in graph.order)


def _running_loss(x, h0):
    """A loss over a scan's outputs: T is the scan's trip count, a size known only at run time."""
    ys = nf.scan(lambda h, x_t: (h + x_t, h + x_t), h0, x)[1]
    return (ys * ys).sum()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_a_long_loss_matches_torch_at_every_length(backend: str, rng: np.random.Generator, dtype) -> None:
    """One compiled loss over a scan's [T, 64, 64] outputs (4096 partial sums: split on Triton), called at
    T = 6, 1 and 3 with one trace, against torch's sum of the same rounded squares in float64: within
    float32's rounding of 4096 * T terms, or one half-precision rounding of the result (2⁻¹⁰ relative)."""
    f = nf.compile(_running_loss, backend=backend)
    for T in (6, 1, 3):
        x = (rng.standard_normal((T, 64, 64)) * 0.3).astype(dtype)
        h0 = (rng.standard_normal((64, 64)) * 0.3).astype(dtype)  # squares summed stay below 65504
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a second trace warns
            got = np.float64(np.asarray(f(x, h0)))
        h, ys = torch.from_numpy(h0), []
        for t in range(T):
            h = h + torch.from_numpy(x[t])
            ys.append(h)
        products = (torch.stack(ys) ** 2).double()
        want, scale = products.sum().item(), products.abs().sum().item()
        tol = (2.0 ** -10 * abs(want) if dtype == np.float16 else 0) + 1e-6 * scale
        assert abs(got - want) <= tol, (T, got, want)


def _twice(x):
    return x.sum(axis=0).sum(axis=0)


@pytest.mark.parametrize(("inner", "outer", "axes", "shape"), [
    ((0, False), (0, False), (0, 1), (16,)), ((0, False), (0, True), (0, 1), (1, 16)),
    ((0, True), (1, False), (0, 1), (1, 16)), ((1, False), (1, False), (1, 2), (7,))])
def test_a_half_sum_of_a_half_sum_is_one_sum(rng: np.random.Generator, inner, outer, axes, shape) -> None:
    """``sum(sum(x, a, keepdims), b, keepdims)`` in float16: one sum over both axes (reshaped where the outer
    sum keeps an axis the inner one dropped), its value the two sums' to float16 rounding."""
    from nnforge.passes.sums import nested_half_sums

    x = rng.uniform(0, 1, (7, 8, 16)).astype(np.float16)

    def f(x):
        return x.sum(axis=inner[0], keepdims=inner[1]).sum(axis=outer[0], keepdims=outer[1])

    graph = nf.compile(f).trace(x)
    merged = nested_half_sums(graph)
    (total,) = _reductions(merged)
    assert total.attrs["axes"] == axes and tuple(merged.outputs[0].shape) == shape
    got, want = ReferenceProgram(merged)([x])[0], ReferenceProgram(graph)([x])[0]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2 ** -9)


def test_sums_that_must_stay_two_stay(rng: np.random.Generator) -> None:
    """Not merged: float32 sums (their partial sums lose nothing worth a change), and an inner sum read
    elsewhere too."""
    from nnforge.passes.sums import nested_half_sums

    x = rng.uniform(0, 1, (7, 8, 16)).astype(np.float32)
    graph = nf.compile(_twice).trace(x)
    assert nested_half_sums(graph) is graph
    graph = nf.compile(lambda x: (x.sum(axis=0).sum(axis=0), x.sum(axis=0))).trace(x.astype(np.float16))
    assert len(_reductions(nested_half_sums(graph))) == 2


def test_a_half_bias_gradient_is_rounded_once(backend: str, rng: np.random.Generator) -> None:
    """A float16 sum over a sequence's steps and then its rows (how autodiff sums a bias's gradient): compiled,
    the float64 sum rounded to float16 once, exactly; the reference interpreter runs the graph as written, two
    sums each rounded to float16, within two roundings."""
    x = rng.uniform(0, 1, (64, 16, 64)).astype(np.float16)
    got = np.asarray(nf.compile(_twice, backend=backend)(x))
    want = x.astype(np.float64).sum(axis=(0, 1)).astype(np.float16)
    if backend == "reference":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2 ** -9)
    else:
        np.testing.assert_array_equal(got, want)
