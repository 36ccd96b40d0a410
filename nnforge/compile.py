"""``nf.compile``: trace once per input signature, optimize, hand to a backend, cache.

Every input size is traced as a symbolic ``Dim``. Sizes that decide a scan's trip count are left out of the
cache key: a call with a new sequence length re-specializes the cached graph (shape rules re-run, no Python
tracing) instead of tracing again. Tensors the function captures that require gradients (model parameters)
are read at call time rather than baked in, and tensors it updates in place (optimizer steps) are written
back after each call, so a compiled training step behaves like the eager one.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import logging
import os
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from .codegen import build_program
from .control import _is_leaf
from .dtypes import DType, as_dtype, from_numpy
from .errors import NNForgeError, TraceError, at, user_stacklevel
from .interop.autograd import call_with_autograd, joint_function, joint_key, needs_autograd, vjp_function
from .interop.convert import is_torch, to_numpy, to_torch
from .ir.dims import Dim, baked_symbols, expressed, free_symbols, normal, sym, symbol_name, value_at
from .ir.lengths import loop_lengths
from .ir.loops import placeholder
from .ir.node import Graph, Node, toposort
from .ir.ops import Op
from .passes import run_pipeline
from .passes.rewrite import substitute
from .passes.specialize import specialize, unify_sizes
from .pytree import flatten, flatten_call, leaf_paths, unflatten
from .tensor import Tensor, adopt
from .trace import scope, session

log = logging.getLogger("nnforge.compile")


def same_statics(a: tuple, b: tuple) -> bool:
    """Python values as a trace saw them: ``2``, ``2.0`` and ``True`` are equal in Python but trace differently
    (an int tensor times 2.0 is float), so their types must agree too; NaN matches NaN (it would never equal
    itself and trace anew at every call)."""
    return len(a) == len(b) and all(type(x) is type(y) and (x == y or (x != x and y != y)) for x, y in zip(a, b))


@dataclass
class _Entry:
    """One traced signature: the optimized generic graph and the programs built from it per concrete size."""

    treedef: Any
    dtypes: tuple
    shapes: tuple                    # traced shapes (ints), for the fixed axes
    generic: frozenset               # (leaf index, axis) pairs free to change
    statics: tuple
    graph: Graph
    out_def: Any
    implicit: list[weakref.ref]      # captured tensors read at call time (after the explicit inputs)
    state: list[tuple[weakref.ref, int]]  # tensors written back from output index
    n_out: int
    programs: dict[tuple, Callable] = field(default_factory=dict)
    epoch: int = 0                   # the session's epoch after tracing: what the tensors it captured were then
    grads: list[tuple[weakref.ref, int | None]] = field(default_factory=list)  # .grad written back (None: cleared)
    grad_reads: list[weakref.ref] = field(default_factory=list)  # tensors whose .grad is read (after ``implicit``)
    presence: tuple[tuple[weakref.ref, bool], ...] = ()  # whether each .grad the trace depends on was set
    modes: tuple[tuple[weakref.ref, bool], ...] = ()  # each module the trace called, and whether it was training
    baked_values: tuple[tuple[weakref.ref, Node], ...] = ()  # tensors baked in, and the value each held
    ties: tuple[Tie, ...] = ()  # generic axes whose size is set by others' (the sequences one scan walks)
    split: Any = None  # a joint graph's Partition for torch autograd (``interop.autograd``); False: run it whole

    def grads_as_traced(self) -> bool:
        """Whether every ``.grad`` whose presence the trace depends on (gradients accumulate onto it) is set or
        unset now as it was then: if not, the call needs a trace of its own."""
        return all((t := r()) is None or (t._grad is not None) == had for r, had in self.presence)

    def modes_as_traced(self) -> bool:
        """Whether every module the trace called is in the mode (``train()`` / ``eval()``) it was then: the mode
        decides what a module computes (dropout, batch statistics), so another mode needs a trace of its own."""
        return all((m := r()) is None or m.training == was for r, was in self.modes)

    def values_as_traced(self) -> bool:
        """Whether every tensor the trace baked in (a called module's frozen parameter or a batch norm's running
        statistics read in eval mode, a tensor the function captured) still holds the value it held then: loaded,
        trained or assigned since, the trace would compute with the old one."""
        return all((t := r()) is None or t.node is node for r, node in self.baked_values)

    def captures_alive(self) -> bool:
        """Whether every tensor the trace reads at call time still exists: one that is gone was replaced (a global
        name bound to a new tensor) and the function, traced again, reads whatever holds its place now."""
        return all(r() is not None for r in self.implicit)

    def matches(self, treedef: Any, dts: tuple, shapes: tuple, statics: tuple) -> bool:
        if treedef != self.treedef or dts != self.dtypes or not same_statics(statics, self.statics):
            return False
        if shapes == self.shapes:  # the traced shapes themselves (their ties held when traced)
            return True
        for i, (a, b) in enumerate(zip(shapes, self.shapes)):
            if len(a) != len(b):
                return False
            if any(x != y and (i, ax) not in self.generic for ax, (x, y) in enumerate(zip(a, b))):
                return False
        return all(tie.holds(shapes) for tie in self.ties)


def _is_static(x: Any) -> bool:
    return isinstance(x, (bool, int, float, str)) or x is None


def _is_argument(x: Any) -> bool:
    """A leaf of a call's arguments: an array, a tensor or a Python scalar, string or None (what ``_split`` sorts
    into arrays and statics)."""
    return _is_leaf(x) or _is_static(x)


def _flatten_call(args: tuple, kwargs: dict) -> tuple[list, Any]:
    """A call's leaves and structure, flattened once per call (the signature lookup and the checks before it
    read the same leaves)."""
    return flatten_call(args, kwargs, _is_argument)


class CompiledFunction:
    """A function traced and compiled per input signature. Call it with numpy arrays or torch tensors."""

    loaded_from: str | None = None  # the file of a program ``nf.load`` rebuilt (``saving.LoadedFunction``)

    def __init__(self, fn: Callable, backend: str = "reference", options: Mapping[str, Any] | None = None,
                 dtype: Any = None):
        from .codegen import BACKENDS, backend_with

        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; available: {', '.join(sorted(BACKENDS))}")
        if not callable(fn):
            raise TraceError(at(f"compile: expected a function, got {type(fn).__name__}"))
        self.fn = fn
        self.dtype = _compute_dtype(dtype)
        self._body = fn if self.dtype is None else _floats_cast(fn, self.dtype)  # what is traced
        self.backend = backend
        self.options = dict(options or {})
        self._builder = backend_with(backend, self.options)  # raises early on options the backend does not take
        self.trace_count = 0
        self._entries: list[_Entry] = []
        self._vjps: dict[tuple, CompiledFunction] = {}
        self._warned_retrace = False
        self._methods: dict[int, tuple[weakref.ref, CompiledFunction]] = {}  # ``__get__``: per instance
        self._loc = f"{getattr(fn, '__qualname__', 'function')} (compiled)"  # where written-back state comes from
        # names and docs only: the function's (or module's) own attributes, such as a model's `dtype`, must not
        # replace the compiled function's settings
        functools.update_wrapper(self, fn, updated=())

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        """``@nf.compile`` on a method: ``obj.f`` is the method compiled for ``obj`` (built once per instance and
        kept while it lives), ``obj`` a closure rather than an argument, so its tensors are captured as a
        function's are and two instances never share a trace (each reads its own parameters)."""
        if obj is None:
            return self
        key = id(obj)
        held = self._methods.get(key)
        if held is None or held[0]() is not obj:
            try:
                ref = weakref.ref(obj, lambda _, key=key, methods=self._methods: methods.pop(key, None))
            except TypeError:
                raise TypeError(at(f"compile: {_name(self.fn)} is compiled as a method, and instances of "
                                   f"{type(obj).__name__} cannot be referred to weakly (__slots__ without "
                                   "'__weakref__'); add '__weakref__' to its __slots__")) from None
            held = self._methods[key] = (ref, CompiledFunction(_bound_method(self.fn, ref), self.backend,
                                                               self.options, self.dtype))
        return BoundCompiledFunction(obj, held[1])

    def __reduce__(self) -> tuple | str:
        """Copied (``copy.deepcopy``) and pickled (to another process: multiprocessing, Ray) as the function and
        its options, not its programs, which hold machine code: the copy traces and compiles its own at its first
        call (``save`` and ``nf.load`` carry built programs instead). A module-level ``@nf.compile`` function is
        pickled by its name, as functions are."""
        owner: Any = sys.modules.get(self.__module__)
        for part in self.__qualname__.split("."):
            owner = getattr(owner, part, None)
        if owner is self:
            return self.__qualname__
        return CompiledFunction, (self.fn, self.backend, self.options, self.dtype)

    def save(self, path: str | os.PathLike) -> None:
        """Write the traced signatures and built programs to ``path``; ``nf.load(path)`` runs them in another
        process without tracing, optimizing or compiling (see ``nnforge.saving``)."""
        from .saving import save

        save(self, path)

    def _split(self, args: tuple, kwargs: dict, flat: tuple[list, Any] | None = None) -> tuple[list, Any, list, tuple]:
        """The call's leaves, structure, arrays (None for a static) and statics; ``flat``: the leaves and structure
        the caller already flattened (``_flatten_call``)."""
        leaves, treedef = flat or _flatten_call(args, kwargs)
        if self.dtype is not None:
            leaves = [_converted(v, self.dtype) for v in leaves]
        arrays, statics = [], []
        for v in leaves:
            if isinstance(v, (str, type(None))) or (isinstance(v, (bool, int, float)) and not isinstance(v, Tensor)):
                statics.append(v)
                arrays.append(None)
            elif isinstance(v, Tensor):
                arrays.append(v.numpy())
            else:
                a = v if type(v) is np.ndarray else _stand_in(v) if _on_gpu(v) else to_numpy(v)
                try:
                    from_numpy(a.dtype)
                except TypeError as e:
                    if a.dtype != object:  # an array of a dtype nnforge has not: name it
                        raise TraceError(at(f"compile: an argument of type {type(v).__name__} and shape "
                                            f"{list(a.shape)}: {e}")) from None
                    raise TraceError(at(f"compile: argument of type {type(v).__name__} is not an array, tensor or "
                                        "Python scalar")) from None
                arrays.append(a)
        return leaves, treedef, arrays, tuple(statics)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if "torch" in sys.modules and sys.modules["torch"].compiler.is_compiling():
            # torch.compile traces its caller: the call runs as it is (where is_compiling() is False), between
            # the graphs it compiles around it
            return sys.modules["torch"].compiler.disable(self.__call__)(*args, **kwargs)
        flat = _flatten_call(args, kwargs)
        given = flat[0]
        if session().tracing or _differentiated(given):
            return self._body(*args, **kwargs)  # inside another trace, or under a gradient: inline
        torch_in = "torch" in sys.modules
        if torch_in and needs_autograd(given):
            return call_with_autograd(self, args, kwargs)
        leaves, entry, outs = self._run(args, kwargs, flat=flat)
        if torch_in and any(is_torch(v) for v in leaves):
            outs = [o if is_torch(o) else to_torch(o) for o in outs]
        return unflatten(entry.out_def, outs)

    def _run(self, args: tuple, kwargs: dict, write_back: bool = True,
             flat: tuple[list, Any] | None = None) -> tuple[list, _Entry, list]:
        """Run the program for these arguments: the call's leaves, the entry and the results the caller sees.
        ``write_back``: rebind the tensors the function updates in place and the ``.grad`` it sets (False where a
        call already did: ``interop.autograd``'s whole pullback). ``flat``: as for ``_split``."""
        leaves, arrays, shapes, entry = self._lookup(args, kwargs, flat)
        outs = run_program(self._program(entry, shapes), leaves, arrays, implicit_arrays(entry))
        if write_back:
            self._write_back((ref, outs[i]) for ref, i in entry.state)
            for ref, i in entry.grads:
                t = ref()
                if t is not None:
                    t._grad = None if i is None else Tensor(adopt(to_numpy(outs[i]), self._loc))
        return leaves, entry, outs[:entry.n_out]

    def vjp_program(self, treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> CompiledFunction:
        """The compiled pullback used by torch autograd (``interop.autograd``), one per argument structure."""
        key = (treedef, n_leaves, diff)
        if key not in self._vjps:
            fn = vjp_function(self._body, treedef, n_leaves, diff)
            fn.__qualname__ = f"{_name(self.fn)}.vjp"
            self._vjps[key] = self._derived(fn)
        return self._vjps[key]

    def joint_program(self, treedef: Any, n_leaves: int, diff: tuple[int, ...]) -> CompiledFunction:
        """The function and its pullback traced as one (``interop.autograd``): torch autograd runs it in two
        halves, the forward saving what the backward reads, one per argument structure."""
        key = joint_key(treedef, n_leaves, diff)
        if key not in self._vjps:
            fn = joint_function(self._body, treedef, n_leaves, diff)
            fn.__qualname__ = f"{_name(self.fn)}.joint"
            self._vjps[key] = self._derived(fn)
        return self._vjps[key]

    def _derived(self, fn: Callable) -> CompiledFunction:
        """A function derived from this one (its pullback, or both traced as one) compiled alike. It traces again
        at the sizes this one does, whose own warning names the user's arguments: it only logs why."""
        derived = CompiledFunction(fn, self.backend, self.options)
        derived._warned_retrace = True
        return derived

    def _program(self, entry: _Entry, shapes: tuple, half: str | None = None) -> Callable:
        """The entry's program at these argument shapes, built on first use; ``half``: "forward" or "backward",
        that half of a joint entry's ``split`` (``interop.autograd``), its keys tagged with it."""
        tag = () if half is None else (half,)
        key = (*tag, *(shapes[i][ax] for i, ax in sorted(entry.generic)))
        generic = next((p for k, p in entry.programs.items() if k[:len(tag)] == tag), None)
        if key not in entry.programs and getattr(generic, "sizes_at_runtime", False):
            entry.programs[key] = generic  # the program reads trip counts from its inputs: no rebuild
        if key not in entry.programs:
            start = time.perf_counter()
            env = {f"a{i}.{ax}": shapes[i][ax] for i, ax in entry.generic}
            graph = entry.graph if half is None else getattr(entry.split, half)
            entry.programs[key] = build_program(self.backend, specialize(graph, env) if env else graph, self._builder)
            log.info("%s: %s %sprogram built in %.3f s", _name(self.fn), self.backend, f"{half} " if half else "",
                     time.perf_counter() - start)
        return entry.programs[key]

    def _write_back(self, pairs: Any) -> None:
        """Rebind each still living tensor of ``(weakref, array)`` pairs to its new value (in-place updates)."""
        for ref, value in pairs:
            if (t := ref()) is not None:
                t._rebind(adopt(to_numpy(value), self._loc))

    def trace(self, *args: Any, **kwargs: Any) -> Graph:
        """The optimized graph for these arguments (traced if not cached)."""
        return self._lookup(args, kwargs)[3].graph

    def _lookup(self, args: tuple, kwargs: dict,
                flat: tuple[list, Any] | None = None) -> tuple[list, list, tuple, _Entry]:
        """The cache entry matching these arguments, traced on a miss; also the flattened arguments. ``flat``: as
        for ``_split``."""
        leaves, treedef, arrays, statics = self._split(args, kwargs, flat)
        dts = tuple(None if a is None else a.dtype.str for a in arrays)
        shapes = tuple(() if a is None else tuple(a.shape) for a in arrays)
        self._drop_stale_entries()
        entry = next((e for e in self._entries if e.matches(treedef, dts, shapes, statics) and e.grads_as_traced()
                      and e.modes_as_traced()), None)
        if entry is not None and not entry.captures_alive():
            log.info("%s: a trace dropped: a tensor it captured no longer exists", _name(self.fn))
            self._entries.remove(entry)
            entry = None
        if entry is None:
            entry = self._on_miss(leaves, treedef, arrays, dts, shapes, statics)
            self._entries.append(entry)
        return leaves, arrays, shapes, entry

    def _drop_stale_entries(self) -> None:
        """A tensor frozen or unfrozen since a trace changes what is read at call time and what is baked in, and
        whether its gradient is taken; a module's parameter, buffer or sub-module reassigned since replaces tensors
        the trace captured; a tensor the trace baked in may hold another value since: those traces are dropped."""
        epoch = session().epoch
        if all(e.epoch == epoch and not e.baked_values for e in self._entries):
            return  # nothing any entry depends on can have changed
        kept = [e for e in self._entries if e.epoch == epoch]
        for t in {id(t): t for e in kept for r, node in e.baked_values if (t := r()) is not None
                  and t.node is not node}.values():
            log.info("%s: a trace dropped: %s, a tensor it baked in (a frozen parameter, running statistics read "
                     "in eval mode, a tensor it captured), holds another value since; read at each call from now on",
                     _name(self.fn),
                     t.name or f"a {t.dtype.short}{list(map(int, t.shape))} tensor")
            t._read_live()  # changed once, it may change again: the next trace reads it rather than bakes it
        self._entries = [e for e in kept if e.values_as_traced()]

    def _on_miss(self, leaves: list, treedef: Any, arrays: list, dts: tuple, shapes: tuple, statics: tuple) -> _Entry:
        """No cached signature matches: trace (saying why when only sizes differ from an earlier trace)."""
        self._explain_retrace(treedef, dts, shapes, statics)
        entry = self._trace(leaves, treedef, arrays, dts, shapes, statics)
        entry.epoch = session().epoch
        return entry

    def _explain_retrace(self, treedef: Any, dts: tuple, shapes: tuple, statics: tuple) -> None:
        """A trace that differs from an earlier one only in input sizes says which sizes and why (a Python loop
        over a size unrolls it into the trace): logged every time, warned once per function."""
        same = [e for e in self._entries if e.treedef == treedef and e.dtypes == dts and
                same_statics(e.statics, statics)]
        if not same:
            return
        prev = same[-1]
        if shapes == prev.shapes:  # only grads_as_traced() or modes_as_traced() differs
            why = ("a .grad its gradients accumulate onto was set or cleared since" if prev.modes_as_traced() else
                   "a module it calls was switched between train() and eval() since (each mode keeps its trace)")
            log.info("%s: traced again (trace %d): %s", _name(self.fn), self.trace_count + 1, why)
            return
        names = _argument_names(self.fn, treedef)
        changed = [f"{names[i]}.shape[{ax}] {b} -> {a}" for i, (new, old) in enumerate(zip(shapes, prev.shapes))
                   for ax, (a, b) in enumerate(zip(new, old))
                   if a != b and len(new) == len(old) and (i, ax) not in prev.generic]  # a scan's length is free
        msg = (f"{_name(self.fn)}: traced again (trace {self.trace_count + 1}) because input sizes changed: "
               f"{', '.join(changed) or 'ranks differ'}. Only a size that sets an nf.scan's trip count is free; "
               "any other size is part of the trace (a Python loop over a size unrolls it: write it with nf.scan "
               "to take every length with one trace)")
        log.info(msg)
        if not self._warned_retrace:
            self._warned_retrace = True
            warnings.warn(msg, stacklevel=user_stacklevel())

    def _trace(self, leaves: list, treedef: Any, arrays: list, dts: tuple, shapes: tuple, statics: tuple) -> _Entry:
        self.trace_count += 1
        start = time.perf_counter()
        t = trace_function(self._body, treedef, leaves, arrays)
        traced = time.perf_counter()
        graph = run_pipeline(t.graph)
        log.info("%s: traced in %.3f s (%d nodes), passes in %.3f s", _name(self.fn), traced - start,
                 len(t.graph.order), time.perf_counter() - traced)
        graph, generic, ties = _generic_axes(graph, shapes, t.baked)
        return _Entry(treedef, dts, shapes, generic, statics, graph, t.out_def, t.implicit, t.state, t.n_out,
                      grads=t.grads, grad_reads=t.grad_reads, presence=t.presence, modes=t.modes,
                      baked_values=t.baked_values, ties=ties)


def _argument_names(fn: Callable, treedef: Any) -> list[str]:
    """Each leaf of a call's arguments (``treedef``: of ``(args, kwargs)``) as the user wrote it: ``x``,
    ``state[0]``, ``args[1]`` for ``*args``, from ``fn``'s signature (``arg2`` where it has none)."""
    args_def, kwargs_def = treedef[1]
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    star = next((k for k, p in enumerate(params) if p.kind is p.VAR_POSITIONAL), None)

    def positional(k: int) -> str:
        if star is not None and k >= star:
            return f"{params[star].name}[{k - star}]"
        return params[k].name if k < len(params) else f"arg{k}"

    return ([positional(k) + path for k, child in enumerate(args_def[1]) for path in leaf_paths(child)]
            + [key + path for key, child in zip(kwargs_def[1], kwargs_def[2]) for path in leaf_paths(child)])


class BoundCompiledFunction:
    """A compiled method looked up on its instance (``obj.f``), as Python's bound method is: it holds the instance
    for as long as it is held (``A().f(x)``), calls the compiled function kept for that instance, and reads as it
    (``trace_count``, ``save``)."""

    def __init__(self, obj: Any, compiled: CompiledFunction):
        self.__self__, self.__func__ = obj, compiled

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.__func__(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__func__, name)

    def __repr__(self) -> str:
        return f"<compiled method {_name(self.__func__.fn)} of {self.__self__!r}>"


def _bound_method(fn: Callable, ref: weakref.ref) -> Callable:
    """``fn`` with its first argument (``self``) the object ``ref`` refers to, named and signed as the method
    without ``self`` (argument names in messages); weakly, so that a compiled method does not keep every
    instance it was called on alive."""
    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        obj = ref()
        if obj is None:
            raise ReferenceError(f"{_name(fn)}: the instance this compiled method was bound to no longer exists")
        return fn(obj, *args, **kwargs)

    try:
        signature = inspect.signature(fn)
        method.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        pass
    return method


def _compute_dtype(dtype: Any) -> DType | None:
    """``nf.compile``'s ``dtype``: None, or a floating-point dtype (else ``ValueError`` naming it)."""
    if dtype is None:
        return None
    try:
        dt = as_dtype(dtype)
    except (TypeError, ValueError):
        raise ValueError(f"compile: dtype must be a floating-point dtype such as nf.float16, got {dtype!r}") from None
    if not dt.is_float:
        raise ValueError(f"compile: dtype must be a floating-point dtype such as nf.float16, got {dt.value}")
    return dt


def _converted(v: Any, dtype: DType) -> Any:
    """A floating-point array argument in ``dtype`` (a torch tensor stays on its device); anything else as it is."""
    if isinstance(v, Tensor):
        return v.cast(dtype) if v.dtype.is_float else v
    if isinstance(v, np.ndarray):
        return v.astype(dtype.np) if from_numpy(v.dtype).is_float and v.dtype != dtype.np else v
    if is_torch(v) and v.is_floating_point():
        import torch

        return v.to(getattr(torch, dtype.value))
    return v


def _floats_cast(fn: Callable, dtype: DType) -> Callable:
    """``fn`` reading its floating-point array arguments as ``dtype``, for a trace that calls it (the compiled
    function inlined in another, or its gradient program for torch autograd): there the casts are nodes of the
    graph, so gradients with respect to those arguments come back in their own dtype."""
    @functools.wraps(fn)
    def cast(*args: Any, **kwargs: Any) -> Any:
        leaves, treedef = flatten((args, kwargs), _is_leaf)
        a, k = unflatten(treedef, [_converted(v, dtype) for v in leaves])
        return fn(*a, **k)

    return cast


def _differentiated(leaves: list) -> bool:
    """Whether a gradient will be taken through these arguments' nnforge tensors: under an eager ``nf.grad`` or
    ``nf.vjp``, or computed from a tensor created with ``requires_grad=True`` (``Tensor.backward``). A program
    run on them would hand back constants, its gradient silently zero; inlined, its ops join the graph."""
    nodes = [v.node for v in leaves if isinstance(v, Tensor)]
    if not nodes:
        return False
    s = session()
    if s.differentiating:
        return True
    for n in toposort(nodes):
        ref = s.grad_leaves.get(id(n))
        t = ref() if ref is not None else None
        if t is not None and t.node is n:
            return True
    return False


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", type(fn).__name__)


class Tie(NamedTuple):
    """A generic input axis whose size is set by other generic axes: the sequences one scan walks have one length,
    so a cotangent of a scan over ``x[::2]`` is ``(T + 1) // 2`` long where ``x`` is ``T`` long. Checked whenever
    a call's shapes are matched against a trace."""

    axis: tuple[int, int]  # (argument, axis)
    size: int              # a Dim of other generic axes' symbols

    def holds(self, shapes: tuple) -> bool:
        i, ax = self.axis
        return shapes[i][ax] == value_at(self.size, {name: shapes[j][b] for name in free_symbols(self.size)
                                                     for j, b in [_input_axis(name)]})


def _input_axis(name: str) -> tuple[int, int]:
    """The (argument, axis) whose size the trace named ``name`` (``a2.0``: argument 2, axis 0)."""
    return tuple(map(int, name[1:].split(".")))  # type: ignore[return-value]


def _generic_axes(graph: Graph, shapes: tuple, baked: set[str]) -> tuple[Graph, frozenset, tuple[Tie, ...]]:
    """Input axes whose size only sets a loop's trip count, checked by re-specializing at another size, and how
    those that must agree are tied (``Tie``): a scan over several sequences takes its length from each, so they
    are freed together, the graph writes each tied size as the one it equals (its programs then check them against
    each other), and a later call must satisfy every tie to match.

    Sizes the function turned into Python floats (``baked``) are in the trace as constants: never generic.
    """
    linked: list[tuple[set[str], list[tuple]]] = []  # loops sharing symbols: their lengths are freed together
    for sizes in loop_lengths(graph):
        names = free_symbols(sizes)
        joined = [c for c in linked if c[0] & names]
        linked = [c for c in linked if not c[0] & names] + [
            (names.union(*(c[0] for c in joined)), [*(s for c in joined for s in c[1]), sizes])]
    axes: set[tuple[int, int]] = set()
    ties: list[Tie] = []
    tied: dict[str, int] = {}
    for names, loops in linked:
        if not names or names & baked:
            continue
        these = _tied_lengths(loops)
        if these is None:
            continue  # lengths that cannot be written as one another: keep them in the cache key
        try:
            specialize(unify_sizes(graph, these) if these else graph,
                       {name: shapes[i][ax] + 1 for name in names - these.keys() for i, ax in [_input_axis(name)]})
        except NNForgeError:
            continue  # a size is baked into the graph somewhere else: keep it in the cache key
        axes |= {_input_axis(name) for name in names}
        ties += [Tie(_input_axis(name), size) for name, size in these.items()]
        tied |= these
    return (unify_sizes(graph, tied) if tied else graph), frozenset(axes), tuple(ties)


def _tied_lengths(loops: list[tuple]) -> dict[str, int] | None:
    """Loops' lengths (each loop's sizes: ``ir.lengths.loop_lengths``) written as one another: in each loop every
    sequence's bare-symbol length but one becomes the loop's length, the one expression among its sizes if there is
    one, else the first argument's symbol. None where that cannot be said: a constant, two different expressions,
    a symbol equal to an expression of itself."""
    tied: dict[str, int] = {}
    for sizes in loops:
        sizes = tuple(expressed(size, tied) for size in sizes)
        if not all(isinstance(size, Dim) for size in sizes):
            return None
        bare = {name: size for size in sizes if (name := symbol_name(size)) is not None}
        exprs = {normal(size.expr): size for size in sizes if symbol_name(size) is None}
        if len(exprs) > 1:
            return None
        length = next(iter(exprs.values())) if exprs else bare[min(bare, key=_input_axis)]
        rest = bare.keys() - {symbol_name(length)}
        if free_symbols(length) & rest:
            return None
        new = dict.fromkeys(rest, length)
        tied = {name: expressed(size, new) for name, size in tied.items()} | new
    return tied


class Traced(NamedTuple):
    """A traced function: its graph, output structure, inputs read at call time and tensors written back."""

    graph: Graph
    out_def: Any
    implicit: list[weakref.ref]             # captured tensors, read after the explicit inputs
    state: list[tuple[weakref.ref, int]]     # tensors written back from output index
    n_out: int                               # outputs the caller sees (state outputs follow)
    baked: set[str]                          # size symbols used as Python floats during the trace
    grads: list[tuple[weakref.ref, int | None]]  # .grad written back from output index (None: set to None)
    grad_reads: list[weakref.ref]            # tensors whose .grad is read at call time (after ``implicit``)
    presence: tuple[tuple[weakref.ref, bool], ...]  # whether each .grad the trace depends on was set
    modes: tuple[tuple[weakref.ref, bool], ...]  # each module the trace called, and whether it was training
    baked_values: tuple[tuple[weakref.ref, Node], ...]  # tensors baked in, and the value each held


def _stand_in(t: Any) -> np.ndarray:
    """A device tensor's ``stand_in``: what tracing and the signature cache read, without copying the tensor to
    the host."""
    return stand_in(tuple(t.shape), to_numpy(t.new_empty((0,))).dtype)


def stand_in(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array of this shape and dtype with no memory of its own (every stride 0), for tracing."""
    return np.lib.stride_tricks.as_strided(np.empty(1, dtype), shape, (0,) * len(shape), writeable=False)


def _on_gpu(v: Any) -> bool:
    return is_torch(v) and v.device.type != "cpu"


def implicit_arrays(entry: _Entry) -> list:
    """The values an entry's program reads after the call's arguments: captured tensors, then ``.grad`` values."""
    out = []
    for ref in entry.implicit:
        t = ref()
        if t is None:
            raise NNForgeError("a tensor captured by the compiled function no longer exists")
        out.append(t.numpy())
    for ref in entry.grad_reads:  # set: grads_as_traced() chose this entry
        out.append(ref().grad.numpy())
    return out


def run_program(program: Any, leaves: list, arrays: list, extra: list) -> list:
    """``program`` on a call's arrays (``_split``) followed by ``extra`` inputs: torch tensors where the program
    runs are passed and returned without host copies; anything else goes through numpy."""
    tensors = _on_device(program, leaves, arrays)
    if tensors is not None:
        return program.call_tensors(tensors + extra)
    host = [a if v is a else to_numpy(v) if _on_gpu(v) else a for v, a in zip(leaves, arrays) if a is not None]
    return program(host + extra)


def _on_device(program: Any, leaves: list, arrays: list) -> list | None:
    """The call's tensors when the program takes tensors (``call_tensors``) and every array argument is a torch
    tensor on the program's device; else None (the call goes through numpy)."""
    device = getattr(program, "device", None)
    if device is None or not hasattr(program, "call_tensors"):
        return None
    tensors = [v for v, a in zip(leaves, arrays) if a is not None]
    if not tensors or not all(is_torch(t) and t.device.type == device for t in tensors):
        return None
    return tensors


def trace_function(fn: Callable, treedef: Any, leaves: list, arrays: list) -> Traced:
    """Trace ``fn`` on symbolic placeholders."""
    placeholders, wrapped = [], []
    for i, (v, a) in enumerate(zip(leaves, arrays)):
        if a is None:
            wrapped.append(v)
            continue
        shape = tuple(sym(f"a{i}.{ax}", d) for ax, d in enumerate(a.shape))
        p = placeholder(shape, from_numpy(a.dtype), f"arg{i}")
        placeholders.append(p)
        wrapped.append(Tensor(p))
    args, kwargs = unflatten(treedef, wrapped)
    baked: set[str] = set()
    token = baked_symbols.set(baked)
    try:
        with scope("function") as sc:
            out = fn(*args, **kwargs)
    finally:
        baked_symbols.reset(token)
    # .grad the function set: (tensor, before the call, what it leaves, whether it first cleared it)
    grads = [(t, before, t._grad, id(t) in sc.grads_cleared) for t, before in sc.grads_set.values()]
    for t, before, _, _ in grads:
        t._grad = before
    out_leaves, out_def = flatten(out, _is_leaf)
    outs = []
    for v in out_leaves:
        if not isinstance(v, Tensor):
            if isinstance(v, (np.ndarray, int, float, bool)) or is_torch(v):
                v = Tensor(v)
            else:
                raise TraceError(at(f"compile: the function returned a {type(v).__name__}; return tensors"))
        outs.append(v.node)
    # In-place updates of captured tensors become extra outputs written back after each call; their values
    # before the call, like captured parameters, become inputs read at call time instead of baked constants.
    inside = _dependents(outs + [t.node for t, _ in sc.assigned.values()], placeholders)
    state = [(t, before) for t, before in sc.assigned.values() if id(before) not in inside]
    new_nodes = [t.node for t, _ in state]
    for t, before in sc.assigned.values():
        t._rebind(before)
    # .grad the function leaves set is written back after each call, as in-place updates are (extra outputs after
    # them); what it accumulated onto is read at call time, and its presence then must be what it was now.
    left = [g.node for _, _, g, _ in grads if isinstance(g, Tensor)]
    graph = Graph(placeholders, outs + new_nodes + left, sc.effects)
    captured = _captured(graph, state)
    used = {id(n) for n in graph.order}
    known = {id(n) for n, _ in captured}
    reads = [(b.node, t) for t, b, _, cleared in grads
             if not cleared and isinstance(b, Tensor) and id(b.node) in used and id(b.node) not in known]
    presence = tuple((weakref.ref(t), b is not None) for t, b, _, cleared in grads
                     if not cleared and (b is None or id(b.node) in used))
    mapping = {id(n): placeholder(n.shape, n.dtype, f"param{k}") for k, (n, _) in enumerate(captured)}
    mapping.update({id(n): placeholder(n.shape, n.dtype, f"grad{k}") for k, (n, _) in enumerate(reads)})
    graph = substitute(graph, mapping)
    graph = Graph(tuple(graph.inputs) + tuple(mapping[id(n)] for n, _ in [*captured, *reads]), graph.outputs,
                  graph.effects)
    implicit = [weakref.ref(t) for _, t in captured]
    state_refs = [(weakref.ref(t), len(outs) + i) for i, (t, _) in enumerate(state)]
    slot = itertools.count(len(outs) + len(state))  # the outputs of ``left``, in order
    grad_refs = [(weakref.ref(t), next(slot) if isinstance(g, Tensor) else None) for t, _, g, _ in grads]
    live = {id(t) for _, t in captured}
    # tensors baked in as constants (a module's frozen parameter or running statistics, a global mask): the value
    # each held, to trace again once one holds another
    read = [t for r in sc.read.values() if (t := r()) is not None]
    baked_values = [(weakref.ref(t), t.node) for t in read
                    if id(t) not in live and id(t.node) in used and id(t.node) not in inside]
    return Traced(graph, out_def, implicit, state_refs, len(outs), baked, grad_refs,
                  [weakref.ref(t) for _, t in reads], presence, tuple(sc.modes.values()), tuple(baked_values))


def _dependents(roots: list[Node], placeholders: list[Node]) -> set[int]:
    """ids of the nodes under ``roots`` computed from the function's inputs (made during this call)."""
    out = {id(p) for p in placeholders}
    for n in toposort(roots, placeholders):
        if any(id(s) in out for s in n.srcs):
            out.add(id(n))
    return out


def _captured(graph: Graph, state: list[tuple[Tensor, Node]]) -> list[tuple[Node, Tensor]]:
    """Values read at call time: the tensors updated in place, then live parameters (tensors requiring grad) and
    the session's other live tensors (``HostValue`` numbers, tensors that changed after a trace baked them).

    Any node kind counts, not only DATA: after an eager optimizer step a parameter holds an expression node, and
    baking that in would freeze the parameter at its trace-time value.
    """
    s = session()
    out = [(before, t) for t, before in state]
    seen = {id(n) for n, _ in out}
    for n in graph.order:  # captured values inside bodies are consts of their loop node: top-level too
        if n.op == Op.INPUT or id(n) in seen:
            continue
        ref = s.grad_leaves.get(id(n)) or s.live.get(id(n))
        t = ref() if ref is not None else None
        if t is not None and t.node is n:
            out.append((n, t))
            seen.add(id(n))
    return out


def compile(fn: Callable | None = None, *, backend: str = "reference", options: Mapping[str, Any] | None = None,
            dtype: Any = None) -> Any:
    """Compile ``fn`` (usable as ``@nf.compile`` or ``@nf.compile(backend="cpu")``). ``options``: settings of the
    backend, for ``triton`` ``{"cuda_graphs": True}`` (replay its programs as CUDA graphs) and ``{"tiles":
    Tiles(...)}`` (block sizes); an option the backend does not take raises ``ValueError``. ``dtype``: a
    floating-point dtype (``nf.float16``, ``nf.bfloat16``...) every floating-point array argument is converted to
    at the call (a torch tensor on its device), so a function written and called in float32 runs in half
    precision (its matmuls accumulating in float32) with the very program the converted arguments would get;
    the results are what the computation makes of them, and torch autograd's gradients of the arguments are in
    the arguments' dtype (a compiled ``nf.grad`` converts its own arguments: its gradients are in ``dtype``).
    Tensors the function captures (a module's parameters) keep theirs: cast the module (``Module.to``)."""
    if fn is None:
        return lambda f: CompiledFunction(f, backend, options, dtype)
    return CompiledFunction(fn, backend, options, dtype)


def show(fn: Callable, *args: Any, stage: str = "ir", **kwargs: Any) -> str:
    """Print and return the IR of ``fn`` for these arguments. ``stage``: "traced" (before passes), "ir",
    "scheduled" (the backend-neutral program a target schedules: kernels named after what they fuse, where results
    go, which loops are split by rows, chunked projections; the Triton target's for a function compiled with
    ``backend="triton"``, else the CPU target's), "fused" (the C backend's kernel listing: what each kernel fuses
    and its index expressions) or "source" (the code the compiled function's backend generates: C, or a Triton
    module)."""
    stages = ("traced", "ir", "scheduled", "fused", "source")
    if stage not in stages:
        raise ValueError(f"show: unknown stage {stage!r}; choose one of {', '.join(stages)}")
    cf = fn if isinstance(fn, CompiledFunction) else CompiledFunction(fn)
    shown = getattr(cf._builder, stage, None)  # a code-generating backend's own view of the stage
    if stage == "ir":
        text = repr(cf.trace(*args, **kwargs))
    elif stage == "fused":
        from .codegen.c import fused_listing

        text = fused_listing(cf.trace(*args, **kwargs))
    elif stage == "scheduled":
        from .codegen.c import scheduled

        text = (shown or scheduled)(cf.trace(*args, **kwargs))
    elif stage == "source":
        if shown is None:
            raise ValueError(f"show: backend {cf.backend!r} generates no code; stage 'source' shows a function "
                             "compiled with backend='cpu' or backend='triton'")
        text = shown(cf.trace(*args, **kwargs))
    else:
        leaves, treedef, arrays, _ = cf._split(args, kwargs)
        text = repr(trace_function(cf._body, treedef, leaves, arrays).graph)
    print(text)
    return text
