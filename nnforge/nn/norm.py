"""LayerNorm, RMSNorm, GroupNorm and BatchNorm1d.

BatchNorm's running statistics are buffers updated with ``assign`` in training mode, so inside ``nf.loop`` or a
compiled training step they are carried state like the parameters, not values frozen at trace time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import ShapeError, at
from ..tensor import Tensor
from . import functional as F
from . import init
from .module import Module, Parameter


class LayerNorm(Module):
    """Normalizes over the trailing ``normalized_shape`` axes; per-element affine weight and bias."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.register_parameter("weight", Parameter(init.ones(shape)) if elementwise_affine else None)
        self.register_parameter("bias", Parameter(init.zeros(shape)) if elementwise_affine and bias else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """Root-mean-square normalization over the trailing ``normalized_shape`` axes (no mean subtracted, no bias),
    with a per-element weight; ``eps=None`` is the machine epsilon of the input's dtype, as torch.nn.RMSNorm."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True):
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.normalized_shape, self.eps, self.elementwise_affine = shape, eps, elementwise_affine
        self.register_parameter("weight", Parameter(init.ones(shape)) if elementwise_affine else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Normalizes each sample's ``[N, C, ...]`` channels in ``num_groups`` groups, with a per-channel affine
    weight and bias (a conv front end's norm where batch statistics would couple the samples)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True):
        super().__init__()
        if num_groups <= 0 or num_channels % num_groups:
            raise ShapeError(at(f"GroupNorm: {num_channels} channels do not split into {num_groups} groups"))
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.register_parameter("weight", Parameter(init.ones((num_channels,))) if affine else None)
        self.register_parameter("bias", Parameter(init.zeros((num_channels,))) if affine else None)

    def forward(self, x: Tensor) -> Tensor:
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


def _register_channel_state(m: Module, channels: int, affine: bool, tracked: bool) -> None:
    """A batch or instance norm's state under torch's names: a per-channel weight and bias (``affine``), the
    running mean and variance and the batch count (``tracked``); None where absent, as torch registers them."""
    m.register_parameter("weight", Parameter(init.ones((channels,))) if affine else None)
    m.register_parameter("bias", Parameter(init.zeros((channels,))) if affine else None)
    m.register_buffer("running_mean", Tensor(init.zeros((channels,))) if tracked else None)
    m.register_buffer("running_var", Tensor(init.ones((channels,))) if tracked else None)
    m.register_buffer("num_batches_tracked", Tensor(np.array(0, np.int64)) if tracked else None)


class InstanceNorm1d(Module):
    """Normalizes each sample's channel over its positions (``[N, C, L]`` or ``[C, L]``), torch's settings:
    ``affine`` adds a per-channel weight and bias; ``track_running_stats`` keeps running statistics, updated in
    training and used in eval mode (``momentum=None`` leaves them as they are, as torch does)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = False,
                 track_running_stats: bool = False):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _register_channel_state(self, num_features, affine, track_running_stats)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in (2, 3) or ((self.affine or self.track_running_stats)
                                    and int(x.shape[-2]) != self.num_features):
            raise ShapeError(at(f"InstanceNorm1d({self.num_features}): expected [N, {self.num_features}, L] or "
                             f"[{self.num_features}, L] input, got {list(map(int, x.shape))}"))
        use_input_stats = self.training or not self.track_running_stats
        if use_input_stats and self.training and int(x.shape[-1]) <= 1:
            raise ValueError(f"InstanceNorm1d: expected more than 1 position per channel in training, got input "
                             f"{list(map(int, x.shape))}")
        batched = x if x.ndim == 3 else x.unsqueeze(0)
        y = F.instance_norm(batched, self.running_mean, self.running_var, self.weight, self.bias, use_input_stats,
                            self.momentum if self.momentum is not None else 0.0, self.eps)
        return y if x.ndim == 3 else y.squeeze(0)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(Module):
    """Batch normalization over [N, C] or [N, C, L] inputs, per channel C.

    Training mode normalizes with the batch's biased variance and updates ``running_mean``/``running_var``
    (the latter with the unbiased variance) by ``momentum``, or by a cumulative average when ``momentum`` is
    None; eval mode normalizes with the running statistics. Matches torch.nn.BatchNorm1d.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True):
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        _register_channel_state(self, num_features, affine, track_running_stats)

    def forward(self, x: Tensor) -> Tensor:
        if x.ndim not in (2, 3) or int(x.shape[1]) != self.num_features:
            raise ShapeError(at(f"BatchNorm1d({self.num_features}): expected [N, {self.num_features}] or "
                             f"[N, {self.num_features}, L] input, got {list(map(int, x.shape))}"))
        axes = (0,) if x.ndim == 2 else (0, 2)
        shape = (self.num_features,) if x.ndim == 2 else (self.num_features, 1)
        use_batch = self.training or not self.track_running_stats
        if use_batch:
            mean = x.mean(axes)
            d = x - mean.reshape(*shape)
            var = (d * d).mean(axes)
            if self.training and self.track_running_stats:
                self._update_running(mean, var, x)
        else:
            mean, var = self.running_mean, self.running_var
            d = x - mean.reshape(*shape)
        y = d * (var + self.eps).rsqrt().reshape(*shape)
        if self.weight is not None:
            y = y * self.weight.reshape(*shape)
        if self.bias is not None:
            y = y + self.bias.reshape(*shape)
        return y

    def _update_running(self, mean: Tensor, var: Tensor, x: Tensor) -> None:
        count = int(x.shape[0]) * (int(x.shape[2]) if x.ndim == 3 else 1)
        if count <= 1:
            raise ValueError(f"BatchNorm1d: expected more than 1 value per channel in training, got input "
                             f"{list(map(int, x.shape))}")
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        if self.momentum is None:  # cumulative moving average
            m = 1.0 / self.num_batches_tracked.cast(self.running_mean.dtype)
        else:
            m = self.momentum
        unbiased = var.detach() * (count / (count - 1))
        self.running_mean.assign(self.running_mean * (1 - m) + mean.detach() * m)
        self.running_var.assign(self.running_var * (1 - m) + unbiased * m)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")
