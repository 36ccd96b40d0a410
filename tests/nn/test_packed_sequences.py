"""Batches of sequences of different lengths (``nn.utils.rnn``) through LSTM and GRU layers, against torch's packed
sequences: padded outputs, each sequence's final states, and the gradients of the input and the weights, on
every backend and in float64; one compiled program for any lengths; the checks torch makes of lengths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence as torch_pack
from torch.nn.utils.rnn import pad_packed_sequence as torch_pad

import nnforge as nf
import nnforge.nn as nn
from nnforge.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

T, N, I, H = 6, 4, 3, 5


def _torch_run(t_mod: torch.nn.Module, x: np.ndarray, lengths: list[int], weights: np.ndarray):
    """torch's outputs (padded to T), final states and gradients (input, then each parameter by name) of
    sum(outputs * weights)."""
    tx = torch.tensor(x, requires_grad=True)
    out, state = t_mod(torch_pack(tx, torch.tensor(lengths), batch_first=True, enforce_sorted=False))
    ys, _ = torch_pad(out, batch_first=True, total_length=T)
    (ys * torch.tensor(weights)).sum().backward()
    grads = {"x": tx.grad, **{k: p.grad for k, p in t_mod.named_parameters()}}
    return ys.detach().numpy(), nf.pytree.flatten(state)[0], {k: g.numpy() for k, g in grads.items()}


@pytest.mark.parametrize("mode,kw", [
    ("LSTM", dict(num_layers=2, bidirectional=True)),
    ("GRU", dict(num_layers=2, bidirectional=True)),
    ("LSTM", dict(proj_size=2)),
    ("RNN", dict(nonlinearity="relu")),
])
def test_packed_batches_match_torch(backend: str, rng: np.random.Generator, mode: str, kw: dict) -> None:
    """Sequences of 6, 2, 4 and 1 steps, unsorted: every step past a sequence's end leaves its state as it was and
    outputs zeros, so the final states are each sequence's own (its first step's, for the reversed direction)."""
    t_mod = getattr(torch.nn, mode)(I, H, batch_first=True, **kw).double()
    n_mod = getattr(nn, mode)(I, H, batch_first=True, **kw).double()
    n_mod.load_state_dict(t_mod.state_dict())
    lengths = [6, 2, 4, 1]
    x = rng.standard_normal((N, T, I))
    width = 2 * H if kw.get("bidirectional") else kw.get("proj_size") or H
    weights = rng.standard_normal((N, T, width))
    want_ys, want_state, want_grads = _torch_run(t_mod, x, lengths, weights)

    def run(x, lengths, weights):
        def loss(x):
            out, _ = n_mod(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
            return (pad_packed_sequence(out, batch_first=True)[0] * weights).sum()

        out, state = n_mod(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        n_mod.zero_grad()
        loss(x).backward()
        grads = {k: p.grad for k, p in n_mod.named_parameters()}
        return pad_packed_sequence(out, batch_first=True)[0], state, nf.grad(loss)(x), grads

    ys, state, dx, dparams = nf.compile(run, backend=backend)(x, np.array(lengths), weights)
    np.testing.assert_allclose(np.asarray(ys), want_ys, rtol=1e-10, atol=1e-12)
    for got, want in zip(nf.pytree.flatten(state)[0], want_state):
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(dx), want_grads["x"], rtol=1e-10, atol=1e-12)
    assert sorted(dparams) == sorted(k for k in want_grads if k != "x")
    for name, g in dparams.items():
        np.testing.assert_allclose(np.asarray(g), want_grads[name], rtol=1e-10, atol=1e-12, err_msg=name)
    assert np.abs(want_ys[1, 2:]).max() == 0 and np.abs(want_grads["x"][3, 1:]).max() == 0  # padding


def test_one_program_serves_any_lengths_and_padding(backend: str, rng: np.random.Generator) -> None:
    """Lengths are data and T a scan's trip count: new lengths and a new T run the compiled program without
    tracing again. Padding takes ``padding_value`` and ``total_length`` as torch's does."""
    t_mod = torch.nn.GRU(I, H).double()
    n_mod = nn.GRU(I, H).double()
    n_mod.load_state_dict(t_mod.state_dict())

    def run(x, lengths):
        out, h = n_mod(pack_padded_sequence(x, lengths))
        return pad_packed_sequence(out, padding_value=-1.5)[0], h

    f = nf.compile(run, backend=backend)
    for steps, lengths in ((T, [6, 5, 3, 3]), (T, [2, 1, 1, 1]), (4, [4, 4, 2, 1])):
        x = rng.standard_normal((steps, N, I))
        out, h = t_mod(torch_pack(torch.tensor(x), torch.tensor(lengths)))
        want, _ = torch_pad(out, padding_value=-1.5, total_length=steps)
        got, got_h = f(x, np.array(lengths))
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(np.asarray(got_h), h.detach().numpy(), rtol=1e-10, atol=1e-12)
    assert f.trace_count == 1
    for total in (T + 2, 4):
        padded = nf.compile(lambda x, n, total=total: pad_packed_sequence(  # a fixed length: traced per length
            n_mod(pack_padded_sequence(x, n))[0], False, 0.5, total)[0], backend=backend)
        got = padded(x, np.array(lengths))
        want, _ = torch_pad(t_mod(torch_pack(torch.tensor(x), torch.tensor(lengths)))[0], False, 0.5, total)
        np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("lengths,enforce_sorted,message", [
    ([6, 2, 4, 1], True, r"lengths \[6, 2, 4, 1\] are not in decreasing order; sort the batch or pass enforce_sorted"),
    ([6, 0, 4, 1], False, r"lengths must be in 1..6 \(the input's time axis\), got \[6, 0, 4, 1\]"),
    ([6, 2, 1], True, r"3 lengths for a batch of 4 sequences \(input \[6, 4, 3\], batch_first=False\)"),
    ([7, 2, 2, 1], True, r"lengths must be in 1..6"),  # torch reads past the input's end here
])
def test_lengths_are_checked_as_torch_checks_them(lengths: list[int], enforce_sorted: bool, message: str) -> None:
    x = np.ones((T, N, I))
    if max(lengths) <= T:
        with pytest.raises(RuntimeError):  # torch refuses them too
            torch_pack(torch.tensor(x), torch.tensor(lengths), enforce_sorted=enforce_sorted)
    with pytest.raises((ValueError, nf.ShapeError), match=message):
        pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
