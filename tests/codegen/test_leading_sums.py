"""Sums over leading axes run with the outputs innermost (``Reduce.leading``) whatever they read: a stored buffer,
elementwise work on views of buffers (a layer norm's weight gradient ``sum(dy * xhat)`` over [T, N]), with an
epilogue on the sums; a source read across its last axis keeps the generic form, whose loops run the reduced
axis read with the shortest stride innermost. Checked on every backend against float64 numpy, and the
schedule's decision on the CPU and Triton targets."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nnforge as nf
from nnforge.codegen.c import prepare
from nnforge.codegen.c.target import cpu_target
from nnforge.codegen.triton.target import triton_target
from nnforge.schedule import Reduce, schedule


def _product(x, y):  # [T, N, C, W] * [C, W] summed over T and N: two kept axes
    return (x * y).sum(axis=(0, 1))


def _epilogue(x, y):  # keepdims, an epilogue on the sums
    return nf.tanh((x * 0.5 + y).sum(axis=(0,), keepdims=True)) * 3.0


def _viewed(x, y):  # a permute of the reduced axes only: still unit stride along W
    return (x.permute(1, 0, 2, 3) - y).sum(axis=(0, 1, 2))


def _stored(x, y):  # a stored source, kept axes [300, 3]: read as rows of 900 sums
    return x.reshape(9, 5, 300, 3).sum(axis=(0, 1))


def _across(x, y):  # the kept last axis is the source's C: stride W, the generic form
    return x.permute(0, 1, 3, 2).sum(axis=(0, 1))


def _reordered(x, y):  # W, N and T reduced, C kept: the generic loop, W (the stride-1 axis) innermost
    return x.permute(3, 1, 0, 2).sum(axis=(0, 1, 2))


CASES = {
    "product": (_product, lambda x, y: (x * y).sum(axis=(0, 1)), True),
    "epilogue": (_epilogue, lambda x, y: np.tanh((x * 0.5 + y).sum(axis=(0,), keepdims=True)) * 3.0, True),
    "viewed": (_viewed, lambda x, y: (x.transpose(1, 0, 2, 3) - y).sum(axis=(0, 1, 2)), True),
    "stored": (_stored, lambda x, y: x.reshape(9, 5, 300, 3).sum(axis=(0, 1)), True),
    "across": (_across, lambda x, y: x.transpose(0, 1, 3, 2).sum(axis=(0, 1)), False),
    "reordered": (_reordered, lambda x, y: x.sum(axis=(0, 1, 3)), False),
}


def _args(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    # W = 300: more than one block of 256 outputs per row of the kept axes, and a partial one
    return rng.standard_normal((9, 5, 3, 300)).astype(np.float32), rng.standard_normal((3, 300)).astype(np.float32)


@pytest.mark.parametrize("case", CASES)
def test_leading_sums_match_float64(backend: str, case: str, rng: np.random.Generator) -> None:
    fn, ref, _ = CASES[case]
    x, y = _args(rng)
    got = np.asarray(nf.compile(fn, backend=backend)(x, y))
    want = ref(x.astype(np.float64), y.astype(np.float64))
    # float32 terms (one rounding each) summed over 45 of them: a few float32 ulps of the terms' size
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(x).max() * np.sqrt(45))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("target", [cpu_target, triton_target])
def test_the_schedule_runs_outputs_innermost_where_reads_are_unit_stride(case: str, target,
                                                                         rng: np.random.Generator) -> None:
    fn, _, leading = CASES[case]
    program = schedule(prepare(nf.compile(fn).trace(*_args(rng))), target())
    (sums,) = [k for k in program.kernels() if isinstance(k, Reduce)]
    assert sums.leading is leading
    assert (sums.epilogue is not None) is (case == "epilogue")


def test_the_generic_sum_runs_its_shortest_stride_innermost(rng: np.random.Generator) -> None:
    """A sum the leading form does not take reads its source in memory order: the reduced axis whose reads are
    contiguous is the innermost (vectorized) loop, not the last one of the view."""
    from nnforge.codegen.c import lower

    src = lower(prepare(nf.compile(_reordered).trace(*_args(rng)))).source()
    assert re.search(r"#pragma omp simd reduction\(\+:z\d+\)\s+for \(int64_t z\d+ = 0; z\d+ < 300;", src)


def test_a_layer_norms_weight_gradient_is_a_leading_sum_of_fused_work(backend: str,
                                                                       rng: np.random.Generator) -> None:
    """``d weight = sum over T, N of dy * xhat``: xhat is elementwise work on the input and the row statistics,
    evaluated where the sum reads it; checked against torch's gradient."""
    import torch

    x = rng.standard_normal((6, 4, 48)).astype(np.float32)
    w, b = (rng.standard_normal(48).astype(np.float32) for _ in range(2))
    cot = rng.standard_normal((6, 4, 48)).astype(np.float32)

    def loss(x, w, b, cot):
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        xhat = xc / nf.sqrt((xc * xc).mean(axis=-1, keepdims=True) + 1e-5)
        return ((xhat * w + b) * cot).sum()

    grad = nf.grad(loss, argnums=(1, 2))
    program = schedule(prepare(nf.compile(grad).trace(x, w, b, cot)), cpu_target())
    assert sum(isinstance(k, Reduce) and k.leading for k in program.kernels()) == 2  # dw and db
    dw, db = nf.compile(grad, backend=backend)(x, w, b, cot)
    tx, tw, tb = (torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in (x, w, b))
    (torch.nn.functional.layer_norm(tx, (48,), tw, tb) * torch.tensor(cot, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(db, tb.grad.numpy(), rtol=1e-4, atol=1e-4)
