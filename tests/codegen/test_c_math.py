"""The C backend's float32 exp, log, sigmoid, tanh and erf (``prelude.h``: no libm calls, so loops vectorize)
against float64 torch rounded to float32 over the whole float range, in scalar and vector form: relative error
within 4e-7 (~3 ulp), subnormal results within 1e-37, signed zeros, overflow to infinity, log's -inf at zero and
NaN below, infinities and NaN as torch has them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def _grid(rng: np.random.Generator) -> np.ndarray:
    mag = np.concatenate([np.geomspace(1e-38, 100, 100_000), rng.uniform(0, 20, 100_000)])
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 9.0, -9.0, 88.0, -88.0, 88.72, 88.73, 89.0, -87.5, -103.5,
               -104.5, 1e-45, 1.0, 1.0000001, 0.99999994, 3.4028235e38]
    return np.concatenate([mag, -mag, special]).astype(np.float32)


def _run(op: str, x: np.ndarray, vector: bool) -> np.ndarray:
    """``op`` compiled over ``x``: as one axis (the scalar form, ``nf_tanhf``), or as rows of 16 (the vector form
    the LSTM tiles use, ``nf_vtanhf``; the source is checked for it)."""
    from nnforge.codegen.c import lower, prepare

    fn = nf.compile(lambda a: getattr(nf, op)(a), backend="cpu")
    if not vector:
        return fn(x)
    rows = np.concatenate([x, np.ones(-len(x) % 16, np.float32)]).reshape(-1, 16)
    assert f"nf_v{op}f(" in lower(prepare(fn.trace(rows))).text.split("/*@nf_unit*/", 1)[1]
    return fn(rows).ravel()[:len(x)]


@pytest.mark.parametrize("vector", [False, True])
@pytest.mark.parametrize("op", ["exp", "log", "tanh", "sigmoid", "erf"])
def test_float32_transcendentals(rng: np.random.Generator, op: str, vector: bool) -> None:
    x = _grid(rng)
    got = _run(op, x, vector)
    want = getattr(torch, op)(torch.from_numpy(x).double()).numpy()
    finite = np.isfinite(want.astype(np.float32))  # exp(88.73) overflows float32
    assert np.array_equal(got[~finite & ~np.isnan(want)], want.astype(np.float32)[~finite & ~np.isnan(want)])
    normal = finite & (np.abs(want) > 1e-37)  # results below float32's normal range: absolute error
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() < 4e-7, (op, float(rel.max()), float(x[normal][rel.argmax()]))
    tiny = finite & ~normal
    assert np.abs(got[tiny] - want[tiny]).max() < 1e-37  # log(1) = 0 exactly
    assert np.array_equal(np.isnan(got), np.isnan(want))
    if op in ("tanh", "erf"):
        zeros = x == 0
        assert np.array_equal(np.signbit(got[zeros]), np.signbit(x[zeros]))  # tanh(-0) = erf(-0) = -0
