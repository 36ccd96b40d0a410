"""Compiled functions inside torch autograd: grad_fn on results, gradients equal to torch's own, the compiled
VJP built once per signature, and an nnforge module trained by a torch loop step by step like its torch twin."""

from __future__ import annotations

import copy
import functools
import io

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.errors import NNForgeError
from nnforge.ir.ops import Op
from nnforge.torch import TorchModule


def _lstm(x, h0, c0, w_ih, w_hh, b, reverse=False):
    def step(carry, x_t):
        h, c = carry
        i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(c)
        return (h, c), h

    (h, c), ys = nf.scan(step, (h0, c0), x, reverse=reverse)
    return ys, (h, c)


def test_results_carry_a_grad_fn_and_torch_gradients_match(backend: str, rng: np.random.Generator) -> None:
    torch.manual_seed(int(rng.integers(1 << 31)))
    f = nf.compile(_lstm, backend=backend)
    ref = torch.nn.LSTM(4, 6, dtype=torch.float64)
    params = (ref.weight_ih_l0, ref.weight_hh_l0, ref.bias_ih_l0, ref.bias_hh_l0)
    for T in (5, 5, 9):  # a new length without tracing again, the forward and its vjp (x and ys: one length)
        x = torch.randn(T, 3, 4, dtype=torch.float64, requires_grad=True)
        h0 = torch.randn(3, 6, dtype=torch.float64)
        c0 = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
        ys, (h, _) = f(x, h0, c0, params[0], params[1], params[2] + params[3])
        assert ys.grad_fn is not None and h.grad_fn is not None
        (ys.square().sum() + (h * 0.5).sum()).backward()
        ours = [t.grad.clone() for t in (x, c0, *params)]
        for t in (x, c0, *params):
            t.grad = None
        ys2, (h2, _) = ref(x, (h0[None], c0[None]))
        (ys2.square().sum() + (h2[0] * 0.5).sum()).backward()
        for a, b in zip(ours, [t.grad for t in (x, c0, *params)]):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        for t in (x, c0, *params):
            t.grad = None
    assert f.trace_count == 1
    (vjp,) = f._vjps.values()
    assert vjp.trace_count == 1


