"""Gradients and results at the points where composed rules go wrong: exact zeros, ties at a clamp's bounds,
constant slices, impossible CTC alignments, 0-d tensors and empty axes. Each is compared with torch (float64),
on every backend (compiled: forward and the vjp program)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn.functional as F
from nnforge.errors import ShapeError


def _grad(backend: str, fn, *args: np.ndarray, argnums: int | tuple = 0):
    return nf.compile(nf.grad(fn, argnums=argnums), backend=backend)(*args)


def _torch_grad(fn, *args: np.ndarray, argnums: tuple = (0,)):
    ts = [torch.tensor(a, requires_grad=i in argnums) for i, a in enumerate(args)]
    fn(*ts).backward()
    return [ts[i].grad.numpy() for i in argnums]


def _same(got, want, rtol: float = 1e-12, atol: float = 1e-300) -> None:
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, atol=atol,
                               equal_nan=True)


# ---- erf ------------------------------------------------------------------------------------------------------

def test_erf_vjp_is_the_exact_derivative(backend: str) -> None:
    """At 0 and away from it: 2/sqrt(pi) exp(-x^2), not the derivative of a polynomial approximation."""
    x = np.array([0.0, 1e-8, -0.3, 0.7, 1.9, -2.6, 5.0])
    got = _grad(backend, lambda v: nf.erf(v).sum(), x)
    _same(got, _torch_grad(lambda v: torch.erf(v).sum(), x)[0], rtol=1e-14)
    assert got[0] == 2 / math.sqrt(math.pi)


def test_erf_and_gelu_are_float64_accurate(backend: str, rng: np.random.Generator) -> None:
    x = np.concatenate([rng.standard_normal(200) * 3, [0.0, -0.0, 6.0, -30.0, np.inf, -np.inf, np.nan]])
    erf, gelu = nf.compile(lambda v: (nf.erf(v), nf.gelu(v)), backend=backend)(x)
    t = torch.from_numpy(x)
    _same(erf, torch.erf(t).numpy(), rtol=4.5e-16)  # libm and torch each within an ulp
    # 1 + erf(x / sqrt 2) cancels for x << 0: an ulp of erf is then 1e-16 absolute, as in torch's own formula
    _same(gelu, torch.nn.functional.gelu(t).numpy(), rtol=4e-16, atol=4e-16)
    got32 = nf.compile(nf.erf, backend=backend)(x.astype(np.float32))
    assert got32.dtype == np.float32
    _same(got32, torch.erf(t.float()).numpy(), rtol=2.4e-7)  # within an ulp of float32


# ---- pow ------------------------------------------------------------------------------------------------------

def test_pow_gradients_at_zero_and_negative_bases(backend: str) -> None:
    """d/db of b^e is 0 where e = 0 (even at b = 0); d/de is 0 at b = 0 with e >= 0, NaN for b < 0 and -inf at
    b = 0 with e < 0: torch's values, nothing hidden."""
    b = np.array([0.0, 0.0, 0.0, -1.5, -2.0, 2.0, 0.0])
    e = np.array([0.0, 2.0, -1.0, 2.0, 0.5, 0.0, 0.5])
    got = _grad(backend, lambda b, e: (b ** e).sum(), b, e, argnums=(0, 1))
    want = _torch_grad(lambda b, e: (b ** e).sum(), b, e, argnums=(0, 1))
    assert got[0][0] == 0.0 and np.isnan(got[1][3]) and got[1][2] == -np.inf
    for g, w in zip(got, want):
        _same(g, w)


# ---- std, clamp ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 1])
def test_std_of_a_constant_slice_has_zero_gradient(backend: str, axis) -> None:
    x = np.array([[2.0, 2.0, 2.0], [1.0, -0.5, 3.0]])
    got = _grad(backend, lambda v: v.std(axis).sum() if axis else v[0].std(), x)
    want = _torch_grad(lambda v: v.std(axis).sum() if axis else v[0].std(), x)[0]
    _same(got, want)
    assert np.isfinite(got).all()


