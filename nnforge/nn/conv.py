"""Conv1d: the front end of most basecallers, as im2col plus one grouped matmul."""

from __future__ import annotations

import math

from ..tensor import Tensor
from . import functional as F
from . import init
from .functional import _conv_padding, _single
from .module import Module, Parameter


class Conv1d(Module):
    """1-d convolution over [N, C_in, L] (or [C_in, L]); weight [C_out, C_in/groups, K] as in torch.

    ``padding`` is an int, "valid" or "same"; ``padding_mode`` "zeros" (inside the convolution), or "reflect",
    "replicate", "circular" (``F.pad`` of the input first, as torch does).
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int | str = 0, dilation: int = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros"):
        super().__init__()
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"Conv1d: padding_mode must be one of {', '.join(_PADDING_MODES)}, got {padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv1d: in_channels {in_channels} and out_channels {out_channels} must be divisible "
                             f"by groups {groups}")
        kernel_size = _single(kernel_size)
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.dilation, self.groups = _single(stride), padding, _single(dilation), groups
        self.padding_mode = padding_mode
        fan_in = in_channels // groups * kernel_size
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = Parameter(init.uniform((out_channels, in_channels // groups, kernel_size), bound))
        self.register_parameter("bias", Parameter(init.uniform((out_channels,), bound)) if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        if self.padding_mode == "zeros":
            return F.conv1d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)
        lo, hi = _conv_padding(self.padding, self.kernel_size, self.dilation, self.stride)
        x = F.pad(x, (lo, hi), self.padding_mode)
        return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding!r}, dilation={self.dilation}, groups={self.groups}, "
                f"bias={self.bias is not None}" + ("" if self.padding_mode == "zeros" else
                                                   f", padding_mode={self.padding_mode!r}"))


_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
