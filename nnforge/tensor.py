"""The lazy Tensor: every operator builds an IR node; nothing runs until a value is asked for.

A Tensor is a small mutable handle on an immutable node. In-place updates (``assign``, optimizer steps) re-bind
the handle, which is how ``nf.loop`` finds the state a training step carries from one iteration to the next.
Reading a value (``.numpy()``, ``.item()``, ``.torch()``) interprets the node's graph with the reference backend
and memoizes the result for as long as the node lives.
"""

from __future__ import annotations

import builtins
import contextvars
import functools
import math
import re
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import dtypes
from .dtypes import DType, as_dtype
from .errors import DTypeError, ShapeError, TraceError, at
from .ir.build import make
from .ir.dims import Dim
from .ir.node import Node
from .ir.ops import FLOAT_ONLY, Op, fmt_shape
from .trace import session

Scalar = int | float | bool
ShapeLike = Sequence[int]

# The op the user called while a composed op (softmax, mean, std...) builds the ops it is made of: errors name it,
# not the internal one (``max``, ``sum``). A context variable, so concurrent traces in other threads do not mix.
_called: contextvars.ContextVar[str | None] = contextvars.ContextVar("nnforge_called_op", default=None)
_PREFIX = re.compile(r"^[a-z_]+: ")


def _opname(name: str) -> str:
    """The name an error should give: the outermost op the user called, else ``name``."""
    return _called.get() or name


