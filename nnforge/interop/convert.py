"""numpy <-> torch conversion without importing torch unless the user already uses it."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..dtypes import DType, as_dtype


def is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def to_numpy(x: Any) -> np.ndarray:
    """A numpy view/copy of an array-like; torch tensors are detached and moved to the CPU (bfloat16 kept)."""
    if isinstance(x, np.ndarray):
        return x
    if is_torch(x):
        import torch

        t = x.detach().cpu()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(DType.bfloat16.np)
        return t.numpy()
    return np.asarray(x)


def to_torch(a: np.ndarray):
    """A torch tensor sharing memory with ``a`` where the dtype allows (bfloat16 via a bit-cast)."""
    import torch

    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = a.copy()  # not np.ascontiguousarray: it turns a 0-d array into shape [1]
    if a.dtype == DType.bfloat16.np:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy() if not a.flags.writeable else a)


def torch_dtype(d: Any):
    import torch

    return getattr(torch, as_dtype(d).value)
