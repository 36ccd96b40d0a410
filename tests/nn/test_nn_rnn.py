"""LSTM / GRU layers and cells against torch, the alternating-direction stack, and float64 gradient checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_testutil import compare_with_torch, randn

import nnforge as nf
import nnforge.nn as nn
from nnforge.ir.node import toposort
from nnforge.ir.ops import Op

T, N, I, H = 5, 3, 4, 6


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("num_layers,bidirectional,batch_first,bias", [
    (1, False, False, True),
    (2, False, True, True),
    (1, True, False, True),
    (2, True, True, False),
])
def test_rnn_matches_torch(mode: str, num_layers: int, bidirectional: bool, batch_first: bool, bias: bool) -> None:
    rng = np.random.default_rng(1)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first, bias=bias)
    t_mod = getattr(torch.nn, mode)(I, H, **kw)
    n_mod = getattr(nn, mode)(I, H, **kw)
    x = randn(rng, *((N, T, I) if batch_first else (T, N, I)))
    compare_with_torch(n_mod, t_mod, [x])


@pytest.mark.parametrize("mode,proj", [("LSTM", 0), ("GRU", 0), ("RNN", 0), ("LSTM", 3)])
@pytest.mark.parametrize("hidden", [H, 40])
def test_rnn_layers_compile_on_every_backend(backend: str, mode: str, proj: int, hidden: int) -> None:
    """The layer compiled (a GRU's gate row is read through slices of slices: every width cut where either is;
    an LSTM's h projected inside the step), outputs and final states against torch, and the input gradient, in
    float64."""
    rng = np.random.default_rng(5 + hidden + proj)
    kw = dict(num_layers=2, bidirectional=True, batch_first=True, **(dict(proj_size=proj) if proj else {}))
    t_mod = getattr(torch.nn, mode)(I, hidden, **kw).double()
    n_mod = getattr(nn, mode)(I, hidden, **kw).double()
    n_mod.load_state_dict(t_mod.state_dict())
    x = rng.standard_normal((N, T, I))
    ct = rng.standard_normal((N, T, 2 * (proj or hidden)))
    run = nf.compile(lambda v, c: (n_mod(v), nf.grad(lambda v: (n_mod(v)[0] * c).sum())(v)), backend=backend)
    (ys, state), dx = run(x, ct)
    tx = torch.tensor(x, requires_grad=True)
    t_ys, t_state = t_mod(tx)
    (t_ys * torch.tensor(ct)).sum().backward()
    for got, want in zip(nf.pytree.flatten((ys, state))[0], nf.pytree.flatten((t_ys, t_state))[0]):
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(dx), tx.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_rnn_with_initial_state(mode: str) -> None:
    rng = np.random.default_rng(2)
    t_mod, n_mod = getattr(torch.nn, mode)(I, H, num_layers=2, bidirectional=True), getattr(nn, mode)(
        I, H, num_layers=2, bidirectional=True)
    x, h0, c0 = randn(rng, T, N, I), randn(rng, 4, N, H), randn(rng, 4, N, H)
    if mode == "LSTM":
        compare_with_torch(n_mod, t_mod, [x, h0, c0], call=lambda m, x, h, c: m(x, (h, c)))
    else:
        compare_with_torch(n_mod, t_mod, [x, h0], call=lambda m, x, h: m(x, h))


@pytest.mark.parametrize("num_layers,bidirectional,batch_first", [(1, False, False), (2, True, True)])
def test_lstm_projection_matches_torch(num_layers: int, bidirectional: bool, batch_first: bool) -> None:
    """torch's LSTMP: weight_hr_l{k} [proj, H] after each direction's biases; h0 and the outputs proj wide."""
    rng = np.random.default_rng(7)
    kw = dict(num_layers=num_layers, bidirectional=bidirectional, batch_first=batch_first, proj_size=2)
    t_mod, n_mod = torch.nn.LSTM(I, H, **kw), nn.LSTM(I, H, **kw)
    assert list(n_mod.state_dict()) == list(t_mod.state_dict())
    states = num_layers * (2 if bidirectional else 1)
    x = randn(rng, *((N, T, I) if batch_first else (T, N, I)))
    compare_with_torch(n_mod, t_mod, [x, randn(rng, states, N, 2), randn(rng, states, N, H)],
                       call=lambda m, x, h, c: m(x, (h, c)))
    with pytest.raises(nf.ShapeError, match=r"LSTM: h0 has shape \[\d, 3, 6\], expected \[\d, 3, 2\]"):
        n_mod(nf.tensor(x), (nf.zeros(states, N, H), nf.zeros(states, N, H)))
    with pytest.raises(ValueError, match=r"GRU: proj_size is an LSTM's"):
        nn.GRU(I, H, proj_size=2)
    with pytest.raises(ValueError, match=r"proj_size must be >= 0 and smaller than hidden_size 6, got 6"):
        nn.LSTM(I, H, proj_size=H)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_rnn_unbatched_input(mode: str) -> None:
    rng = np.random.default_rng(3)
    t_mod, n_mod = getattr(torch.nn, mode)(I, H), getattr(nn, mode)(I, H)
    compare_with_torch(n_mod, t_mod, [randn(rng, T, I)])


def test_alternating_five_layer_lstm_matches_flipped_torch_layers() -> None:
    """A basecaller-style stack: per-layer direction, checked against torch single layers on flipped inputs."""
    rng = np.random.default_rng(4)
    rev = [True, False, True, False, True]
    n_mod = nn.LSTM(I, H, num_layers=5, reverse=rev)
    t_layers = [torch.nn.LSTM(I if k == 0 else H, H) for k in range(5)]
    sd = {}
    for k, layer in enumerate(t_layers):
        for name, v in layer.state_dict().items():
            sd[name.replace("_l0", f"_l{k}")] = v
    n_mod.load_state_dict(sd)
    x = randn(rng, T, N, I)
    xt = torch.tensor(x, requires_grad=True)
    h, hs, cs = xt, [], []
    for layer, r in zip(t_layers, rev):
        y, (hn, cn) = layer(h.flip(0) if r else h)
        h = y.flip(0) if r else y
        hs.append(hn)
        cs.append(cn)
    t_h, t_c = torch.cat(hs), torch.cat(cs)
    xn = nf.tensor(x, requires_grad=True)
    out, (n_h, n_c) = n_mod(xn)
    w = randn(rng, T, N, H)
    ((out * nf.tensor(w)).sum() + n_h.sum() + (n_c * 0.5).sum()).backward()
    ((h * torch.tensor(w)).sum() + t_h.sum() + (t_c * 0.5).sum()).backward()
    np.testing.assert_allclose(out.numpy(), h.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(n_h.numpy(), t_h.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(n_c.numpy(), t_c.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(xn.grad.numpy(), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    for k, layer in enumerate(t_layers):
        for name, p in layer.named_parameters():
            mine = getattr(n_mod, name.replace("_l0", f"_l{k}"))
            np.testing.assert_allclose(mine.grad.numpy(), p.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def test_reverse_flag_validation() -> None:
    with pytest.raises(ValueError, match="entries"):
        nn.LSTM(I, H, num_layers=3, reverse=[True, False])
    with pytest.raises(ValueError, match="bidirectional"):
        nn.GRU(I, H, bidirectional=True, reverse=True)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_one_scan_per_layer_direction_and_premul_outside(mode: str) -> None:
    """The time loop stays a loop: one SCAN per layer-direction, whose body has only the recurrent matmul."""
    model = getattr(nn, mode)(I, H, num_layers=2, bidirectional=True)
    out = model(nf.tensor(randn(np.random.default_rng(5), T, N, I)))[0]
    order = toposort([out.node])
    scans = [n for n in order if n.op == Op.SCAN]
    assert len(scans) == 4
    for s in scans:
        body_matmuls = [n for n in s.attrs["body"].order if n.op == Op.MATMUL]
        assert len(body_matmuls) == 1  # h @ W_hh.T only; x @ W_ih.T was hoisted before the scan


@pytest.mark.parametrize("mode", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells_match_torch(mode: str) -> None:
    rng = np.random.default_rng(6)
    t_mod, n_mod = getattr(torch.nn, mode)(I, H), getattr(nn, mode)(I, H)
    x, h = randn(rng, N, I), randn(rng, N, H)
    if mode == "LSTMCell":
        c = randn(rng, N, H)
        compare_with_torch(n_mod, t_mod, [x, h, c], call=lambda m, x, h, c: m(x, (h, c)))
    else:
        compare_with_torch(n_mod, t_mod, [x, h], call=lambda m, x, h: m(x, h))


@pytest.mark.parametrize("bidirectional", [False, True])
def test_elman_rnn_with_relu_matches_torch(backend: str, rng: np.random.Generator, bidirectional: bool) -> None:
    """nn.RNN's relu form, its nonlinearity given fourth as torch takes it, compiled: outputs, h_n and the
    gradients of the input and the recurrent weights in float64; the cell alike; an unknown nonlinearity
    refused."""
    t_mod = torch.nn.RNN(I, H, 2, "relu", bidirectional=bidirectional).double()
    n_mod = nn.RNN(I, H, 2, "relu", bidirectional=bidirectional).double()
    n_mod.load_state_dict(t_mod.state_dict())
    x, ct = rng.standard_normal((T, N, I)), rng.standard_normal((T, N, 2 * H if bidirectional else H))

    def run(x, ct):
        n_mod.zero_grad()
        ys, h = n_mod(x)
        (ys * ct).sum().backward()
        return ys, h, n_mod.weight_hh_l1.grad, nf.grad(lambda v: (n_mod(v)[0] * ct).sum())(x)

    ys, h, dw, dx = nf.compile(run, backend=backend)(x, ct)
    tx = torch.tensor(x, requires_grad=True)
    t_ys, t_h = t_mod(tx)
    (t_ys * torch.tensor(ct)).sum().backward()
    for got, want in ((ys, t_ys), (h, t_h), (dw, t_mod.weight_hh_l1.grad), (dx, tx.grad)):
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert (t_ys.detach().numpy() == 0).any()  # the relu's zeros reached
    t_cell, n_cell = torch.nn.RNNCell(I, H, nonlinearity="relu"), nn.RNNCell(I, H, nonlinearity="relu")
    compare_with_torch(n_cell, t_cell, [randn(rng, N, I), randn(rng, N, H)], call=lambda m, x, h: m(x, h))
    with pytest.raises(ValueError, match="RNN: nonlinearity must be 'tanh' or 'relu', got 'gelu'"):
        nn.RNN(I, H, nonlinearity="gelu")


def test_cell_in_user_scan_matches_layer() -> None:
    rng = np.random.default_rng(7)
    layer, cell = nn.LSTM(I, H), nn.LSTMCell(I, H)
    cell.load_state_dict({k[:-3]: v for k, v in layer.state_dict().items()})
    x = nf.tensor(randn(rng, T, N, I))
    out, _ = layer(x)

    def body(carry, x_t):
        h, c = cell(x_t, carry)
        return (h, c), h

    _, ys = nf.scan(body, (nf.zeros(N, H), nf.zeros(N, H)), x)
    np.testing.assert_allclose(ys.numpy(), out.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["LSTM", "GRU", "RNN"])
def test_float64_finite_differences(mode: str) -> None:
    """Autodiff through the scans against central differences, in float64 so the check itself is exact enough."""
    rng = np.random.default_rng(8)
    model = getattr(nn, mode)(2, 3, num_layers=2, reverse=[True, False]).double()
    x = rng.standard_normal((4, 2, 2))
    w = rng.standard_normal((4, 2, 3))

    def loss_of(xv: np.ndarray) -> nf.Tensor:
        out, _ = model(nf.tensor(xv, dtype=nf.float64))
        return (out * nf.tensor(w, dtype=nf.float64)).sum()

    xt = nf.tensor(x, dtype=nf.float64, requires_grad=True)
    out, _ = model(xt)
    (out * nf.tensor(w, dtype=nf.float64)).sum().backward()
    eps = 1e-6
    num = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        d = np.zeros_like(x)
        d[idx] = eps
        num[idx] = (loss_of(x + d).item() - loss_of(x - d).item()) / (2 * eps)
    np.testing.assert_allclose(xt.grad.numpy(), num, rtol=1e-6, atol=1e-8)
    # and one weight matrix, entry by entry
    p = model.weight_hh_l0
    p0 = p.numpy().copy()
    analytic = p.grad.numpy()
    for idx in [(0, 0), (2, 1), (p0.shape[0] - 1, 2)]:
        vals = []
        for sgn in (1, -1):
            q = p0.copy()
            q[idx] += sgn * eps
            model.load_state_dict({**model.state_dict(), "weight_hh_l0": q})
            vals.append(loss_of(x).item())
        np.testing.assert_allclose(analytic[idx], (vals[0] - vals[1]) / (2 * eps), rtol=1e-6, atol=1e-8)


def test_shape_errors_are_clear() -> None:
    model = nn.LSTM(I, H, num_layers=2)
    with pytest.raises(nf.ShapeError, match="features"):
        model(nf.zeros(T, N, I + 1))
    with pytest.raises(nf.ShapeError, match="h0"):
        model(nf.zeros(T, N, I), (nf.zeros(1, N, H), nf.zeros(2, N, H)))


def test_a_state_that_is_not_a_pair_or_a_torch_packed_sequence_is_named(rng: np.random.Generator) -> None:
    """One tensor for an LSTM's (h0, c0) was split along its first axis and refused by a shape the user never
    passed; torch's PackedSequence, another layout, failed inside numpy."""
    x = randn(rng, T, N, I)
    with pytest.raises(TypeError, match=rf"LSTM: the state must be a pair \(h0, c0\), got a tensor of shape "
                                        rf"\[2, {N}, {H}\] \(at .*test_nn_rnn.py"):
        nn.LSTM(I, H, num_layers=2)(x, randn(rng, 2, N, H))
    with pytest.raises(TypeError, match=r"LSTMCell: the state must be a pair \(h, c\), got a list of 1"):
        nn.LSTMCell(I, H)(x[0], [randn(rng, N, H)])
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), [T] * N)
    with pytest.raises(TypeError, match=r"GRU: a torch PackedSequence.*pack_padded_sequence"):
        nn.GRU(I, H)(packed)


def test_compiled_rnn_takes_new_lengths_without_retracing() -> None:
    rng = np.random.default_rng(9)
    model = nn.GRU(I, H, num_layers=2, batch_first=True, reverse=[False, True])
    f = nf.compile(lambda x: model(x)[0])
    for t in (4, 7):
        x = randn(rng, N, t, I)
        np.testing.assert_allclose(f(x), model(nf.tensor(x))[0].numpy(), rtol=1e-5, atol=1e-6)
    assert f.trace_count == 1


def test_inter_layer_dropout_only_in_training() -> None:
    rng = np.random.default_rng(10)
    t_mod, n_mod = torch.nn.LSTM(I, H, num_layers=2, dropout=0.5), nn.LSTM(I, H, num_layers=2, dropout=0.5)
    t_mod.eval()
    n_mod.eval()
    compare_with_torch(n_mod, t_mod, [randn(rng, T, N, I)])
    n_mod.train()
    x = nf.tensor(randn(rng, T, N, I))
    assert not np.allclose(n_mod(x)[0].numpy(), n_mod(x)[0].numpy())
