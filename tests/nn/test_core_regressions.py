"""Regression tests for core bugs found while building nnforge.nn."""

from __future__ import annotations

import numpy as np

import nnforge as nf


def test_zero_d_tensor_keeps_its_shape() -> None:
    # np.ascontiguousarray promotes 0-d arrays to 1-d; scalars (and 0-d step counters) must stay 0-d.
    assert nf.tensor(3.0).shape == ()
    assert nf.tensor(np.array(2, np.int64)).shape == ()
    assert nf.tensor(np.array(2.5, np.float32)).numpy().shape == ()


def test_tensor_from_numpy_leaves_callers_array_writable() -> None:
    a = np.arange(3, dtype=np.float32)
    t = nf.tensor(a)
    a[0] = 7.0  # must not raise, and must not change the tensor
    assert a.flags.writeable
    assert t.numpy()[0] == 0.0


def _sgd_momentum_step(w: nf.Tensor, buf: nf.Tensor, step: nf.Tensor, x: nf.Tensor) -> nf.Tensor:
    loss = ((x @ w) ** 2).mean()
    loss.backward()
    buf.assign(buf * 0.9 + w.grad)
    step.assign(step + 1)
    w.assign(w - 0.1 * buf)
    w.grad = None
    return loss


def test_compile_reads_state_that_does_not_require_grad_at_call_time() -> None:
    # Optimizer state (momentum buffers, a 0-d int step counter) is updated in place but does not require grad;
    # compile used to reject it, or (after an eager step turned it into an expression) bake it in as a constant.
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 2)).astype(np.float32)
    x = rng.standard_normal((5, 3)).astype(np.float32)

    def make():
        return (nf.tensor(w0, requires_grad=True), nf.tensor(np.zeros((3, 2), np.float32)),
                nf.tensor(np.array(0, np.int64)))

    w, buf, step = make()
    eager = [_sgd_momentum_step(w, buf, step, nf.tensor(x)).item() for _ in range(4)]

    w2, buf2, step2 = make()
    first = _sgd_momentum_step(w2, buf2, step2, nf.tensor(x)).item()  # an eager step first: state is now non-DATA
    f = nf.compile(lambda xx: _sgd_momentum_step(w2, buf2, step2, xx))
    compiled = [first] + [float(f(x)) for _ in range(3)]
    np.testing.assert_allclose(compiled, eager, rtol=1e-5)
    assert step2.numpy().shape == () and int(step2.item()) == 4
    np.testing.assert_allclose(w2.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(buf2.numpy(), buf.numpy(), rtol=1e-5, atol=1e-6)
