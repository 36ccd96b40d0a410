"""nf.compile: one trace per signature, new scan lengths without retracing, array kinds in = out, nf.show."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nfnn
from nnforge.ir.ops import Op

from .scan_util import py_scan
from .utils import assert_close, seed_of, to_torch

N, I, H = 2, 3, 4


def rnn(xs, h0, w_ih, w_hh, b):
    def cell(h, x_t):
        h = (x_t @ w_ih.T + h @ w_hh.T + b).tanh()
        return h, h

    h, ys = nf.scan(cell, h0, xs)
    return ys, h


def torch_rnn(xs, h0, w_ih, w_hh, b):
    h, ys = py_scan(lambda h, x: ((x @ w_ih.T + h @ w_hh.T + b).tanh(),) * 2, h0, xs)
    return ys, h


def rnn_inputs(T, dtype=np.float32, n=N, seed=0):
    r = np.random.default_rng(seed_of("compile", T, n, seed))
    return [a.astype(dtype) for a in (r.standard_normal((T, n, I)), r.standard_normal((n, H)),
                                      r.standard_normal((H, I)) * 0.5, r.standard_normal((H, H)) * 0.5,
                                      r.standard_normal(H) * 0.1)]


def test_new_sequence_length_reuses_the_trace():
    f = nf.compile(rnn)
    for T in (10, 37, 10, 1):
        args = rnn_inputs(T)
        ys, h = f(*args)
        assert isinstance(ys, np.ndarray) and ys.shape == (T, N, H) and ys.dtype == np.float32
        ys_t, h_t = torch_rnn(*[to_torch(a) for a in args])
        assert_close(ys, ys_t, "float32")
        assert_close(h, h_t, "float32")
    assert f.trace_count == 1


def test_new_sequence_length_reuses_the_trace_of_a_gradient():
    def loss(xs, h0, w_ih, w_hh, b):
        ys, h = rnn(xs, h0, w_ih, w_hh, b)
        return (ys * ys).sum() + h.sum()

    f = nf.compile(nf.value_and_grad(loss, argnums=(0, 1, 2, 3, 4)))
    for T in (10, 37):
        args = rnn_inputs(T, np.float64)
        value, grads = f(*args)
        tt = [to_torch(a, requires_grad=True) for a in args]
        ys_t, h_t = torch_rnn(*tt)
        v_t = (ys_t * ys_t).sum() + h_t.sum()
        v_t.backward()
        assert_close(value, v_t, "float64")
        for g, t in zip(grads, tt):
            assert g.shape == tuple(t.shape)
            assert_close(g, t.grad, "float64", grad=True)
    assert f.trace_count == 1


def test_scan_is_not_unrolled():
    """The traced graph does not grow with T: the same node count at T=3 and at T=50."""

    def loss(xs, h0, w_ih, w_hh, b):
        return rnn(xs, h0, w_ih, w_hh, b)[0].sum()

    def size(graph):
        total = 0
        for n in graph.order:
            total += 1
            if "body" in n.attrs:
                total += size(n.attrs["body"])
        return total

    g = nf.grad(loss, argnums=(2, 3))
    small, big = nf.compile(g).trace(*rnn_inputs(3)), nf.compile(g).trace(*rnn_inputs(50))
    assert size(small) == size(big)
    assert sum(n.op == Op.SCAN for n in small.order) >= 2  # forward and backward scans, both loops


@pytest.mark.parametrize(("change", "retrace"), [
    ("same", False), ("seq_len", False), ("batch", True), ("dtype", True), ("hidden", True),
])
def test_cache_is_per_signature(change, retrace):
    f = nf.compile(rnn)
    f(*rnn_inputs(5))
    args = {"same": rnn_inputs(5, seed=1), "seq_len": rnn_inputs(9), "batch": rnn_inputs(5, n=3),
            "dtype": rnn_inputs(5, np.float64), "hidden": None}[change]
    if args is None:
        r = np.random.default_rng(1)
        args = [r.standard_normal(s).astype(np.float32) for s in ((5, N, I), (N, 6), (6, I), (6, 6), (6,))]
    ys, _ = f(*args)
    assert f.trace_count == (2 if retrace else 1)
    ys_t, _ = torch_rnn(*[to_torch(a) for a in args])
    assert ys.dtype == args[0].dtype
    assert_close(ys, ys_t, "float64" if args[0].dtype == np.float64 else "float32")
    f(*rnn_inputs(5))  # the first signature is still cached
    assert f.trace_count == (2 if retrace else 1)


def test_static_python_arguments_are_part_of_the_key():
    f = nf.compile(lambda x, scale, mode: x * scale if mode == "mul" else x + scale)
    x = np.arange(3.0, dtype=np.float32)
    np.testing.assert_array_equal(f(x, 2.0, "mul"), x * 2)
    np.testing.assert_array_equal(f(x, 3.0, "mul"), x * 3)
    np.testing.assert_array_equal(f(x, 3.0, "add"), x + 3)
    np.testing.assert_array_equal(f(x, 2.0, "mul"), x * 2)
    assert f.trace_count == 3


def test_static_python_arguments_are_keyed_by_type_and_nan_by_itself():
    """2, 2.0 and True are equal in Python and trace differently; NaN never equals itself and must not retrace."""
    x = np.arange(3, dtype=np.int64)
    f = nf.compile(lambda x, s: x * s)
    assert f(x, 2).dtype == np.int64 and f(x, 2.0).dtype == np.float32 and f.trace_count == 2
    np.testing.assert_array_equal(f(x, True), x)
    assert f.trace_count == 3
    g = nf.compile(lambda x, flag: x + 1 if flag is True else x - 1)
    np.testing.assert_array_equal(g(x, True), x + 1)
    np.testing.assert_array_equal(g(x, 1), x - 1)
    h = nf.compile(lambda x, s: x * 0.0 + s)
    for _ in range(3):
        assert np.isnan(h(x, float("nan"))).all()
    assert h.trace_count == 1


def test_a_compiled_objects_attributes_leave_the_compiled_functions_settings_alone():
    """functools.update_wrapper copied a model's own `dtype` and `backend` over the compiled function's."""

    class Scaled:
        dtype, backend, options = "float16", "elsewhere", {"x": 1}

        def __call__(self, x):
            return x * 3.0

    f = nf.compile(Scaled(), backend="reference")
    assert f.dtype is None and f.backend == "reference" and f.options == {}
    x = np.array([1.0, 2048.5], np.float32)
    assert f(x).dtype == np.float32 and f(x)[1] == np.float32(6145.5)  # not rounded through float16


def test_numpy_in_numpy_out_torch_in_torch_out():
    f = nf.compile(lambda a, b: {"sum": a + b, "parts": (a * b, b.sum())})
    a, b = np.ones((2, 3), np.float32), np.arange(6, dtype=np.float32).reshape(2, 3)
    out = f(a, b)
    assert set(out) == {"sum", "parts"} and isinstance(out["parts"], tuple)
    assert all(isinstance(v, np.ndarray) for v in (out["sum"], *out["parts"]))
    np.testing.assert_array_equal(out["sum"], a + b)
    out_t = f(torch.from_numpy(a), torch.from_numpy(b))
    assert all(isinstance(v, torch.Tensor) for v in (out_t["sum"], *out_t["parts"]))
    assert torch.equal(out_t["parts"][0], torch.from_numpy(a * b))
    assert out_t["parts"][1].item() == 15.0
    assert f.trace_count == 1  # same signature whichever array library carried it


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.float64])
def test_torch_dtypes_survive_the_round_trip(dtype):
    f = nf.compile(lambda a: a * 2)
    x = torch.arange(6).reshape(2, 3).to(dtype)
    y = f(x)
    assert isinstance(y, torch.Tensor) and y.dtype == dtype
    assert torch.equal(y, x * 2)


def test_kwargs_and_nested_argument_structures():
    f = nf.compile(lambda params, x, *, bias: (x @ params["w"] + params["b"]) * bias)
    r = np.random.default_rng(3)
    p = {"w": r.standard_normal((3, 2)), "b": r.standard_normal(2)}
    x = r.standard_normal((4, 3))
    np.testing.assert_allclose(f(p, x, bias=2.0), (x @ p["w"] + p["b"]) * 2.0, rtol=1e-12)
    np.testing.assert_allclose(f(p, x, bias=2.0), (x @ p["w"] + p["b"]) * 2.0, rtol=1e-12)
    assert f.trace_count == 1


@pytest.mark.parametrize("args", [(), (np.ones(2),), (np.ones(2), 3, None, "mode", True),
                                  (torch.ones(2), np.ones(3), 2.5), ((np.ones(2),), np.ones(2)), ([1, 2],)],
                         ids=["none", "one array", "statics", "torch", "nested tuple", "list"])
def test_a_calls_leaves_and_structure_are_those_of_the_generic_walk(args: tuple):
    """A call of positional leaves skips the pytree walk (the common call, flattened once per call): its leaves
    and structure must be the walk's, or a signature traced one way would not be found the other."""
    from nnforge.compile import _flatten_call, _is_argument
    from nnforge.pytree import flatten

    leaves, treedef = _flatten_call(args, {})
    want_leaves, want_def = flatten((args, {}), _is_argument)
    assert treedef == want_def and len(leaves) == len(want_leaves)
    assert all(a is b for a, b in zip(leaves, want_leaves))