def composed(name: str):
    """Mark a frontend function built from other ops: shape and dtype errors raised inside it name ``name``."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if _called.get() is not None:
                return fn(*args, **kwargs)
            token = _called.set(name)
            try:
                return fn(*args, **kwargs)
            except (ShapeError, DTypeError) as e:
                msg = str(e)
                if _PREFIX.match(msg) and not msg.startswith(f"{name}: "):
                    raise type(e)(_PREFIX.sub(f"{name}: ", msg, count=1)) from None
                raise
            finally:
                _called.reset(token)

        return wrapper

    return deco


class Tensor:
    """A lazy n-dimensional array: a handle on an IR node."""

    __slots__ = ("__weakref__", "_grad", "_live", "_node", "_requires_grad", "name")
    __array_priority__ = 1000  # numpy defers to our reflected operators

    def __init__(self, data: Any, dtype: Any = None, requires_grad: bool = False, name: str = ""):
        node = data if isinstance(data, Node) else data.node if isinstance(data, Tensor) else _data_node(data, dtype)
        if dtype is not None and isinstance(data, (Node, Tensor)) and as_dtype(dtype) != node.dtype:
            node = make(Op.CAST, (node,), {"dtype": as_dtype(dtype)})
        object.__setattr__(self, "_node", node)
        self._grad = None
        self.name = name
        self._requires_grad = False
        self._live = False
        if requires_grad:
            self._set_requires_grad(True)

    @property
    def requires_grad(self) -> bool:
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, flag: bool) -> None:
        """Freezing (False) takes the tensor off the leaves ``backward`` fills, and compiled functions trace again:
        they read a tensor that requires grad at call time and bake in one that does not."""
        if bool(flag) != self._requires_grad:
            self._set_requires_grad(bool(flag))
            session().epoch += 1

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        """torch's in-place form of setting ``requires_grad``; returns the tensor."""
        self.requires_grad = requires_grad
        return self

    def _set_requires_grad(self, flag: bool) -> None:
        s = session()
        if flag:
            if not self._node.dtype.is_float:
                raise DTypeError(at(f"only float tensors can require gradients, got {self._node.dtype}"))
            s.grad_leaves[id(self._node)] = weakref.ref(self)
        else:
            s.grad_leaves.pop(id(self._node), None)
        self._requires_grad = flag

    # ---- the handle ------------------------------------------------------------------------------------------
    @property
    def node(self) -> Node:
        s = session()
        if len(s.scopes) > 1:  # tracing: the compiled function must know which tensors it read (``_note_read``)
            _note_read(self, s)
        return self._node

    def _rebind(self, node: Node) -> None:
        """Point this handle at another node (used by in-place updates and by nf.loop)."""
        s = session()
        if self.requires_grad:
            s.grad_leaves.pop(id(self._node), None)
            s.grad_leaves[id(node)] = weakref.ref(self)
        if self._live:
            s.live.pop(id(self._node), None)
            s.live[id(node)] = weakref.ref(self)
        object.__setattr__(self, "_node", node)

    def _read_live(self) -> None:
        """From now on, compiled functions traced again read this tensor at call time rather than baking it in
        (``HostValue``s; a tensor that changed after a trace baked it in)."""
        if not self._live:
            self._live = True
            session().live[id(self._node)] = weakref.ref(self)

    def assign(self, value: Tensor | np.ndarray | Scalar) -> Tensor:
        """In-place update: this tensor now holds ``value`` (same shape and dtype). Inside nf.loop it is loop state."""
        value = as_tensor(value, like=self)
        if tuple(map(int, value.shape)) != tuple(map(int, self.shape)):
            raise ShapeError(at(f"assign: shape {fmt_shape(value.shape)} does not fit a tensor of "
                                f"{fmt_shape(self.shape)}"))
        if value.dtype != self.dtype:
            value = value.cast(self.dtype)
        sc = session().scope
        sc.assigned.setdefault(id(self), (self, self._node))
        self._rebind(value.node)
        return self

    @property
    def grad(self) -> Tensor | None:
        return self._grad

    @grad.setter
    def grad(self, value: Tensor | None) -> None:
        sc = session().scope
        if id(self) not in sc.grads_set:
            sc.grads_set[id(self)] = (self, self._grad)
            if value is None:  # zero_grad(): what came before no longer matters
                sc.grads_cleared.add(id(self))
        self._grad = value

    def detach(self) -> Tensor:
        """The same values, cut off from gradient flow (a copy of the node the autodiff does not see through)."""
        return Tensor(make(Op.RESHAPE, (self.node,), {"shape": self.shape, "detach": True}))

    # ---- metadata --------------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self._node.shape

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    @property
    def ndim(self) -> int:
        return len(self._node.shape)

    def size(self, axis: int | None = None) -> Any:
        return self.shape if axis is None else self.shape[_axis(axis, self.ndim, "size")]

    def numel(self) -> int:
        return math.prod(self.shape)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return int(self.shape[0])

    def __repr__(self) -> str:
        label = f" {self.name!r}" if self.name else ""
        return f"Tensor{label}({self.dtype.short}{fmt_shape(self.shape)}, {self._node.op.name.lower()})"

    def __bool__(self) -> bool:
        if session().tracing:
            raise TraceError(at("the truth value of a traced tensor is unknown at trace time; use nf.where"))
        return bool(self.numpy())

    def _one_number(self, what: str) -> Scalar:
        """The value of a one-element tensor, for ``float()``, ``int()`` and format specs (a loss to log)."""
        if session().tracing:
            raise TraceError(at(f"{what} of a traced tensor is unknown at trace time: return the tensor and convert "
                                "the compiled function's result"))
        if self.numel() != 1:
            raise TypeError(f"{what} needs a tensor of one element, got shape {list(map(int, self.shape))}")
        return self.numpy().item()

    def __float__(self) -> float:
        return float(self._one_number("float()"))

    def __int__(self) -> int:
        return int(self._one_number("int()"))

    def __format__(self, spec: str) -> str:
        return format(self._one_number(f"format spec {spec!r}"), spec) if spec else str(self)

    def __hash__(self) -> int:
        return id(self)

    # ---- values ----------------------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Compute (once) and return the value as a numpy array."""
        from .codegen.reference import realize

        return realize(self._node)

    def item(self) -> Scalar:
        return self.numpy().item()

    def __reduce__(self) -> tuple:
        """Pickled and deep-copied as its value (a pending expression is computed first), so a module copies with
        ``copy.deepcopy`` and pickles: the copy is a tensor of the same class over its own copy of the value, with
        the same ``requires_grad``, name and ``.grad`` (as torch copies a parameter). The IR node is not copied: a
        graph holds every expression that reads it."""
        grad = None if self._grad is None else self._grad.numpy()
        return _restored, (type(self), self.numpy(), self.dtype, self._requires_grad, self.name, grad)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def torch(self):
        from .interop.convert import to_torch

        return to_torch(self.numpy())

    def __array__(self, dtype=None, copy=None):
        a = self.numpy()
        return a.astype(dtype) if dtype is not None else a

    def backward(self, gradient: Tensor | None = None) -> None:
        """Accumulate d(self)/d(leaf) into ``.grad`` of every reachable tensor created with requires_grad=True."""
        from .differentiate import backward

        backward(self, gradient)

    # ---- elementwise -----------------------------------------------------------------------------------------
    def __add__(self, o):
        return _binary(Op.ADD, self, o)

    def __radd__(self, o):
        return _binary(Op.ADD, o, self)

    def __sub__(self, o):
        return _binary(Op.SUB, self, o)

    def __rsub__(self, o):
        return _binary(Op.SUB, o, self)

    def __mul__(self, o):
        return _binary(Op.MUL, self, o)

    def __rmul__(self, o):
        return _binary(Op.MUL, o, self)

    def __truediv__(self, o):
        return _binary(Op.DIV, self, o, float_result=True)

    def __rtruediv__(self, o):
        return _binary(Op.DIV, o, self, float_result=True)

    def __pow__(self, o):
        if isinstance(o, int) and not isinstance(o, bool) and o < 0 and self.dtype.is_int:
            raise DTypeError(at(f"pow: an integer tensor ({self.dtype}) to the negative power {o}: integers to "
                                f"negative integer powers are not allowed (as in PyTorch); cast to a float first"))
        if isinstance(o, (int, float)) and not isinstance(o, bool) and self.dtype != dtypes.bool_:
            if o == 2:
                return self * self
            if o == 1:
                return self
            if o == 0.5:
                return self.sqrt()
            if o == -1:
                return self.reciprocal()
        return _binary(Op.POW, self, o)  # int ** int stays int, as in PyTorch

    def __rpow__(self, o):
        return _binary(Op.POW, o, self)

    def __neg__(self):
        return _unary(Op.NEG, self)

    def __matmul__(self, o):
        return matmul(self, o)

    def __rmatmul__(self, o):
        return matmul(o, self)

    def __lt__(self, o):
        return _binary(Op.LT, self, o)

    def __le__(self, o):
        return _binary(Op.LE, self, o)

    def __gt__(self, o):
        return _binary(Op.LT, o, self)

    def __ge__(self, o):
        return _binary(Op.LE, o, self)

    def __eq__(self, o):  # type: ignore[override]
        return _binary(Op.EQ, self, o)

    def __ne__(self, o):  # type: ignore[override]
        return _binary(Op.NE, self, o)

    def __invert__(self):
        if self.dtype != dtypes.bool_:
            raise DTypeError(at(f"~ needs a bool tensor, got {self.dtype}"))
        return self == False  # noqa: E712

    def __and__(self, o):
        return _logical(self, o, Op.MIN)

    def __or__(self, o):
        return _logical(self, o, Op.MAX)

    def exp(self):
        return _unary(Op.EXP, self)

    def log(self):
        return _unary(Op.LOG, self)

    def sqrt(self):
        return _unary(Op.SQRT, self)

    @composed("rsqrt")
    def rsqrt(self):
        return _unary(Op.RECIP, _unary(Op.SQRT, self))

    def reciprocal(self):
        return _unary(Op.RECIP, self)

    def sin(self):
        return _unary(Op.SIN, self)

    def cos(self):
        return _unary(Op.COS, self)

    def tanh(self):
        return _unary(Op.TANH, self)

    def sigmoid(self):
        return _unary(Op.SIGMOID, self)

    def erf(self):
        return erf(self)

    def log1p(self):
        """log(1 + x), exact where x is small (``log(1 + x)`` would round ``1 + x`` first)."""
        return _unary(Op.LOG1P, self)

    def expm1(self):
        """exp(x) - 1, exact where x is small."""
        return _unary(Op.EXPM1, self)

    def square(self):
        return self * self

    @composed("relu")
    def relu(self):
        return where(self <= 0, 0, self)  # NaN stays NaN, as torch

    def abs(self):
        return _unary(Op.ABS, self)

    def sign(self):
        return _unary(Op.SIGN, self)

    def maximum(self, o):
        return _binary(Op.MAX, self, o)

    def minimum(self, o):
        return _binary(Op.MIN, self, o)

    @composed("clamp")
    def clamp(self, min: Scalar | None = None, max: Scalar | None = None):
        """min(max(x, min), max) as torch: the gradient passes on the closed interval [min, max] (a maximum would
        halve it at the bounds), NaN stays NaN, and min > max gives max everywhere."""
        out = self
        if min is not None:
            out = where(out < min, min, out)
        if max is not None:
            out = where(out > max, max, out)
        return out

    def cast(self, dtype: Any) -> Tensor:
        dtype = as_dtype(dtype)
        return self if dtype == self.dtype else Tensor(make(Op.CAST, (self.node,), {"dtype": dtype}))

    astype = to = cast

    def float(self):
        return self.cast(dtypes.float32)

    def double(self):
        return self.cast(dtypes.float64)

    def half(self):
        return self.cast(dtypes.float16)

    # ---- reductions ------------------------------------------------------------------------------------------
    def sum(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        x = self.cast(dtypes.int64) if self.dtype in (dtypes.bool_, dtypes.int32) else self
        return _reduce(Op.SUM, x, axis, keepdims, "sum")

    def max(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return _reduce(Op.REDUCE_MAX, self, axis, keepdims, "max")

    @composed("min")
    def min(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        return -_reduce(Op.REDUCE_MAX, -self, axis, keepdims, "min")

    @composed("argmax")
    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        """The index of the largest value along ``axis`` (of the flattened tensor when None), int64, as torch: the
        first of equal maxima, and NaN counts as the largest (the first NaN's index). No gradient."""
        return _arg_extreme(self, axis, keepdims, largest=True)

    @composed("argmin")
    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        """The index of the smallest value along ``axis``, int64: the first of equal minima; NaN counts as the
        smallest, as torch."""
        return _arg_extreme(self, axis, keepdims, largest=False)

    @composed("cumsum")
    def cumsum(self, axis: int) -> Tensor:
        """Running sums along ``axis``, as torch (integers and bools sum in int64): one ``nf.scan`` over that axis,
        so its length may change without a new trace and its gradient is the reversed running sum."""
        return _running(self, axis, "cumsum")

    @composed("cumprod")
    def cumprod(self, axis: int) -> Tensor:
        """Running products along ``axis`` (one ``nf.scan``); the gradient needs no division, so zeros are
        fine."""
        return _running(self, axis, "cumprod")

    @composed("mean")
    def mean(self, axis: int | Sequence[int] | None = None, keepdims: bool = False) -> Tensor:
        x = _as_float(self)
        return x.sum(axis, keepdims) / _count(x, axis)

    @composed("var")
    def var(self, axis: int | Sequence[int] | None = None, keepdims: bool = False, correction: int = 1) -> Tensor:
        """Variance with Bessel's correction by default (as torch.var)."""
        x = _as_float(self)
        d = x - x.mean(axis, keepdims=True)
        return (d * d).sum(axis, keepdims) / builtins.max(_count(x, axis) - correction, 0)

    @composed("std")
    def std(self, axis: int | Sequence[int] | None = None, keepdims: bool = False, correction: int = 1) -> Tensor:
        """sqrt(var), with torch's gradient 0 where the variance is 0 (a constant slice), not 0 * inf = NaN."""
        return _root_or_zero(self.var(axis, keepdims, correction), 0.5)

    @composed("logsumexp")
    def logsumexp(self, axis: int | Sequence[int] | None = -1, keepdims: bool = False) -> Tensor:
        """log(sum(exp(x))) computed as m + log(sum(exp(x - m))), m the max: no overflow. m carries no gradient
        (the result does not depend on it: the gradient is softmax(x) either way, without comparing every element
        with m)."""
        if _empty(self, axis):  # an empty sum: log 0 = -inf, as torch
            m = full(self.sum(axis, keepdims=True).shape, 0.0, _as_float(self).dtype)
        else:
            m = self.max(axis, keepdims=True).detach()
            m = where(m.abs() == math.inf, 0.0, m)  # all -inf (or an inf) in a slice: give -inf/inf, not inf - inf
        out = (self - m).exp().sum(axis, keepdims=True).log() + m
        return out if keepdims else out.squeeze(_axes(axis, self.ndim, "logsumexp"))

    @composed("softmax")
    def softmax(self, axis: int = -1) -> Tensor:
        if _empty(self, axis):  # no element to normalize: the (empty) result needs no maximum
            return _as_float(self)
        # the max carries no gradient: the result does not depend on it, and through it a gradient would compare
        # every element with its slice's max (a pass over an attention's scores) to route exactly 0
        e = (self - self.max(axis, keepdims=True).detach()).exp()
        return e / e.sum(axis, keepdims=True)

    @composed("log_softmax")
    def log_softmax(self, axis: int = -1) -> Tensor:
        """(x - m) - log(sum(exp(x - m))), m the slice's maximum, as torch: a slice holding +inf or only -inf is
        NaN (x - logsumexp(x) would give -inf beside NaN); m carries no gradient (the result does not depend on
        it)."""
        if _empty(self, axis):
            return _as_float(self)
        shifted = self - self.max(axis, keepdims=True).detach()
        return shifted - shifted.exp().sum(axis, keepdims=True).log()

    # ---- movement --------------------------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> Tensor:
        shape = _shape_arg(shape)
        if -1 in [int(d) for d in shape]:
            if [int(d) for d in shape].count(-1) > 1:
                raise ShapeError(at(f"reshape: only one -1 allowed, got {tuple(shape)}"))
            known = math.prod(int(d) for d in shape if int(d) != -1)
            total = math.prod(self.shape)
            if known == 0 or total % known:
                raise ShapeError(at(f"reshape: cannot view {fmt_shape(self.shape)} as {tuple(map(int, shape))}"))
            rest = math.prod(self.shape) // math.prod(d for d in shape if int(d) != -1)  # symbolic sizes stay so
            shape = tuple(rest if int(d) == -1 else d for d in shape)
        if tuple(map(int, shape)) == tuple(map(int, self.shape)):
            return self
        return Tensor(make(Op.RESHAPE, (self.node,), {"shape": tuple(shape)}))

    view = reshape

    @composed("flatten")
    def flatten(self, start: int = 0, end: int = -1) -> Tensor:
        s, e = _axis(start, self.ndim, "flatten"), _axis(end, self.ndim, "flatten")
        if s > e:
            raise ShapeError(at(f"{_opname('flatten')}: start axis {start} comes after end axis {end} of a "
                                f"{self.ndim}-d tensor"))
        return self.reshape(*self.shape[:s], math.prod(self.shape[s:e + 1]), *self.shape[e + 1:])

    @composed("unflatten")
    def unflatten(self, axis: int, sizes: Sequence[Any]) -> Tensor:
        """torch's unflatten: ``axis`` split into ``sizes`` (one may be -1)."""
        a = _axis(axis, self.ndim, "unflatten")
        return self.reshape(*self.shape[:a], *sizes, *self.shape[a + 1:])

    @composed("unfold")
    def unfold(self, axis: int, size: int, step: int) -> Tensor:
        """torch's ``Tensor.unfold``: the windows of ``size`` elements every ``step`` along ``axis`` (which keeps
        the window count), each window a new last axis. One strided slice per window position, stacked."""
        if self.ndim == 0:
            raise ShapeError(at(f"{_opname('unfold')}: needs a tensor with at least one axis, got a 0-d tensor"))
        a = _axis(axis, self.ndim, "unfold")
        if size < 1 or step < 1 or size > int(self.shape[a]):
            raise ShapeError(at(f"unfold: windows of {size} every {step} along axis {a} of {fmt_shape(self.shape)} "
                                f"(size between 1 and {int(self.shape[a])}, step >= 1)"))
        count = (self.shape[a] - size) // step + 1
        pick = lambda j: (slice(None),) * a + (slice(j, j + step * (count - 1) + 1, step),)  # noqa: E731
        return stack([self[pick(j)] for j in range(size)], -1)

    def permute(self, *perm: Any) -> Tensor:
        perm = tuple(_axis(p, self.ndim, "permute") for p in _shape_arg(perm))
        if perm == tuple(range(self.ndim)):
            return self
        return Tensor(make(Op.PERMUTE, (self.node,), {"perm": perm}))

    @composed("transpose")
    def transpose(self, a: int = -2, b: int = -1, *more: int) -> Tensor:
        """Axes ``a`` and ``b`` swapped (torch's ``transpose``; numpy's reordering of every axis is ``permute``)."""
        if more or isinstance(a, (tuple, list)):
            axes = tuple(a) if isinstance(a, (tuple, list)) else (a, b, *more)
            if len(axes) == 2:  # the two axes as one tuple: torch takes them as two arguments
                fix = f"to swap two axes write transpose({axes[0]}, {axes[1]})"
            elif len(axes) == self.ndim:
                fix = f"to reorder the axes of a {self.ndim}-d tensor write permute{axes}"
            else:
                fix = f"permute takes all {self.ndim} axes of this tensor, in their new order"
            raise ShapeError(at(f"transpose swaps two axes (torch's form), got {axes}: {fix}"))
        perm = list(range(self.ndim))
        a, b = _axis(a, self.ndim, "transpose"), _axis(b, self.ndim, "transpose")
        if self.ndim == 0:
            return self
        perm[a], perm[b] = perm[b], perm[a]
        return self.permute(*perm)

    @property
    def T(self) -> Tensor:
        return self.permute(*reversed(range(self.ndim)))

    @property
    def mT(self) -> Tensor:
        return self if self.ndim == 0 else self.transpose(-2, -1)  # a 0-d tensor is its own, as in torch

    def expand(self, *shape: Any) -> Tensor:
        shape = _shape_arg(shape)
        if len(shape) < self.ndim:
            raise ShapeError(at(f"expand: target {tuple(shape)} has fewer axes than {fmt_shape(self.shape)}"))
        lead = len(shape) - self.ndim
        if any(int(d) == -1 for d in shape[:lead]):
            raise ShapeError(at(f"{_opname('expand')}: -1 keeps an existing axis; new leading axes of "
                                f"{tuple(map(int, shape))} need sizes (tensor {fmt_shape(self.shape)})"))
        x = self.reshape(*([1] * lead), *self.shape) if lead else self
        shape = tuple(x.shape[i] if int(d) == -1 else d for i, d in enumerate(shape))
        if tuple(map(int, shape)) == tuple(map(int, x.shape)):
            return x
        return Tensor(make(Op.EXPAND, (x.node,), {"shape": shape}))

    @composed("broadcast_to")
    def broadcast_to(self, shape: ShapeLike) -> Tensor:
        return self.expand(*shape)

    @composed("repeat")
    def repeat(self, *repeats: Any) -> Tensor:
        """The tensor tiled ``repeats[i]`` times along axis ``i``, as torch's ``repeat``: one repeat per axis,
        extra repeats add leading axes. A broadcast between two reshapes, so its gradient is a sum."""
        reps = _shape_arg(repeats)
        if len(reps) < self.ndim:
            raise ShapeError(at(f"repeat: {len(reps)} repeats {tuple(map(int, reps))} for a tensor of "
                                f"{fmt_shape(self.shape)}: give one per axis"))
        if any(int(r) < 0 for r in reps):
            raise ShapeError(at(f"repeat: repeats must be >= 0, got {tuple(map(int, reps))}"))
        x = self.reshape(*([1] * (len(reps) - self.ndim)), *self.shape)
        spread = [s for d in x.shape for s in (1, d)]
        tiled = [s for r, d in zip(reps, x.shape) for s in (r, d)]
        return x.reshape(*spread).expand(*tiled).reshape(*(r * d for r, d in zip(reps, x.shape)))

    @composed("tile")
    def tile(self, *repeats: Any) -> Tensor:
        """torch's and numpy's ``tile``: as ``repeat``, with fewer repeats than axes meaning 1 for the leading ones."""
        reps = _shape_arg(repeats)
        return self.repeat(*([1] * (self.ndim - len(reps))), *reps)

    @composed("repeat_interleave")
    def repeat_interleave(self, repeats: int, axis: int | None = None) -> Tensor:
        """Each element repeated ``repeats`` times in place along ``axis`` (of the flattened tensor without one),
        as torch's. ``repeats`` is a number: per-element counts would make the size depend on the data."""
        if isinstance(repeats, Tensor) or not isinstance(repeats, (int, np.integer)) or repeats < 0:
            raise ShapeError(at(f"repeat_interleave: repeats must be a number >= 0 (per-element counts make the "
                                f"size depend on values), got {repeats!r}"))
        x = self.reshape(-1) if axis is None else self
        a = 0 if axis is None else _axis(axis, x.ndim, "repeat_interleave")
        spread = x.unsqueeze(a + 1).expand(*x.shape[:a + 1], int(repeats), *x.shape[a + 1:])
        return spread.reshape(*x.shape[:a], x.shape[a] * int(repeats), *x.shape[a + 1:])

    @composed("squeeze")
    def squeeze(self, axis: int | Sequence[int] | None = None) -> Tensor:
        if axis is None:
            axes = [i for i, d in enumerate(self.shape) if int(d) == 1]
        else:
            axes = _axes(axis, self.ndim, "squeeze")
            axes = [a for a in axes if int(self.shape[a]) == 1]
        return self.reshape(*[d for i, d in enumerate(self.shape) if i not in axes])

    @composed("unsqueeze")
    def unsqueeze(self, axis: int) -> Tensor:
        a = _axis(axis, self.ndim + 1, "unsqueeze")
        return self.reshape(*self.shape[:a], 1, *self.shape[a:])

    @composed("flip")
    def flip(self, axis: int | Sequence[int] = 0) -> Tensor:
        axes = _axes(axis, self.ndim, "flip")
        idx = tuple(slice(None, None, -1) if i in axes else slice(None) for i in range(self.ndim))
        return self[idx]

    def __getitem__(self, index: Any) -> Tensor:
        return _getitem(self, index)

    @composed("chunk")
    def chunk(self, n: int, axis: int = 0) -> list[Tensor]:
        if self.ndim == 0:
            raise ShapeError(at(f"{_opname('chunk')}: needs a tensor with at least one axis, got a 0-d tensor"))
        a = _axis(axis, self.ndim, "chunk")
        size = self.shape[a]
        if int(size) == 0:  # torch: n empty chunks
            return [self] * n
        if int(size) % n:
            raise ShapeError(at(f"chunk: axis {a} of size {int(size)} does not split into {n} equal chunks"))
        step = size // n
        return self.split(step, a)

    def split(self, sizes: int | Sequence[int], axis: int = 0) -> list[Tensor]:
        if self.ndim == 0:
            raise ShapeError(at(f"{_opname('split')}: needs a tensor with at least one axis, got a 0-d tensor"))
        a = _axis(axis, self.ndim, "split")
        total = self.shape[a]
        if isinstance(sizes, int) and int(total) == 0:  # torch: one empty piece
            return [self]
        if isinstance(sizes, int):
            bounds, start = [], 0
            while int(start) < int(total):
                stop = start + sizes if int(start) + int(sizes) <= int(total) else total
                bounds.append((start, stop))
                start = stop
        else:
            if builtins.sum(int(s) for s in sizes) != int(total):
                raise ShapeError(at(f"split: sizes {list(map(int, sizes))} do not add up to {int(total)}"))
            bounds, start = [], 0
            for s in sizes:
                bounds.append((start, start + s))
                start = start + s
        return [_slice_axis(self, a, lo, hi) for lo, hi in bounds]

    def pad(self, pads: Sequence[tuple[int, int]], value: Scalar = 0) -> Tensor:
        """Constant padding: ``pads`` holds (before, after) per axis, from the first axis (numpy order)."""
        pads = tuple((lo, hi) for lo, hi in _shape_pairs(pads))
        if len(pads) != self.ndim:
            raise ShapeError(at(f"pad: needs {self.ndim} (before, after) pairs for {fmt_shape(self.shape)}, "
                                f"got {pads}"))
        if all(p == (0, 0) for p in pads):
            return self
        return Tensor(make(Op.PAD, (self.node,), {"pads": pads, "value": value}))

    # ---- masks ------------------------------------------------------------------------------------------------
    @composed("masked_fill")
    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """``value`` where the bool ``mask`` (broadcast to this shape) is True, as torch: the result keeps this
        tensor's dtype and shape."""
        mask = _operand(mask, "masked_fill")
        if mask.dtype != dtypes.bool_:
            raise DTypeError(at(f"masked_fill: the mask must be bool, got {mask.dtype}"))
        if isinstance(value, Tensor) and value.ndim:
            raise ShapeError(at(f"masked_fill: the value must be a number or a 0-d tensor, got "
                                f"{fmt_shape(value.shape)}"))
        if tuple(map(int, broadcast_shapes(self.shape, mask.shape, op="masked_fill"))) != tuple(map(int, self.shape)):
            raise ShapeError(at(f"masked_fill: a mask of {fmt_shape(mask.shape)} does not broadcast to the tensor's "
                                f"{fmt_shape(self.shape)}"))
        return where(mask, value, self).cast(self.dtype)

    @composed("tril")
    def tril(self, diagonal: int = 0) -> Tensor:
        """The lower triangle of the last two axes (column - row <= ``diagonal``), zeros above."""
        return _triangle(self, lambda offset: offset <= diagonal, "tril")

    @composed("triu")
    def triu(self, diagonal: int = 0) -> Tensor:
        """The upper triangle of the last two axes (column - row >= ``diagonal``), zeros below."""
        return _triangle(self, lambda offset: offset >= diagonal, "triu")


def _triangle(x: Tensor, keep: Any, name: str) -> Tensor:
    if x.ndim < 2:
        raise ShapeError(at(f"{name}: needs at least 2 dimensions, got {fmt_shape(x.shape)}"))
    rows, cols = x.shape[-2], x.shape[-1]
    offset = arange(cols).reshape(1, cols) - arange(rows).reshape(rows, 1)
    return where(keep(offset), x, 0).cast(x.dtype)


class HostValue(Tensor):
    """A 0-d tensor whose value is a Python number that may change between calls (an optimizer's learning rate,
    which schedulers set): a compiled function that reads it reads ``get()`` at each call, as it reads a
    parameter, instead of baking the number in when traced. ``refresh()`` before it enters a trace makes the
    trace see the current number (an eager ``nf.loop`` body bakes that one)."""

    __slots__ = ("_get",)

    def __init__(self, get: Any, dtype: Any = dtypes.float64):
        super().__init__(np.asarray(get(), as_dtype(dtype).np))
        object.__setattr__(self, "_get", get)
        self._read_live()

    def refresh(self) -> HostValue:
        """Hold the number ``get()`` returns now, where it changed (a trace reading the tensor twice sees one
        node); returns the tensor."""
        now = self.numpy()
        if self._node.op != Op.DATA or not np.array_equal(self._node.attrs["array"], now):
            self._rebind(_data_node(now, None))
        return self

    def numpy(self) -> np.ndarray:
        return np.asarray(self._get(), self.dtype.np)

    def __reduce__(self) -> tuple:
        raise TypeError("a HostValue reads a Python number through a function: make a new one where it is used")


# ---- construction ---------------------------------------------------------------------------------------------

def _restored(cls: type[Tensor], value: np.ndarray, dtype: DType, requires_grad: bool, name: str,
              grad: np.ndarray | None) -> Tensor:
    """The tensor ``Tensor.__reduce__`` describes (a subclass's own ``__init__`` is not called: its arguments
    differ, the state does not)."""
    t = cls.__new__(cls)
    Tensor.__init__(t, value, dtype=dtype, requires_grad=requires_grad, name=name)
    t._grad = None if grad is None else Tensor(grad)
    return t


def _data_node(data: Any, dtype: Any) -> Node:
    from .interop.convert import is_torch, to_numpy

    arr = to_numpy(data)
    if dtype is not None:
        arr = arr.astype(as_dtype(dtype).np)
    elif arr.dtype == np.float64 and not isinstance(data, (np.ndarray, np.generic)) and not is_torch(data):
        arr = arr.astype(np.float32)  # Python floats default to float32, as in PyTorch
    try:
        dtypes.from_numpy(arr.dtype)
    except TypeError as e:
        raise DTypeError(at(f"tensor: cannot make a tensor of a {type(data).__name__}: {e}")) from None
    arr = np.array(arr, order="C")  # a private copy: 0-d stays 0-d (ascontiguousarray makes it 1-d), and the
    arr.setflags(write=False)       # caller's own array is not turned read-only
    return make(Op.DATA, (), {"array": arr})


def adopt(arr: np.ndarray, loc: str) -> Node:
    """A DATA node over ``arr`` itself, made read-only, no copy and no stack walk: for arrays nnforge just produced
    and nobody else holds (a compiled training step's updated parameters and optimizer state, every call)."""
    arr.setflags(write=False)
    return Node(Op.DATA, (), {"array": arr}, tuple(arr.shape), dtypes.from_numpy(arr.dtype), loc)


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False) -> Tensor:
    """A tensor from a numpy array, a torch tensor, a nested list or a Python scalar."""
    if isinstance(data, Dim) and not requires_grad:
        return full((), data, dtype or dtypes.int64)  # a size used as a value stays symbolic
    return Tensor(data, dtype=dtype, requires_grad=requires_grad)


def as_tensor(x: Any, like: Tensor | None = None) -> Tensor:
    """``x`` as a Tensor; Python scalars take the dtype of ``like`` (weak typing)."""
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (bool, int, float)):
        return full(like.shape, x, dtypes.scalar_dtype(x, like.dtype))
    return Tensor(x)


def full(shape: ShapeLike, value: Scalar, dtype: Any = None) -> Tensor:
    """``shape`` filled with ``value``. A symbolic size as value (``x.shape[0]``) stays symbolic, so a compiled
    function that divides by a sequence length stays correct when the length changes."""
    if dtype is None:
        dtype = dtypes.bool_ if isinstance(value, bool) else dtypes.int64 if isinstance(value, int) else dtypes.float32
    dtype = as_dtype(dtype)
    shape = tuple(_shape_arg(tuple(shape)) if not isinstance(shape, int) else (shape,))
    value = value if isinstance(value, Dim) else dtype.np.type(value).item()
    return Tensor(make(Op.CONST, (), {"value": value, "shape": shape, "dtype": dtype}))


def zeros(*shape: Any, dtype: Any = dtypes.float32) -> Tensor:
    return full(_shape_arg(shape), 0, dtype)


def ones(*shape: Any, dtype: Any = dtypes.float32) -> Tensor:
    return full(_shape_arg(shape), 1, dtype)


def zeros_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full(x.shape, 0, dtype or x.dtype)


def ones_like(x: Tensor, dtype: Any = None) -> Tensor:
    return full(x.shape, 1, dtype or x.dtype)


def arange(start: int | float, stop: int | float | None = None, step: int | float = 1, dtype: Any = None) -> Tensor:
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        dtype = dtypes.int64 if all(isinstance(v, int) for v in (start, stop, step)) else dtypes.float32
    return Tensor(np.arange(start, stop, step).astype(as_dtype(dtype).np))


def _random(shape: tuple, dtype: Any, dist: str) -> Tensor:
    dtype = as_dtype(dtype)
    if not dtype.is_float:
        raise DTypeError(at(f"random numbers need a float dtype, got {dtype}"))
    s = session()
    if s.tracing:  # inside a traced program: fresh numbers on every execution
        node = make(Op.RAND, (), {"shape": shape, "dtype": dtype, "dist": dist})
        s.scope.effectful.add(id(node))
        return Tensor(node)
    draw = s.rng.standard_normal if dist == "normal" else s.rng.random
    return Tensor(draw(tuple(map(int, shape))).astype(dtype.np))


def randn(*shape: Any, dtype: Any = dtypes.float32) -> Tensor:
    """Standard normal samples (from the generator seeded by nf.manual_seed)."""
    return _random(_shape_arg(shape), dtype, "normal")


def rand(*shape: Any, dtype: Any = dtypes.float32) -> Tensor:
    """Uniform samples in [0, 1)."""
    return _random(_shape_arg(shape), dtype, "uniform")


# ---- helpers --------------------------------------------------------------------------------------------------

def _shape_arg(shape: tuple) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    for d in shape:
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool):
            raise ShapeError(at(f"a shape holds ints, got {d!r} in {shape}"))
    return tuple(d if isinstance(d, int) else int(d) for d in shape)