def test_a_strided_convolution_before_an_lstm_trains_at_odd_and_even_lengths(backend: str,
                                                                           rng: np.random.Generator) -> None:
    """A basecaller's front end: the LSTM walks the stride-2 convolution's ``(T - 1) // 2 + 1`` steps, so its
    backward walks that sequence beside the cotangent's. Every length trains (even ones once failed in a pass,
    the two lengths taken as one) with the one trace, gradients as torch's."""
    from nnforge.torch import from_torch

    class Front(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 4, 5, stride=2, padding=2, dtype=torch.float64)
            self.rnn = torch.nn.LSTM(4, 5, dtype=torch.float64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # [N, 1, T] -> [(T - 1) // 2 + 1, N, 5]
            return self.rnn(self.conv(x).permute(2, 0, 1))[0].log_softmax(-1)

    torch.manual_seed(int(rng.integers(1 << 31)))
    twin = Front()
    ours = TorchModule(from_torch(twin), twin=twin, backend=backend)
    for T in (9, 8, 10, 8):
        x = torch.randn(2, 1, T, dtype=torch.float64)
        weight = torch.randn((T - 1) // 2 + 1, 2, 5, dtype=torch.float64)
        grads = []
        for model in (ours, twin):
            (model(x) * weight).sum().backward()
            grads.append([p.grad.clone() for p in twin.parameters()])
            twin.zero_grad()
        for a, b in zip(*grads):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert ours._compiled.trace_count == 1


def test_no_grad_and_integer_outputs(backend: str) -> None:
    f = nf.compile(lambda x: ((x * 2).sum(), (x > 0).sum()), backend=backend)
    x = torch.tensor([1.0, -2.0, 3.0], requires_grad=True)
    with torch.no_grad():
        s, n = f(x)
    assert s.grad_fn is None
    s, n = f(x)
    assert not n.requires_grad and n.item() == 2
    s.backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_torch_training_loop_with_a_compiled_nnforge_layer_matches_the_torch_loop(
        backend: str, dtype: torch.dtype, rng: np.random.Generator) -> None:
    torch.manual_seed(int(rng.integers(1 << 31)))
    I, H, T, N = 4, 8, 6, 3
    twin = torch.nn.LSTM(I, H, num_layers=2, dtype=dtype)
    head = torch.nn.Linear(H, 2, dtype=dtype)
    ours = torch.nn.Sequential(TorchModule(nn.LSTM(I, H, num_layers=2).to(nf.float64 if dtype == torch.float64
                                                                           else nf.float32), twin, backend=backend),
                               _First(), head)
    theirs = torch.nn.Sequential(copy.deepcopy(twin), _First(), copy.deepcopy(head))
    opts = [torch.optim.Adam(m.parameters(), lr=1e-2) for m in (ours, theirs)]
    tol = 1e-12 if dtype == torch.float64 else 2e-5
    for _ in range(4):
        x, y = torch.randn(T, N, I, dtype=dtype), torch.randn(T, N, 2, dtype=dtype)
        losses = []
        for model, opt in zip((ours, theirs), opts):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        assert losses[0] == pytest.approx(losses[1], rel=tol)
        for a, b in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("with_twin", [True, False])
@pytest.mark.parametrize("how", ["deepcopy", "torch.save"])
def test_a_model_with_a_compiled_layer_copies_and_trains_on_its_own(
        backend: str, rng: np.random.Generator, with_twin: bool, how: str) -> None:
    """``copy.deepcopy`` (an EMA or best-so-far copy) and ``torch.save`` of a whole model give a model whose
    compiled layer reads its own parameters: the same outputs and gradients as the original, and an optimizer
    step on the copy leaves the original as it was."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    twin = torch.nn.LSTM(4, 6, num_layers=2, dtype=torch.float64) if with_twin else None
    layer = TorchModule(nn.LSTM(4, 6, num_layers=2).to(nf.float64), twin, backend=backend)
    model = torch.nn.Sequential(layer, _First(), torch.nn.Linear(6, 2, dtype=torch.float64))
    x = torch.randn(5, 3, 4, dtype=torch.float64)
    model(x).square().sum().backward()  # compiled and run before the copy
    if how == "deepcopy":
        other = copy.deepcopy(model)
    else:
        buf = io.BytesIO()
        torch.save(model, buf)
        buf.seek(0)
        other = torch.load(buf, weights_only=False)
    before = [p.detach().clone() for p in model.parameters()]
    for m in (model, other):
        m.zero_grad()
        m(x).square().sum().backward()
    for a, b in zip(model.parameters(), other.parameters()):
        assert a is not b
        torch.testing.assert_close(b, a, rtol=0, atol=0)
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)
    torch.optim.SGD(other.parameters(), lr=0.1).step()
    for a, b, was in zip(model.parameters(), other.parameters(), before):
        torch.testing.assert_close(a, was, rtol=0, atol=0)
        assert not torch.equal(b, was)
    torch.testing.assert_close(other(x), other[2](_torch_stack(other[0], x)), rtol=1e-12, atol=1e-12)


def _torch_stack(layer: TorchModule, x: torch.Tensor) -> torch.Tensor:
    """What ``layer`` (an nnforge LSTM of two layers) computes, by a torch LSTM of its current parameters."""
    ref = torch.nn.LSTM(4, 6, num_layers=2, dtype=torch.float64)
    with torch.no_grad():
        for (_, p), q in zip(ref.named_parameters(), layer._params()):
            p.copy_(q)
    return ref(x)[0]


def test_torch_compile_runs_compiled_functions_between_its_graphs(backend: str, rng: np.random.Generator) -> None:
    """A model under ``torch.compile`` (dynamo, which traces Python) that calls a compiled function directly and
    holds a ``TorchModule``: dynamo does not trace into them (ctypes and numpy code) but calls them between the
    graphs it compiles; outputs and gradients are the eager model's."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    f = nf.compile(lambda x, w: (x @ w).tanh(), backend=backend)
    rnn = TorchModule(nn.LSTM(3, 5).to(nf.float64), torch.nn.LSTM(3, 5, dtype=torch.float64), backend=backend)
    lin = torch.nn.Linear(4, 3, dtype=torch.float64)
    w = torch.randn(3, 3, dtype=torch.float64, requires_grad=True)

    def model(x):
        return rnn(f(lin(x), w))[0].square().sum()

    x = torch.randn(6, 2, 4, dtype=torch.float64)
    leaves = [w, *lin.parameters(), *rnn.parameters()]
    want = torch.autograd.grad(model(x), leaves)
    compiled = torch.compile(model, backend="eager")  # dynamo's tracing is what is tested: no code generation
    got = torch.autograd.grad(compiled(x), leaves)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_the_torch_models_mode_reaches_the_nnforge_module(backend: str, rng: np.random.Generator) -> None:
    """``model.eval()`` / ``model.train()`` of the torch model reach a TorchModule's nnforge module: in eval its
    dropout is off (the output is the linear layer's, call after call), in train it drops; each mode is traced
    once, and switching back reuses its program."""
    nf.manual_seed(int(rng.integers(1 << 31)))
    layer = TorchModule(nn.Sequential(nn.Linear(4, 6), nn.Dropout(0.5)).to(nf.float64), backend=backend)
    model = torch.nn.Sequential(layer)
    x = torch.tensor(rng.standard_normal((5, 4)))
    w, b = layer._params()
    model.eval()
    assert not layer.module.training
    plain = (x @ w.T + b).detach()
    for _ in range(2):
        torch.testing.assert_close(model(x).detach(), plain, rtol=1e-12, atol=1e-12)
    model.train()
    assert layer.module.training
    dropped = model(x).detach()
    assert (dropped == 0).any() and not torch.equal(dropped, model(x).detach())
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], 2 * plain[kept], rtol=1e-12, atol=1e-12)  # scaled by 1 / (1 - p)
    model.eval()
    torch.testing.assert_close(model(x).detach(), plain, rtol=1e-12, atol=1e-12)
    assert layer._compiled.trace_count == 2  # one trace per mode