@pytest.mark.parametrize("order", [2.0, 3.0, 1.0])
def test_norms_of_a_zero_vector_have_torchs_gradient(backend: str, order: float) -> None:
    """A zero-padded row: 0 for the norm (not 0 * inf = NaN), 1 / eps for normalize, as torch."""
    x = np.array([[3.0, -4.0, 1.5], [0.0, 0.0, 0.0]])
    got = _grad(backend, lambda v: F.vector_norm(v, order, 1).sum(), x)
    _same(got, _torch_grad(lambda v: torch.linalg.vector_norm(v, order, 1).sum(), x)[0], rtol=1e-14)
    got = _grad(backend, lambda v: (F.normalize(v, order, 1) * np.array([1.0, -2.0, 0.5])).sum(), x)
    want = _torch_grad(lambda v: (torch.nn.functional.normalize(v, order, 1) * torch.tensor([1.0, -2.0, 0.5])).sum(),
                       x)[0]
    _same(got, want)  # a difference of terms 30 times its size: 1e-13 relative


def test_clamp_passes_the_gradient_on_the_closed_interval(backend: str) -> None:
    """Forward with NaN too (it stays NaN); the gradient at NaN is not compared (torch's mask makes it 0)."""
    x = np.array([0.5, 1.0, 2.0, 3.0, 3.5, np.nan])
    for lo, hi in [(1.0, 3.0), (None, 3.0), (1.0, None), (3.0, 1.0)]:
        def f(v, lo=lo, hi=hi):
            return (v.clamp(lo, hi) * np.arange(1.0, 7.0)).sum()

        _same(nf.compile(lambda v, lo=lo, hi=hi: v.clamp(lo, hi), backend=backend)(x),
              torch.from_numpy(x).clamp(lo, hi).numpy())
        _same(_grad(backend, f, x)[:5], _torch_grad(lambda v, lo=lo, hi=hi: (v.clamp(lo, hi) * torch.arange(
            1.0, 7.0, dtype=torch.float64)).sum(), x)[0][:5])


# ---- CTC ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_ctc_impossible_alignment_gives_inf_and_a_nan_gradient(backend: str, reduction: str,
                                                                rng: np.random.Generator) -> None:
    """Sample 1 needs 5 steps for three repeated labels but has 3: torch's loss is inf and its gradient NaN for
    that sample's log-probabilities (not a silent 0); sample 0's gradient stays finite."""
    x = rng.standard_normal((3, 2, 4))
    tg, il, tl = np.array([[1, 2, 3], [1, 1, 1]]), np.array([3, 3]), np.array([1, 3])

    def ours(v):
        return F.ctc_loss(v.log_softmax(-1), tg, il, tl, reduction=reduction).sum()

    def theirs(v):
        return torch.nn.functional.ctc_loss(v.log_softmax(-1), torch.from_numpy(tg), torch.from_numpy(il),
                                            torch.from_numpy(tl), reduction=reduction).sum()

    loss = nf.compile(ours, backend=backend)(x)
    assert loss == np.inf
    got, want = _grad(backend, ours, x), _torch_grad(theirs, x)[0]
    assert np.isnan(got[:, 1]).all() and np.isfinite(got[:, 0]).all()
    _same(got, want, rtol=1e-10)


def test_ctc_zero_infinity_zeroes_the_impossible_sample(backend: str, rng: np.random.Generator) -> None:
    x = rng.standard_normal((3, 2, 4))
    tg, il, tl = np.array([[1, 2, 3], [1, 1, 1]]), np.array([3, 3]), np.array([1, 3])
    got = _grad(backend, lambda v: F.ctc_loss(v.log_softmax(-1), tg, il, tl, zero_infinity=True), x)
    assert (got[:, 1] == 0).all() and np.isfinite(got).all()


# ---- 0-d tensors and empty axes -------------------------------------------------------------------------------

