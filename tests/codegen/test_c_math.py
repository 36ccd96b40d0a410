"""The C backend's float32 sigmoid and tanh (``prelude.h``: no libm calls, so loops vectorize) against float64 torch
over the whole float range: relative error within 4e-7 (~3 ulp), signed zeros, infinities and NaN as torch has them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf

pytestmark = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def _grid(rng: np.random.Generator) -> np.ndarray:
    mag = np.concatenate([np.geomspace(1e-38, 100, 100_000), rng.uniform(0, 20, 100_000)])
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 9.0, -9.0, 88.0, -88.0, 1e-45]
    return np.concatenate([mag, -mag, special]).astype(np.float32)


@pytest.mark.parametrize("op", ["tanh", "sigmoid"])
def test_float32_transcendentals(rng: np.random.Generator, op: str) -> None:
    x = _grid(rng)
    got = nf.compile(lambda a: getattr(nf, op)(a), backend="cpu")(x)
    want = getattr(torch, op)(torch.from_numpy(x).double()).numpy()
    normal = np.isfinite(want) & (np.abs(want) > 1e-37)  # results below float32's normal range: absolute error
    rel = np.abs(got[normal] - want[normal]) / np.abs(want[normal])
    assert rel.max() < 4e-7, (op, float(rel.max()), float(x[normal][rel.argmax()]))
    assert np.abs(got[~normal & ~np.isnan(want)] - want[~normal & ~np.isnan(want)]).max() < 1e-37
    assert np.array_equal(np.isnan(got), np.isnan(want))
    if op == "tanh":
        zeros = x == 0
        assert np.array_equal(np.signbit(got[zeros]), np.signbit(x[zeros]))  # tanh(-0) = -0