def _shape_pairs(pads: Any) -> tuple:
    try:
        pairs = tuple((lo, hi) for lo, hi in pads)
    except (TypeError, ValueError):
        raise ShapeError(at(f"pad: expected (before, after) pairs, got {pads!r}")) from None
    for p in pairs:
        _shape_arg(p)
    return pairs


def _axis(axis: int, ndim: int, op: str) -> int:
    """``axis`` in [0, ndim); a 0-d tensor takes -1 and 0 as torch does (as if it had one axis)."""
    n = builtins.max(ndim, 1)
    if not isinstance(axis, (int, np.integer)) or isinstance(axis, bool) or not -n <= axis < n:
        raise ShapeError(at(f"{op}: axis {axis} out of range for a {ndim}-d tensor"))
    return int(axis) % n


def _axes(axis: int | Sequence[int] | None, ndim: int, op: str) -> list[int]:
    """Sorted axes; none for a 0-d tensor (reducing or squeezing it over -1 or 0 gives it back, as in torch)."""
    if axis is None:
        return list(range(ndim))
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = sorted({_axis(a, ndim, op) for a in axes})
    if len(out) != len(axes):  # (0, -2) of a 2-d tensor: numpy and torch refuse it too
        raise ShapeError(at(f"{_opname(op)}: an axis appears more than once in {tuple(axes)} of a {ndim}-d tensor"))
    return out if ndim else []