def test_compiled_function_is_inlined_inside_another_trace():
    inner = nf.compile(lambda x: x.exp())
    outer = nf.compile(lambda x: inner(x) + 1)
    x = np.linspace(-1, 1, 5)
    np.testing.assert_allclose(outer(x), np.exp(x) + 1, rtol=1e-14)
    assert inner.trace_count == 0 and outer.trace_count == 1


def test_captured_parameter_is_read_at_call_time():
    w = nf.tensor(np.array([1.0, 2.0]), requires_grad=True)
    f = nf.compile(lambda x: x * w)
    x = np.array([3.0, 4.0])
    np.testing.assert_array_equal(f(x), [3.0, 8.0])
    w.assign(np.array([-1.0, 0.5]))
    np.testing.assert_array_equal(f(x), [-3.0, 2.0])
    assert f.trace_count == 1


def test_captured_constant_assigned_later_is_not_stale(backend):
    """A tensor the function reads without taking it as an argument or a gradient (a global mask, a lookup table,
    read inside a scan body too) is baked into the program; once it holds another value the trace is dropped,
    and the next one reads it at every call: assigned again, no third trace."""
    rng = np.random.default_rng(seed_of("captured_constant", backend))
    mask = nf.tensor(rng.standard_normal(3))
    table = nf.tensor(rng.standard_normal(3))

    def f(xs):
        _, ys = nf.scan(lambda c, x: (c, x * table), xs[0], xs)
        return ys * mask

    g = nf.compile(f, backend=backend)
    xs = rng.standard_normal((4, 3))
    for _ in range(2):
        np.testing.assert_allclose(g(xs), xs * table.numpy() * mask.numpy(), rtol=1e-12)
    assert g.trace_count == 1
    for k in range(3):
        mask.assign(rng.standard_normal(3))
        if k == 1:
            table.assign(rng.standard_normal(3))
        np.testing.assert_allclose(g(xs), xs * table.numpy() * mask.numpy(), rtol=1e-12)
    assert g.trace_count == 3  # once for the mask, once for the table; read at call time after that


