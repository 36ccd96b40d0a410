"""``shared_weight_products`` and ``biases_into_scans``: an RNN layer's input projection ``x @ W + b`` is one
GEMM whose result the row-split loop reads directly (a chunk of steps at a time where the length is a symbol),
the bias added in the step — never a separate pass over the [T, N, 4H] projection."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import nnforge as nf
import nnforge.nn as nn
from nnforge.codegen.c.target import cpu_target
from nnforge.ir.ops import Op
from nnforge.passes import pipeline, run_pipeline
from nnforge.passes.biases import biases_into_scans
from nnforge.passes.products import shared_weight_products

cpu_only = pytest.mark.skipif("cpu" not in nf.available_backends(), reason="no working C compiler")


def _listing(fn, *args) -> list:
    from nnforge.codegen.c import lower, prepare

    return lower(prepare(nf.compile(fn).trace(*args))).listing


def _xs_sources(g) -> list[str]:
    return [n.srcs[n.attrs["n_carry"]].op.name for n in g.order if n.op == Op.SCAN]


def test_the_projection_is_one_gemm_and_the_bias_moves_into_the_step(rng: np.random.Generator) -> None:
    rnn = nn.LSTM(8, 8)
    x = rng.standard_normal((6, 16, 8)).astype(np.float32)
    g = nf.compile(lambda x: rnn(x)[0]).trace(x)
    assert _xs_sources(g) == ["ADD"]  # x @ W_ih (a batched product with W expanded over T) + expand(b)
    flat = shared_weight_products(g)
    (mm,) = [n for n in flat.order if n.op == Op.MATMUL and n.ndim == 2 and int(n.shape[1]) == 32]
    assert [int(d) for d in mm.srcs[0].shape] == [6 * 16, 8]  # the T * N rows of x
    sunk = biases_into_scans(flat, cpu_target())
    assert _xs_sources(sunk) == ["RESHAPE"]  # the GEMM's result, viewed as [T, N, 4H]
    (scan,) = [n for n in sunk.order if n.op == Op.SCAN]
    body_adds = [m for m in scan.attrs["body"].order if m.op == Op.ADD and Op.EXPAND in (m.srcs[0].op, m.srcs[1].op)]
    assert len(body_adds) == 1


def test_a_loop_that_is_not_split_or_an_add_read_elsewhere_keeps_its_input(rng: np.random.Generator) -> None:
    rnn = nn.LSTM(8, 8)
    small = rng.standard_normal((6, 4, 8)).astype(np.float32)  # 4 rows: not split among threads
    g = shared_weight_products(nf.compile(lambda x: rnn(x)[0]).trace(small))
    assert biases_into_scans(g, cpu_target()) is g

    w, b = (rng.standard_normal(s).astype(np.float32) for s in ((8, 8), (8,)))

    def also_returned(x, h0):
        proj = x @ w + b

        def cell(h, p):
            h = nf.tanh(p + h @ w)
            return h, h

        return nf.scan(cell, h0, proj)[1], proj

    args = (rng.standard_normal((5, 16, 8)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32))
    g = shared_weight_products(nf.compile(also_returned).trace(*args))
    assert biases_into_scans(g, cpu_target()) is g


@cpu_only
@pytest.mark.parametrize("N", [16, 13])
def test_compiled_lstm_reads_the_gemm_chunk_by_chunk_and_matches_torch(rng: np.random.Generator, N: int) -> None:
    """Float32 against torch's LSTM: 2e-5 over 70 steps of a well-conditioned cell (the C backend's vector
    transcendentals are within 4e-7 relative; the GEMMs reassociate)."""
    torch.manual_seed(int(rng.integers(1 << 31)))
    ref = torch.nn.LSTM(8, 8)
    rnn = nn.LSTM(8, 8)
    rnn.load_state_dict({k: v.detach().numpy() for k, v in ref.state_dict().items()})
    x = rng.standard_normal((70, N, 8)).astype(np.float32)
    fn = lambda x: rnn(x)[0]  # noqa: E731
    (scan,) = [k for k in _listing(fn, x) if k.kind == "scan"]
    assert "input projection computed 64 steps at a time" in scan.note
    got = nf.compile(fn, backend="cpu")(x)
    with torch.no_grad():
        want = ref(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@cpu_only
def test_a_derived_sequence_length_is_chunked_and_still_right(rng: np.random.Generator) -> None:
    """After a strided conv the LSTMs' length is (T + 2p - k) // s + 1, a size derived from T: the projections are
    still computed 64 steps at a time (the chunk GEMM's rows are the chunk's step count times N), the bias moves
    into the step, and the results match the interpreter at lengths that end inside a chunk, forward and reversed,
    from one compiled program."""
    conv, rnn = nn.Conv1d(1, 8, 5, stride=3, padding=2), nn.LSTM(8, 8, num_layers=2, reverse=[True, False])

    def encoder(x):
        return rnn(nf.silu(conv(x)).permute(2, 0, 1))[0]

    x = rng.standard_normal((16, 1, 450)).astype(np.float32)
    listing = _listing(encoder, x)
    # no kernel over the [T', N, 4H] projection: only the two bias vectors' sum, f32[32]
    assert not any(k.kind == "elementwise" and re.search(r"\[\d+, 16, 32\]", k.type) for k in listing)
    scans = [k for k in listing if k.kind == "scan"]
    assert len(scans) == 2 and all("input projection computed 64 steps at a time" in k.note for k in scans)
    compiled = nf.compile(encoder, backend="cpu")
    for length in (450, 200):  # 150 and 67 LSTM steps: the last chunk partial
        x = rng.standard_normal((16, 1, length)).astype(np.float32)
        np.testing.assert_allclose(compiled(x), nf.compile(encoder)(x), rtol=2e-5, atol=2e-5)
    g = run_pipeline(nf.compile(encoder).trace(x), pipeline(cpu_target()))
    assert _xs_sources(g) == ["RESHAPE", "RESHAPE"]


def test_the_input_gradient_of_a_shared_projection_is_one_gemm(rng: np.random.Generator, backend: str) -> None:
    """d/dx of sum((x @ Wᵀ) * g) is g @ W per step, traced as a batched product with the transpose of W broadcast
    over T: one 2-D GEMM of T * N rows after ``shared_weight_products`` (it was a small GEMM per step, with W
    packed again each time); the values match torch (float32, K = 9)."""
    x, w, g = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6, 7), (9, 7), (8, 6, 9)))

    def input_grad(x, w, g):
        return nf.grad(lambda x: ((x @ w.T) * g).sum())(x)

    traced = nf.compile(input_grad).trace(x, w, g)
    batched = [n for n in traced.order if n.op == Op.MATMUL and n.ndim == 3]
    assert batched and batched[0].srcs[1].op == Op.PERMUTE  # what autodiff gives: g @ expand(W)ᵀ
    flat = shared_weight_products(traced)
    (mm,) = [n for n in flat.order if n.op == Op.MATMUL]
    assert [int(d) for d in mm.srcs[0].shape] == [48, 9] and [int(d) for d in mm.shape] == [48, 7]
    tx = torch.from_numpy(x).requires_grad_()
    ((tx @ torch.from_numpy(w).T) * torch.from_numpy(g)).sum().backward()
    np.testing.assert_allclose(nf.compile(input_grad, backend=backend)(x, w, g), tx.grad.numpy(), rtol=1e-5,
                               atol=1e-5)
