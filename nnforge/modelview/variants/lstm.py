"""The LSTM implementations of the thesis talk (seed 000), plus torch.nn.LSTM.

All compute the same function (one LSTM layer, zero initial state, output = all hidden states), so their FLOP and
byte counts are the same and their achieved FLOP/s compare directly; they differ in how the work is cut into kernels:

* ``lstm_manual``   — the talk's per-step cell: two matmuls per step, ``x_t W_ih^T + b_ih + h W_hh^T + b_hh``.
* ``lstm_combined`` — ``Linear(cat([x_t, h]))``: one matmul per step over the concatenated input ("combined layer").
* ``lstm_premult``  — the input projection for all steps premultiplied in one large matmul before the loop.
* ``lstm_stacked``  — gates stored as [i, f, o | g]: one sigmoid over the stacked i/f/o block ("stack then sigmoid?").
* ``torch_lstm``    — ``torch.nn.LSTM`` (oneDNN on CPU, cuDNN on GPU).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
from torch import nn

from ..registry import variant
from .base import NnforgeImpl, Param, Request, Variant, seq_randn

LSTM_PARAMS = {
    "input_size": Param(64, help="features per time step"),
    "hidden": Param(64, help="hidden units"),
}


def lstm_flops(req: Request, layers: int = 1, directions: int = 1) -> float:
    i, h = req.params["input_size"], req.params["hidden"]
    total = 0.0
    for layer in range(layers):
        inp = i if layer == 0 else h * directions
        # 2 FLOPs per multiply-add of the two gate matmuls, 2 adds per gate element, 9 pointwise ops per unit.
        total += directions * req.seq_len * req.batch * (2 * 4 * h * (inp + h) + 2 * 4 * h + 9 * h)
    return total


def lstm_param_count(i: int, h: int, layers: int = 1, directions: int = 1) -> int:
    total = 0
    for layer in range(layers):
        inp = i if layer == 0 else h * directions
        total += directions * (4 * h * (inp + h) + 8 * h)
    return total


def lstm_min_bytes(req: Request, itemsize: int, layers: int = 1) -> float:
    i, h = req.params["input_size"], req.params["hidden"]
    elems = lstm_param_count(i, h, layers) + req.seq_len * req.batch * (i + h)
    return float(elems * itemsize)


class _LSTMCellBase(nn.Module):
    """Weights in the torch.nn.LSTM convention (gates i, f, g, o; uniform(-1/sqrt(H), 1/sqrt(H)) init)."""


    def __init__(self, input_size: int, hidden: int, batch_first: bool) -> None:
        super().__init__()
        k = 1.0 / math.sqrt(hidden)
        self.hidden = hidden
        self.batch_first = batch_first
        self.weight_ih = nn.Parameter(torch.empty(4 * hidden, input_size, dtype=torch.float64).uniform_(-k, k))
        self.weight_hh = nn.Parameter(torch.empty(4 * hidden, hidden, dtype=torch.float64).uniform_(-k, k))
        self.bias_ih = nn.Parameter(torch.empty(4 * hidden, dtype=torch.float64).uniform_(-k, k))
        self.bias_hh = nn.Parameter(torch.empty(4 * hidden, dtype=torch.float64).uniform_(-k, k))

    def lstm_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(W_ih, W_hh, b) in i, f, g, o order, for the nnforge implementation."""
        return self.weight_ih, self.weight_hh, self.bias_ih + self.bias_hh


class ManualLSTM(_LSTMCellBase):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tdim = 1 if self.batch_first else 0
        n = x.shape[1 - tdim]
        h = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        c = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        ys: list[torch.Tensor] = []
        for x_t in x.unbind(tdim):
            gates = x_t @ self.weight_ih.t() + self.bias_ih + h @ self.weight_hh.t() + self.bias_hh
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            ys.append(h)
        return torch.stack(ys, tdim)


class CombinedLSTM(nn.Module):

    def __init__(self, input_size: int, hidden: int, batch_first: bool) -> None:
        super().__init__()
        self.hidden = hidden
        self.input_size = input_size
        self.batch_first = batch_first
        self.combined_layer = nn.Linear(input_size + hidden, 4 * hidden, dtype=torch.float64)

    def lstm_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        w = self.combined_layer.weight
        return w[:, : self.input_size], w[:, self.input_size :], self.combined_layer.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tdim = 1 if self.batch_first else 0
        n = x.shape[1 - tdim]
        h = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        c = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        ys: list[torch.Tensor] = []
        for x_t in x.unbind(tdim):
            gates = self.combined_layer(torch.cat((x_t, h), dim=1))
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            ys.append(h)
        return torch.stack(ys, tdim)


class PremultLSTM(_LSTMCellBase):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tdim = 1 if self.batch_first else 0
        n = x.shape[1 - tdim]
        xw = torch.matmul(x, self.weight_ih.t()) + (self.bias_ih + self.bias_hh)  # all steps in one matmul
        h = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        c = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        ys: list[torch.Tensor] = []
        for xw_t in xw.unbind(tdim):
            gates = xw_t + h @ self.weight_hh.t()
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            ys.append(h)
        return torch.stack(ys, tdim)


