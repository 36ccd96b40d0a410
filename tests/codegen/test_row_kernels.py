"""Kernels over rows (a layer norm's): float32 row sums in vector form, a division by a row-invariant value as a
multiplication by its reciprocal, and cheap shared values (``d = v - mean``) recomputed by each reader instead
of stored. Each checked on the generated code and against torch in float64."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from test_vector_tiles import _source, layer_norm_gate

import nnforge as nf
from nnforge.passes.fuse import group

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def row_sums(v):
    d = v - v.mean(-1, keepdims=True)
    return v.sum(-1), (d * d).sum(-1)


@pytest.mark.parametrize("width", [5, 8, 31, 32, 45, 96, 100])
def test_row_sums_in_vector_form(rng: np.random.Generator, width: int) -> None:
    """Sums over the last axis, plain and of a fused expression (the variance's squares, reading the row's mean
    as a row-invariant): whole 32-column blocks in four vectors, then eights, then a scalar rest; a width below 8
    keeps the scalar loop. Against float64 torch, to a few ulp of the sum of magnitudes."""
    v = (rng.standard_normal((11, width)) * 3 + 1).astype(np.float32)
    src = _source(row_sums, v)
    assert ("nf_vacc_f64(" in src) == (width >= 8)
    assert ("+= 32)" in src) == (width >= 32)
    got = nf.compile(row_sums, backend="cpu")(v)
    t = torch.from_numpy(v).double()
    want = (t.sum(-1), ((t - t.mean(-1, keepdim=True)) ** 2).sum(-1))
    for g, w, scale in zip(got, want, (t.abs().sum(-1), ((t - t.mean(-1, keepdim=True)) ** 2).sum(-1))):
        assert np.all(np.abs(g - w.numpy()) <= 4e-7 * scale.numpy() + 1e-30), (width, g, w)


def test_long_row_sum_keeps_float64_accuracy(rng: np.random.Generator) -> None:
    """100 000 values near 1: float32 accumulators (even 32 of them) would be off by ~1e-4 relative; the vector
    form adds four values in float32, then accumulates in float64 as the scalar form does."""
    v = (1 + rng.standard_normal((2, 100_000)) * 1e-3).astype(np.float32)
    got = nf.compile(lambda a: a.sum(-1), backend="cpu")(v)
    want = v.astype(np.float64).sum(-1)
    assert np.abs(got / want - 1).max() < 3e-7


def test_row_sum_of_a_strided_read_stays_scalar(rng: np.random.Generator) -> None:
    """The reduced axis read with a stride (a transposed input): no vector load, the scalar loop, same sums."""
    v = rng.standard_normal((40, 9)).astype(np.float32)
    src = _source(lambda a: a.T.sum(-1), v)
    assert "nf_vacc_f64(" not in src
    np.testing.assert_allclose(nf.compile(lambda a: a.T.sum(-1), backend="cpu")(v), v.astype(np.float64).sum(0),
                               rtol=1e-6, atol=1e-6)


def _vector_divisions(src: str) -> list[str]:
    return [ln for ln in src.splitlines() if "const nf_vf32" in ln and re.search(r"\) / |\w / \w", ln)]


def test_division_by_a_row_invariant_is_a_multiplication(rng: np.random.Generator) -> None:
    """``d / sqrt(var + eps)``: the reciprocal once per row, a multiplication per element (a vector division
    costs as much as a sigmoid); a divisor that varies along the row still divides. Accuracy of the layer norm
    is checked against torch by ``test_elementwise_kernel_in_vector_form``; here the bound is 2 ulp per element."""
    v = rng.standard_normal((13, 48)).astype(np.float32)
    s = (rng.random((13, 1)) + 0.5).astype(np.float32)

    def by_row(a, b):
        return a / b

    src = _source(by_row, v, s)
    assert not _vector_divisions(src) and re.search(r"= 1\.0f / ", src)
    got = nf.compile(by_row, backend="cpu")(v, s)
    want = v.astype(np.float64) / s.astype(np.float64)
    assert np.all(np.abs(got - want) <= 2 * np.spacing(np.abs(want).astype(np.float32)))
    w = (rng.random((13, 48)) + 0.5).astype(np.float32)
    assert _vector_divisions(_source(by_row, v, w))
    np.testing.assert_array_equal(nf.compile(by_row, backend="cpu")(v, w), v / w)


def _grouping(fn, *args):
    graph = nf.compile(fn).trace(*args)
    return graph, group(graph)


def test_layer_norm_difference_is_recomputed_not_stored(rng: np.random.Generator) -> None:
    """``d = v - mean`` is read by the variance's sum and by the output kernel: recomputed in both (one load of
    ``v``, the mean a row-invariant) instead of a pass storing it; the output still matches torch."""
    v, gain, bias = (rng.standard_normal(s).astype(np.float32) for s in [(13, 40), (40,), (40,)])
    graph, g = _grouping(layer_norm_gate, v, gain, bias)
    subs = [n for n in graph.order if n.op.name == "SUB" and n.shape[-1] == 40]
    assert subs and all(id(n) in g.recomputed and not g.is_stored(n) for n in subs)
    assert not any("sub at" in r for r in g.refusals)
    got = nf.compile(layer_norm_gate, backend="cpu")(v, gain, bias)
    t = [torch.from_numpy(a).double() for a in (v, gain, bias)]
    want = torch.tanh(torch.nn.functional.layer_norm(t[0], (40,), eps=1e-5) * t[1] + t[2]).numpy()
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def two_readers(a, b, w):
    p = a * b  # two arrays read element by element: recomputing would load both in every reader
    q = a @ w + 1.0  # a GEMM's only reader: stored as that GEMM's epilogue
    return p.sum(-1), nf.tanh(p), q.sum(-1), nf.sigmoid(q)


def test_values_not_worth_recomputing_are_stored(rng: np.random.Generator) -> None:
    a, b, w = (rng.standard_normal(s).astype(np.float32) for s in [(6, 16), (6, 16), (16, 16)])
    graph, g = _grouping(two_readers, a, b, w)
    mul = next(n for n in graph.order if n.op.name == "MUL" and n.shape == (6, 16))
    add = next(n for n in graph.order if n.op.name == "ADD" and n.shape == (6, 16))
    assert g.is_stored(mul) and id(mul) not in g.recomputed
    assert id(add) not in g.recomputed and id(add) in g.prologue
    want = nf.compile(two_readers)(a, b, w)
    for got, ref in zip(nf.compile(two_readers, backend="cpu")(a, b, w), want):
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=2e-6)


def mean_also_a_matmul_operand(v, w):
    m = v.sum(-1, keepdims=True) / 16.0
    d = v - m  # recomputed by its two elementwise readers; m is in its cone
    return (d * d).sum(-1), nf.tanh(d), m @ w  # and m is a GEMM operand: it needs a buffer


def test_recomputed_cone_keeps_buffers_that_a_matmul_reads(rng: np.random.Generator) -> None:
    v, w = rng.standard_normal((6, 16)).astype(np.float32), rng.standard_normal((1, 3)).astype(np.float32)
    graph, g = _grouping(mean_also_a_matmul_operand, v, w)
    mean = next(n for n in graph.order if n.op.name == "DIV" and n.shape[-1] == 1)
    assert g.is_stored(mean)
    want = nf.compile(mean_also_a_matmul_operand)(v, w)
    for got, ref in zip(nf.compile(mean_also_a_matmul_operand, backend="cpu")(v, w), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