def test_compiled_matches_eager():
    args = rnn_inputs(7, np.float64)
    ys_c, h_c = nf.compile(rnn)(*args)
    ys_e, h_e = rnn(*[nf.tensor(a) for a in args])
    np.testing.assert_array_equal(ys_c, ys_e.numpy())
    np.testing.assert_array_equal(h_c, h_e.numpy())


# ---- nf.show --------------------------------------------------------------------------------------------------
def tiny(xs, h0, w):
    return nf.scan(lambda h, x: ((h @ w + x).tanh(), h.sum()), h0, xs)


TINY_GOLDEN = """\
graph(%0: f32[T, 2], %1: f32[2], %2: f32[2, 2]) {
  %3 = scan(%1, %0, %2) length=T n_carry=1 n_xs=1 reverse=False unroll=1 : (f32[2], f32[T]) {
    body(%0: f32[2], %1: f32[2], %2: f32[2, 2]) {
      %3 = reshape(%0) shape=(1, 2) : f32[1, 2]
      %4 = matmul(%3, %2) : f32[1, 2]
      %5 = reshape(%4) shape=(2) : f32[2]
      %6 = add(%5, %1) : f32[2]
      %7 = tanh(%6) : f32[2]
      %8 = sum(%0) axes=(0) keepdims=False : f32[]
      return %7, %8
    }
  }
  %4 = proj(%3) index=0 : f32[2]
  %5 = proj(%3) index=1 : f32[T]
  return %4, %5
}"""