def _root_or_zero(s: Tensor, power: float) -> Tensor:
    """``s ** power``, 0 with gradient 0 where ``s`` is 0, where the root's derivative is infinite and would make
    0 * inf = NaN (std of a constant slice, the norm of a zero vector), as torch's gradients are."""
    zero = s == 0
    return where(zero, 0.0, where(zero, 1.0, s) ** power)


def _empty(x: Tensor, axis: int | Sequence[int] | None) -> bool:
    """Whether one of the reduced axes has no element."""
    return any(int(x.shape[a]) == 0 for a in _axes(axis, x.ndim, "reduce"))


def _count(x: Tensor, axis: int | Sequence[int] | None) -> int:
    return math.prod(x.shape[a] for a in _axes(axis, x.ndim, "reduce"))


def _as_float(x: Tensor) -> Tensor:
    return x if x.dtype.is_float else x.cast(dtypes.float32)


def broadcast_shapes(*shapes: tuple, op: str = "broadcast") -> tuple:
    """numpy broadcasting; symbolic sizes win over equal plain ints so compiled graphs stay generic."""
    nd = builtins.max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        dims = [s[i - nd + len(s)] for s in shapes if i - nd + len(s) >= 0]
        sizes = {int(d) for d in dims} - {1}
        if len(sizes) > 1:
            raise ShapeError(at(f"{op}: cannot broadcast shapes {', '.join(fmt_shape(s) for s in shapes)}"))
        big = [d for d in dims if int(d) != 1] or dims
        sym = [d for d in big if type(d) is not int]
        out.append(sym[0] if sym else big[0])
    return tuple(out)


