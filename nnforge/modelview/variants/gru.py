"""GRU variants: ``torch.nn.GRU`` and a parallel-scan minGRU.

minGRU (Feng et al., "Were RNNs all we needed?", 2024) drops the hidden-state dependence of the gates, so
``h_t = (1 - z_t) h_{t-1} + z_t h̃_t`` is a linear recurrence that a parallel scan evaluates in O(log T) depth. We use
the log-space form (``logcumsumexp``), which stays stable for long sequences — the shape of the thesis' ParallelGRU.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import variant
from .base import NnforgeImpl, Param, Request, Variant, seq_randn
from .lstm import LSTM_PARAMS


class TorchGRU(nn.Module):
    def __init__(self, input_size: int, hidden: int, layers: int, batch_first: bool) -> None:
        super().__init__()
        self.gru = nn.GRU(input_size, hidden, num_layers=layers, batch_first=batch_first, dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x)[0]


class MinGRU(nn.Module):

    def __init__(self, input_size: int, hidden: int, batch_first: bool) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.proj = nn.Linear(input_size, 2 * hidden, dtype=torch.float64)  # [gate k | candidate]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tdim = 1 if self.batch_first else 0
        k, cand = self.proj(x).chunk(2, -1)
        log_z = -F.softplus(-k)  # log sigmoid(k)
        log_one_minus_z = -F.softplus(k)
        # log g(cand), g(v) = v + 0.5 for v >= 0 else sigmoid(v): positive, so the scan can run in log space
        log_cand = torch.where(cand >= 0, torch.log(F.relu(cand) + 0.5), -F.softplus(-cand))
        a_star = torch.cumsum(log_one_minus_z, dim=tdim)
        log_h = a_star + torch.logcumsumexp(log_z + log_cand - a_star, dim=tdim)
        return torch.exp(log_h)


@variant
class GRUTorch(Variant):
    name = "torch_gru"
    description = "torch.nn.GRU"
    params: ClassVar[dict[str, Param]] = {**LSTM_PARAMS, "layers": Param(1, help="stacked layers")}

    def module(self, req: Request) -> nn.Module:
        p = req.params
        return TorchGRU(p["input_size"], p["hidden"], p["layers"], req.batch_first)

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (seq_randn(req, req.params["input_size"], gen),)

    def flops(self, req: Request) -> float:
        i, h, layers = req.params["input_size"], req.params["hidden"], req.params["layers"]
        total = 0.0
        for layer in range(layers):
            inp = i if layer == 0 else h
            total += req.seq_len * req.batch * (2 * 3 * h * (inp + h) + 2 * 3 * h + 9 * h)
        return total

    def min_bytes(self, req: Request, itemsize: int) -> float:
        i, h, layers = req.params["input_size"], req.params["hidden"], req.params["layers"]
        params = sum(3 * h * ((i if l == 0 else h) + h) + 6 * h for l in range(layers))
        return float((params + req.seq_len * req.batch * (i + h)) * itemsize)

    def nnforge_impl(self, req: Request) -> NnforgeImpl | None:
        if req.params["layers"] != 1:
            return None

        def fn(x: Any, h0: Any, w_ih: Any, w_hh: Any, b_ih: Any, b_hh: Any) -> Any:
            import nnforge as nf

            def cell(h: Any, x_t: Any) -> Any:
                xr, xz, xn = (x_t @ w_ih.T + b_ih).chunk(3, axis=-1)
                hr, hz, hn = (h @ w_hh.T + b_hh).chunk(3, axis=-1)
                r = nf.sigmoid(xr + hr)
                z = nf.sigmoid(xz + hz)
                n = nf.tanh(xn + r * hn)
                h = (1.0 - z) * n + z * h
                return h, h

            _, ys = nf.scan(cell, h0, x)
            return ys

        def bind(module: nn.Module) -> Any:
            g = module.gru  # type: ignore[attr-defined]
            w = [t.detach().contiguous() for t in (g.weight_ih_l0, g.weight_hh_l0, g.bias_ih_l0, g.bias_hh_l0)]

            def args(x: torch.Tensor) -> tuple[Any, ...]:
                xt = x.transpose(0, 1).contiguous() if req.batch_first else x
                h0 = torch.zeros(xt.shape[1], req.params["hidden"], dtype=x.dtype, device=x.device)
                return (xt, h0, *w)

            return args

        def output(ys: Any) -> torch.Tensor:
            y = ys if isinstance(ys, torch.Tensor) else torch.as_tensor(ys)
            return y.transpose(0, 1) if req.batch_first else y

        def weights(module: nn.Module) -> tuple[torch.Tensor, ...]:
            g = module.gru  # type: ignore[attr-defined]
            return g.weight_ih_l0, g.weight_hh_l0, g.bias_ih_l0, g.bias_hh_l0

        return NnforgeImpl(fn=fn, bind=bind, output=output, weights=weights, weight_argnums=(2, 3, 4, 5))


@variant
class MinGRUScan(Variant):
    name = "min_gru"
    description = "minGRU evaluated by a log-space parallel scan (logcumsumexp)"
    params: ClassVar[dict[str, Param]] = dict(LSTM_PARAMS)

    def module(self, req: Request) -> nn.Module:
        return MinGRU(req.params["input_size"], req.params["hidden"], req.batch_first)

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (seq_randn(req, req.params["input_size"], gen),)

    def flops(self, req: Request) -> float:
        i, h = req.params["input_size"], req.params["hidden"]
        # projection matmul + bias, then ~16 pointwise/scan ops per hidden unit (softplus×3, log, where, cumsums, exp)
        return req.seq_len * req.batch * (2 * 2 * h * i + 2 * h + 16 * h)

    def min_bytes(self, req: Request, itemsize: int) -> float:
        i, h = req.params["input_size"], req.params["hidden"]
        return float((2 * h * i + 2 * h + req.seq_len * req.batch * (i + h)) * itemsize)
