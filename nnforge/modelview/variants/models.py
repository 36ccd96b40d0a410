"""Whole-model variants: a Bonito-like basecaller encoder and a transformer encoder layer."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from ..registry import variant
from .base import Param, Request, Variant, seq_randn
from .lstm import lstm_flops, lstm_param_count

BONITO_CONV = {96: (4, 16), 384: (16, 16), 1024: (16, 16)}  # channels of the first two convolutions per width
BONITO_STRIDE = 5


class BonitoEncoder(nn.Module):
    """Raw signal [N, 1, T] → three Conv1d+SiLU (the last with stride 5) → five LSTM layers of alternating direction
    (reverse first, as in Bonito) → linear head. The recurrent part runs in the cell's layout; output is
    [T/5, N, out] (TNC) or [N, T/5, out] (NTC)."""


    def __init__(self, width: int, layers: int, head_out: int, batch_first: bool) -> None:
        super().__init__()
        c1, c2 = BONITO_CONV[width]
        f64 = torch.float64
        self.batch_first = batch_first
        self.conv = nn.Sequential(
            nn.Conv1d(1, c1, 5, padding=2, dtype=f64),
            nn.SiLU(),
            nn.Conv1d(c1, c2, 5, padding=2, dtype=f64),
            nn.SiLU(),
            nn.Conv1d(c2, width, 19, stride=BONITO_STRIDE, padding=9, dtype=f64),
            nn.SiLU(),
        )
        self.rnns = nn.ModuleList(nn.LSTM(width, width, batch_first=batch_first, dtype=f64) for _ in range(layers))
        self.head = nn.Linear(width, head_out, dtype=f64)

    def forward(self, signal: torch.Tensor) -> torch.Tensor:
        x = self.conv(signal)  # [N, C, T']
        tdim = 1 if self.batch_first else 0
        x = x.transpose(1, 2) if self.batch_first else x.permute(2, 0, 1)
        reverse = True
        for rnn in self.rnns:
            if reverse:
                x = rnn(x.flip(tdim))[0].flip(tdim)
            else:
                x = rnn(x)[0]
            reverse = not reverse
        return self.head(x)


@variant
class Bonito(Variant):
    name = "bonito"
    description = "Bonito-like basecaller encoder: 3 Conv1d+SiLU (stride 5), 5 alternating LSTMs, linear head"
    params: ClassVar[dict[str, Param]] = {
        "width": Param(96, choices=(96, 384, 1024), help="LSTM width (Bonito fast / hac / sup)"),
        "layers": Param(5, help="LSTM layers, alternating direction"),
        "head_out": Param(1280, help="head outputs (5·4^4 for a CRF head with state length 4)"),
    }
    throughput_unit = "samples/s"

    def module(self, req: Request) -> nn.Module:
        p = req.params
        return BonitoEncoder(p["width"], p["layers"], p["head_out"], req.batch_first)

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (torch.randn(req.batch, 1, req.seq_len, generator=gen, dtype=torch.float64),)

    def _steps(self, req: Request) -> int:
        return math.ceil(req.seq_len / BONITO_STRIDE)

    def flops(self, req: Request) -> float:
        p = req.params
        w, n, t = p["width"], req.batch, req.seq_len
        c1, c2 = BONITO_CONV[w]
        t2 = self._steps(req)
        conv = 2 * n * t * (1 * 5 * c1 + c1 * 5 * c2) + 2 * n * t2 * c2 * 19 * w
        silu = 4 * n * (t * (c1 + c2) + t2 * w)
        rnn_req = Request(req.batch, t2, req.layout, {"input_size": w, "hidden": w})
        rnn = lstm_flops(rnn_req, layers=p["layers"])
        head = 2 * n * t2 * w * p["head_out"]
        return float(conv + silu + rnn + head)

    def min_bytes(self, req: Request, itemsize: int) -> float:
        p = req.params
        w = p["width"]
        c1, c2 = BONITO_CONV[w]
        params = (5 * c1 + c1) + (c1 * 5 * c2 + c2) + (c2 * 19 * w + w)
        params += p["layers"] * lstm_param_count(w, w) + w * p["head_out"] + p["head_out"]
        io = req.batch * req.seq_len + req.batch * self._steps(req) * p["head_out"]
        return float((params + io) * itemsize)


@variant
class Transformer(Variant):
    name = "transformer"
    description = "torch.nn.TransformerEncoderLayer (post-norm, ReLU, no dropout)"
    params: ClassVar[dict[str, Param]] = {
        "d_model": Param(64, help="model width"),
        "nhead": Param(4, help="attention heads (must divide d_model)"),
        "ff": Param(256, help="feed-forward width"),
    }

    @classmethod
    def check_params(cls, params: Mapping[str, Any]) -> str | None:
        if params["d_model"] % params["nhead"]:
            return f"d_model={params['d_model']} is not divisible by nhead={params['nhead']}"
        return None

    def module(self, req: Request) -> nn.Module:
        p = req.params
        err = self.check_params(p)
        if err:
            raise ValueError(err)
        return nn.TransformerEncoderLayer(
            p["d_model"], p["nhead"], p["ff"], dropout=0.0, batch_first=req.batch_first, dtype=torch.float64
        )

    def inputs(self, req: Request, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        return (seq_randn(req, req.params["d_model"], gen),)

    def flops(self, req: Request) -> float:
        d, ff, t = req.params["d_model"], req.params["ff"], req.seq_len
        per_token = 2 * 4 * d * d + 2 * 2 * t * d + 2 * 2 * d * ff + 5 * t * req.params["nhead"] + 20 * d
        return float(req.batch * t * per_token)

    def min_bytes(self, req: Request, itemsize: int) -> float:
        d, ff = req.params["d_model"], req.params["ff"]
        params = 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d
        return float((params + 2 * req.batch * req.seq_len * d) * itemsize)