def _expand_to(x: Tensor, shape: tuple) -> Tensor:
    if tuple(map(int, x.shape)) == tuple(map(int, shape)):
        return x
    return x.expand(*shape)


def _binary(op: Op, a: Any, b: Any, float_result: bool = False) -> Tensor:
    name = op.name.lower()
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise TraceError(at(f"{name}: needs at least one tensor operand"))
    a, b = _lift_pair(a, b, name)
    dt = dtypes.promote(a.dtype, b.dtype)
    if float_result and not dt.is_float:
        dt = dtypes.float32
    a, b = a.cast(dt), b.cast(dt)
    shape = broadcast_shapes(a.shape, b.shape, op=name)
    a, b = _expand_to(a, shape), _expand_to(b, shape)
    return Tensor(make(op, (a.node, b.node)))


def _lift_pair(a: Any, b: Any, name: str) -> tuple[Tensor, Tensor]:
    for v in (a, b):
        if not isinstance(v, (Tensor, bool, int, float, np.ndarray, np.generic)) and type(v).__module__ != "torch":
            raise TraceError(at(f"{name}: unsupported operand of type {type(v).__name__}"))
    if not isinstance(a, Tensor):
        a = full((), a, dtypes.scalar_dtype(a, b.dtype)) if isinstance(a, (bool, int, float)) else Tensor(a)
    if not isinstance(b, Tensor):
        b = full((), b, dtypes.scalar_dtype(b, a.dtype)) if isinstance(b, (bool, int, float)) else Tensor(b)
    return a, b


