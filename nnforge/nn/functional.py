"""Stateless layer functions (the ``torch.nn.functional`` of nnforge), composed from core tensor ops.

Everything here is a composition of the small IR op set, so autodiff and every backend get it for free. A table
lookup (``embedding``) is a gather, whose gradient is a scatter-add. The loss functions live in ``losses.py`` and
are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

from .. import dtypes
from ..errors import DTypeError, ShapeError, at
from ..indexing import index_select
from ..tensor import (
    Tensor,
    _root_or_zero,
    arange,
    as_tensor,
    broadcast_shapes,
    clamp,
    composed,
    concat,
    full,
    gelu,
    minimum,
    relu,
    sigmoid,
    silu,
    stack,
    tanh,
    where,
    zeros_like,
)
from ..tensor import rand as _rand
from .crf import crf_logz, crf_predecessors, crf_viterbi, ctc_crf_loss
from .losses import cross_entropy, ctc_loss, mse_loss, nll_loss

__all__ = [
    "alpha_dropout", "celu", "conv1d", "conv_transpose1d", "crf_logz", "crf_predecessors", "crf_viterbi",
    "cross_entropy", "ctc_crf_loss", "ctc_loss", "dropout", "dropout1d", "elu", "embedding", "gelu", "glu",
    "hardshrink", "hardsigmoid", "hardswish", "hardtanh", "instance_norm", "layer_norm", "leaky_relu", "linear",
    "logsigmoid", "lp_pool1d", "mish", "mse_loss", "nll_loss", "one_hot", "pad", "prelu", "relu", "relu6", "rms_norm",
    "scaled_dot_product_attention", "selu", "sigmoid", "silu", "softmin", "softplus", "softshrink", "softsign",
    "swish", "tanh", "tanhshrink", "threshold",
]

swish = silu


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x @ weight.T + bias`` with torch's [out_features, in_features] weight layout."""
    x = as_tensor(x)
    if x.ndim == 0 or weight.ndim not in (1, 2) or int(x.shape[-1]) != int(weight.shape[-1]):
        raise ShapeError(at(f"linear: input {list(map(int, x.shape))} does not end with the weight's in_features "
                            f"{int(weight.shape[-1])} (weight [out_features, in_features] = "
                            f"{list(map(int, weight.shape))})"))
    y = x @ weight.T
    return y + bias if bias is not None else y


def one_hot(index: Any, num_classes: int, dtype: Any = dtypes.float32) -> Tensor:
    """[..., num_classes] indicator of integer ``index``; out-of-range indices give an all-zero row."""
    index = as_tensor(index)
    if index.dtype.is_float:
        raise DTypeError(at(f"one_hot: needs integer indices, got {index.dtype}"))
    return (index.unsqueeze(-1) == arange(num_classes)).cast(dtype)