ZERO_D = [
    ("softmax(0)", lambda t: t.softmax(0), lambda t: t.softmax(0)),
    ("log_softmax(-1)", lambda t: t.log_softmax(-1), lambda t: t.log_softmax(-1)),
    ("logsumexp(0)", lambda t: t.logsumexp(0), lambda t: t.logsumexp(0)),
    ("max(0)", lambda t: t.max(0), lambda t: t.amax(0)),
    ("min(0, keepdims)", lambda t: t.min(0, keepdims=True), lambda t: t.amin(0, keepdim=True)),
    ("squeeze(0)", lambda t: t.squeeze(0), lambda t: t.squeeze(0)),
    ("transpose(0, 0)", lambda t: t.transpose(0, 0), lambda t: t.transpose(0, 0)),
    ("flatten()", lambda t: t.flatten(), lambda t: t.flatten()),
    ("sum(0)", lambda t: t.sum(0), lambda t: t.sum(0)),
    ("mean(0)", lambda t: t.mean(0), lambda t: t.mean(0)),
    ("unsqueeze(-1)", lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(-1)),
    ("flip(0)", lambda t: t.flip(0), lambda t: t.flip(0)),
    ("var(0, correction=0)", lambda t: t.var(0, correction=0), lambda t: t.var(0, correction=0)),
]


@pytest.mark.parametrize(("ours", "theirs"), [c[1:] for c in ZERO_D], ids=[c[0] for c in ZERO_D])
def test_ops_on_a_0d_tensor_match_torch(backend: str, ours, theirs) -> None:
    """A 0-d tensor takes axis 0 or -1 as torch does; the result's shape, value and gradient agree."""
    x = np.array(-1.25)
    got = nf.compile(ours, backend=backend)(x)
    want = theirs(torch.from_numpy(x))
    assert np.shape(got) == tuple(want.shape)
    _same(got, want.numpy())
    g = _grad(backend, lambda v: (ours(v) * 3.0).sum(), x)
    _same(g, _torch_grad(lambda v: (theirs(v) * 3.0).sum(), x)[0])


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp"])
def test_an_empty_axis_gives_torchs_result(backend: str, op: str) -> None:
    for shape in [(5, 0, 0), (5, 0), (0, 3)]:
        x = np.ones(shape)
        got = nf.compile(lambda v: getattr(v, op)(-1), backend=backend)(x)
        want = getattr(torch.from_numpy(x), op)(-1).numpy()
        assert got.shape == want.shape, (op, shape)
        _same(got, want)


def test_max_over_an_empty_axis_is_an_error_as_in_torch() -> None:
    with pytest.raises(ShapeError, match=r"^max: reduction over an empty axis 1 of \[2, 0\]"):
        nf.tensor(np.ones((2, 0))).max(-1)


@pytest.mark.parametrize(("call", "name"), [
    (lambda t: t.mean(5), "mean"), (lambda t: t.std(4), "std"), (lambda t: t.var(-3), "var"),
    (lambda t: t.softmax(2), "softmax"), (lambda t: t.log_softmax(-4), "log_softmax"),
    (lambda t: t.logsumexp(7), "logsumexp"), (lambda t: t.min(3), "min"), (lambda t: t.flatten(0, 5), "flatten"),
    (lambda t: t.transpose(0, 9), "transpose"), (lambda t: t.chunk(2, 4), "chunk"),
    (lambda t: nf.tensor(np.ones((2, 0))).min(-1), "min"), (lambda t: t.clamp(np.ones((4, 1)), None), "clamp"),
    (lambda t: F.normalize(t, dim=5), "normalize"), (lambda t: F.vector_norm(t, 3.0, 2), "vector_norm"),
    (lambda t: nf.set_at(t, (0,), np.ones(2)), "set_at"), (lambda t: t.flatten(1, 0), "flatten"),
    (lambda t: t.sum((0, -2)), "sum"),
])
def test_errors_inside_a_composed_op_name_the_op_the_user_called(call, name: str) -> None:
    t = nf.tensor(np.ones((2, 3)))
    with pytest.raises(ShapeError) as info:
        call(t)
    assert str(info.value).startswith(f"{name}: "), str(info.value)
    assert "test_edge_points.py" in str(info.value)  # the user's line


def test_interpreted_fallback_is_a_warning_once(caplog: pytest.LogCaptureFixture) -> None:
    if "cpu" not in nf.available_backends():
        pytest.skip("no working C compiler")
    from nnforge.codegen import c

    backend = c.CpuBackend()
    x = np.arange(1.0, 4.0, dtype=np.float16)
    graph = nf.compile(lambda v: v * 2).trace(x)
    with caplog.at_level(logging.INFO, logger="nnforge.codegen.c"):
        backend(graph)
        backend(graph)
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "float16" in warned[0].getMessage()
    assert "reference interpreter" in warned[0].getMessage()