def _logical(a: Tensor, b: Any, op: Op) -> Tensor:
    b = as_tensor(b, like=a)
    if a.dtype != dtypes.bool_ or b.dtype != dtypes.bool_:
        raise DTypeError(at(f"& and | need bool tensors, got {a.dtype} and {b.dtype}"))
    return _binary(op, a, b)


def _unary(op: Op, x: Tensor) -> Tensor:
    if not isinstance(x, Tensor):
        x = Tensor(x)
    if op in FLOAT_ONLY and not x.dtype.is_float:
        x = x.cast(dtypes.float32)
    return Tensor(make(op, (x.node,)))


def _reduce(op: Op, x: Tensor, axis: Any, keepdims: bool, name: str) -> Tensor:
    axes = tuple(_axes(axis, x.ndim, name))
    if not axes:
        return x
    for a in axes:
        if op == Op.REDUCE_MAX and int(x.shape[a]) == 0:
            raise ShapeError(at(f"{name}: reduction over an empty axis {a} of {fmt_shape(x.shape)}"))
    return Tensor(make(op, (x.node,), {"axes": axes, "keepdims": bool(keepdims)}))


def _note_read(t: Tensor, s: Any) -> None:
    """Record ``t`` with the innermost compiled function being traced: a tensor it reads but does not take as an
    argument (a global mask, a table) is baked into its program, which must be traced again once ``t`` holds
    another value (``compile._Entry.values_as_traced``)."""
    for sc in reversed(s.scopes):
        if sc.kind == "function":
            if id(t) not in sc.read:
                sc.read[id(t)] = weakref.ref(t)
            return


