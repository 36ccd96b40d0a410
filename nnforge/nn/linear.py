"""Linear, Identity and Embedding layers."""

from __future__ import annotations

import math

import numpy as np

from ..tensor import Tensor, where
from . import functional as F
from . import init
from .module import Module, Parameter


class Identity(Module):
    """Returns its input (a placeholder where an architecture has an optional layer)."""

    def forward(self, x: Tensor) -> Tensor:
        return x


class Linear(Module):
    """``y = x @ weight.T + bias``; weight [out_features, in_features], initialized as torch does."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = 1.0 / math.sqrt(in_features) if in_features else 0.0
        self.weight = Parameter(init.uniform((out_features, in_features), bound))
        self.register_parameter("bias", Parameter(init.uniform((out_features,), bound)) if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Embedding(Module):
    """A lookup table [num_embeddings, embedding_dim] indexed by integer tensors (a gather).

    ``padding_idx`` starts as a zero row and gets no gradient, as in torch.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None):
        super().__init__()
        if padding_idx is not None and padding_idx < 0:
            padding_idx += num_embeddings
        self.num_embeddings, self.embedding_dim, self.padding_idx = num_embeddings, embedding_dim, padding_idx
        w = init.normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            w[padding_idx] = 0.0
        self.weight = Parameter(w)

    def forward(self, index: Tensor) -> Tensor:
        w = self.weight
        if self.padding_idx is not None:
            frozen = Tensor(np.arange(self.num_embeddings) == self.padding_idx).unsqueeze(-1)
            w = where(frozen, w.detach(), w)
        return F.embedding(index, w)

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"