def embedding(index: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` picked by ``index`` (any shape): one gather, a load per element in compiled code, where a
    one-hot matmul cost num_embeddings multiply-adds per element; the weight's gradient is a scatter-add."""
    index = as_tensor(index)
    if index.dtype.is_float:
        raise DTypeError(at(f"embedding: needs integer indices, got {index.dtype}"))
    rows = index_select(weight, 0, index.reshape(-1))
    return rows.reshape(*index.shape, weight.shape[1])


def dropout(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1/(1-p); the identity when not training.

    Inside a traced program the mask is a random node, so every execution (every loop iteration) draws anew.
    """
    return _scaled_kept(x, p, x.shape) if _drops("dropout", p, training) else x


def _drops(name: str, p: float, training: bool) -> bool:
    """Whether a dropout of probability ``p`` (checked) drops anything."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}: probability must be in [0, 1], got {p}")
    return training and p > 0.0


def _scaled_kept(x: Tensor, p: float, shape: Sequence[Any]) -> Tensor:
    """``x`` where a uniform draw of ``shape`` (broadcast to x) passes ``p``, scaled by 1/(1-p); 0 elsewhere."""
    if p == 1.0:
        return x * 0
    keep = _rand(*shape, dtype=x.dtype if x.dtype.is_float else dtypes.float32) >= p
    return where(keep, x * (1.0 / (1.0 - p)), 0.0)


def dropout1d(x: Tensor, p: float = 0.5, training: bool = True) -> Tensor:
    """Whole channels of ``[N, C, L]`` (or ``[C, L]``) zeroed with probability ``p``, the rest scaled by
    1/(1-p); the identity when not training."""
    if x.ndim not in (2, 3):
        raise ShapeError(at(f"dropout1d: expected [N, C, L] or [C, L] input, got {list(map(int, x.shape))}"))
    return _scaled_kept(x, p, (*x.shape[:-1], 1)) if _drops("dropout1d", p, training) else x


# SELU's negative saturation, -scale * alpha: what alpha_dropout sets a dropped element to
_SELU_SATURATION = -1.0507009873554804934193349852946 * 1.6732632423543772848170429916717


def alpha_dropout(x: Tensor, p: float = 0.5, training: bool = False) -> Tensor:
    """Dropout for SELU networks: dropped elements set to SELU's negative saturation, then an affine map that
    keeps the mean and variance (torch's); the identity when not training."""
    if not _drops("alpha_dropout", p, training):
        return x
    if p == 1.0:
        return x * 0
    a = ((1 - p) * (1 + p * _SELU_SATURATION ** 2)) ** -0.5
    keep = _rand(*x.shape, dtype=x.dtype) >= p
    return where(keep, x, _SELU_SATURATION) * a - a * _SELU_SATURATION * p


def instance_norm(x: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """torch's instance_norm over ``[N, C, ...]``: each sample's channel normalized over its positions (biased
    variance), then a per-channel weight and bias. With ``use_input_stats`` the running statistics given are
    updated in place by ``momentum`` with the batch's mean of each instance's mean and unbiased variance; without
    it they normalize instead."""
    if x.ndim < (3 if use_input_stats else 2):  # statistics of an instance need its positions
        raise ShapeError(at(f"instance_norm: needs [N, C, ...]{'' if use_input_stats else ' or [N, C]'}, got "
                         f"{list(map(int, x.shape))}"))
    channels = int(x.shape[1])
    if not use_input_stats and 0 in tuple(map(int, x.shape)):
        return x * 1.0  # nothing to normalize (torch's result, whatever the statistics' size)
    if use_input_stats:
        if running_mean is not None or running_var is not None:
            flat = x.reshape(x.shape[0], channels, -1).detach()
            count = int(flat.shape[-1])
            mean = flat.mean(-1)
            d = flat - mean.unsqueeze(-1)
            if running_mean is not None:
                running_mean.assign(running_mean * (1 - momentum) + mean.mean(0) * momentum)
            if running_var is not None:
                unbiased = (d * d).sum(-1) / max(count - 1, 1)
                running_var.assign(running_var * (1 - momentum) + unbiased.mean(0) * momentum)
        return group_norm(x, channels, weight, bias, eps)
    if running_mean is None or running_var is None:
        raise ValueError("instance_norm: use_input_stats=False normalizes with running_mean and running_var: "
                         "give both")
    shape = (channels, *(1,) * (x.ndim - 2))
    y = (x - running_mean.reshape(*shape)) * (running_var + eps).rsqrt().reshape(*shape)
    if weight is not None:
        y = y * weight.reshape(*shape)
    return y + bias.reshape(*shape) if bias is not None else y


def layer_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing ``normalized_shape`` axes with the biased variance (as torch does)."""
    shape = tuple(int(d) for d in normalized_shape)
    if tuple(int(d) for d in x.shape[x.ndim - len(shape):]) != shape:
        raise ShapeError(at(f"layer_norm: input {list(map(int, x.shape))} does not end with {list(shape)}"))
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


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize each sample's channels ``[N, C, ...]`` in ``num_groups`` groups (statistics over a group's
    channels and all positions, biased variance), then a per-channel affine weight and bias, as torch."""
    if x.ndim < 2:
        raise ShapeError(at(f"group_norm: needs [N, C, ...], got {list(map(int, x.shape))}"))
    channels = int(x.shape[1])
    if num_groups <= 0 or channels % num_groups:
        raise ShapeError(at(f"group_norm: {channels} channels of {list(map(int, x.shape))} do not split into "
                         f"{num_groups} groups"))
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(map(int, p.shape)) != (channels,):
            raise ShapeError(at(f"group_norm: {name} {list(map(int, p.shape))} is not one per channel ({channels})"))
    n, size = x.shape[0], channels // num_groups
    groups = x.reshape(n, num_groups, -1)
    mean = groups.mean(-1, keepdims=True)
    d = groups - mean
    rstd = ((d * d).mean(-1, keepdims=True) + eps).rsqrt()
    if weight is None and bias is None:
        return (d * rstd).reshape(*x.shape)
    # torch's form: x * scale + shift per (sample, channel), so an infinite weight gives torch's NaNs
    scale = rstd.expand(n, num_groups, size)
    if weight is not None:
        scale = scale * weight.reshape(num_groups, size)
    shift = -mean * scale
    if bias is not None:
        shift = shift + bias.reshape(num_groups, size)
    per_channel = (n, channels, *[1] * (x.ndim - 2))
    return x * scale.reshape(*per_channel) + shift.reshape(*per_channel)


def rms_norm(x: Tensor, normalized_shape: Sequence[int], weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` axes, as torch: ``eps``
    defaults to the machine epsilon of ``x``'s dtype, and half precision is computed in float32 (its squares
    would overflow past 256) and rounded once."""
    shape = tuple(int(d) for d in normalized_shape)
    if tuple(int(d) for d in x.shape[x.ndim - len(shape):]) != shape:
        raise ShapeError(at(f"rms_norm: input {list(map(int, x.shape))} does not end with {list(shape)}"))
    if weight is not None and tuple(int(d) for d in weight.shape) != shape:
        raise ShapeError(at(f"rms_norm: weight {list(map(int, weight.shape))} is not the normalized shape "
                         f"{list(shape)}"))
    eps = float(ml_dtypes.finfo(x.dtype.np).eps) if eps is None else eps
    xf = x.cast(x.dtype.accumulator)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    y = xf * ((xf * xf).mean(axes, keepdims=True) + eps).rsqrt()
    if weight is not None:
        y = y * weight.cast(xf.dtype)
    return y.cast(x.dtype)


# ---- activations: torch's formulas, NaN where torch gives NaN, torch's gradient at every kink -------------------
# A branch that ``where`` does not take still gets a zero cotangent, and 0 * inf is NaN: a branch that overflows
# where it is not taken (exp of a large input) reads a safe stand-in there instead.

def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    return where(x > 0, x, x * negative_slope)


def _exp_below_zero(x: Tensor, alpha: float, rate: float = 1.0) -> Tensor:
    """x above 0, ``alpha * (exp(rate * x) - 1)`` at and below it (ELU's family), the exp on x's negative side
    only (0 above it, where it could overflow)."""
    return where(x > 0, x, alpha * (where(x > 0, 0.0, x) * rate).expm1())


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    return _exp_below_zero(x, alpha)


def selu(x: Tensor) -> Tensor:
    """``scale * elu(x, alpha)`` with the self-normalizing constants."""
    return 1.0507009873554804934193349852946 * _exp_below_zero(x, 1.6732632423543772848170429916717)


def celu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """x above 0, ``alpha * (exp(x / alpha) - 1)`` at and below it."""
    if alpha == 0:
        raise ValueError("celu: alpha must not be 0")
    return _exp_below_zero(x, alpha, 1.0 / alpha)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, and x itself where ``beta * x`` passes ``threshold`` (as torch)."""
    bx = x * beta
    linear = bx > threshold
    return where(linear, x, where(linear, 0.0, bx).exp().log1p() * (1.0 / beta))


def logsigmoid(x: Tensor) -> Tensor:
    """``log(sigmoid(x))`` as ``min(x, 0) - log(1 + exp(-|x|))``: no overflow on either side."""
    return minimum(x, 0.0) - (-x.abs()).exp().log1p()


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """x clipped to [min_val, max_val]; unlike ``clamp``, no gradient at the bounds themselves (torch's)."""
    if min_val > max_val:
        raise ValueError(f"hardtanh: min_val {min_val} is above max_val {max_val}")
    return where(x <= min_val, min_val, where(x >= max_val, max_val, x))


def relu6(x: Tensor) -> Tensor:
    return hardtanh(x, 0.0, 6.0)


def hardsigmoid(x: Tensor) -> Tensor:
    """``(x + 3) / 6`` clipped to [0, 1]."""
    return where(x <= -3, 0.0, where(x >= 3, 1.0, (x + 3) / 6))


def hardswish(x: Tensor) -> Tensor:
    """``x * clip(x + 3, 0, 6) / 6``, with torch's gradient (the clip passes it on its closed interval)."""
    return x * clamp(x + 3, 0.0, 6.0) / 6


def softsign(x: Tensor) -> Tensor:
    return x / (1 + x.abs())


def mish(x: Tensor) -> Tensor:
    """``x * tanh(softplus(x))``."""
    return x * softplus(x).tanh()


def prelu(x: Tensor, weight: Tensor) -> Tensor:
    """x above 0, ``weight * x`` at and below it; ``weight`` one slope, or one per channel (axis 1, as torch)."""
    weight = as_tensor(weight)
    if weight.ndim > 1:
        raise ShapeError(at(f"prelu: weight must be 0-d or 1-d (one slope, or one per channel), got shape "
                         f"{list(map(int, weight.shape))}"))
    slopes = int(weight.numel())
    if slopes == 1:
        weight = weight.reshape(())
    else:
        if x.ndim < 2 or int(x.shape[1]) != slopes:
            raise ShapeError(at(f"prelu: {slopes} slopes for an input of shape {list(map(int, x.shape))}: one per "
                             "channel needs that many channels in axis 1"))
        weight = weight.reshape(slopes, *(1,) * (x.ndim - 2))
    return where(x > 0, x, weight * x)


def threshold(x: Tensor, threshold: float, value: float) -> Tensor:
    """x above ``threshold``, ``value`` at and below it (NaN stays NaN, as torch)."""
    return where(x <= threshold, value, x)


def softmin(x: Tensor, dim: int) -> Tensor:
    return (-x).softmax(dim)


def tanhshrink(x: Tensor) -> Tensor:
    return x - x.tanh()


def softshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """x moved ``lambd`` towards 0, and 0 within ``lambd`` of it."""
    if lambd < 0:
        raise ValueError(f"softshrink: lambd must be >= 0, got {lambd}")
    return where(x > lambd, x - lambd, where(x < -lambd, x + lambd, x * 0.0))


def hardshrink(x: Tensor, lambd: float = 0.5) -> Tensor:
    """0 within ``lambd`` of 0, x elsewhere (NaN stays NaN, as torch)."""
    return where((x >= -lambd) & (x <= lambd), 0.0, x)


def glu(x: Tensor, dim: int = -1) -> Tensor:
    """The gated linear unit: the first half of ``dim`` times the sigmoid of the second."""
    axis = dim + x.ndim if dim < 0 else dim
    if not 0 <= axis < x.ndim:
        raise ShapeError(at(f"glu: dim {dim} is out of range for an input of {x.ndim} dimensions"))
    if int(x.shape[axis]) % 2:
        raise ShapeError(at(f"glu: dimension {dim} of input {list(map(int, x.shape))} must have an even size to be "
                         f"halved"))
    a, b = x.chunk(2, axis)
    return a * b.sigmoid()


_PAD_MODES = ("constant", "reflect", "replicate", "circular")


def pad(x: Tensor, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Tensor:
    """torch.nn.functional.pad: ``pad`` holds (before, after) sizes from the last dimension backwards, as torch
    (``Tensor.pad`` takes numpy's order instead). ``constant`` fills with ``value`` (0 by default) and crops where
    a size is negative; ``reflect`` mirrors without repeating the edge, ``replicate`` repeats it, ``circular``
    wraps around. Every mode is slices, flips and a concatenation, so its gradient is their transpose."""
    x = as_tensor(x)
    sizes = [int(p) for p in pad]
    if mode not in _PAD_MODES:
        raise ValueError(f"pad: mode must be one of {', '.join(_PAD_MODES)}, got {mode!r}")
    if mode != "constant" and value is not None:
        raise ValueError(f"pad: mode {mode!r} takes no value (only 'constant' fills)")
    if len(sizes) % 2:
        raise ValueError(f"pad: needs (before, after) pairs, last dimension first; got {len(sizes)} sizes")
    if len(sizes) // 2 > x.ndim:
        raise ShapeError(at(f"pad: {len(sizes)} sizes pad {len(sizes) // 2} dimensions, the input "
                         f"{list(map(int, x.shape))} has {x.ndim}"))
    for i in range(len(sizes) // 2):
        axis = x.ndim - 1 - i
        x = _pad_axis(x, axis, sizes[2 * i], sizes[2 * i + 1], mode, 0.0 if value is None else value)
    return x


def _pad_axis(x: Tensor, axis: int, lo: int, hi: int, mode: str, value: float) -> Tensor:
    n = int(x.shape[axis])

    def part(start: int, stop: int, step: int = 1) -> Tensor:
        return x[(slice(None),) * axis + (slice(start, stop, step),)]

    if mode == "constant":
        if n + min(lo, 0) + min(hi, 0) < 0:
            raise ShapeError(at(f"pad: cropping {-min(lo, 0)} and {-min(hi, 0)} from dimension {axis} of size {n} "
                             f"leaves less than nothing"))
        x = part(-min(lo, 0), n + min(hi, 0)) if min(lo, hi) < 0 else x
        pairs = [(max(lo, 0), max(hi, 0)) if k == axis else (0, 0) for k in range(x.ndim)]
        return x.pad(pairs, value)
    if lo < 0 or hi < 0:
        raise ValueError(f"pad: mode {mode!r} takes no negative sizes, got ({lo}, {hi}) for dimension {axis}")
    if not lo and not hi:
        return x
    if n == 0:
        raise ShapeError(at(f"pad: {mode} padding of an empty dimension ({axis}) has nothing to repeat"))
    if (mode == "reflect" and max(lo, hi) >= n) or (mode == "circular" and max(lo, hi) > n):
        rule = "smaller than" if mode == "reflect" else "at most"
        raise ShapeError(at(f"pad: {mode} padding of ({lo}, {hi}) on dimension {axis} of size {n}: each side must be "
                         f"{rule} the size"))
    if mode == "reflect":  # x[lo], ..., x[1] before; x[n-2], ..., x[n-1-hi] after
        before, after = part(lo, 0, -1), part(n - 2, n - 2 - hi if n - 2 - hi >= 0 else None, -1)
    elif mode == "replicate":
        reps = lambda k, at: part(at, at + 1).expand(  # noqa: E731
            *[k if a == axis else d for a, d in enumerate(x.shape)])
        before, after = reps(lo, 0), reps(hi, n - 1)
    else:
        before, after = part(n - lo, n), part(0, hi)
    return concat([p for p, k in ((before, lo), (x, n), (after, hi)) if k], axis)


# ---- pooling along the last axis: one strided slice per kernel tap, combined elementwise -------------------------
# The taps fuse into whatever reads the pool (one kernel, no window copies); their gradient is the slices'.

def _single(v: Any) -> int:
    """A 1-d layer's size as a number: torch's layers keep sizes as ints or 1-tuples."""
    return int(v[0]) if isinstance(v, (tuple, list)) else int(v)


def _pool_taps(x: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool,
               fill: float, name: str) -> tuple[list[Tensor], Any, Any]:
    """The kernel's taps (tap j: the padded input at ``start + j * dilation`` for each output position), the
    number of outputs and the first window's start (``-padding``)."""
    x = as_tensor(x)
    k, p, d = _single(kernel_size), _single(padding), _single(dilation)
    s = k if stride is None or stride == () or stride == [] else _single(stride)
    if x.ndim < 2 or int(x.shape[-1]) == 0:
        raise ShapeError(at(f"{name}: needs [N, C, L] or [C, L] with L > 0, got {list(map(int, x.shape))}"))
    if not x.dtype.is_float:
        raise DTypeError(at(f"{name}: needs a floating-point input, got {x.dtype}"))
    if k < 1 or s < 1 or d < 1 or p < 0:
        raise ValueError(f"{name}: kernel_size {k}, stride {s} and dilation {d} must be >= 1, padding {p} >= 0")
    if 2 * p > k:
        raise ValueError(f"{name}: padding {p} is more than half the kernel size {k} (as torch refuses)")
    length, span = x.shape[-1], d * (k - 1) + 1
    room = length + 2 * p - span
    if int(room) < 0:
        raise ShapeError(at(f"{name}: a window of {span} does not fit the input's last axis of {int(length)} padded "
                         f"by {p} on each side ({list(map(int, x.shape))})"))
    out = (room + s - 1) // s + 1 if ceil_mode else room // s + 1
    if ceil_mode and int((out - 1) * s) >= int(length + p):  # torch: the last window starts inside the input
        out = out - 1
    right = s * (out - 1) + span - length - p
    pads = [(0, 0)] * (x.ndim - 1) + [(p, right if int(right) > 0 else 0)]
    padded = x.pad(pads, fill) if p or int(right) > 0 else x
    taps = [padded[..., j * d:j * d + s * (out - 1) + 1:s] for j in range(k)]
    return taps, out, s


def max_pool1d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """torch's max_pool1d over the last axis (padding reads -inf); with ``return_indices`` also each maximum's
    position in the input (int64, the first of equal values)."""
    taps, out, s = _pool_taps(x, kernel_size, stride, padding, dilation, ceil_mode, float("-inf"), "max_pool1d")
    y = taps[0]
    for t in taps[1:]:
        y = y.maximum(t)
    if not return_indices:
        return y
    tap = stack(taps, -1).argmax(-1)
    return y, arange(out) * s - _single(padding) + tap * _single(dilation)


def avg_pool1d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """torch's avg_pool1d over the last axis: each window's sum over its size, padding counted in it unless
    ``count_include_pad=False``, a window past the padding (``ceil_mode``) never."""
    taps, out, s = _pool_taps(x, kernel_size, stride, padding, 1, ceil_mode, 0.0, "avg_pool1d")
    total = taps[0]
    for t in taps[1:]:
        total = total + t
    k, p, length = _single(kernel_size), _single(padding), x.shape[-1]
    if count_include_pad and int(s * (out - 1) + k) <= int(length + 2 * p):
        return total * (1.0 / k)
    starts = arange(out) * s - p
    ends = minimum(starts + k, length + p)
    if not count_include_pad:
        starts, ends = starts.maximum(0), minimum(ends, length)
    return total / (ends - starts).cast(total.dtype)


def lp_pool1d(x: Tensor, norm_type: float, kernel_size: Any, stride: Any = None, ceil_mode: bool = False) -> Tensor:
    """torch's lp_pool1d: each window's ``norm_type``-norm, (sum x^p)^(1/p), by torch's formula (an average of
    x^p times the window's size, its negative sums taken as 0)."""
    k = _single(kernel_size)
    out = avg_pool1d(as_tensor(x) ** norm_type, k, stride, 0, ceil_mode)
    return (out.sign() * relu(out.abs()) * k) ** (1.0 / norm_type)


def _adaptive_windows(length: int, out: int) -> list[tuple[int, int]]:
    return [(i * length // out, -(-(i + 1) * length // out)) for i in range(out)]


def adaptive_avg_pool1d(x: Tensor, output_size: Any) -> Tensor:
    """torch's adaptive_avg_pool1d: ``output_size`` windows over the last axis, window i from floor(i L / n) to
    ceil((i + 1) L / n); one reshape and mean where n divides L."""
    return _adaptive(as_tensor(x), _single(output_size), "adaptive_avg_pool1d", lambda w: w.mean(-1))


def adaptive_max_pool1d(x: Tensor, output_size: Any, return_indices: bool = False) -> Tensor:
    """torch's adaptive_max_pool1d (windows as ``adaptive_avg_pool1d``'s); ``return_indices`` is not supported."""
    if return_indices:
        raise ValueError("adaptive_max_pool1d: return_indices is not supported (max_pool1d has it)")
    return _adaptive(as_tensor(x), _single(output_size), "adaptive_max_pool1d", lambda w: w.max(-1))


def _adaptive(x: Tensor, out: int, name: str, reduce: Any) -> Tensor:
    if x.ndim < 2 or int(x.shape[-1]) == 0 or out < 1:
        raise ShapeError(at(f"{name}: needs [N, C, L] or [C, L] with L > 0, and an output size >= 1, got "
                         f"{list(map(int, x.shape))} and {out}"))
    length = x.shape[-1]
    if int(length) % out == 0:
        return reduce(x.reshape(*x.shape[:-1], out, length // out))
    return stack([reduce(x[..., a:b]) for a, b in _adaptive_windows(int(length), out)], -1)


@composed("vector_norm")
def vector_norm(x: Tensor, ord: float = 2.0, dim: Any = None, keepdim: bool = False) -> Tensor:
    """torch.linalg.vector_norm: 2, 1, inf (the largest magnitude), -inf (the smallest), 0 (the count of
    non-zeros) or any other power ``ord``, over ``dim`` (all axes when None). The gradient at a zero vector is 0,
    as torch's, not 0 * inf = NaN (a zero-padded row must not poison training)."""
    a = as_tensor(x).abs()
    if ord == 2:
        return _root_or_zero((a * a).sum(dim, keepdims=keepdim), 0.5)
    if ord == 1:
        return a.sum(dim, keepdims=keepdim)
    if ord == math.inf:
        return a.max(dim, keepdims=keepdim)
    if ord == -math.inf:
        return a.min(dim, keepdims=keepdim)
    if ord == 0:
        return (a != 0).cast(a.dtype).sum(dim, keepdims=keepdim)
    return _root_or_zero((a ** ord).sum(dim, keepdims=keepdim), 1.0 / ord)


@composed("normalize")
def normalize(x: Tensor, p: float = 2.0, dim: int = 1, eps: float = 1e-12) -> Tensor:
    """torch's normalize: ``x`` over its ``p``-norm (``vector_norm``'s) along ``dim``, the norm held at ``eps``
    or above."""
    x = as_tensor(x)
    return x / vector_norm(x, p, dim, keepdim=True).clamp(eps, None)


def interpolate(x: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                antialias: bool = False) -> Tensor:
    """torch's interpolate along the last axis of ``[N, C, L]``: ``nearest``, ``nearest-exact`` or ``linear``
    (``align_corners`` as torch). Each output reads input positions computed from the sizes: a gather, and for
    ``linear`` a weighted pair of them, so the gradient is a scatter-add."""
    x = as_tensor(x)
    if x.ndim != 3:
        raise ShapeError(at(f"interpolate: needs [N, C, L] (the 1-d modes), got {list(map(int, x.shape))}"))
    if mode not in ("nearest", "nearest-exact", "linear"):
        raise ValueError(f"interpolate: mode {mode!r} is not supported (nearest, nearest-exact, linear are)")
    if antialias:
        raise ValueError("interpolate: antialias applies to torch's 2-d modes only")
    if align_corners is not None and mode != "linear":
        raise ValueError("interpolate: align_corners only applies to mode='linear' (as torch)")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give exactly one of size and scale_factor")
    length = int(x.shape[-1])
    if isinstance(scale_factor, (tuple, list)):
        (scale_factor,) = scale_factor
    factor = None if scale_factor is None else float(scale_factor)
    out = _single(size) if size is not None else math.floor(length * factor)
    if out < 1 or length < 1:
        raise ShapeError(at(f"interpolate: input length {length} to output length {out}: both must be >= 1"))
    # torch's source coordinate per output: 1 / scale_factor when given (and not recomputed), else in / out
    scale = 1.0 / factor if factor is not None and not recompute_scale_factor else length / out
    dst = np.arange(out, dtype=np.float64)
    if mode == "nearest":
        return index_select(x, 2, np.minimum(np.floor(dst * scale).astype(np.int64), length - 1))
    if mode == "nearest-exact":
        return index_select(x, 2, np.minimum(np.floor((dst + 0.5) * scale).astype(np.int64), length - 1))
    if align_corners:
        src = dst * ((length - 1) / (out - 1) if out > 1 else 0.0)
    else:
        src = np.maximum((dst + 0.5) * scale - 0.5, 0.0)
    lo = np.minimum(np.floor(src).astype(np.int64), length - 1)
    hi = np.minimum(lo + 1, length - 1)
    w = Tensor(src - lo, dtype=x.dtype)
    return index_select(x, 2, lo) * (1.0 - w) + index_select(x, 2, hi) * w


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


def _batched(x: Any, name: str) -> tuple[Tensor, bool]:
    """A convolution's input as [N, C, L], and whether it came as one sequence [C, L]."""
    x = as_tensor(x)
    if x.ndim not in (2, 3):
        raise ShapeError(at(f"{name}: expected [N, C, L] or [C, L] input, got {list(map(int, x.shape))}"))
    return (x.unsqueeze(0), True) if x.ndim == 2 else (x, False)


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
    x, unbatched = _batched(x, "conv1d")
    n, c_in, length = x.shape
    c_out, c_per_group, k = (int(d) for d in weight.shape)
    if int(c_in) != c_per_group * groups:
        raise ShapeError(at(f"conv1d: input has {int(c_in)} channels, the weight expects {c_per_group * groups} "
                         f"({c_per_group} per group x {groups} groups)"))
    lo, hi = _conv_padding(padding, k, dilation, stride)
    if lo or hi:
        x = x.pad(((0, 0), (0, 0), (lo, hi)))
    span = dilation * (k - 1) + 1
    l_out = (length + lo + hi - span) // stride + 1
    if int(l_out) <= 0:
        raise ShapeError(at(f"conv1d: input length {int(length)} (padded {int(length) + lo + hi}) is shorter than the "
                         f"kernel's span {span}"))
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


def conv_transpose1d(x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: int = 1, padding: int = 0,
                     output_padding: int = 0, groups: int = 1, dilation: int = 1) -> Tensor:
    """The transpose of ``conv1d`` (its input gradient, as torch's) on [N, C_in, L] or [C_in, L] input; weight
    [C_in, C_out/groups, K]. The output is (L - 1) * stride - 2 * padding + dilation * (K - 1) + output_padding + 1
    long. Built as ``conv1d`` with stride 1 over the input spread ``stride`` apart (zeros between) and padded by
    the kernel's span, with the kernel flipped and its channel axes swapped: one convolution, its gradients
    those of the ops it is made of."""
    x, unbatched = _batched(x, "conv_transpose1d")
    c_in, c_per_group, k = (int(d) for d in weight.shape)
    if int(x.shape[1]) != c_in or c_in % groups:
        raise ShapeError(at(f"conv_transpose1d: input has {int(x.shape[1])} channels, the weight "
                         f"{list(map(int, weight.shape))} expects {c_in} (divisible by groups {groups})"))
    if not 0 <= output_padding < max(stride, dilation):
        raise ValueError(f"conv_transpose1d: output_padding {output_padding} must be smaller than stride {stride} "
                         f"or dilation {dilation}")
    n, length = x.shape[0], int(x.shape[2])
    if stride > 1 and length:  # x[..., s] at s * stride, zeros between
        spread = stack([x] + [zeros_like(x)] * (stride - 1), axis=3).reshape(n, c_in, length * stride)
        x = spread[:, :, :(length - 1) * stride + 1]
    # [C_in, C_out/g, K] -> [C_out, C_in/g, K], the taps in reverse order
    w = weight.reshape(groups, c_in // groups, c_per_group, k).transpose(1, 2).reshape(
        groups * c_per_group, c_in // groups, k).flip(2)
    lo = dilation * (k - 1) - padding
    hi = lo + output_padding
    y = conv1d(x.pad(((0, 0), (0, 0), (max(lo, 0), max(hi, 0)))), w, bias, 1, 0, dilation, groups)
    if lo < 0 or hi < 0:  # more padding than the kernel's span: the ends cut off instead
        y = y[:, :, max(-lo, 0):int(y.shape[2]) - max(-hi, 0)]
    return y.squeeze(0) if unbatched else y


def _shape_of(x: Tensor) -> list[int]:
    return [int(d) for d in x.shape]


def _broadcast(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """The broadcast of ``shapes`` (nnforge's one rule, ``broadcast_shapes``), or None where they do not
    broadcast."""
    try:
        return tuple(int(d) for d in broadcast_shapes(*(tuple(s) for s in shapes)))
    except ShapeError:
        return None


@composed("scaled_dot_product_attention")
def scaled_dot_product_attention(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """torch.nn.functional.scaled_dot_product_attention, the same signature and semantics (torch 2.13's):
    ``softmax(query @ keyᵀ * scale + bias) @ value`` over the last two axes, query [..., L, E], key [..., S, E],
    value [..., S, Ev] -> [..., L, Ev]; the leading axes broadcast.

    - ``attn_mask`` broadcasts to the scores' [..., L, S]. A bool mask says which scores take part (True = attend:
      the inverse of ``MultiheadAttention``'s masks); a float mask, of the query's dtype, is added to the scores.
    - ``is_causal``: query i attends to keys 0..i (the lower triangle of [L, S] from its top-left corner). Given
      ``attn_mask`` as well, both apply, as torch 2.13 does (its documentation still says they exclude each other).
    - ``scale`` defaults to 1/sqrt(E).
    - ``enable_gqa``: grouped-query attention, key and value with fewer heads (axis -3) than the query, each head
      shared by ``query heads / key heads`` consecutive query heads (torch's ``repeat_interleave``).
    - ``dropout_p`` > 0 drops attention probabilities in every mode, as torch's function does: a module passes
      ``p if self.training else 0.0``.

    A query row whose scores are all masked gives zeros, and passes no gradient, as torch's (its safe softmax):
    a left-padded sequence under a causal and a padding mask has such rows, and a plain softmax would make them
    0/0 = NaN, in the values and then in every gradient.
    """
    q, k, v = as_tensor(query), as_tensor(key), as_tensor(value)
    _check_attention(q, k, v, enable_gqa)
    if enable_gqa:  # each key/value head serves a group of consecutive query heads
        heads = int(q.shape[-3])
        k = k.repeat_interleave(heads // int(k.shape[-3]), -3) if int(k.shape[-3]) != heads else k
        v = v.repeat_interleave(heads // int(v.shape[-3]), -3) if int(v.shape[-3]) != heads else v
    length, source = int(q.shape[-2]), int(k.shape[-2])
    factor = 1.0 / math.sqrt(int(q.shape[-1])) if scale is None else float(scale)
    # the scale on q (L x E values) rather than on the scores (L x S); 1.0 (a caller that scaled q) costs nothing
    scores = (q if factor == 1.0 else q * factor) @ k.mT
    lowest = full((), float("-inf"), scores.dtype)
    if is_causal:
        keep = arange(source).reshape(1, source) <= arange(length).reshape(length, 1)
        scores = where(keep, scores, lowest)
    if attn_mask is not None:
        mask = _attention_mask(as_tensor(attn_mask), q, scores)
        scores = where(mask, scores, lowest) if mask.dtype == dtypes.bool_ else scores + mask
    # only a mask can remove every score of a row (a causal triangle keeps key 0 in each)
    attn = _safe_softmax(scores) if attn_mask is not None else scores.softmax(-1)
    return dropout(attn, dropout_p, True) @ v


def _safe_softmax(scores: Tensor) -> Tensor:
    """softmax over the last axis, a row of only -inf giving zeros (torch's ``_safe_softmax``). Its max shifts by 0
    instead of -inf (no -inf - -inf) and its sum, 0, divides as 1; a live row's sum is at least 1, so it is the
    plain softmax, and the shape is softmax's: exp, a row sum, a division the passes recognize."""
    if int(scores.shape[-1]) == 0:
        return scores.softmax(-1)
    top = scores.max(-1, keepdims=True).detach()
    e = (scores - where(top == float("-inf"), 0.0, top)).exp()
    total = e.sum(-1, keepdims=True)
    return e / where(total == 0.0, 1.0, total)


def _check_attention(q: Tensor, k: Tensor, v: Tensor, enable_gqa: bool) -> None:
    """torch's checks of query, key and value, one line each naming the shapes, where a wrong shape would
    otherwise fail in a matmul inside."""
    name = "scaled_dot_product_attention"
    qs, ks, vs = _shape_of(q), _shape_of(k), _shape_of(v)
    given = f"query {qs}, key {ks}, value {vs}"
    if min(q.ndim, k.ndim, v.ndim) < 2:
        raise ShapeError(at(f"{name}: query, key and value need at least 2 dimensions ([..., L, E], [..., S, E], "
                            f"[..., S, Ev]), got {given}"))
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_float:
        raise DTypeError(at(f"{name}: query, key and value must have one float dtype, got {q.dtype}, {k.dtype} "
                            f"and {v.dtype}"))
    if qs[-1] != ks[-1]:
        raise ShapeError(at(f"{name}: query and key differ in their last dimension E, {qs[-1]} vs {ks[-1]} "
                            f"({given})"))
    if ks[-2] != vs[-2]:
        raise ShapeError(at(f"{name}: key and value differ in source length S (dimension -2), {ks[-2]} vs "
                            f"{vs[-2]} ({given})"))
    if enable_gqa:
        if min(q.ndim, k.ndim, v.ndim) < 3:
            raise ShapeError(at(f"{name}: enable_gqa needs a heads dimension (-3) in query, key and value, got "
                                f"{given}"))
        if ks[-3] == 0 or vs[-3] == 0 or qs[-3] % ks[-3] or qs[-3] % vs[-3]:
            raise ShapeError(at(f"{name}: enable_gqa: the key's {ks[-3]} and the value's {vs[-3]} heads "
                                f"(dimension -3) must divide the query's {qs[-3]} ({given})"))
        ks[-3] = vs[-3] = qs[-3]
    if _broadcast(qs[:-2], ks[:-2], vs[:-2]) is None:
        hint = ("; key and value with fewer heads than the query need enable_gqa=True"
                if not enable_gqa and min(q.ndim, k.ndim) >= 3 and ks[-3] != qs[-3] else "")
        raise ShapeError(at(f"{name}: the leading dimensions of query {qs[:-2]}, key {ks[:-2]} and value "
                            f"{vs[:-2]} do not broadcast{hint}"))


def _attention_mask(mask: Tensor, q: Tensor, scores: Tensor) -> Tensor:
    """``attn_mask`` checked as torch checks it: bool or the query's float dtype, broadcasting to the scores'
    [..., L, S] without enlarging them."""
    name = "scaled_dot_product_attention"
    if mask.dtype != dtypes.bool_ and mask.dtype != q.dtype:
        raise DTypeError(at(f"{name}: attn_mask must be bool or the query's dtype {q.dtype}, got {mask.dtype}"))
    want = _shape_of(scores)
    if _broadcast(_shape_of(mask), want) != tuple(want):
        raise ShapeError(at(f"{name}: attn_mask of shape {_shape_of(mask)} does not broadcast to the attention "
                            f"scores' {want} ([..., target length L, source length S])"))
    return mask
