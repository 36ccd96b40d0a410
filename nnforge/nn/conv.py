"""Conv1d, the front end of most basecallers, as im2col plus one grouped matmul; ConvTranspose1d, its
transpose (an upsampling layer)."""

from __future__ import annotations

import math
from collections.abc import Sequence

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


class ConvTranspose1d(Module):
    """The transpose of a 1-d convolution over [N, C_in, L] (or [C_in, L]): weight [C_in, C_out/groups, K] and
    arguments as in torch; ``forward(x, output_size=None)`` picks the ``output_padding`` that gives the length
    asked for, as torch does."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1, padding: int = 0,
                 output_padding: int = 0, groups: int = 1, bias: bool = True, dilation: int = 1,
                 padding_mode: str = "zeros"):
        super().__init__()
        if padding_mode != "zeros":
            raise ValueError(f"ConvTranspose1d: only padding_mode='zeros' is supported (as in torch), got "
                             f"{padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"ConvTranspose1d: in_channels {in_channels} and out_channels {out_channels} must be "
                             f"divisible by groups {groups}")
        kernel_size, stride, dilation = _single(kernel_size), _single(stride), _single(dilation)
        padding, output_padding = _single(padding), _single(output_padding)
        if not 0 <= output_padding < max(stride, dilation):
            raise ValueError(f"ConvTranspose1d: output_padding {output_padding} must be smaller than stride "
                             f"{stride} or dilation {dilation}")
        self.in_channels, self.out_channels, self.kernel_size = in_channels, out_channels, kernel_size
        self.stride, self.padding, self.output_padding = stride, padding, output_padding
        self.groups, self.dilation = groups, dilation
        fan_in = out_channels // groups * kernel_size  # torch's, from the weight's second axis
        bound = 1.0 / math.sqrt(fan_in) if fan_in else 0.0
        self.weight = Parameter(init.uniform((in_channels, out_channels // groups, kernel_size), bound))
        self.register_parameter("bias", Parameter(init.uniform((out_channels,), bound)) if bias else None)

    def forward(self, x: Tensor, output_size: Sequence[int] | None = None) -> Tensor:
        extra = self.output_padding
        if output_size is not None:
            length = int(x.shape[-1])
            least = (length - 1) * self.stride - 2 * self.padding + self.dilation * (self.kernel_size - 1) + 1
            want = int(output_size[-1])
            extra = want - least
            if not 0 <= extra < self.stride:  # torch's range (from the stride alone)
                raise ValueError(f"ConvTranspose1d: output_size {want} is not reachable from an input of length "
                                 f"{length}: {least} to {least + self.stride - 1}")
        return F.conv_transpose1d(x, self.weight, self.bias, self.stride, self.padding, extra, self.groups,
                                  self.dilation)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, output_padding={self.output_padding}, groups={self.groups}, "
                f"dilation={self.dilation}, bias={self.bias is not None}")