class _First(torch.nn.Module):
    def forward(self, out):
        return out[0]


def test_a_twin_that_does_not_fit_is_refused() -> None:
    with pytest.raises(NNForgeError, match=r"parameter 'weight_ih_l0' is \[24, 4\] in the twin and \[32, 4\]"):
        TorchModule(nn.LSTM(4, 8), torch.nn.LSTM(4, 6))
    with pytest.raises(NNForgeError, match="no parameter 'weight_ih_l0'"):
        TorchModule(nn.LSTM(4, 8), torch.nn.Linear(4, 8))


def _split(f: nf.CompiledFunction):
    """The joint graph's cut (``autodiff.partition``) torch autograd ran ``f`` with."""
    (joint,) = f._vjps.values()
    (entry,) = joint._entries
    return entry.split


def _reads(graph, names: set[str]) -> set[int]:
    """ids of the nodes of ``graph`` computed from its inputs named ``names``."""
    out = {id(n) for n in graph.inputs if n.attrs["name"] in names}
    for n in graph.order:
        if any(id(s) in out for s in n.srcs):
            out.add(id(n))
    return out


def test_the_backward_runs_from_saved_values_without_the_forward_again(backend: str, rng: np.random.Generator) -> None:
    f = nf.compile(_lstm, backend=backend)
    x, h0, c0 = (torch.tensor(rng.standard_normal(s), requires_grad=True) for s in ((5, 3, 4), (3, 6), (3, 6)))
    w_ih, w_hh, b = (torch.tensor(rng.standard_normal(s) * 0.3, requires_grad=True) for s in ((24, 4), (24, 6), (24,)))
    ys, (h, c) = f(x, h0, c0, w_ih, w_hh, b)
    (ys.square().sum() + h.sum() - c.sum()).backward()
    split = _split(f)
    scans = [n for n in split.forward.order if n.op == Op.SCAN]
    assert len(scans) == 1
    assert len(scans[0].types) == 3 + 3  # ys, h, c; the stacked h (unread) and c each step starts from, the gates
    ct = _reads(split.backward, {"arg6", "arg7", "arg8"})  # the cotangents of ys, h and c
    again = [n for n in split.backward.order if n.op in (Op.SCAN, Op.MATMUL) and id(n) not in ct]
    assert not again, f"the backward half recomputes {again}"


