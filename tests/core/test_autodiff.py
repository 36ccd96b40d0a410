"""The differentiation API: grad (argnums, pytrees, has_aux), value_and_grad, vjp, Tensor.backward, detach."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import nnforge as nf

from .utils import assert_close, seed_of, to_torch


def rng(*parts):
    return np.random.default_rng(seed_of("autodiff", *parts))


def mlp(params, x):
    h = (x @ params["w1"] + params["b1"]).tanh()
    return ((h @ params["w2"]) ** 2).mean()


def mlp_arrays():
    r = rng("mlp")
    params = {"w1": r.standard_normal((3, 5)), "b1": r.standard_normal(5), "w2": r.standard_normal((5, 2))}
    return params, r.standard_normal((4, 3))


def torch_mlp_grads(params, x, wrt_x=False):
    tp = {k: to_torch(v, requires_grad=True) for k, v in params.items()}
    tx = to_torch(x, requires_grad=wrt_x)
    loss = mlp(tp, tx)
    loss.backward()
    return loss, {k: v.grad for k, v in tp.items()}, tx.grad


def test_grad_pytree_argument_matches_torch():
    params, x = mlp_arrays()
    g = nf.grad(mlp)(params, x)
    assert isinstance(g, dict) and set(g) == set(params)
    _, tg, _ = torch_mlp_grads(params, x)
    for k in params:
        assert isinstance(g[k], np.ndarray) and g[k].shape == params[k].shape
        assert_close(g[k], tg[k], "float64", grad=True, what=k)


def test_grad_argnums_tuple_and_int():
    params, x = mlp_arrays()
    gp, gx = nf.grad(mlp, argnums=(0, 1))(params, x)
    gx_only = nf.grad(mlp, argnums=1)(params, x)
    _, tg, tgx = torch_mlp_grads(params, x, wrt_x=True)
    assert_close(gx, tgx, "float64", grad=True)
    np.testing.assert_array_equal(gx, gx_only)
    for k in params:
        assert_close(gp[k], tg[k], "float64", grad=True)


def test_grad_list_and_tuple_arguments_keep_their_structure():
    def f(ws, pair):
        a, b = pair
        return (ws[0] * a).sum() + (ws[1] * b * b).sum()

    ws = [np.array([1.0, 2.0]), np.array([3.0])]
    pair = (np.array([4.0, 5.0]), np.array([6.0]))
    gw, gp = nf.grad(f, argnums=(0, 1))(ws, pair)
    assert isinstance(gw, list) and isinstance(gp, tuple)
    np.testing.assert_array_equal(gw[0], [4.0, 5.0])
    np.testing.assert_array_equal(gw[1], [36.0])
    np.testing.assert_array_equal(gp[0], [1.0, 2.0])
    np.testing.assert_array_equal(gp[1], [36.0])


def test_value_and_grad():
    params, x = mlp_arrays()
    value, g = nf.value_and_grad(mlp)(params, x)
    t_value, tg, _ = torch_mlp_grads(params, x)
    assert_close(value, t_value, "float64")
    for k in params:
        assert_close(g[k], tg[k], "float64", grad=True)


def test_has_aux():
    def f(w, x):
        y = x * w
        return (y * y).sum(), {"y": y, "n": y.sum()}

    w, x = np.array([1.0, -2.0]), np.array([3.0, 0.5])
    g, aux = nf.grad(f, has_aux=True)(w, x)
    np.testing.assert_allclose(g, 2 * x * x * w)
    assert set(aux) == {"y", "n"}
    np.testing.assert_allclose(aux["y"], x * w)
    (value, aux2), g2 = nf.value_and_grad(f, has_aux=True)(w, x)
    np.testing.assert_allclose(value, np.sum((x * w) ** 2))
    np.testing.assert_allclose(aux2["n"], np.sum(x * w))
    np.testing.assert_array_equal(g, g2)


def test_grad_of_tensor_arguments_returns_tensors():
    w = nf.tensor(np.array([1.0, 2.0]))
    g = nf.grad(lambda w: (w * w * w).sum())(w)
    assert isinstance(g, nf.Tensor)
    np.testing.assert_allclose(g.numpy(), [3.0, 12.0])


def test_grad_of_unused_argument_is_zeros():
    g = nf.grad(lambda a, b: (a * 2).sum(), argnums=(0, 1))(np.ones(3), np.ones((2, 2)))
    np.testing.assert_array_equal(g[0], 2 * np.ones(3))
    np.testing.assert_array_equal(g[1], np.zeros((2, 2)))


def test_second_derivative():
    def f(x):
        return (x ** 3 * x.sin()).sum()

    x = np.array([0.3, -1.2, 2.0])
    d2 = nf.grad(lambda x: nf.grad(f)(x).sum())(x)
    expected = 6 * x * np.sin(x) + 6 * x ** 2 * np.cos(x) - x ** 3 * np.sin(x)
    np.testing.assert_allclose(d2, expected, rtol=1e-12)


def test_vjp_multiple_outputs_matches_torch():
    r = rng("vjp")
    a, b = r.standard_normal((3, 4)), r.standard_normal(4)

    def f(a, b):
        return (a * b).tanh(), (a @ b).exp()

    out, vjp_fn = nf.vjp(f, a, b)
    assert isinstance(out, tuple) and out[0].shape == (3, 4) and out[1].shape == (3,)
    cts = (r.standard_normal((3, 4)), r.standard_normal(3))
    ga, gb = vjp_fn(cts)
    ta, tb = to_torch(a, requires_grad=True), to_torch(b, requires_grad=True)
    to = f(ta, tb)
    tga, tgb = torch.autograd.grad(to, (ta, tb), tuple(to_torch(c) for c in cts))
    assert_close(out[0], to[0], "float64")
    assert_close(ga, tga, "float64", grad=True)
    assert_close(gb, tgb, "float64", grad=True)
    ga2, _ = vjp_fn((cts[0] * 2, cts[1] * 2))  # the vjp function can be called again
    np.testing.assert_allclose(ga2, 2 * ga, rtol=1e-13)


def test_vjp_cotangent_must_match_output():
    _, vjp_fn = nf.vjp(lambda a: a * 2, np.ones(3))
    with pytest.raises(nf.ShapeError, match="cotangent"):
        vjp_fn(np.ones(4))
    with pytest.raises(nf.TraceError, match="structure"):
        vjp_fn((np.ones(3), np.ones(3)))


def test_backward_accumulates_across_calls():
    r = rng("backward")
    w_np, x_np = r.standard_normal(4), r.standard_normal(4)
    w = nf.tensor(w_np, requires_grad=True)
    x = nf.tensor(x_np)
    assert w.grad is None
    loss = (w * w * x).sum()
    loss.backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * w_np * x_np, rtol=1e-14)
    (w.exp().sum()).backward()
    np.testing.assert_allclose(w.grad.numpy(), 2 * w_np * x_np + np.exp(w_np), rtol=1e-14)
    w.grad = None
    (w * 3).sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.full(4, 3.0))


def test_backward_with_explicit_gradient_and_several_leaves():
    a = nf.tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    b = nf.tensor(np.array([0.5, -1.0, 2.0]), requires_grad=True)
    unused = nf.tensor(np.ones(2), requires_grad=True)
    y = a * b + a
    g = np.array([1.0, 10.0, 100.0])
    y.backward(nf.tensor(g))
    np.testing.assert_allclose(a.grad.numpy(), g * (np.array([0.5, -1.0, 2.0]) + 1))
    np.testing.assert_allclose(b.grad.numpy(), g * np.array([1.0, 2.0, 3.0]))
    assert unused.grad is None
    with pytest.raises(nf.ShapeError, match="backward"):
        y.backward()


def test_backward_matches_torch_through_many_ops():
    r = rng("backward_torch")
    arrays = [r.standard_normal((3, 4)), r.standard_normal((4, 2)), r.standard_normal(2)]
    ts = [nf.tensor(a, requires_grad=True) for a in arrays]
    tt = [to_torch(a, requires_grad=True) for a in arrays]
    for lib, (w, v, b) in (("nf", ts), ("torch", tt)):
        h = (w @ v + b).softmax(-1)
        out = (h * h.log()).sum() + (w.abs().max() if lib == "nf" else w.abs().amax())
        out.backward()
    for t, r_ in zip(ts, tt):
        assert_close(t.grad, r_.grad, "float64", grad=True)


def test_detach_stops_gradient():
    x_np = np.array([1.0, -2.0, 0.5])
    x = nf.tensor(x_np, requires_grad=True)
    (x * x.detach()).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), x_np)  # not 2x
    g = nf.grad(lambda x: (x * x.detach() + x.detach().exp()).sum())(x_np)
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
    with pytest.raises(nf.TraceError, match="scalar tensor"):
        nf.grad(lambda x: 3.0)(np.ones(3))
