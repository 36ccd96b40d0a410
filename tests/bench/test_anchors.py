"""The GPU bench's FlashRNN anchor computes the layer it is compared with: ``bench/lstm_gpu.py``'s
``flashrnn_lstm`` (weights laid out as FlashRNN takes them, one head, batch-major input projection) through
FlashRNN's PyTorch loop ("vanilla", the CPU one) against ``torch.nn.LSTM`` in float64, outputs and weight gradients
per element, from random weights, inputs and initial states. The fused kernels take the same layout (FlashRNN
permutes for each backend), so a wrong one would show here, not as a misleading ratio on a GPU."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("flashrnn")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from lstm_gpu import flashrnn_backends, flashrnn_lstm  # noqa: E402


@pytest.mark.parametrize("T,N,H", [(5, 3, 16), (2, 1, 40)])
def test_the_flashrnn_anchor_is_torch_s_lstm(T: int, N: int, H: int, rng: np.random.Generator):
    torch.manual_seed(int(rng.integers(1 << 31)))
    ref = torch.nn.LSTM(H, H).double()
    x = torch.randn(T, N, H, dtype=torch.float64)
    h0, c0 = torch.randn(N, H, dtype=torch.float64) * 0.5, torch.randn(N, H, dtype=torch.float64) * 0.5
    cot = torch.randn(T, N, H, dtype=torch.float64)
    want, _ = ref(x, (h0[None], c0[None]))
    want_grads = torch.autograd.grad((want * cot).sum(), [ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0])
    leaves = [w.detach().clone().requires_grad_() for w in
              (ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0 + ref.bias_hh_l0)]
    (backend,) = flashrnn_backends(H, "cpu", "auto")
    got = flashrnn_lstm(x, h0, c0, *leaves, backend)
    grads = torch.autograd.grad((got * cot).sum(), leaves)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_which_flashrnn_backends_a_shape_gets():
    assert flashrnn_backends(96, "cuda", "auto") == ["cuda_fused"]  # one head over its Triton kernel's limit
    assert flashrnn_backends(64, "cuda", "auto") == ["cuda_fused", "triton_fused"]
    assert flashrnn_backends(96, "cpu", "auto") == ["vanilla"]
    assert flashrnn_backends(96, "cuda", "none") == []
    assert flashrnn_backends(96, "cuda", "cuda,cuda_fused") == ["cuda", "cuda_fused"]
