"""Activation and Dropout modules (thin wrappers so they can sit in a Sequential and a state_dict)."""

from __future__ import annotations

from .. import dtypes
from ..tensor import Tensor, full, gelu, silu
from . import functional as F
from .module import Module, Parameter


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


class LeakyReLU(Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = negative_slope

    def forward(self, x: Tensor) -> Tensor:
        return F.leaky_relu(x, self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


class ELU(Module):
    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = alpha

    def forward(self, x: Tensor) -> Tensor:
        return F.elu(x, self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class CELU(ELU):
    def __init__(self, alpha: float = 1.0):
        if alpha == 0:
            raise ValueError("CELU: alpha must not be 0")
        super().__init__(alpha)

    def forward(self, x: Tensor) -> Tensor:
        return F.celu(x, self.alpha)


class SELU(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.selu(x)


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear where ``beta * x`` passes ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: Tensor) -> Tensor:
        return F.softplus(x, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class LogSigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.logsigmoid(x)


class Hardtanh(Module):
    def __init__(self, min_val: float = -1.0, max_val: float = 1.0):
        super().__init__()
        if min_val > max_val:
            raise ValueError(f"Hardtanh: min_val {min_val} is above max_val {max_val}")
        self.min_val, self.max_val = min_val, max_val

    def forward(self, x: Tensor) -> Tensor:
        return F.hardtanh(x, self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


class ReLU6(Hardtanh):
    def __init__(self):
        super().__init__(0.0, 6.0)


class Hardsigmoid(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.hardsigmoid(x)


class Hardswish(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.hardswish(x)


class Softsign(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.softsign(x)


class Mish(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.mish(x)


class GLU(Module):
    """The gated linear unit over ``dim``: first half times the sigmoid of the second."""

    def __init__(self, dim: int = -1):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.glu(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class PReLU(Module):
    """``x`` above 0, ``weight * x`` at and below it: one learned slope, or one per channel (``num_parameters``
    = the channels of axis 1), each starting at ``init``."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25):
        super().__init__()
        if num_parameters < 1:
            raise ValueError(f"PReLU: num_parameters must be at least 1, got {num_parameters}")
        self.num_parameters = num_parameters
        self.weight = Parameter(full((num_parameters,), init, dtypes.float32))

    def forward(self, x: Tensor) -> Tensor:
        return F.prelu(x, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class Threshold(Module):
    def __init__(self, threshold: float, value: float):
        super().__init__()
        self.threshold, self.value = threshold, value

    def forward(self, x: Tensor) -> Tensor:
        return F.threshold(x, self.threshold, self.value)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, value={self.value}"


class Softmin(Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor) -> Tensor:
        return F.softmin(x, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Tanhshrink(Module):
    def forward(self, x: Tensor) -> Tensor:
        return F.tanhshrink(x)


class Softshrink(Module):
    def __init__(self, lambd: float = 0.5):
        super().__init__()
        if lambd < 0:
            raise ValueError(f"Softshrink: lambd must be >= 0, got {lambd}")
        self.lambd = lambd

    def forward(self, x: Tensor) -> Tensor:
        return F.softshrink(x, self.lambd)

    def extra_repr(self) -> str:
        return f"lambd={self.lambd}"


class Hardshrink(Softshrink):
    def forward(self, x: Tensor) -> Tensor:
        return F.hardshrink(x, self.lambd)


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


class Dropout1d(Dropout):
    """Zeroes whole channels of ``[N, C, L]`` (or ``[C, L]``) with probability ``p`` in training mode."""

    def forward(self, x: Tensor) -> Tensor:
        return F.dropout1d(x, self.p, self.training)


class AlphaDropout(Dropout):
    """Dropout that keeps a SELU network's mean and variance, in training mode (torch's)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.alpha_dropout(x, self.p, self.training)