class StackedLSTM(_LSTMCellBase):
    """Rows stored as [i, f, o, g] so one sigmoid covers the three sigmoid gates."""

    def __init__(self, input_size: int, hidden: int, batch_first: bool) -> None:
        super().__init__(input_size, hidden, batch_first)
        with torch.no_grad():
            for p in (self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh):
                i, f, g, o = p.chunk(4, 0)
                p.copy_(torch.cat((i, f, o, g), 0))

    def lstm_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        def ifgo(t: torch.Tensor) -> torch.Tensor:
            i, f, o, g = t.chunk(4, 0)
            return torch.cat((i, f, g, o), 0)

        return ifgo(self.weight_ih), ifgo(self.weight_hh), ifgo(self.bias_ih + self.bias_hh)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tdim = 1 if self.batch_first else 0
        n = x.shape[1 - tdim]
        h3 = 3 * self.hidden
        h = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        c = torch.zeros(n, self.hidden, dtype=x.dtype, device=x.device)
        ys: list[torch.Tensor] = []
        for x_t in x.unbind(tdim):
            gates = x_t @ self.weight_ih.t() + self.bias_ih + h @ self.weight_hh.t() + self.bias_hh
            ifo = torch.sigmoid(gates[:, :h3])
            g = torch.tanh(gates[:, h3:])
            i, f, o = ifo.chunk(3, 1)
            c = f * c + i * g
            h = o * torch.tanh(c)
            ys.append(h)
        return torch.stack(ys, tdim)


class TorchLSTM(nn.Module):
    def __init__(self, input_size: int, hidden: int, layers: int, batch_first: bool) -> None:
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden, num_layers=layers, batch_first=batch_first, dtype=torch.float64)

    def lstm_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m = self.lstm
        return m.weight_ih_l0, m.weight_hh_l0, m.bias_ih_l0 + m.bias_hh_l0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def nnforge_lstm_impl(req: Request) -> NnforgeImpl:
    """The LSTM as an nnforge scan (the API of docs/guide.md); nnforge is imported only when the backend runs it."""

    def fn(x: Any, h0: Any, c0: Any, w_ih: Any, w_hh: Any, b: Any) -> Any:
        import nnforge as nf

        def cell(carry: Any, x_t: Any) -> Any:
            h, c = carry
            i, f, g, o = (x_t @ w_ih.T + h @ w_hh.T + b).chunk(4, axis=-1)
            c = nf.sigmoid(f) * c + nf.sigmoid(i) * nf.tanh(g)
            h = nf.sigmoid(o) * nf.tanh(c)
            return (h, c), h

        _, ys = nf.scan(cell, (h0, c0), x)
        return ys

    def bind(module: nn.Module) -> Any:
        w_ih, w_hh, b = (t.detach().contiguous() for t in module.lstm_weights())  # type: ignore[operator]
        hidden = w_hh.shape[1]

        def args(x: torch.Tensor) -> tuple[Any, ...]:
            xt = x.transpose(0, 1).contiguous() if req.batch_first else x
            z = torch.zeros(xt.shape[1], hidden, dtype=x.dtype, device=x.device)
            return xt, z, z, w_ih, w_hh, b

        return args

    def output(ys: Any) -> torch.Tensor:
        y = ys if isinstance(ys, torch.Tensor) else torch.as_tensor(ys)
        return y.transpose(0, 1) if req.batch_first else y

    return NnforgeImpl(fn=fn, bind=bind, output=output, weights=lambda m: tuple(m.lstm_weights()),  # type: ignore[operator]
                       weight_argnums=(3, 4, 5))


class _LSTMVariant(Variant):
    params: ClassVar[dict[str, Param]] = LSTM_PARAMS
    impl: type[nn.Module] = ManualLSTM

    def module(self, req: Request) -> nn.Module:
        return self.impl(req.params["input_size"], req.params["hidden"], req.batch_first)

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (seq_randn(req, req.params["input_size"], gen),)

    def flops(self, req: Request) -> float:
        return lstm_flops(req)

    def min_bytes(self, req: Request, itemsize: int) -> float:
        return lstm_min_bytes(req, itemsize)

    def nnforge_impl(self, req: Request) -> NnforgeImpl | None:
        return nnforge_lstm_impl(req)


@variant
class LSTMManual(_LSTMVariant):
    name = "lstm_manual"
    description = "per-step cell with two matmuls (the talk's hand-written LSTM)"
    impl = ManualLSTM


@variant
class LSTMCombined(_LSTMVariant):
    name = "lstm_combined"
    description = "Linear over cat([x_t, h]): one matmul per step (combined layer)"
    impl = CombinedLSTM


@variant
class LSTMPremult(_LSTMVariant):
    name = "lstm_premult"
    description = "input projection of all steps premultiplied in one matmul"
    impl = PremultLSTM


@variant
class LSTMStacked(_LSTMVariant):
    name = "lstm_stacked"
    description = "gates stored [i,f,o|g]: one stacked sigmoid per step"
    impl = StackedLSTM


@variant
class LSTMTorch(Variant):
    name = "torch_lstm"
    description = "torch.nn.LSTM (oneDNN on CPU, cuDNN on GPU)"
    params: ClassVar[dict[str, Param]] = {**LSTM_PARAMS, "layers": Param(1, help="stacked layers")}

    def module(self, req: Request) -> nn.Module:
        p = req.params
        return TorchLSTM(p["input_size"], p["hidden"], p["layers"], req.batch_first)

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (seq_randn(req, req.params["input_size"], gen),)

    def flops(self, req: Request) -> float:
        return lstm_flops(req, layers=req.params["layers"])

    def min_bytes(self, req: Request, itemsize: int) -> float:
        return lstm_min_bytes(req, itemsize, layers=req.params["layers"])

    def nnforge_impl(self, req: Request) -> NnforgeImpl | None:
        return nnforge_lstm_impl(req) if req.params["layers"] == 1 else None
