"""Multi-head self-attention, the Transformer encoder layer and its stack, with torch's parameter names and masks.

Mask conventions follow torch.nn.MultiheadAttention: a bool mask marks positions that may NOT be attended
(True = masked out); a float mask is added to the attention scores (use -inf to mask).
``F.scaled_dot_product_attention`` has torch's opposite convention for its bool mask (True = attend). Inputs may be
batched, [L, N, E] ([N, L, E] with ``batch_first``), or one unbatched sequence [L, E], as in torch. Masks of the
wrong shape are refused up front with the shape expected, naming the argument as the caller passed it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from .. import dtypes
from ..errors import DTypeError, ShapeError, at
from ..tensor import Tensor, arange, as_tensor, full, gelu, relu, where
from . import functional as F
from . import init
from .activation import Dropout
from .functional import _shape_of as _dims
from .linear import Linear
from .module import Module, ModuleList, Parameter
from .norm import LayerNorm


def _additive(mask: Tensor, dtype: Any) -> Tensor:
    """A mask as an additive float tensor: bool True -> -inf, False -> 0; float masks pass through."""
    if mask.dtype.is_float:
        return mask.cast(dtype)
    return where(mask, full((), float("-inf"), dtype), full((), 0.0, dtype))


def _layout(batch_first: bool, length: str = "L") -> str:
    return f"[N, {length}, E]" if batch_first else f"[{length}, N, E]"


def _checked_masks(owner: str, key_padding_mask: Any, attn_mask: Any, batched: bool, n: int, tgt: int, src: int,
                   heads: int, kpm_name: str = "key_padding_mask",
                   mask_name: str = "attn_mask") -> tuple[Tensor | None, Tensor | None]:
    """The masks as tensors, their dtypes and shapes checked as torch's ``multi_head_attention_forward`` checks them
    (a key-padding mask [N, S], or [S] unbatched; an attention mask [L, S], or [N * heads, L, S], [heads, L, S]
    unbatched). A wrong shape would otherwise fail inside, in a reshape or an add of internal shapes."""
    out = []
    for name, mask in ((kpm_name, key_padding_mask), (mask_name, attn_mask)):
        if mask is None:
            out.append(None)
            continue
        m = as_tensor(mask)
        if m.dtype != dtypes.bool_ and not m.dtype.is_float:
            raise DTypeError(at(f"{owner}: {name} must be bool (True = masked out) or float (added to the scores), "
                                f"got {m.dtype}"))
        out.append(m)
    kpm, am = out
    if kpm is not None:
        want = [n, src] if batched else [src]
        if _dims(kpm) != want:
            what = "(batch size, source length)" if batched else "(source length; unbatched input)"
            raise ShapeError(at(f"{owner}: {kpm_name} of shape {_dims(kpm)}, expected {want} {what}"))
    if am is not None:
        flat, per_head = [tgt, src], [n * heads if batched else heads, tgt, src]
        per_head_what = "(batch size * num_heads" if batched else "(num_heads"
        per_head_what += ", target length, source length)"
        if am.ndim == 2 and _dims(am) != flat:
            raise ShapeError(at(f"{owner}: {mask_name} of shape {_dims(am)}, expected {flat} (target length, "
                                f"source length)"))
        if am.ndim == 3 and _dims(am) != per_head:
            raise ShapeError(at(f"{owner}: {mask_name} of shape {_dims(am)}, expected {per_head} {per_head_what}"))
        if am.ndim not in (2, 3):
            raise ShapeError(at(f"{owner}: {mask_name} of shape {_dims(am)}, expected {flat} (target length, "
                                f"source length) or {per_head} {per_head_what}"))
    return kpm, am


def _check_self_attention_input(owner: str, x: Tensor, attn: MultiheadAttention, mask: Any, key_padding_mask: Any,
                                mask_name: str) -> None:
    """An encoder's input [S, N, E] ([N, S, E] with ``batch_first``, [S, E] unbatched) and its masks, checked where
    the caller passed them so that an error names them as the caller did (``src_mask``, not ``attn_mask``)."""
    if x.ndim not in (2, 3) or int(x.shape[-1]) != attn.embed_dim:
        raise ShapeError(at(f"{owner}: src of shape {_dims(x)}, expected {_layout(attn.batch_first, 'S')} or "
                            f"[S, E] (unbatched) with E = d_model = {attn.embed_dim}"))
    batched = x.ndim == 3
    n, length = (1, int(x.shape[0])) if not batched else (int(x.shape[0 if attn.batch_first else 1]),
                                                          int(x.shape[1 if attn.batch_first else 0]))
    _checked_masks(owner, key_padding_mask, mask, batched, n, length, length, attn.num_heads,
                   kpm_name="src_key_padding_mask", mask_name=mask_name)


class MultiheadAttention(Module):
    """torch.nn.MultiheadAttention for the common case (same embed dim for query, key and value).

    Parameters: ``in_proj_weight`` [3E, E], ``in_proj_bias`` [3E], ``out_proj.weight``/``out_proj.bias``.

    A query row whose every key is masked behaves as in torch (its ``multi_head_attention_forward``): with
    ``need_weights=True`` the weights are computed by a plain softmax, so that row's weights and output are NaN;
    with ``need_weights=False`` (what ``TransformerEncoderLayer`` asks for) the attention is
    ``F.scaled_dot_product_attention``, whose row is zeros, so the output there is ``out_proj``'s bias and the
    gradients are finite. (torch's inference fast path, in eval without gradients on batch_first self-attention,
    gives NaN there instead.)
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

    def _check_inputs(self, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Query, key and value shapes as torch checks them (one line naming the shapes, where a mismatch would
        fail in a reshape inside); whether they are batched."""
        layout = _layout(self.batch_first)
        if q.ndim not in (2, 3):
            raise ShapeError(at(f"MultiheadAttention: query of shape {_dims(q)}, expected {layout} or [L, E] "
                                f"(unbatched)"))
        batched = q.ndim == 3
        if k.ndim != q.ndim or v.ndim != q.ndim:
            raise ShapeError(at(f"MultiheadAttention: query of shape {_dims(q)} is {'' if batched else 'un'}batched "
                                f"({q.ndim}-D), so must key and value be: got {_dims(k)} and {_dims(v)}"))
        for name, x in (("query", q), ("key", k), ("value", v)):
            if int(x.shape[-1]) != self.embed_dim:
                raise ShapeError(at(f"MultiheadAttention: {name} of shape {_dims(x)} has {int(x.shape[-1])} "
                                    f"features, expected embed_dim {self.embed_dim}"))
        if _dims(k) != _dims(v):
            raise ShapeError(at(f"MultiheadAttention: key of shape {_dims(k)} and value of shape {_dims(v)} differ; "
                                f"both are {_layout(self.batch_first, 'S') if batched else '[S, E]'}"))
        b = 0 if self.batch_first else 1
        if batched and int(q.shape[b]) != int(k.shape[b]):
            raise ShapeError(at(f"MultiheadAttention: query of shape {_dims(q)} and key of shape {_dims(k)} differ "
                                f"in batch size, {int(q.shape[b])} vs {int(k.shape[b])}"))
        return batched

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None, need_weights: bool = True,
                attn_mask: Any = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """Returns (output, attention weights or None). Inputs are [L, N, E] ([N, L, E] with batch_first), or one
        sequence [L, E] (the masks then [S] and [L, S] or [heads, L, S]), as in torch.

        The weights returned are those the output used: in training with dropout, the dropped-out ones (rows no
        longer summing to 1), as torch's. ``is_causal`` without ``attn_mask`` applies the causal mask (torch refuses
        it; with ``attn_mask`` it is a hint, and the mask given is used)."""
        q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
        batched = self._check_inputs(q, k, v)
        if not batched:  # one sequence: a batch of one, squeezed again at the end, as torch
            q, k, v = q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
        elif self.batch_first:
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        tgt, n, e = q.shape
        src = k.shape[0]
        h, d = self.num_heads, self.head_dim
        kpm, am = _checked_masks("MultiheadAttention", key_padding_mask, attn_mask, batched, int(n), int(tgt),
                                 int(src), h)
        wq, wk, wv = self.in_proj_weight.chunk(3, axis=0)
        bq = bk = bv = None
        if self.in_proj_bias is not None:
            bq, bk, bv = self.in_proj_bias.chunk(3, axis=0)

        def heads(x: Tensor, length: int) -> Tensor:  # [L, N, E] -> [N, heads, L, d]
            return x.reshape(length, n, h, d).permute(1, 2, 0, 3)

        # scaled before the heads are split (the same values): the projection's GEMM scales on its accumulator
        qh = heads(F.linear(q, wq, bq) * (1.0 / d ** 0.5), tgt)
        kh = heads(F.linear(k, wk, bk), src)
        vh = heads(F.linear(v, wv, bv), src)
        mask = None
        if am is None and is_causal and (need_weights or kpm is not None):
            am = arange(int(src)).reshape(1, int(src)) > arange(int(tgt)).reshape(int(tgt), 1)
        if am is not None:
            mask = _additive(am, qh.dtype)
            if mask.ndim == 3:  # [N * heads, L, S]
                mask = mask.reshape(n, h, tgt, src)
        if kpm is not None:
            kp = _additive(kpm, qh.dtype).reshape(n, 1, 1, src)
            mask = kp if mask is None else mask + kp
        p = self.dropout if self.training else 0.0
        if need_weights:  # torch's explicit path: the (dropped-out) weights are returned; a fully masked row is NaN
            scores = qh @ kh.mT
            weights = F.dropout((scores if mask is None else scores + mask).softmax(-1), p, True)
            ctx = weights @ vh
        else:  # torch's path through scaled_dot_product_attention: a fully masked row attends to nothing (zeros)
            ctx = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, dropout_p=p,
                                                 is_causal=is_causal and mask is None, scale=1.0)
        out = self.out_proj(ctx.permute(2, 0, 1, 3).reshape(tgt, n, e))      # [L, N, E]
        if not batched:
            out = out.squeeze(1)
        elif self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = weights.mean(1) if average_attn_weights else weights
        return out, weights if batched else weights.squeeze(0)


class TransformerEncoder(Module):
    """``num_layers`` copies of ``encoder_layer``, each with its own parameters (torch clones it too), then an
    optional final ``norm``. The masks and ``is_causal`` reach every layer; input and masks may be unbatched
    ([S, E], [S, S] and [S]), as in torch. Unlike torch's inference fast path (nested tensors, eval mode without
    gradients), positions a key-padding mask hides keep the values computed there instead of zeros."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = ModuleList([copy.deepcopy(encoder_layer) for _ in range(num_layers)])
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, src: Any, mask: Any = None, src_key_padding_mask: Any = None,
                is_causal: bool | None = None) -> Tensor:
        x = as_tensor(src)
        if len(self.layers):
            _check_self_attention_input("TransformerEncoder", x, self.layers[0].self_attn, mask, src_key_padding_mask,
                                        "mask")
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
    Parameter names match torch: self_attn.*, linear1, linear2, norm1, norm2. The input is [S, N, E] ([N, S, E] with
    ``batch_first``) or one sequence [S, E], as in torch. The attention runs as torch's does here, without weights
    (``F.scaled_dot_product_attention``): a query whose every key is masked gets zeros from it, not NaN.
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
        _check_self_attention_input("TransformerEncoderLayer", x, self.self_attn, src_mask, src_key_padding_mask,
                                    "src_mask")
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