def _tiny_args(T=5):
    return np.ones((T, 2), np.float32), np.ones(2, np.float32), np.eye(2, dtype=np.float32)


def test_show_golden_text(capsys):
    text = nf.show(tiny, *_tiny_args(), stage="traced")
    assert text == TINY_GOLDEN
    assert capsys.readouterr().out.strip() == TINY_GOLDEN


def test_show_is_deterministic_and_nested():
    def f(xs, h0, w):
        def outer(h, x):
            acc, _ = nf.scan(lambda a, x_k: ((a * x_k + h).sin(), None), h, x)
            return (h @ w + acc).tanh(), acc

        return nf.grad(lambda h0_: nf.scan(outer, h0_, xs)[1].sum())(h0)

    args = (np.ones((4, 3, 2), np.float32), np.ones(2, np.float32), np.eye(2, dtype=np.float32))
    texts = [nf.show(f, *args), nf.show(f, *args), nf.show(nf.compile(f), *args)]
    assert texts[0] == texts[1] == texts[2]
    assert "scan(" in texts[0]
    depth = max(len(line) - len(line.lstrip()) for line in texts[0].splitlines() if "body(" in line)
    assert depth >= 8, "a scan inside a scan body prints as a body nested in a body"
    assert nf.show(tiny, *_tiny_args(5)) == nf.show(tiny, *_tiny_args(9)), "T prints symbolically"


def test_show_rejects_unknown_stage():
    with pytest.raises(ValueError, match="stage"):
        nf.show(tiny, *_tiny_args(), stage="kernels?")


def _normalized(x, g, b):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) / nf.sqrt(v + 1e-5) * g + b


def test_show_follows_the_compiled_functions_backend(rng: np.random.Generator):
    """"scheduled" is the program of the target the function is compiled for — the Triton target makes a
    layer norm one kernel of whole rows, the CPU target three kernels — and "source" the code its backend
    generates (C, or a Triton module of ``@triton.jit`` kernels); the reference backend generates none."""
    x = rng.standard_normal((8, 48)).astype(np.float32)
    args = (x, x[0] + 1, x[1])
    cpu, gpu = (nf.show(nf.compile(_normalized, backend=b), *args, stage="scheduled") for b in ("cpu", "triton"))
    assert cpu == nf.show(_normalized, *args, stage="scheduled") and cpu.startswith("program for target cpu")
    assert gpu.startswith("program for target triton") and "whole in each program" in gpu
    assert "whole in each program" not in cpu and cpu.count(" -> ") == 3
    c = nf.show(nf.compile(_normalized, backend="cpu"), *args, stage="source")
    triton = nf.show(nf.compile(_normalized, backend="triton"), *args, stage="source")
    assert "void " in c and "@triton.jit" not in c
    assert triton.count("@triton.jit\ndef k") == 1 and "def run(" in triton
    with pytest.raises(ValueError, match="backend 'reference' generates no code"):
        nf.show(_normalized, *args, stage="source")


