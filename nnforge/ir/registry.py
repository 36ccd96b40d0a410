"""Per-transform tables of the op set, keyed by ``Op``: shape/dtype rules, numpy implementations, vjp rules.

Each op family module in ``nnforge.ir.opdefs`` states everything about its ops on one screen (shape rule,
numpy reference, vjp) and registers it here with ``define``, JAX-style; importing ``nnforge.ir`` imports the
families, so the tables are complete before the first node is built, and nothing changes them afterwards.
The tables live below the families so that ``build.make`` (which the vjp rules call) never imports a family.

A backend's spelling is one more table keyed by ``Op``, kept in the backend's own package (the C backend's is
``nnforge/codegen/c/cexpr.py``): adding a backend adds a table there and needs no field here. The reference
interpreter and constant folding both read ``NUMPY``, so a folded constant is what the interpreter computes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DType
from .ops import Op

if TYPE_CHECKING:
    from .node import Node

Type = tuple[tuple[int, ...] | None, DType | None]
ShapeRule = Callable[[Op, tuple, Mapping[str, Any]], Type]
"""``(op, srcs, attrs) -> (shape, dtype)``; raises ShapeError/DTypeError naming the op."""
NumpyRule = Callable[["Node", Sequence[np.ndarray]], np.ndarray]
"""``(node, source values) -> value``: the ground truth, shared by the reference interpreter and constant folding."""
VjpRule = Callable[["Node", "Node"], tuple["Node | None", ...]]
"""``(node, cotangent) -> one cotangent per source`` (None where no gradient flows), built with IR builders, so
the rule's own nodes are differentiable by the same autodiff."""

SHAPE_RULES: dict[Op, ShapeRule] = {}
NUMPY: dict[Op, NumpyRule] = {}
VJP: dict[Op, VjpRule] = {}


def define(ops: Op | Sequence[Op], shape: ShapeRule, numpy: NumpyRule | None = None,
           vjp: VjpRule | None = None) -> None:
    """Register the rules of ``ops``. Called by the op family modules at import only.

    ``numpy=None``: the op needs the interpreter itself (loops, host I/O, random numbers, placeholders).
    ``vjp=None``: no gradient flows through the op (integer or boolean results, leaves, effects, loops).
    """
    for op in (ops,) if isinstance(ops, Op) else ops:
        if op in SHAPE_RULES:
            raise RuntimeError(f"op {op.name} is defined twice")
        SHAPE_RULES[op] = shape
        if numpy is not None:
            NUMPY[op] = numpy
        if vjp is not None:
            VJP[op] = vjp
