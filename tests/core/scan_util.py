"""A Python-loop scan that runs on nf tensors or torch tensors: the unrolled ground truth for nf.scan."""

from __future__ import annotations

from typing import Any

import torch

import nnforge as nf
from nnforge.pytree import flatten, unflatten


def _is_leaf(x: Any) -> bool:
    return isinstance(x, (nf.Tensor, torch.Tensor))


def py_scan(body, init, xs=None, reverse: bool = False, length: int | None = None):
    """``nf.scan`` semantics written as a plain loop (works for nf and torch tensors alike)."""
    x_leaves, x_def = flatten(xs, _is_leaf)
    n = int(x_leaves[0].shape[0]) if x_leaves else int(length)
    carry, ys = init, [None] * n
    for t in (range(n - 1, -1, -1) if reverse else range(n)):
        x_t = unflatten(x_def, [x[t] for x in x_leaves]) if x_leaves else None
        carry, ys[t] = body(carry, x_t)
    if n == 0 or ys[0] is None:
        return carry, None
    y_def = flatten(ys[0], _is_leaf)[1]
    cols = list(zip(*[flatten(y, _is_leaf)[0] for y in ys]))
    stack = torch.stack if isinstance(cols[0][0], torch.Tensor) else nf.stack
    return carry, unflatten(y_def, [stack(list(c)) for c in cols])