def _size_uses(xs):
    h, ys = nf.scan(lambda h, x: (h + x, h), nf.zeros(2, dtype=xs.dtype), xs)
    n = xs.shape[0]
    return (ys[n // 2], ys[n - 1], ys[: n // 2].sum(0), ys[n // 2:].sum(0), ys[-(n // 2)], ys.mean(0),
            ys.sum(0) / n, ys[::2].sum(0), h * n)


def test_values_derived_from_the_length_follow_a_new_length():
    """Sizes used as values (indices, slice bounds, means) stay symbolic: no retrace and no baked-in T."""
    f = nf.compile(_size_uses)
    for T in (4, 9, 6):
        xs = np.random.default_rng(T).standard_normal((T, 2))
        got = f(xs)
        expected = [o.numpy() for o in _size_uses(nf.tensor(xs))]
        for k, (g, e) in enumerate(zip(got, expected)):
            np.testing.assert_allclose(g, e, rtol=1e-12, err_msg=f"output {k} at T={T}")
    assert f.trace_count == 1


@pytest.mark.xfail(strict=True, reason="CPython computes float / int-subclass in float.__truediv__ without calling "
                                       "any hook of the int: 1.0 / x.shape[0] cannot be seen, so it is baked into "
                                       "the trace (write x.sum() / x.shape[0] or float(x.shape[0]) instead)")
def test_python_float_of_a_length_is_not_baked_in():
    def f(xs):
        _, ys = nf.scan(lambda h, x: (h + x, h), nf.zeros(2, dtype="float64"), xs)
        return ys.sum(0) * (1.0 / xs.shape[0])

    cf = nf.compile(f)
    cf(np.ones((4, 2)))
    np.testing.assert_allclose(cf(np.ones((9, 2))), [4.0, 4.0])


@pytest.mark.parametrize("scale", [lambda t: 1.0 / float(t), lambda t: t / 4 / t ** 2 * 4, lambda t: 1 / t])
def test_sizes_turned_into_floats_stay_in_the_cache_key(scale):
    """float(T), T / n, T ** k and int / T leave the symbolic world visibly: the size joins the cache key."""
    def f(xs):
        _, ys = nf.scan(lambda h, x: (h + x, h), nf.zeros(2, dtype="float64"), xs)
        return ys.sum(0) * scale(xs.shape[0])

    cf = nf.compile(f)
    np.testing.assert_allclose(cf(np.ones((4, 2))), [1.5, 1.5])
    np.testing.assert_allclose(cf(np.ones((9, 2))), [4.0, 4.0])
    assert cf.trace_count == 2


def test_scan_length_from_a_size_and_the_length_used_outside_the_loop():
    f = nf.compile(lambda x, c: nf.scan(lambda c, _: (c * 0.5 + x.sum(), None), c, None, length=x.shape[0])[0])
    g = nf.compile(lambda xs: (nf.scan(lambda c, x: (c + x, c), nf.zeros(2, dtype="float64"), xs)[1].reshape(-1).sum(),
                               xs.reshape(-1)))
    for T in (3, 8, 5):
        c = 0.0
        for _ in range(T):
            c = c * 0.5 + T
        np.testing.assert_allclose(f(np.ones(T), np.zeros(())), c, rtol=1e-15)
        total, flat = g(np.ones((T, 2)))
        assert total == T * (T - 1) and flat.shape == (2 * T,)


def test_state_written_back_keeps_each_steps_values(backend: str, rng: np.random.Generator):
    """Updated parameters and optimizer state are adopted without a copy: the arrays a step returned must not be
    overwritten by later calls (the program's output memory is recycled only once nothing holds it)."""
    w0 = rng.standard_normal((4, 3)).astype(np.float32)
    w = nf.tensor(w0, requires_grad=True)
    opt = nfnn.optim.Adam([w], lr=0.1)

    @nf.compile(backend=backend)
    def step(x):
        opt.zero_grad()
        loss = ((x @ w) ** 2).sum()
        loss.backward()
        opt.step()
        return loss

    xs = [rng.standard_normal((5, 4)).astype(np.float32) for _ in range(4)]
    seen, copies = [], []
    for x in xs:
        step(x)
        seen.append(w.numpy())
        copies.append(w.numpy().copy())
    assert not seen[-1].flags.writeable
    for a, b in zip(seen, copies):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(copies[0], copies[-1])
    # and the same steps eagerly, from the same start
    w2 = nf.tensor(w0, requires_grad=True)
    opt2 = nfnn.optim.Adam([w2], lr=0.1)
    for x in xs:
        opt2.zero_grad()
        ((x @ w2) ** 2).sum().backward()
        opt2.step()
    np.testing.assert_allclose(w2.numpy(), copies[-1], rtol=1e-5, atol=1e-6)



def test_grad_is_written_back_and_accumulates_as_eagerly(backend: str, rng: np.random.Generator):
    """What a compiled call leaves in ``.grad`` is written back after it, as in-place updates are: a function that
    only calls ``backward()`` (its optimizer stepped outside) gives the eager gradients; a second call accumulates
    onto them (read at call time: a trace of its own, since the first assumed no gradient), one after
    ``grad = None`` starts afresh; a training step that clears, backpropagates and steps inside leaves the
    gradients it used."""
    from nnforge.nn import optim

    w = nf.tensor(rng.standard_normal((3, 1)).astype(np.float32), requires_grad=True)
    x = rng.standard_normal((2, 3)).astype(np.float32)
    tw = torch.tensor(w.numpy(), requires_grad=True)
    torch.tanh(torch.from_numpy(x) @ tw).sum().backward()
    want = tw.grad.numpy()

    def backward_only(x):
        loss = nf.tanh(x @ w).sum()
        loss.backward()
        return loss

    f = nf.compile(backward_only, backend=backend)
    f(x)
    assert_close(w.grad.numpy(), want, "float32")
    f(x)
    assert_close(w.grad.numpy(), 2 * want, "float32")
    w.grad = None
    f(x)
    assert_close(w.grad.numpy(), want, "float32")
    assert f.trace_count == 2

    model = nfnn.Linear(3, 1)
    opt = optim.SGD(model.parameters(), lr=0.1)

    def train(x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    step = nf.compile(train, backend=backend)
    for _ in range(2):
        weight = model.weight.numpy().copy()
        step(x)
        assert_close(model.weight.grad.numpy(), np.broadcast_to(x.sum(0), (1, 3)), "float32")
        assert_close(model.weight.numpy(), weight - 0.1 * model.weight.grad.numpy(), "float32")
    assert step.trace_count == 1  # the step clears the gradients first: their presence does not matter


def _scanned(w, xs):
    """A scan whose gradient reaches ``w`` through every step (a compiled function's worth of ops)."""
    h, ys = nf.scan(lambda h, x: (nf.tanh(h * w + x), h * h), nf.zeros_like(w), xs)
    return ys.sum() + (h * w).sum()


def test_a_compiled_function_under_an_eager_gradient_is_differentiated(backend: str, rng: np.random.Generator):
    """Called under an eager ``nf.grad`` or ``nf.vjp``, or on a tensor computed from one created with
    ``requires_grad=True``, a compiled function is inlined: its ops join the graph differentiated, so the
    gradients are those of the plain function (a program's results would be constants: a gradient of zero).
    Called on nnforge tensors with no gradient taken, it still runs its program."""
    w, xs = rng.standard_normal(3).astype(np.float32), rng.standard_normal((6, 3)).astype(np.float32)
    cf = nf.compile(_scanned, backend=backend)
    want = nf.grad(_scanned)(w, xs)
    assert np.abs(want).min() > 0
    assert_close(nf.grad(lambda w: cf(w, xs))(w), want, "float32")
    value, back = nf.vjp(lambda w: cf(w, xs) * 2.0, w)
    assert_close(back(np.float32(0.5))[0], want, "float32")
    assert_close(value, 2 * _scanned(nf.tensor(w), nf.tensor(xs)).numpy(), "float32")
    leaf = nf.tensor(w, requires_grad=True)
    cf(leaf * 1.0, nf.tensor(xs)).backward()
    assert_close(leaf.grad, want, "float32")
    assert cf.trace_count == 0
    plain = cf(nf.tensor(w), nf.tensor(xs))
    assert isinstance(plain, np.ndarray) and cf.trace_count == 1
    assert_close(plain, _scanned(nf.tensor(w), nf.tensor(xs)).numpy(), "float32")


def test_a_host_value_is_read_at_each_call(backend: str, rng: np.random.Generator) -> None:
    """``nf.HostValue(get)``: a Python number a compiled function reads at each call instead of baking it in."""
    box = [0.5]
    scale = nf.HostValue(lambda: box[0], nf.float32)
    f = nf.compile(lambda x: x * scale, backend=backend)
    x = rng.standard_normal(4).astype(np.float32)
    for value in (0.5, 2.0, -3.0):
        box[0] = value
        np.testing.assert_allclose(np.asarray(f(x)), x * np.float32(value), rtol=1e-6)
    assert f.trace_count == 1
    np.testing.assert_array_equal(scale.numpy(), np.float32(-3.0))


def test_one_number_tensors_convert_and_format_eagerly(rng: np.random.Generator) -> None:
    """``float()``, ``int()`` and format specs of a one-element tensor (a loss to log) give its value; a longer
    tensor, or a traced one, says why not."""
    value = rng.standard_normal()
    t = nf.tensor(np.float64(value))
    assert float(t) == value and f"{t:.3f}" == f"{value:.3f}" and int(nf.tensor(np.int64(7))) == 7
    assert f"{t}" == str(t)
    with pytest.raises(TypeError, match=r"float\(\) needs a tensor of one element, got shape \[3\]"):
        float(nf.tensor(np.ones(3)))
    with pytest.raises(nf.TraceError, match=r"int\(\) of a traced tensor is unknown at trace time"):
        nf.compile(lambda x: int(x))(np.ones(()))


class _State(NamedTuple):
    """A scan's carry as a namedtuple whose fields have different shapes."""

    h: Any
    steps: Any


def test_a_namedtuple_argument_carry_and_result_keep_their_fields(backend: str, rng: np.random.Generator) -> None:
    """A namedtuple is a node of the argument tree, not one array: its fields (of any shapes) reach the function
    as the same namedtuple type, a scan carries it and a result comes back as it."""

    def run(xs: Any, s: _State) -> tuple[_State, Any]:
        def cell(c: _State, x_t: Any) -> tuple[_State, Any]:
            return _State((c.h + x_t).tanh(), c.steps + 1.0), c.h * 2

        return nf.scan(cell, s, xs)

    f = nf.compile(run, backend=backend)
    xs = rng.standard_normal((5, 3)).astype(np.float32)
    s = _State(rng.standard_normal(3).astype(np.float32), np.float32(rng.standard_normal()))
    (c, ys), ((want_c, want_ys)) = f(xs, s), run(nf.tensor(xs), _State(nf.tensor(s.h), nf.tensor(s.steps)))
    assert type(c) is _State and c.h.shape == (3,) and c.steps.shape == ()
    assert_close(c.h, want_c.h.numpy(), "float32")
    assert_close(c.steps, want_c.steps.numpy(), "float32")
    assert_close(ys, want_ys.numpy(), "float32")
    f(xs[:2], s)
    assert f.trace_count == 1
    with pytest.raises(nf.TraceError, match=r"carry structure \(\*, \*\), expected _State\(h=\*, steps=\*\)"):
        nf.compile(lambda x, s: nf.scan(lambda c, x_t: (tuple(c), x_t), s, x), backend=backend)(xs, s)


class _Scaled(nfnn.Module):
    """A module whose ``forward`` is compiled as a method: its parameter and a plain tensor it holds."""

    def __init__(self, rng: np.random.Generator):
        super().__init__()
        self.proj = nfnn.Linear(3, 2)
        self.shift = nf.tensor(rng.standard_normal(2).astype(np.float32))

    @nf.compile(backend="cpu")
    def forward(self, x: Any) -> Any:
        return self.proj(x) + self.shift


def test_a_compiled_method_binds_its_instance(rng: np.random.Generator) -> None:
    """``@nf.compile`` on a method: ``obj.f(x)`` runs it for ``obj`` (not an array argument), a temporary
    instance included; two instances each compute with their own tensors, and an instance is not kept alive by
    its class's compiled method."""
    import gc

    x = rng.standard_normal((4, 3)).astype(np.float32)
    a, b = _Scaled(rng), _Scaled(rng)
    for m in (a, b, a):
        want = x @ m.proj.weight.numpy().T + m.proj.bias.numpy() + m.shift.numpy()
        assert_close(m(x), want, "float32")
        assert_close(m.forward(x), want, "float32")
    assert a.forward.trace_count == 1 and b.forward.trace_count == 1
    assert _Scaled(rng).forward(x).shape == (4, 2)  # the instance lives as long as the call
    assert _Scaled.forward is _Scaled.__dict__["forward"]
    gone = id(a)
    del a, m
    gc.collect()
    assert gone not in _Scaled.forward._methods

    class Slotted:
        __slots__ = ()

        @nf.compile
        def f(self, x: Any) -> Any:
            return x

    with pytest.raises(TypeError, match=r"Slotted cannot be referred to weakly.*add '__weakref__'"):
        Slotted().f(x)