def _torch_cell_loop(x, h0, c0, w_ih, w_hh, b, reverse):
    h, c, ys = h0, c0, [None] * x.shape[0]
    for t in reversed(range(x.shape[0])) if reverse else range(x.shape[0]):
        i, f, g, o = (x[t] @ w_ih.T + h @ w_hh.T + b).chunk(4, dim=-1)
        c = f.sigmoid() * c + i.sigmoid() * g.tanh()
        h = o.sigmoid() * c.tanh()
        ys[t] = h
    return (torch.stack(ys) if ys else x.new_zeros((0, *h0.shape))), (h, c)


@pytest.mark.parametrize("reverse", [False, True])
def test_an_lstm_saves_no_second_stack_of_h(backend: str, rng: np.random.Generator, reverse: bool) -> None:
    """The stack of the ``h`` each step starts from, which the backward reads only for ``dW_hh``'s product, is
    the output ``ys`` one step shifted: not saved (the stack of ``c`` and the gate sums are). Gradients against a
    torch loop of the same cell, both directions, at T = 5, 1 and 0 (the initial ``h`` fills ``min(T, 1)``
    steps)."""
    f = nf.compile(functools.partial(_lstm, reverse=reverse), backend=backend)
    w = [torch.tensor(rng.standard_normal(s) * 0.3, requires_grad=True) for s in ((24, 4), (24, 6), (24,))]
    for T in (5, 1, 0):
        x, h0, c0 = (torch.tensor(rng.standard_normal(s), requires_grad=True) for s in ((T, 3, 4), (3, 6), (3, 6)))
        leaves = (x, h0, c0, *w)
        ys, (h, c) = f(*leaves)
        (ys.square().sum() + h.sum() - c.sum()).backward()
        ours = [t.grad.clone() for t in leaves]
        for t in leaves:
            t.grad = None
        ys, (h, c) = _torch_cell_loop(*leaves, reverse)
        (ys.square().sum() + h.sum() - c.sum()).backward()
        for i, (a, t) in enumerate(zip(ours, leaves)):
            want = torch.zeros_like(t) if t.grad is None else t.grad  # no steps: nothing reads the weights
            torch.testing.assert_close(a, want, rtol=1e-12, atol=1e-12, msg=f"T={T}, leaf {i}")
            t.grad = None
    split = _split(f)  # one trace (at T = 5) for every length
    assert split.saved_at[0] == 0  # ys, a result, is read back
    extra = [split.forward.outputs[k] for k in split.saved_at if k >= 3]
    assert [tuple(map(int, n.shape)) for n in extra] == [(5, 3, 6), (5, 3, 24)], extra  # c's stack, the gates


def test_a_saved_result_changed_in_place_is_refused(backend: str, rng: np.random.Generator) -> None:
    """``ys`` is both a result and what the backward reads: changed in place before ``backward()``, torch's
    version counter refuses the backward (as for its own saved tensors) rather than giving wrong gradients."""
    f = nf.compile(_lstm, backend=backend)
    x, h0, c0 = (torch.tensor(rng.standard_normal(s)) for s in ((5, 3, 4), (3, 6), (3, 6)))
    w = [torch.tensor(rng.standard_normal(s) * 0.3, requires_grad=True) for s in ((24, 4), (24, 6), (24,))]
    ys, _ = f(x, h0, c0, *w)
    ys.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        ys.square().sum().backward()


