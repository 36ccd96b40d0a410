"""Initial values for parameters, drawn from the session's generator (seeded by ``nf.manual_seed``).

They return numpy arrays rather than tensors: a parameter starts as concrete data even when a module is built
inside a traced function, and PyTorch's default distributions are reproduced so freshly built models train alike.
"""

from __future__ import annotations

import math

import numpy as np

from ..trace import session


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    """U(-bound, bound): PyTorch's default for Linear, Conv and RNN weights (bound = 1/sqrt(fan_in))."""
    return (session().rng.random(shape) * (2 * bound) - bound).astype(np.float32)


def normal(shape: tuple[int, ...], std: float = 1.0) -> np.ndarray:
    return (session().rng.standard_normal(shape) * std).astype(np.float32)


def xavier_uniform(shape: tuple[int, int]) -> np.ndarray:
    """Glorot uniform for a [fan_out, fan_in] matrix (attention projections)."""
    fan_out, fan_in = shape
    return uniform(shape, math.sqrt(6.0 / (fan_in + fan_out)))


def zeros(shape: tuple[int, ...]) -> np.ndarray:
    return np.zeros(shape, np.float32)


def ones(shape: tuple[int, ...]) -> np.ndarray:
    return np.ones(shape, np.float32)
