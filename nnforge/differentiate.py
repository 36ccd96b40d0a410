"""User-facing differentiation: ``grad``, ``value_and_grad``, ``vjp`` and ``Tensor.backward``.

The frontend's side of autodiff: it wraps arguments and cotangents as Tensors and hands nodes to
``nnforge.autodiff.gradients``, which works on the IR alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from .autodiff import fresh, gradients
from .control import _is_leaf
from .errors import DTypeError, ShapeError, TraceError, at
from .ir.node import toposort
from .pytree import flatten, unflatten
from .tensor import Tensor, full, ones_like
from .trace import session


def _prepare(args: Sequence[Any], argnums: Sequence[int]) -> tuple[list[Any], list[list[Tensor]], list[Any], bool]:
    """Wrap the differentiated arguments as fresh tensors; remember whether the caller passed arrays."""
    args = list(args)
    wrt, defs, eager = [], [], True
    for i in argnums:
        if i >= len(args):
            raise TraceError(at(f"grad: argnums {i} but the function was called with {len(args)} arguments"))
        leaves, d = flatten(args[i], _is_leaf)
        ts = []
        for v in leaves:
            if isinstance(v, Tensor):
                eager = False
                t = Tensor(fresh(v.node))
            else:
                t = Tensor(v)
            if not t.dtype.is_float:
                raise DTypeError(at(f"grad: argument {i} must hold float tensors, got {t.dtype}"))
            ts.append(t)
        args[i] = unflatten(d, ts)
        wrt.append(ts)
        defs.append(d)
    return args, wrt, defs, eager


@contextlib.contextmanager
def _differentiating() -> Iterator[None]:
    """While a function whose gradient is taken runs: a compiled function it calls on nnforge tensors is inlined
    (its ops join the graph differentiated), not run as a program whose results would be constants."""
    s = session()
    s.differentiating += 1
    try:
        yield
    finally:
        s.differentiating -= 1


def _finish(values: Any, eager: bool) -> Any:
    if not eager:
        return values
    leaves, d = flatten(values, _is_leaf)
    return unflatten(d, [v.numpy() if isinstance(v, Tensor) else v for v in leaves])


def _scalar_output(out: Any, name: str) -> Tensor:
    """The scalar to differentiate. A plain number or 0-d array comes from a function that never touched the
    differentiated arguments (the others stay arrays): a constant, whose gradient is zero, as in JAX."""
    if isinstance(out, (float, np.floating)) or (isinstance(out, np.ndarray) and out.dtype.kind == "f"):
        out = Tensor(np.asarray(out))
    if not isinstance(out, Tensor):
        raise TraceError(at(f"{name}: the function must return a scalar tensor, got {type(out).__name__}"))
    if out.ndim != 0:
        raise ShapeError(at(f"{name}: the function must return a scalar, got shape {list(map(int, out.shape))}"))
    if not out.dtype.is_float:
        raise DTypeError(at(f"{name}: the function must return a float scalar, got {out.dtype}"))
    return out


def _grads_for(out_nodes: list, cts: list[Tensor], wrt: list[list[Tensor]], defs: list[Any]) -> list[Any]:
    flat = [t for group in wrt for t in group]
    gs = gradients(out_nodes, [c.node for c in cts], [t.node for t in flat])
    gs = [Tensor(g) if g is not None else full(t.shape, 0, t.dtype) for g, t in zip(gs, flat)]
    out, k = [], 0
    for group, d in zip(wrt, defs):
        out.append(unflatten(d, gs[k:k + len(group)]))
        k += len(group)
    return out


def value_and_grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """``f``'s value and its gradient w.r.t. the arguments in ``argnums`` (pytrees of tensors allowed)."""
    single = isinstance(argnums, int)
    nums = (argnums,) if single else tuple(argnums)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        call_args, wrt, defs, eager = _prepare(args, nums)
        with _differentiating():
            result = f(*call_args, **kwargs)
        out, aux = (result if has_aux else (result, None))
        out = _scalar_output(out, "grad")
        g = _grads_for([out.node], [ones_like(out)], wrt, defs)
        g = g[0] if single else tuple(g)
        value = (out, aux) if has_aux else out
        return _finish(value, eager), _finish(g, eager)

    return wrapped


def grad(f: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Gradient of a scalar-valued ``f`` w.r.t. the arguments in ``argnums``."""
    vg = value_and_grad(f, argnums, has_aux)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    return wrapped


def vjp(f: Callable, *primals: Any) -> tuple[Any, Callable]:
    """``(f(*primals), vjp_fn)``; ``vjp_fn(cotangent)`` returns one cotangent per primal."""
    args, wrt, defs, eager = _prepare(primals, range(len(primals)))
    with _differentiating():
        out = f(*args)
    leaves, out_def = flatten(out, _is_leaf)

    def vjp_fn(cotangent: Any) -> tuple:
        c_leaves, c_def = flatten(cotangent, _is_leaf)
        if c_def != out_def:
            raise TraceError(at("vjp: the cotangent's structure differs from the output's"))
        cts = [c if isinstance(c, Tensor) else Tensor(c, dtype=o.dtype) for c, o in zip(c_leaves, leaves)]
        for c, o in zip(cts, leaves):
            if tuple(map(int, c.shape)) != tuple(map(int, o.shape)):
                raise ShapeError(at(f"vjp: cotangent shape {list(map(int, c.shape))} differs from output "
                                    f"shape {list(map(int, o.shape))}"))
        return _finish(tuple(_grads_for([o.node for o in leaves], cts, wrt, defs)), eager)

    return _finish(out, eager), vjp_fn


def backward(t: Tensor, gradient: Tensor | None = None) -> None:
    """Accumulate gradients into ``.grad`` of the tensors created with requires_grad=True that ``t`` depends on."""
    if gradient is None:
        if t.ndim != 0:
            raise ShapeError(at(f"backward: needs a gradient for a non-scalar output of shape "
                                f"{list(map(int, t.shape))}"))
        gradient = ones_like(t)
    if not t.dtype.is_float:
        raise DTypeError(at(f"backward: output must be float, got {t.dtype}"))
    s = session()
    leaves = []
    for n in toposort([t.node]):
        ref = s.grad_leaves.get(id(n))
        leaf = ref() if ref is not None else None
        if leaf is not None and leaf.node is n:
            leaves.append(leaf)
    if not leaves:
        return
    gradient = gradient if isinstance(gradient, Tensor) else Tensor(gradient)
    gs = gradients([t.node], [gradient.node], [x.node for x in leaves])
    for leaf, g in zip(leaves, gs):
        if g is not None:
            leaf.grad = Tensor(g) if leaf.grad is None else leaf.grad + Tensor(g)
