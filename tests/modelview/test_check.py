"""The numerical check of every cell (``worker.check_close``): element-wise against the float64 reference, with
the absolute term scaled by each output's largest element so that low-precision gradients (sums over N·T
products) are judged by their own magnitude, and outputs within [-1, 1] exactly as before."""

from __future__ import annotations

import numpy as np
import torch

from nnforge.modelview.worker import check_close


def _ref(rng: np.random.Generator, scale: float) -> torch.Tensor:
    return torch.from_numpy(rng.uniform(-scale, scale, (32, 16)))


def test_outputs_within_one_are_judged_unscaled(rng: np.random.Generator) -> None:
    ref = _ref(rng, 1.0)
    near = ref + 0.09
    assert check_close([near.to(torch.bfloat16)], [ref], 0.1, 0.1)[0]
    far = ref.clone()
    far[3, 4] = ref[3, 4] + 0.12 + 0.1 * abs(float(ref[3, 4]))  # just past atol + rtol·|ref|
    ok, err, msg = check_close([far], [ref], 0.1, 0.1)
    assert not ok and "flat index 52" in msg and "scale = max(1, max |ref|) = 1" in msg
    assert err >= 0.12


def test_a_large_gradient_is_judged_by_its_largest_element(rng: np.random.Generator) -> None:
    grad = _ref(rng, 70.0)
    rounded = grad.to(torch.bfloat16)  # bfloat16 rounding alone: up to ~0.4 here
    noisy = rounded.double() + torch.from_numpy(rng.uniform(-1.4, 1.4, grad.shape))  # 2 % of the largest element
    assert check_close([noisy], [grad], 0.1, 0.1)[0]
    wrong = grad.clone()
    wrong[0, 0] = grad[0, 0] + 10.0 + 0.1 * abs(float(grad[0, 0]))  # a real error: beyond 0.1·70 + 0.1·|ref|
    ok, _, msg = check_close([wrong], [grad], 0.1, 0.1)
    assert not ok and "flat index 0" in msg


def test_float32_stays_strict_on_large_gradients(rng: np.random.Generator) -> None:
    grad = _ref(rng, 70.0)
    off = grad.clone()
    off[5, 5] += 0.5  # beyond 1e-3·70 + 1e-3·|ref| ≤ 0.14
    assert not check_close([off.float()], [grad], 1e-3, 1e-3)[0]
    assert check_close([grad.float()], [grad], 1e-3, 1e-3)[0]
