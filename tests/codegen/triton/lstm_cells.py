"""The layer-norm LSTMs the Triton tests compile: a gate row normalized after the products are summed, or each
product normalized apart (bench/cells_cpu.py's form, whose input projection's norm may leave the step)."""

from __future__ import annotations

import nnforge as nf


def normalized(v):
    """``v`` over its last axis to mean 0 and variance 1 (no learned gain or bias)."""
    d = v - v.mean(-1, keepdims=True)
    return d / nf.sqrt((d * d).mean(-1, keepdims=True) + 1e-5)


def _scan(gates, x, h0, c0):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = gates(x_t, h).chunk(4, axis=-1)
        c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
        h = nf.sigmoid(o) * nf.tanh(normalized(c))
        return (h, c), h

    (h, c), ys = nf.scan(cell, (h0, c0), x)
    return ys, h, c


def layer_norm_lstm(x, h0, c0, w_ih, w_hh, b):
    """Layer norm over each product's whole gate row, then the gates as slices of the normalized sum."""
    return _scan(lambda x_t, h: normalized(x_t @ w_ih.T) + normalized(h @ w_hh.T) + b, x, h0, c0)


def gate_row_norm_lstm(x, h0, c0, w_ih, w_hh, b):
    """The gate row normalized once, after the two products are summed, and the cell state."""
    return _scan(lambda x_t, h: normalized(x_t @ w_ih.T + h @ w_hh.T) + b, x, h0, c0)
