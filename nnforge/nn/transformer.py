"""Multi-head self-attention, the Transformer encoder layer and its stack, with torch's parameter names and masks.

Mask conventions follow torch.nn.MultiheadAttention: a bool mask marks positions that may NOT be attended
(True = masked out); a float mask is added to the attention scores (use -inf to mask).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import ShapeError, at
from ..tensor import Tensor, as_tensor, full, gelu, relu, where
from . import functional as F
from . import init
from .activation import Dropout
from .linear import Linear
from .module import Module, ModuleList, Parameter
from .norm import LayerNorm


def _additive(mask: Any, dtype: Any) -> Tensor:
    """A mask as an additive float tensor: bool True -> -inf, False -> 0; float masks pass through."""
    m = as_tensor(mask)
    if m.dtype.is_float:
        return m.cast(dtype)
    return where(m, full((), float("-inf"), dtype), full((), 0.0, dtype))


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention for the common case (same embed dim for query, key and value).

    Parameters: ``in_proj_weight`` [3E, E], ``in_proj_bias`` [3E], ``out_proj.weight``/``out_proj.bias``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = Parameter(init.xavier_uniform((3 * embed_dim, embed_dim)))
        self.register_parameter("in_proj_bias", Parameter(init.zeros((3 * embed_dim,))) if bias else None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias)
        if bias:
            self.out_proj.bias = Parameter(init.zeros((embed_dim,)))

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None, need_weights: bool = True,
                attn_mask: Any = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """Returns (output, attention weights or None). Inputs are [L, N, E] ([N, L, E] with batch_first)."""
        q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
        if self.batch_first:
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        tgt, n, e = q.shape
        src = k.shape[0]
        if int(e) != self.embed_dim:
            raise ShapeError(at(f"MultiheadAttention: query has {int(e)} features, expected {self.embed_dim}"))
        wq, wk, wv = self.in_proj_weight.chunk(3, axis=0)
        bq = bk = bv = None
        if self.in_proj_bias is not None:
            bq, bk, bv = self.in_proj_bias.chunk(3, axis=0)
        h, d = self.num_heads, self.head_dim

        def heads(x: Tensor, length: int) -> Tensor:  # [L, N, E] -> [N, heads, L, d]
            return x.reshape(length, n, h, d).permute(1, 2, 0, 3)

        # scaled before the heads are split (the same values): the projection's GEMM scales on its accumulator
        qh = heads(F.linear(q, wq, bq) * (1.0 / d ** 0.5), tgt)
        kh = heads(F.linear(k, wk, bk), src)
        vh = heads(F.linear(v, wv, bv), src)
        mask = None
        if attn_mask is None and is_causal:
            attn_mask = Tensor(np.triu(np.ones((int(tgt), int(src)), bool), 1))
        if attn_mask is not None:
            am = _additive(attn_mask, qh.dtype)
            if am.ndim == 3:  # [N * heads, L, S]
                am = am.reshape(n, h, tgt, src)
            mask = am
        if key_padding_mask is not None:
            kp = _additive(key_padding_mask, qh.dtype).reshape(n, 1, 1, src)
            mask = kp if mask is None else mask + kp
        scores = qh @ kh.mT
        if mask is not None:
            scores = scores + mask
        attn = scores.softmax(-1)
        weights = attn
        attn = F.dropout(attn, self.dropout, self.training)
        out = (attn @ vh).permute(2, 0, 1, 3).reshape(tgt, n, e)      # [L, N, E]
        out = self.out_proj(out)
        if self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        return out, weights.mean(1) if average_attn_weights else weights


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer``, each with its own parameters (torch clones it too), then an
    optional final ``norm``. The masks and ``is_causal`` reach every layer. Unlike torch's inference fast path
    (nested tensors, eval mode without gradients), positions a key-padding mask hides keep the values computed
    there instead of zeros."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool | None = None) -> Tensor:
        x = as_tensor(src)
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask, is_causal=bool(is_causal))
        return x if self.norm is None else self.norm(x)


def _activation(activation: str | Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    if callable(activation):
        return activation
    if activation == "relu":
        return relu  # a module-level function: a layer holding it pickles
    if activation == "gelu":
        return gelu
    raise ValueError(f"TransformerEncoderLayer: activation must be 'relu', 'gelu' or a callable, got {activation!r}")


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block, each with a residual connection and LayerNorm.

    ``norm_first`` applies the norms before each block (pre-LN) instead of after (post-LN, torch's default).
    Parameter names match torch: self_attn.*, linear1, linear2, norm1, norm2.
    """

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable[[Tensor], Tensor] = "relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, bias: bool = True):
        super().__init__()
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first)
        self.linear1 = Linear(d_model, dim_feedforward, bias=bias)
        self.dropout = Dropout(dropout)
        self.linear2 = Linear(dim_feedforward, d_model, bias=bias)
        self.norm_first = norm_first
        self.norm1 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src: Any, src_mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool = False) -> Tensor:
        x = as_tensor(src)
        if self.norm_first:
            x = x + self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal)
            return x + self._ff_block(self.norm2(x))
        x = self.norm1(x + self._sa_block(x, src_mask, src_key_padding_mask, is_causal))
        return self.norm2(x + self._ff_block(x))

    def _sa_block(self, x: Tensor, attn_mask: Any, key_padding_mask: Any, is_causal: bool) -> Tensor:
        out, _ = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                need_weights=False, is_causal=is_causal)
        return self.dropout1(out)

    def _ff_block(self, x: Tensor) -> Tensor:
        return self.dropout2(self.linear2(self.dropout(self.activation(self.linear1(x)))))
