"""Elementwise kernels that read padded values along their last axis (a shift: a CTC recursion's ``alpha[s - 1]``,
``alpha[s - 2]``) in vector form: the vector loop runs on the columns where every padded read is inside its
source (``Elementwise.columns``), the columns before and after one at a time, each with the pad's value where it
reads outside. Values that do not move along the row (a sequence's length compared with a step, an int64 read)
are computed once per row as scalars and broadcast. Against numpy, at 8 and 16 lanes, edges included."""

from __future__ import annotations

import numpy as np
import pytest
from test_gemm import _cpu
from test_vector_tiles import VECTORS

import nnforge as nf
from nnforge.codegen.c import cpu_target, prepare
from nnforge.codegen.c.gemm import GemmConfig
from nnforge.schedule import Elementwise, schedule

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")

FILL = -7.0  # the pad's value: a finite number that shows wherever it is read


def _elementwise(fn, cfg: GemmConfig, *args) -> list[Elementwise]:
    """The elementwise kernels the CPU target schedules for ``fn`` (loop bodies included)."""
    program = schedule(prepare(nf.compile(fn).trace(*args), cfg), cpu_target(cfg))
    return [k for k in program.kernels() if isinstance(k, Elementwise)]


def _shifted(x: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """numpy's ``x`` shifted right by ``lo`` and left by ``hi`` along the last axis, ``FILL`` shifted in."""
    w = x.shape[-1]
    right = np.concatenate([np.full((len(x), lo), FILL, np.float32), x], axis=1)[:, :w]
    left = np.concatenate([x, np.full((len(x), hi), FILL, np.float32)], axis=1)[:, hi:]
    return right, left


def _shifts(lo: int, hi: int):
    def fn(x, y):
        w = x.shape[-1]
        right = x.pad(((0, 0), (lo, 0)), value=FILL)[:, :w]
        left = x.pad(((0, 0), (0, hi)), value=FILL)[:, hi:]
        return nf.exp(right * 0.25) + nf.log(left.abs() + 1.0) * y + nf.where(y > 0, right, left)

    return fn


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("lo,hi,width", [(1, 0, 101), (2, 0, 101), (0, 3, 37), (2, 5, 500), (1, 1, 18)])
def test_shifts_run_in_vectors_inside_their_source(rng: np.random.Generator, vectors: str, lo: int, hi: int,
                                                    width: int) -> None:
    """A row shifted right by ``lo`` and left by ``hi``: vectors on ``[lo, width - hi)`` (as many whole vectors
    as fit), the first ``lo`` and the last columns one at a time, where the shifted-in ``FILL`` is read. Float32
    exp and log are within 2 ulp; the absolute bound is for sums that cancel to near zero."""
    cfg = VECTORS[vectors]
    lanes = cfg.vector_width // 4
    x, y = (rng.standard_normal((9, width)).astype(np.float32) for _ in range(2))
    fn = _shifts(lo, hi)
    (k,) = _elementwise(fn, cfg, x, y)
    inside = width - hi - lo >= lanes
    assert (k.lanes, k.columns) == ((lanes, (lo, width - hi)) if inside else (1, None))
    (got,) = _cpu(cfg, fn, x, y)
    right, left = _shifted(x, lo, hi)
    want = np.exp(right * np.float32(0.25)) + np.log(np.abs(left) + np.float32(1)) * y + np.where(y > 0, right, left)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("vectors", VECTORS)
def test_a_pad_across_rows_keeps_the_scalar_loop(rng: np.random.Generator, vectors: str) -> None:
    """A pad along the rows (the axis that does not move with the lanes) has no vector form: the kernel stays
    scalar and reads the pad's value on the padded row."""
    cfg = VECTORS[vectors]
    x = rng.standard_normal((6, 40)).astype(np.float32)

    def fn(x):
        return nf.exp(x.pad(((1, 0), (0, 0)), value=FILL)[:6] * 0.5) + x

    (k,) = _elementwise(fn, cfg, x)
    assert k.lanes == 1
    (got,) = _cpu(cfg, fn, x)
    shifted = np.concatenate([np.full((1, 40), FILL, np.float32), x[:5]])
    np.testing.assert_allclose(got, np.exp(shifted * np.float32(0.5)) + x, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("vectors", VECTORS)
def test_row_invariant_int64_values_are_broadcast(rng: np.random.Generator, vectors: str) -> None:
    """``where(lengths > t, x * 2, x)`` over ``[rows, width]``: the int64 comparison, the same for a whole row, has
    no vector form but needs none; it is computed once per row and broadcast as a mask, the row in vectors."""
    cfg = VECTORS[vectors]
    x = rng.standard_normal((7, 45)).astype(np.float32)
    lengths = rng.integers(0, 6, 7)

    def fn(x, lengths):
        return nf.where(lengths.reshape(7, 1) > 2, x * 2.0, nf.exp(x))

    (k,) = _elementwise(fn, cfg, x, lengths)
    assert k.lanes == cfg.vector_width // 4 and k.columns is None
    (got,) = _cpu(cfg, fn, x, lengths)
    np.testing.assert_allclose(got, np.where(lengths[:, None] > 2, x * 2, np.exp(x)), rtol=2e-6)
