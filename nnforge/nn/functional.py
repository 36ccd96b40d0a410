"""Stateless layer functions (the ``torch.nn.functional`` of nnforge), composed from core tensor ops.

Everything here is a composition of the small IR op set, so autodiff and every backend get it for free. A table
lookup (``embedding``) is a gather, whose gradient is a scatter-add. The loss functions live in ``losses.py`` and
are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import dtypes
from ..errors import ShapeError
from ..indexing import index_select
from ..tensor import Tensor, arange, as_tensor, gelu, relu, sigmoid, silu, stack, tanh, where
from ..tensor import rand as _rand
from .crf import crf_logz, crf_predecessors, crf_viterbi, ctc_crf_loss
from .losses import cross_entropy, ctc_loss, mse_loss, nll_loss

__all__ = [
    "conv1d", "crf_logz", "crf_predecessors", "crf_viterbi", "cross_entropy", "ctc_crf_loss", "ctc_loss",
    "dropout", "embedding", "gelu", "layer_norm", "linear", "mse_loss",
    "nll_loss", "one_hot", "relu", "sigmoid", "silu", "swish", "tanh",
]

swish = silu


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with torch's [out_features, in_features] weight layout."""
    y = as_tensor(x) @ weight.T
    return y + bias if bias is not None else y


def one_hot(index: Any, num_classes: int, dtype: Any = dtypes.float32) -> Tensor:
    """[..., num_classes] indicator of integer ``index``; out-of-range indices give an all-zero row."""
    index = as_tensor(index)
    if index.dtype.is_float:
        raise TypeError(f"one_hot: needs integer indices, got {index.dtype}")
    return (index.unsqueeze(-1) == arange(num_classes)).cast(dtype)


def embedding(index: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` picked by ``index`` (any shape): one gather, a load per element in compiled code, where a
    one-hot matmul cost num_embeddings multiply-adds per element; the weight's gradient is a scatter-add."""
    index = as_tensor(index)
    if index.dtype.is_float:
        raise TypeError(f"embedding: needs integer indices, got {index.dtype}")
    rows = index_select(weight, 0, index.reshape(-1))
    return rows.reshape(*index.shape, weight.shape[1])


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p); the identity when not training.

    Inside a traced program the mask is a random node, so every execution (every loop iteration) draws anew.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout: probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p == 1.0:
        return x * 0
    keep = _rand(*x.shape, dtype=x.dtype if x.dtype.is_float else dtypes.float32) >= p
    return where(keep, x * (1.0 / (1.0 - p)), 0.0)


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing ``normalized_shape`` axes with the biased variance (as torch does)."""
    shape = tuple(int(d) for d in normalized_shape)
    if tuple(int(d) for d in x.shape[x.ndim - len(shape):]) != shape:
        raise ShapeError(f"layer_norm: input {list(map(int, x.shape))} does not end with {list(shape)}")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mean = x.mean(axes, keepdims=True)
    d = x - mean
    var = (d * d).mean(axes, keepdims=True)
    y = d * (var + eps).rsqrt()
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _conv_padding(padding: int | str, kernel: int, dilation: int, stride: int) -> tuple[int, int]:
    if padding == "valid":
        return 0, 0
    if padding == "same":
        if stride != 1:
            raise ValueError("conv1d: padding='same' needs stride 1 (as in torch)")
        total = dilation * (kernel - 1)
        return total // 2, total - total // 2
    if isinstance(padding, (tuple, list)):
        (padding,) = padding
    return int(padding), int(padding)


# Output channels from which conv1d multiplies with the positions as the GEMM's rows (see ``conv1d``): enough
# columns to fill a register tile several vectors wide on any SIMD target.
CHANNELS_AS_COLUMNS = 64


def conv1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int | str = 0,
           dilation: int = 1, groups: int = 1) -> Tensor:
    """1-d convolution (cross-correlation, like torch) on [N, C_in, L] or [C_in, L] input.

    Built as im2col: one strided slice per kernel tap, stacked, then one grouped matmul. The Python loop runs
    over kernel taps (a handful), never over the sequence. With few output channels the product is
    ``weight @ columns`` per sequence (the positions fill the GEMM's tiles); from ``CHANNELS_AS_COLUMNS`` on it is
    ``columns @ weightᵀ`` with a row per position, channels last: one GEMM over every sequence with the weight
    packed once, instead of packing the (stride-fold larger) columns. Its rows are time-major ([L_out, N]), the
    order a recurrent layer after it reads (``y.permute(2, 0, 1)``): the bias and an activation are then the
    GEMM's epilogue (``passes.reshapes``) and the layer reads the product as it is stored.
    """
    x = as_tensor(x)
    unbatched = x.ndim == 2
    if unbatched:
        x = x.unsqueeze(0)
    if x.ndim != 3:
        raise ShapeError(f"conv1d: expected [N, C, L] or [C, L] input, got {list(map(int, x.shape))}")
    n, c_in, length = x.shape
    c_out, c_per_group, k = (int(d) for d in weight.shape)
    if int(c_in) != c_per_group * groups:
        raise ShapeError(f"conv1d: input has {int(c_in)} channels, the weight expects {c_per_group * groups} "
                         f"({c_per_group} per group x {groups} groups)")
    lo, hi = _conv_padding(padding, k, dilation, stride)
    if lo or hi:
        x = x.pad(((0, 0), (0, 0), (lo, hi)))
    span = dilation * (k - 1) + 1
    l_out = (length + lo + hi - span) // stride + 1
    if int(l_out) <= 0:
        raise ShapeError(f"conv1d: input length {int(length)} (padded {int(length) + lo + hi}) is shorter than the "
                         f"kernel's span {span}")
    last = stride * (l_out - 1) + 1
    taps = [x[:, :, j * dilation: j * dilation + last: stride] for j in range(k)]
    if groups == 1 and c_out >= CHANNELS_AS_COLUMNS:
        # rows [L_out, N, C_in * K], time-major as a recurrent layer after it reads them, the weight's own order
        # (its transpose is a view): a row of the concat is C_in runs of K taps, each from one window of the input
        cols = stack([t.permute(2, 0, 1) for t in taps], axis=3).reshape(l_out, n, c_per_group * k)
        y = cols @ weight.reshape(c_out, c_per_group * k).mT
        if bias is not None:
            y = y + bias
        y = y.permute(1, 2, 0)
    else:
        cols = stack(taps, axis=2)  # [N, C_in, K, L_out]
        cols = cols.reshape(n, groups, c_per_group * k, l_out)
        w = weight.reshape(groups, c_out // groups, c_per_group * k)
        y = (w @ cols).reshape(n, c_out, l_out)
        if bias is not None:
            y = y + bias.reshape(c_out, 1)
    return y.squeeze(0) if unbatched else y


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                                 dropout_p: float = 0.0, training: bool = False) -> Tensor:
    """softmax(q k^T / sqrt(d) + mask) v over the last two axes; ``mask`` is additive (0 or -inf).

    Fully masked rows give NaN, as in torch.
    """
    scores = (q * (1.0 / math.sqrt(int(q.shape[-1])))) @ k.mT
    if mask is not None:
        scores = scores + mask
    attn = scores.softmax(-1)
    attn = dropout(attn, dropout_p, training)
    return attn @ v
