"""Activation and Dropout modules (thin wrappers so they can sit in a Sequential and a state_dict)."""

from __future__ import annotations

from ..tensor import Tensor, gelu, silu
from . import functional as F
from .module import Module


class ReLU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.relu()


class Tanh(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.tanh()


class Sigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return x.sigmoid()


class SiLU(Module):
    """x * sigmoid(x) (also known as Swish)."""

    def forward(self, x: Tensor) -> Tensor:
        return silu(x)


Swish = SiLU


class GELU(Module):
    """GELU, exact (erf) by default or ``approximate="tanh"``."""

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Tensor) -> Tensor:
        return gelu(x, approximate=self.approximate)


class Dropout(Module):
    """Zeroes elements with probability ``p`` in training mode (fresh mask per call); identity in eval mode."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