# ---- one-element views -------------------------------------------------------------------------------------------

def test_a_strided_slice_of_a_sum_to_one_value_and_its_gradient(backend: str, rng: np.random.Generator) -> None:
    """``(-x).sum((0, 1))[::2]`` of a [1, 1, 1] x, every value of the way weighed into the loss: the gradient reads
    the slice's cotangent at a padded index that is the same in every lane, a scalar (on Triton a load at it with
    the block's mask was refused). Found by the fuzzer."""
    x = rng.standard_normal((1, 1, 1))
    weights = [rng.standard_normal(s) for s in ((1, 1, 1), (1, 1, 1), (1,), (1,))]

    def values(v):
        n = -v
        s = n.sum(axis=(0, 1))
        return [v, n, s, s[::2]]

    def loss(v):
        return sum((a * w).sum() for a, w in zip(values(v), weights))

    got = nf.compile(lambda v: (*values(v), nf.grad(loss)(v)), backend=backend)(x)
    t = torch.tensor(x, requires_grad=True)
    want = [-t, (-t).sum(dim=(0, 1)), (-t).sum(dim=(0, 1))[::2]]
    sum((a * torch.tensor(w)).sum() for a, w in zip([t, *want], weights)).backward()
    for g, w in zip(got, [t, *want, t.grad]):
        _same(g, w.detach().numpy(), rtol=1e-15)


def test_the_min_of_a_product_of_one_element(backend: str, rng: np.random.Generator) -> None:
    """``(-x @ w).min()`` of a [1, 1] x and a [1] w, every value of the way weighed into the loss: the reduction
    reads its one element as a 0-d value and compares it with the block of running maxima (a min is the max of
    the negation); on Triton a 0-d value's NaN test or-ed with that block failed under the interpreter. Found by
    the fuzzer (``NNFORGE_FUZZ_SEED=505``)."""
    x, w = rng.standard_normal((1, 1)), rng.standard_normal(1)
    weights = [rng.standard_normal(s) for s in ((1, 1), (1, 1), (1,), (1,), ())]

    def values(x, w):
        n = -x
        p = n @ w
        return [x, n, w, p, p.min()]

    def loss(x, w):
        return sum((a * c).sum() for a, c in zip(values(x, w), weights))

    got = nf.compile(lambda x, w: (*values(x, w), *nf.grad(loss, argnums=(0, 1))(x, w)), backend=backend)(x, w)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    want = values(tx, tw)
    sum((a * torch.tensor(c)).sum() for a, c in zip(want, weights)).backward()
    for g, v in zip(got, [*want, tx.grad, tw.grad]):
        _same(g, v.detach().numpy(), rtol=1e-15)


# ---- the max a softmax or log-sum-exp subtracts --------------------------------------------------------------

@pytest.mark.parametrize("op", ["softmax", "logsumexp", "log_softmax"])
def test_the_subtracted_max_carries_no_gradient(backend: str, op: str, rng: np.random.Generator) -> None:
    """The result does not depend on the max subtracted for range, so its gradient goes around it: no element is
    compared with its slice's max (through the max, an attention's softmax gradient took a pass over the scores
    to route exactly 0). The gradient is torch's, ties of the max included."""
    x = rng.standard_normal((3, 4, 9))
    x[0, 1, 2] = x[0, 1, 5] = x[0, 1].max() + 1.0  # a tie for the max
    w = rng.standard_normal((3, 4, 9) if op != "logsumexp" else (3, 4))

    def loss(v):
        return (getattr(v, op)(-1) * w).sum()

    graph = nf.compile(nf.grad(loss)).trace(x)
    assert not [n for n in graph.order if n.op.name == "EQ" and tuple(n.shape) == x.shape], op  # x == its max
    t = torch.tensor(x, requires_grad=True)
    (getattr(t, op)(-1) * torch.tensor(w)).sum().backward()
    _same(nf.compile(nf.grad(loss), backend=backend)(x), t.grad.numpy(), rtol=1e-12, atol=1e-15)