def _running(x: Tensor, axis: int, name: str) -> Tensor:
    from .control import scan  # the frontend's loop construct, built on Tensor

    a = _axis(axis, builtins.max(x.ndim, 1), name)
    if x.dtype in (dtypes.bool_, dtypes.int32):
        x = x.cast(dtypes.int64)
    if x.ndim == 0 or int(x.shape[a]) == 0:
        return x
    xt = x.permute(a, *[k for k in range(x.ndim) if k != a]) if a else x
    acc = x.dtype.accumulator  # half precision runs in float32, rounded once per output (torch's)
    op = (lambda c, v: c + v.cast(acc)) if name == "cumsum" else (lambda c, v: c * v.cast(acc))
    init = full(xt.shape[1:], 0 if name == "cumsum" else 1, acc)
    _, ys = scan(lambda c, v: (op(c, v), op(c, v).cast(x.dtype)), init, xt)
    return ys.permute(*range(1, a + 1), 0, *range(a + 1, x.ndim)) if a else ys


def _arg_extreme(x: Tensor, axis: int | None, keepdims: bool, largest: bool) -> Tensor:
    """argmax / argmin from a reduction and a comparison: the smallest index where the value equals the extreme
    (or is NaN, which torch ranks beyond every number), so ties give the first."""
    name = "argmax" if largest else "argmin"
    if x.dtype == dtypes.bool_:
        raise DTypeError(at(f"{name}: not defined for bool (torch neither): cast to an integer type first"))
    if axis is None:  # over every element, as torch: keepdims keeps each axis as size 1
        out = _arg_extreme(x.reshape(-1), 0, False, largest)
        return out.reshape(*([1] * x.ndim)) if keepdims else out
    a = _axis(axis, builtins.max(x.ndim, 1), name)
    if x.ndim == 0:
        return full((), 0, dtypes.int64)
    n = int(x.shape[a])
    if n == 0:
        raise ShapeError(at(f"{name}: reduction over an empty axis {a} of {fmt_shape(x.shape)}"))
    extreme = x.max(a, keepdims=True) if largest else x.min(a, keepdims=True)
    hit = x == extreme
    if x.dtype.is_float:
        hit = hit | (x != x)
    index = arange(n, dtype=dtypes.int64).reshape(*[n if k == a else 1 for k in range(x.ndim)])
    return where(hit, index, n).min(a, keepdims)


