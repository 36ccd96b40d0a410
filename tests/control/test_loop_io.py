"""nf.loop with in-place state, Feeder and Receiver on the reference backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf


def _linear_regression_data(rng: np.random.Generator, true_w: np.ndarray, n: int = 16) -> np.ndarray:
    x = rng.standard_normal((n, true_w.shape[0])).astype(np.float32)
    return np.concatenate([x, x @ true_w], axis=1)


def test_loop_with_feeder_and_receiver_matches_torch_sgd(rng: np.random.Generator):
    true_w = rng.standard_normal((4, 1)).astype(np.float32)
    w0 = rng.standard_normal((4, 1)).astype(np.float32)
    batches = [_linear_regression_data(rng, true_w) for _ in range(30)]
    feed = iter(batches)
    w = nf.tensor(w0, requires_grad=True)
    losses: list[float] = []

    def step():
        d = nf.Feeder(lambda: next(feed), shape=[16, 5], name="batches")
        loss = ((d[:, :4] @ w - d[:, 4:]) ** 2).mean()
        w.grad = None
        loss.backward()
        w.assign(w - 0.05 * w.grad)
        nf.Receiver(lambda v: losses.append(float(v)), [loss])

    nf.loop(len(batches), step)
    saved: list[np.ndarray] = []
    nf.Receiver(lambda v: saved.append(v), [w])
    assert losses == [] and saved == []  # nothing runs before execute()
    nf.execute()

    tw = torch.tensor(w0, requires_grad=True)
    ref_losses = []
    for b in batches:
        bt = torch.from_numpy(b)
        loss = ((bt[:, :4] @ tw - bt[:, 4:]) ** 2).mean()
        ref_losses.append(loss.item())
        (g,) = torch.autograd.grad(loss, tw)
        with torch.no_grad():
            tw -= 0.05 * g
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(saved[0], tw.detach().numpy(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w.numpy(), saved[0])
    assert w.grad is None  # gradients made inside the loop body do not leak out


def test_loop_index_and_state_without_gradients():
    acc = nf.zeros(3)
    seen: list[int] = []

    def body(i):
        acc.assign(acc + i.cast(nf.float32))
        nf.Receiver(lambda v: seen.append(int(v)), [i])

    nf.loop(5, body)
    np.testing.assert_allclose(acc.numpy(), np.full(3, 10.0))
    nf.execute()  # the loop already ran for acc.numpy(); execute must not run it again
    assert seen == [0, 1, 2, 3, 4]


def test_feeder_shape_mismatch_names_the_feeder():
    x = nf.zeros(2)

    def step():
        x.assign(x + nf.Feeder(lambda: np.ones(3, np.float32), shape=[2], name="bad_feed"))

    nf.loop(2, step)
    with pytest.raises(nf.NNForgeError, match=r"Feeder 'bad_feed'.*expected shape \[2\].*\[3\]"):
        x.numpy()


def test_loop_rejects_gradients_through_it(rng: np.random.Generator):
    w = nf.tensor(rng.standard_normal(3).astype(np.float32), requires_grad=True)
    s = nf.zeros(3)

    def step():
        s.assign(s + w)

    nf.loop(3, step)
    with pytest.raises(nf.TraceError, match=r"cannot differentiate through nf\.loop"):
        s.sum().backward()


def test_state_changing_shape_is_an_error():
    s = nf.zeros(3)
    with pytest.raises(nf.ShapeError, match="assign"):
        nf.loop(2, lambda: s.assign(nf.zeros(4)))


def test_compiled_function_with_receiver_runs_it_every_call(rng: np.random.Generator):
    got: list[np.ndarray] = []

    @nf.compile
    def f(x):
        y = x * 2
        nf.Receiver(lambda v: got.append(v), [y])
        return y + 1

    a = rng.standard_normal(4).astype(np.float32)
    np.testing.assert_allclose(f(a), a * 2 + 1)
    f(a)
    assert len(got) == 2
    np.testing.assert_allclose(got[0], a * 2)


def test_random_ops_in_a_loop_draw_fresh_numbers():
    draws: list[np.ndarray] = []

    def step():
        nf.Receiver(lambda v: draws.append(v), [nf.rand(4)])

    nf.loop(3, step)
    nf.execute()
    assert len(draws) == 3
    assert not np.allclose(draws[0], draws[1])
    assert all((d >= 0).all() and (d < 1).all() for d in draws)


def test_values_of_an_eager_loop_that_stopped_are_refused_not_computed_again(rng: np.random.Generator):
    """``nf.execute()`` stopped by a Receiver's error: reading what the loop updates raises, naming the loop and
    the error, rather than running the loop again (calling its Feeder and Receiver a second time); a value
    assigned anew reads as usual."""
    w0 = rng.standard_normal(2).astype(np.float32)
    w = nf.tensor(w0)
    fed: list[int] = []
    seen: list[float] = []

    def receive(v):
        seen.append(float(v[0]))
        if len(seen) == 3:
            raise ValueError("disk full")

    def step():
        b = nf.Feeder(lambda: fed.append(1) or np.ones(2, np.float32), shape=[2], prefetch=0)
        w.assign(w + b)
        nf.Receiver(receive, [w], pending=0)

    nf.loop(6, step)
    with pytest.raises(ValueError, match="disk full"):
        nf.execute()
    assert len(fed) == 3 and seen == pytest.approx(w0[0] + np.arange(1, 4))
    for read in (lambda: w.numpy(), lambda: (w * 2).numpy()):
        with pytest.raises(nf.NNForgeError, match=r"nf.loop or Receiver \(created at .*test_loop_io.py:\d+\) that "
                                                   r"did not finish: execute\(\) stopped with ValueError: disk full"):
            read()
    assert len(fed) == 3 and len(seen) == 3  # nothing ran again
    w.assign(nf.tensor(w0))
    np.testing.assert_array_equal(w.numpy(), w0)