def test_views_and_cheap_element_wise_values_are_not_saved(backend: str, rng: np.random.Generator) -> None:
    def attention(x, wq, wk, scale):
        p = ((x @ wq) @ (x @ wk).T / 2.0).softmax(-1)
        y = p @ x
        return (y - y.mean(-1, keepdims=True)) * scale

    f = nf.compile(attention, backend=backend)
    args = [torch.tensor(rng.standard_normal(s), requires_grad=True) for s in ((7, 4), (4, 4), (4, 4), (4,))]
    cot = torch.tensor(rng.standard_normal((7, 4)))
    f(*args).backward(cot)
    ours = [a.grad for a in args]
    theirs = torch.autograd.grad(attention(*args), args, cot)  # the same code on torch tensors
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    split = _split(f)
    saved = [split.forward.outputs[k] for k in split.saved_at]
    assert not [n for n in saved if n.op in (Op.RESHAPE, Op.PERMUTE, Op.EXPAND, Op.SLICE)], saved
    assert len([n for n in saved if tuple(map(int, n.shape)) == (7, 7)]) == 1, saved  # exp(s - max), not p too


def test_the_backward_reads_the_random_numbers_the_forward_drew(backend: str, rng: np.random.Generator) -> None:
    nf.manual_seed(int(rng.integers(1 << 31)))
    f = nf.compile(lambda x, w: nn.functional.dropout(x, 0.5) * w, backend=backend)
    x = torch.tensor(rng.uniform(1, 2, (64,)), requires_grad=True)
    w = torch.tensor(rng.uniform(1, 2, (64,)), requires_grad=True)
    y = f(x, w)
    y.sum().backward()
    kept = y != 0
    assert 0 < int(kept.sum()) < 64
    torch.testing.assert_close(x.grad, kept * 2.0 * w.detach(), rtol=1e-12, atol=0)
    torch.testing.assert_close(w.grad, kept * 2.0 * x.detach(), rtol=1e-12, atol=0)


def test_buffers_a_module_updates_in_place_are_updated_once_a_call(backend: str, rng: np.random.Generator) -> None:
    torch.manual_seed(int(rng.integers(1 << 31)))
    twin = torch.nn.BatchNorm1d(3, dtype=torch.float64)
    ours = TorchModule(nn.BatchNorm1d(3).to(nf.float64), twin=twin, backend=backend)
    theirs = copy.deepcopy(twin)
    for _ in range(2):
        x = torch.tensor(rng.standard_normal((5, 3)), requires_grad=True)
        ours(x).pow(3).sum().backward()
        got, x.grad = x.grad, None
        theirs(x).pow(3).sum().backward()
        torch.testing.assert_close(got, x.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.from_numpy(ours.module.running_mean.numpy()), theirs.running_mean)
    torch.testing.assert_close(torch.from_numpy(ours.module.running_var.numpy()), theirs.running_var)
    assert int(ours.module.num_batches_tracked.numpy()) == 2


def test_a_twins_buffers_follow_the_module_and_a_loaded_checkpoint_reaches_it(backend: str,
                                                                              rng: np.random.Generator) -> None:
    """The twin's running statistics are what torch saves (``state_dict``): updated after each call; a checkpoint
    loaded into the twin is what the module then normalizes with."""
    twin = torch.nn.BatchNorm1d(3, dtype=torch.float64)
    ours = TorchModule(nn.BatchNorm1d(3).to(nf.float64), twin=twin, backend=backend)
    theirs = copy.deepcopy(twin)
    for _ in range(2):
        x = torch.tensor(rng.standard_normal((5, 3)) * 3 + 1)
        ours(x), theirs(x)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(ours.state_dict()[f"twin.{name}"], theirs.state_dict()[name], rtol=1e-12, atol=0)
    checkpoint = {k: v + 5 if v.is_floating_point() else v for k, v in theirs.state_dict().items()}
    ours.load_state_dict({f"twin.{k}": v for k, v in checkpoint.items()})
    theirs.load_state_dict(checkpoint)
    ours.eval(), theirs.eval()
    x = torch.tensor(rng.standard_normal((4, 3)))
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-12, atol=1e-12)