def _slice_axis(x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    starts = [0] * x.ndim
    stops = list(x.shape)
    starts[axis], stops[axis] = lo, hi
    return Tensor(make(Op.SLICE, (x.node,), {"starts": tuple(starts), "stops": tuple(stops),
                                               "steps": (1,) * x.ndim}))


def _getitem(x: Tensor, index: Any) -> Tensor:
    """Basic indexing: ints, slices (any step), None and one Ellipsis. A single SLICE node plus a reshape."""
    starts, stops, steps, kinds = _basic_index(x, index)
    node = x.node
    if any(int(a) != 0 or int(b) != int(d) or s != 1 for a, b, s, d in zip(starts, stops, steps, x.shape)):
        node = make(Op.SLICE, (node,), {"starts": tuple(starts), "stops": tuple(stops), "steps": tuple(steps)})
    sliced = iter(node.shape)
    final = []
    for kind in kinds:
        if kind == "new":
            final.append(1)
        elif kind == "keep":
            final.append(next(sliced))
        else:
            next(sliced)
    return Tensor(node).reshape(*final)


def _basic_index(x: Tensor, index: Any) -> tuple[list, list, list, list]:
    """A basic index as per-axis (start, stop, step) of ``x`` and kinds: "keep" or "drop" (an int) per axis of
    ``x``, "new" per None, in the index's order."""
    if not isinstance(index, tuple):
        index = (index,)
    if builtins.sum(i is Ellipsis for i in index) > 1:
        raise ShapeError(at("index: only one Ellipsis allowed"))
    n_real = builtins.sum(1 for i in index if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise ShapeError(at(f"index: {n_real} indices for a {x.ndim}-d tensor of shape {fmt_shape(x.shape)}"))
    if any(i is Ellipsis for i in index):
        pos = next(j for j, i in enumerate(index) if i is Ellipsis)
        index = index[:pos] + (slice(None),) * (x.ndim - n_real) + index[pos + 1:]
    index = index + (slice(None),) * (x.ndim - builtins.sum(1 for i in index if i is not None))
    starts, stops, steps, kinds = [], [], [], []  # kinds: "keep" | "drop" per axis, "new" per None
    ax = 0
    for i in index:
        if i is None:
            kinds.append("new")
            continue
        d = x.shape[ax]
        if isinstance(i, slice):
            step = 1 if i.step is None else int(i.step)
            if step == 0:
                raise ShapeError(at("index: slice step must not be zero"))
            lo, hi = _slice_bounds(i.start, i.stop, step, d)
            starts.append(lo)
            stops.append(hi)
            steps.append(step)
            kinds.append("keep")
        elif isinstance(i, (int, np.integer)) and not isinstance(i, bool):
            k = i if isinstance(i, Dim) else int(i)  # a size-derived index stays symbolic
            if not -int(d) <= k < int(d):
                raise ShapeError(at(f"index: {k} out of range for axis {ax} of size {int(d)}"))
            start = k if k >= 0 else d + k
            starts.append(start)
            stops.append(start + 1)
            steps.append(1)
            kinds.append("drop")
        else:
            raise TraceError(at(f"index: unsupported index of type {type(i).__name__} "
                                "(ints, slices, None and ... are supported)"))
        ax += 1
    return starts, stops, steps, kinds


def _slice_bounds(start: Any, stop: Any, step: int, d: int) -> tuple[int, int]:
    """Clamped (start, stop) as Python slicing does, kept symbolic where a bound is derived from the size."""
    lo, hi, _ = slice(None if start is None else int(start), None if stop is None else int(stop), step).indices(int(d))

    def keep_symbolic(v: Any, concrete: int) -> int:
        if isinstance(v, Dim) and int(v) == concrete:
            return v
        return d + int(v) if v is not None and int(v) < 0 and int(d) + int(v) == concrete else concrete

    if step > 0:
        lo = keep_symbolic(start, lo)
        hi = d if stop is None or int(stop) >= int(d) else keep_symbolic(stop, hi)
        return lo, hi if int(hi) >= int(lo) else lo
    lo = d - 1 if start is None and int(d) > 0 else keep_symbolic(start, lo)
    hi = -1 if stop is None else keep_symbolic(stop, hi)
    return lo, hi if int(hi) <= int(lo) else lo


# ---- free functions -------------------------------------------------------------------------------------------

def matmul(a: Any, b: Any) -> Tensor:
    """numpy matmul semantics: 1-d operands are promoted and squeezed, batch dims broadcast."""
    a, b = _lift_pair(a, b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(at(f"matmul: operands must be at least 1-d, got {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}"))
    dt = dtypes.promote(a.dtype, b.dtype)
    if not dt.is_float:
        raise DTypeError(at(f"matmul: needs float operands, got {a.dtype} and {b.dtype}"))
    a, b = a.cast(dt), b.cast(dt)
    va, vb = a.ndim == 1, b.ndim == 1
    a2 = a.reshape(1, *a.shape) if va else a
    b2 = b.reshape(*b.shape, 1) if vb else b
    if int(a2.shape[-1]) != int(b2.shape[-2]):
        raise ShapeError(at(f"matmul: inner sizes differ: {fmt_shape(a.shape)} @ {fmt_shape(b.shape)}"))
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2], op="matmul")
    a3 = _expand_to(a2, (*batch, *a2.shape[-2:]))
    b3 = _expand_to(b2, (*batch, *b2.shape[-2:]))
    out = Tensor(make(Op.MATMUL, (a3.node, b3.node)))
    if va:
        out = out.squeeze(-2)
    if vb:
        out = out.squeeze(-1)
    return out


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """Elementwise ``a`` where ``cond`` else ``b``, with broadcasting."""
    cond = cond if isinstance(cond, Tensor) else Tensor(cond)
    if cond.dtype != dtypes.bool_:
        raise DTypeError(at(f"where: condition must be bool, got {cond.dtype}"))
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = full((), a) if isinstance(a, (bool, int, float)) else Tensor(a)
    a, b = _lift_pair(a, b, "where")
    dt = dtypes.promote(a.dtype, b.dtype)
    a, b = a.cast(dt), b.cast(dt)
    shape = broadcast_shapes(cond.shape, a.shape, b.shape, op="where")
    return Tensor(make(Op.WHERE, (_expand_to(cond, shape).node, _expand_to(a, shape).node, _expand_to(b, shape).node)))


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = [_operand(t, "concat") for t in tensors]
    if not tensors:
        raise ShapeError(at("concat: needs at least one tensor"))
    if any(t.ndim == 0 for t in tensors):
        raise ShapeError(at(f"{_opname('concat')}: a 0-d tensor cannot be concatenated (add an axis first)"))
    a = _axis(axis, tensors[0].ndim, "concat")
    dt = tensors[0].dtype
    for t in tensors[1:]:
        dt = dtypes.promote(dt, t.dtype)
    tensors = [t.cast(dt) for t in tensors]
    if len(tensors) == 1:
        return tensors[0]
    return Tensor(make(Op.CONCAT, tuple(t.node for t in tensors), {"axis": a}))


cat = concat


@composed("stack")
def stack(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    tensors = [_operand(t, "stack") for t in tensors]
    if not tensors:
        raise ShapeError(at("stack: needs at least one tensor"))
    a = _axis(axis, tensors[0].ndim + 1, "stack")
    shapes = {tuple(map(int, t.shape)) for t in tensors}
    if len(shapes) > 1:
        raise ShapeError(at(f"stack: shapes differ: {', '.join(fmt_shape(t.shape) for t in tensors)}"))
    return concat([t.unsqueeze(a) for t in tensors], a)


def _operand(v: Any, name: str) -> Tensor:
    """``v`` as a Tensor; anything that is not array-like is an error naming the op and the caller's line."""
    if isinstance(v, Tensor):
        return v
    try:
        return Tensor(v)
    except (TypeError, ValueError):
        raise TraceError(at(f"{name}: unsupported operand of type {type(v).__name__}")) from None


def _fn(method: str):
    def f(x: Any, *args: Any, **kwargs: Any) -> Tensor:
        x = _operand(x, method.strip("_"))
        return getattr(x, method)(*args, **kwargs)

    f.__name__ = f.__qualname__ = method  # pickled by reference: a module holding ``nf.relu`` pickles
    f.__doc__ = f"Functional form of ``Tensor.{method}``."
    return f


exp, log, sqrt, rsqrt, sin, cos = _fn("exp"), _fn("log"), _fn("sqrt"), _fn("rsqrt"), _fn("sin"), _fn("cos")
tanh, sigmoid, relu, abs, sign = _fn("tanh"), _fn("sigmoid"), _fn("relu"), _fn("abs"), _fn("sign")
reciprocal, clamp, cast, softmax, log_softmax = (_fn("reciprocal"), _fn("clamp"), _fn("cast"), _fn("softmax"),
                                                 _fn("log_softmax"))
logsumexp, reshape, permute, transpose, expand = (_fn("logsumexp"), _fn("reshape"), _fn("permute"),
                                                  _fn("transpose"), _fn("expand"))
squeeze, unsqueeze, flip, chunk, split, pad = (_fn("squeeze"), _fn("unsqueeze"), _fn("flip"), _fn("chunk"),
                                               _fn("split"), _fn("pad"))
sum, mean, var, std = _fn("sum"), _fn("mean"), _fn("var"), _fn("std")
log1p, expm1, square, argmax, argmin = (_fn("log1p"), _fn("expm1"), _fn("square"), _fn("argmax"),
                                        _fn("argmin"))
masked_fill, tril, triu = _fn("masked_fill"), _fn("tril"), _fn("triu")
cumsum, cumprod = _fn("cumsum"), _fn("cumprod")
repeat, tile, repeat_interleave = _fn("repeat"), _fn("tile"), _fn("repeat_interleave")
neg = _fn("__neg__")


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return as_tensor(x).max(axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return as_tensor(x).min(axis, keepdims)


def maximum(a: Any, b: Any) -> Tensor:
    return _binary(Op.MAX, a, b)


def minimum(a: Any, b: Any) -> Tensor:
    return _binary(Op.MIN, a, b)


@composed("silu")
def silu(x: Tensor) -> Tensor:
    return x * x.sigmoid()


@composed("gelu")
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """GELU; ``approximate="tanh"`` is the tanh form, the default the exact erf form via a tight erf polynomial."""
    if approximate == "tanh":
        return 0.5 * x * (1 + (math.sqrt(2 / math.pi) * (x + 0.044715 * x * x * x)).tanh())
    return 0.5 * x * (1 + erf(x * (1 / math.sqrt(2))))


def erf(x: Any) -> Tensor:
    """The error function, one IR op: libm's erf/erff on the C backend, a float64-exact reference, and the
    vjp 2/sqrt(pi) * exp(-x^2) (a polynomial composition would be float32-accurate and differentiate its own
    approximation)."""
    return _unary(Op.ERF, _operand(x, "erf"))
