"""The differentiation API: grad (argnums, pytrees, has_aux), value_and_grad, vjp, Tensor.backward, detach.

Tests of gradient values run on every backend (the ``backend`` fixture): eagerly on the reference interpreter,
compiled (``tests/core/compiled.py``) elsewhere, where ``backward`` runs inside the compiled function and it
returns the ``.grad`` it filled. All float64 with the table's tolerances. Tests of Python-level types and of
errors raised while tracing have no backend and run once.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf

from .compiled import on_backend
from .utils import assert_close, to_torch


def mlp(params, x):
    h = (x @ params["w1"] + params["b1"]).tanh()
    return ((h @ params["w2"]) ** 2).mean()


def mlp_arrays(r):
    params = {"w1": r.standard_normal((3, 5)), "b1": r.standard_normal(5), "w2": r.standard_normal((5, 2))}
    return params, r.standard_normal((4, 3))


def torch_mlp_grads(params, x, wrt_x=False):
    tp = {k: to_torch(v, requires_grad=True) for k, v in params.items()}
    tx = to_torch(x, requires_grad=wrt_x)
    loss = mlp(tp, tx)
    loss.backward()
    return loss, {k: v.grad for k, v in tp.items()}, tx.grad


def test_grad_pytree_argument_matches_torch(backend, rng):
    params, x = mlp_arrays(rng)
    g = on_backend(nf.grad(mlp), backend)(params, x)
    assert isinstance(g, dict) and set(g) == set(params)
    _, tg, _ = torch_mlp_grads(params, x)
    for k in params:
        assert isinstance(g[k], np.ndarray) and g[k].shape == params[k].shape
        assert_close(g[k], tg[k], "float64", grad=True, what=k)


def test_grad_argnums_tuple_and_int(backend, rng):
    params, x = mlp_arrays(rng)
    gp, gx = on_backend(nf.grad(mlp, argnums=(0, 1)), backend)(params, x)
    gx_only = on_backend(nf.grad(mlp, argnums=1), backend)(params, x)
    _, tg, tgx = torch_mlp_grads(params, x, wrt_x=True)
    assert_close(gx, tgx, "float64", grad=True)
    assert_close(gx_only, gx, rtol=1e-14, atol=1e-14)  # the same gradient (two programs when compiled)
    for k in params:
        assert_close(gp[k], tg[k], "float64", grad=True)


def test_the_gradient_for_an_argument_the_function_ignores_is_zero(backend, rng):
    """The other arguments stay arrays, so the function returned a numpy scalar: a constant, gradient 0 (JAX's)."""
    params, x = mlp_arrays(rng)
    g = on_backend(nf.grad(lambda p, x: (x ** 2).sum(), argnums=0), backend)(params, x)
    assert set(g) == set(params) and all(np.array_equal(g[k], np.zeros_like(params[k])) for k in params)
    value, (gp, gx) = on_backend(nf.value_and_grad(lambda p, x: (x ** 2).sum(), argnums=(0, 1)), backend)(params, x)
    assert_close(value, (x ** 2).sum(), rtol=1e-14, atol=0)
    assert_close(gx, 2 * x, rtol=1e-14, atol=0)
    assert all(np.array_equal(gp[k], np.zeros_like(params[k])) for k in params)


def test_grad_list_and_tuple_arguments_keep_their_structure(backend, rng):
    def f(ws, pair):
        a, b = pair
        return (ws[0] * a).sum() + (ws[1] * b * b).sum()

    ws = [rng.standard_normal(2), rng.standard_normal(1)]
    pair = (rng.standard_normal(2), rng.standard_normal(1))
    gw, gp = on_backend(nf.grad(f, argnums=(0, 1)), backend)(ws, pair)
    assert isinstance(gw, list) and isinstance(gp, tuple)
    assert_close(gw[0], pair[0], "float64")
    assert_close(gw[1], pair[1] * pair[1], "float64")
    assert_close(gp[0], ws[0], "float64")
    assert_close(gp[1], 2 * ws[1] * pair[1], "float64")


def test_value_and_grad(backend, rng):
    params, x = mlp_arrays(rng)
    value, g = on_backend(nf.value_and_grad(mlp), backend)(params, x)
    t_value, tg, _ = torch_mlp_grads(params, x)
    assert_close(value, t_value, "float64")
    for k in params:
        assert_close(g[k], tg[k], "float64", grad=True)


def test_has_aux(backend, rng):
    def f(w, x):
        y = x * w
        return (y * y).sum(), {"y": y, "n": y.sum()}

    w, x = rng.standard_normal(2), rng.standard_normal(2)
    g, aux = on_backend(nf.grad(f, has_aux=True), backend)(w, x)
    np.testing.assert_allclose(g, 2 * x * x * w)
    assert set(aux) == {"y", "n"}
    np.testing.assert_allclose(aux["y"], x * w)
    (value, aux2), g2 = on_backend(nf.value_and_grad(f, has_aux=True), backend)(w, x)
    np.testing.assert_allclose(value, np.sum((x * w) ** 2))
    np.testing.assert_allclose(aux2["n"], np.sum(x * w))
    assert_close(g2, g, rtol=1e-14, atol=1e-14)


def test_grad_of_tensor_arguments_returns_tensors():
    w = nf.tensor(np.array([1.0, 2.0]))
    g = nf.grad(lambda w: (w * w * w).sum())(w)
    assert isinstance(g, nf.Tensor)
    np.testing.assert_allclose(g.numpy(), [3.0, 12.0])


def test_grad_of_unused_argument_is_zeros(backend, rng):
    a, b = rng.standard_normal(3), rng.standard_normal((2, 2))
    g = on_backend(nf.grad(lambda a, b: (a * 2).sum(), argnums=(0, 1)), backend)(a, b)
    np.testing.assert_array_equal(g[0], 2 * np.ones(3))
    np.testing.assert_array_equal(g[1], np.zeros((2, 2)))


def test_second_derivative(backend, rng):
    def f(x):
        return (x ** 3 * x.sin()).sum()

    x = rng.uniform(-2.0, 2.0, 3)
    d2 = on_backend(nf.grad(lambda x: nf.grad(f)(x).sum()), backend)(x)
    expected = 6 * x * np.sin(x) + 6 * x ** 2 * np.cos(x) - x ** 3 * np.sin(x)
    np.testing.assert_allclose(d2, expected, rtol=1e-12)


def test_vjp_multiple_outputs_matches_torch(backend, rng):
    r = rng
    a, b = r.standard_normal((3, 4)), r.standard_normal(4)
    cts = (r.standard_normal((3, 4)), r.standard_normal(3))

    def f(a, b):
        return (a * b).tanh(), (a @ b).exp()

    def run(a, b, ct0, ct1):
        out, vjp_fn = nf.vjp(f, a, b)
        return out, vjp_fn((ct0, ct1)), vjp_fn((ct0 * 2, ct1 * 2))  # the vjp function can be called again

    out, (ga, gb), (ga2, _) = on_backend(run, backend)(a, b, *cts)
    assert isinstance(out, tuple) and out[0].shape == (3, 4) and out[1].shape == (3,)
    ta, tb = to_torch(a, requires_grad=True), to_torch(b, requires_grad=True)
    to = f(ta, tb)
    tga, tgb = torch.autograd.grad(to, (ta, tb), tuple(to_torch(c) for c in cts))
    assert_close(out[0], to[0], "float64")
    assert_close(out[1], to[1], "float64")
    assert_close(ga, tga, "float64", grad=True)
    assert_close(gb, tgb, "float64", grad=True)
    np.testing.assert_allclose(ga2, 2 * np.asarray(ga), rtol=1e-13)


def test_vjp_cotangent_must_match_output():
    _, vjp_fn = nf.vjp(lambda a: a * 2, np.ones(3))
    with pytest.raises(nf.ShapeError, match="cotangent"):
        vjp_fn(np.ones(4))
    with pytest.raises(nf.TraceError, match="structure"):
        vjp_fn((np.ones(3), np.ones(3)))


def test_backward_accumulates_across_calls(backend, rng):
    r = rng
    w_np, x_np = r.standard_normal(4), r.standard_normal(4)
    w = nf.tensor(w_np, requires_grad=True)
    assert w.grad is None

    def steps(x):
        loss = (w * w * x).sum()
        loss.backward()
        g1 = w.grad * 1.0  # a copy: accumulation must not be seen through it
        (w.exp().sum()).backward()
        g2 = w.grad * 1.0
        w.grad = None
        (w * 3).sum().backward()
        return g1, g2, w.grad

    g1, g2, g3 = on_backend(steps, backend)(nf.tensor(x_np) if backend == "reference" else x_np)
    np.testing.assert_allclose(np.asarray(g1), 2 * w_np * x_np, rtol=1e-14)
    np.testing.assert_allclose(np.asarray(g2), 2 * w_np * x_np + np.exp(w_np), rtol=1e-14)
    np.testing.assert_allclose(np.asarray(g3), np.full(4, 3.0))


def test_backward_with_explicit_gradient_and_several_leaves(backend, rng):
    a_np, b_np, g = rng.standard_normal(3), rng.standard_normal(3), rng.standard_normal(3)
    a = nf.tensor(a_np, requires_grad=True)
    b = nf.tensor(b_np, requires_grad=True)
    unused = nf.tensor(rng.standard_normal(2), requires_grad=True)

    def run(g):
        y = a * b + a
        y.backward(g)
        assert unused.grad is None
        return a.grad, b.grad

    ga, gb = on_backend(run, backend)(nf.tensor(g) if backend == "reference" else g)
    assert_close(ga, g * (b_np + 1), "float64")
    assert_close(gb, g * a_np, "float64")
    with pytest.raises(nf.ShapeError, match="backward"):
        (a * b + a).backward()


def test_backward_matches_torch_through_many_ops(backend, rng):
    r = rng
    arrays = [r.standard_normal((3, 4)), r.standard_normal((4, 2)), r.standard_normal(2)]
    ts = [nf.tensor(a, requires_grad=True) for a in arrays]
    tt = [to_torch(a, requires_grad=True) for a in arrays]

    def loss(lib, w, v, b):
        h = (w @ v + b).softmax(-1)
        return (h * h.log()).sum() + (w.abs().max() if lib == "nf" else w.abs().amax())

    def run(scale):  # the parameters are captured; ``scale`` (1.0) is the compiled function's one input
        (loss("nf", *ts) * scale).backward()
        return [t.grad for t in ts]

    grads = on_backend(run, backend)(nf.tensor(np.float64(1.0)) if backend == "reference" else np.array(1.0))
    loss("torch", *tt).backward()
    for g, r_ in zip(grads, tt):
        assert_close(g, r_.grad, "float64", grad=True)


def test_detach_stops_gradient(backend, rng):
    x_np = rng.standard_normal(3)
    x = nf.tensor(x_np, requires_grad=True)

    def run(scale):
        (x * x.detach() * scale).sum().backward()
        return x.grad

    np.testing.assert_allclose(np.asarray(on_backend(run, backend)(
        nf.tensor(np.float64(1.0)) if backend == "reference" else np.array(1.0))), x_np)  # not 2x
    g = on_backend(nf.grad(lambda x: (x * x.detach() + x.detach().exp()).sum()), backend)(x_np)
    np.testing.assert_allclose(g, x_np)
    d = x.detach()
    assert d.shape == x.shape and not d.requires_grad
    np.testing.assert_array_equal(d.numpy(), x_np)


def test_requires_grad_only_for_float():
    with pytest.raises(nf.DTypeError, match="float"):
        nf.tensor(np.array([1, 2]), requires_grad=True)


def test_grad_needs_scalar_float_output():
    with pytest.raises(nf.ShapeError, match="scalar"):
        nf.grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(nf.DTypeError, match="float"):
        nf.grad(lambda x: x.sum())(np.ones(3, np.int64))
    with pytest.raises(nf.TraceError, match="scalar tensor, got str"):
        nf.grad(lambda x: "3.0")(np.ones(3))
    np.testing.assert_array_equal(nf.grad(lambda x: 3.0)(np.ones(3)), np.zeros(3))  # a constant, as in JAX