def test_a_function_that_sets_grad_runs_its_pullback_whole_without_writing_twice(
        backend: str, rng: np.random.Generator) -> None:
    """A compiled function that takes a gradient itself (``.grad`` of a captured parameter) and counts its calls
    in place runs its pullback whole in ``backward()``: the input's gradient is right, and the count and the
    ``.grad`` are what the one call left, not updated a second time."""
    w = nf.tensor(rng.standard_normal(3), requires_grad=True)
    count = nf.tensor(np.zeros((), np.int64))

    def f(x):
        w.grad = None
        loss = ((x * w) ** 2).sum()
        loss.backward()
        count.assign(count + 1)
        return loss * 1.0

    g = nf.compile(f, backend=backend)
    x = torch.tensor(rng.standard_normal(3), requires_grad=True)
    g(x).backward()
    w_np = w.numpy()
    torch.testing.assert_close(x.grad, torch.from_numpy(2 * x.detach().numpy() * w_np ** 2), rtol=1e-12, atol=1e-12)
    assert int(count.numpy()) == 1
    np.testing.assert_allclose(w.grad.numpy(), 2 * x.detach().numpy() ** 2 * w_np, rtol=1e-12)


def test_two_calls_before_one_backward_keep_their_own_saved_values(backend: str, rng: np.random.Generator) -> None:
    f = nf.compile(_lstm, backend=backend)
    w = [torch.tensor(rng.standard_normal(s) * 0.3, requires_grad=True) for s in ((24, 4), (24, 6), (24,))]
    h0, c0 = (torch.tensor(rng.standard_normal((3, 6))) for _ in range(2))
    xs = [torch.tensor(rng.standard_normal((5, 3, 4))) for _ in range(2)]
    first, _ = f(xs[0], h0, c0, *w)
    second, _ = f(xs[1], h0, c0, *w)  # the program's outputs and saved values of the first call are still held
    (first.square().sum() + second.sum()).backward()
    ours = [t.grad for t in w]
    ref = torch.nn.LSTM(4, 6, dtype=torch.float64)
    with torch.no_grad():
        ref.weight_ih_l0.copy_(w[0])
        ref.weight_hh_l0.copy_(w[1])
        ref.bias_ih_l0.copy_(w[2])
        ref.bias_hh_l0.zero_()
    ys = [ref(x, (h0[None], c0[None]))[0] for x in xs]
    (ys[0].square().sum() + ys[1].sum()).backward()
    for a, b in zip(ours, (ref.weight_ih_l0.grad, ref.weight_hh_l0.grad, ref.bias_ih_l0.grad)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cotangent", ["constant", "requiring grad"])
def test_differentiating_the_gradient_again_raises(backend: str, cotangent: str) -> None:
    """A gradient taken with ``create_graph=True`` refuses a second backward, whether or not its cotangent requires
    grad (``loss.sum()``'s does not): a constant gradient would make ``x``'s second derivative silently wrong."""
    f = nf.compile(lambda x: x * x, backend=backend)
    x = torch.tensor([1.0, 2.0], requires_grad=True)
    cot = torch.tensor([3.0, -1.0], requires_grad=cotangent != "constant")
    (g,) = torch.autograd.grad(f(x), x, cot, create_graph=True)
    torch.testing.assert_close(g.detach(), torch.tensor([6.0, -4.0]))
    with pytest.raises(RuntimeError, match=r"once_differentiable.*nf\.grad"):  # never a constant second derivative
        (g * x).sum().backward()
    (g,) = torch.autograd.grad(f(x), x, cot)  # without create_graph: a plain tensor, as torch's
    assert not g.requires_grad


def test_a_receiver_is_called_once_a_call_by_the_forward(backend: str, rng: np.random.Generator) -> None:
    seen: list[float] = []

    def f(x):
        y = x * x
        nf.Receiver(lambda v: seen.append(float(v)), [y.sum()])
        return y

    x = torch.tensor(rng.standard_normal(5), requires_grad=True)
    y = nf.compile(f, backend=backend)(x)
    assert seen == [pytest.approx(float((x * x).sum()))]
    y.sum().backward()
    assert len(seen) == 1  # the backward calls no Python
    torch.testing.assert_close(x.grad, 2 * x.detach(), rtol=1e-12, atol=1e-12)
