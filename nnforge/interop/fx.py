"""A torch model as an ``nnforge.nn`` module: its ``forward`` captured by ``torch.fx``, then run on nnforge tensors.

Each torch layer the graph calls becomes its ``nnforge.nn`` twin (same parameter names and values, so the two load
each other's state dicts); each torch function, operator and tensor method becomes nnforge's, with torch's
argument names (``dim``, ``keepdim``) translated. The result is an ordinary ``nnforge.nn.Module``: a whole
training step that calls it compiles to one program, and ``nnforge.torch.TorchModule(from_torch(m), twin=m)``
runs it inside torch's own training loop. What torch.fx cannot capture (Python control flow on tensor values or
sizes: a time loop written in Python) must be written with ``nf.scan`` in nnforge instead.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import inspect
import operator
import os
import re
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx

from .. import dtypes
from .. import nn as nfnn
from ..dtypes import as_dtype
from ..errors import NNForgeError, ShapeError, at
from ..indexing import set_at
from ..nn import functional as NF
from ..tensor import (
    Tensor,
    arange,
    as_tensor,
    clamp,
    full,
    matmul,
    maximum,
    minimum,
    ones,
    ones_like,
    zeros,
    zeros_like,
)

__all__ = ["from_torch"]

# torch's argument names -> nnforge's, used where the nnforge callable does not take torch's name
_RENAMES = {"dim": "axis", "keepdim": "keepdims", "start_dim": "start", "end_dim": "end", "dims": "axis"}
_IGNORED = frozenset({"device", "layout", "pin_memory", "memory_format", "non_blocking", "copy", "out", "inplace"})


@dataclass(frozen=True)
class _Ref:
    """An fx node's value in the interpreted program, by name."""

    name: str


@dataclass(frozen=True)
class _Step:
    name: str
    op: str        # placeholder, get_attr, call_module, call_function, call_method, output
    target: Any
    args: tuple
    kwargs: dict
    where: str     # the user's source line, for errors
    mutates: tuple[str, ...] = ()  # what an in-place call changes (``x.add_(y)``, ``x[i] = v``) and the values
    # sharing its memory (``x.mul_(2).add_(1)``): each rebound to the call's result
    assigns: tuple[str, ...] = ()  # the buffers among them (``self.mean.mul_(0.9)``), which keep the result


class FromTorch(nfnn.Module):
    """The module ``from_torch`` returns: the captured graph's steps and the nnforge layers they call. Where
    ``forward`` reads ``self.training``, one graph per set of modes it was captured in (``_variants``: the modes
    read, then the steps), and each call runs the one its parts' modes now select."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        env: dict[str, Any] = {}
        inputs = [_as_input(a) for a in args]
        kwargs = {k: _as_input(v) for k, v in kwargs.items()}
        for step in self._graph():
            if step.op == "placeholder":
                if inputs:
                    env[step.name] = inputs.pop(0)
                elif step.target in kwargs:
                    env[step.name] = kwargs[step.target]
                elif step.args:
                    env[step.name] = step.args[0]
                else:
                    raise TypeError(f"{self._torch_name}.forward: missing argument {step.target!r}")
                continue
            if step.op == "output":
                return _load(step.args[0], env)
            a, kw = _load(step.args, env), _load(step.kwargs, env)
            try:
                env[step.name] = self._run(step, a, kw)
            except NNForgeError as e:
                raise type(e)(f"{e} [{step.where}]") from None
            except TypeError as e:  # an operand or argument torch takes and nnforge does not (x // 3)
                raise TypeError(f"from_torch: {e} [{step.where}]") from e
            for name in step.mutates:  # later steps read the changed value
                env[name] = env[step.name]
            for path in step.assigns:  # and so do later calls: module state, as a BatchNorm's running mean
                _at(self, path).assign(env[step.name])
        raise AssertionError("an fx graph ends with its output")

    def _graph(self) -> tuple[_Step, ...]:
        """The steps captured in the modes the parts whose ``self.training`` forward reads are in now: fx baked
        each read into the graph (``F.dropout(x, training=self.training)``, ``p if self.training else 0``)."""
        for reads, steps in self._variants:
            if all(self._part(path)._mode_noted() == mode for path, mode in reads):  # the steps depend on it
                return steps
        now = ", ".join(f"{path or self._torch_name!r} in {'train' if self._part(path).training else 'eval'} "
                        "mode" for path in dict(r for reads, _ in self._variants for r in reads))
        raise NNForgeError(f"from_torch: {self._torch_name}.forward reads self.training, and was captured with the "
                           f"whole model in train mode, in eval mode and in the modes it was converted in, not with "
                           f"{now}: set the modes with .train() / .eval() on the whole model")

    def _part(self, path: str) -> nfnn.Module:
        return self if not path else _at(self, path)

    def _run(self, step: _Step, a: tuple, kw: dict) -> Any:
        if step.op == "get_attr":
            return _at(self, step.target)
        if step.op == "call_module":
            return _at(self, step.target)(*a, **kw)
        if step.op == "call_method":
            return _method(step, a[0], a[1:], kw)
        return _function(step, a, kw)

    def extra_repr(self) -> str:
        return f"from torch {self._torch_name}"


def _as_input(x: Any) -> Any:
    """An argument as nnforge's own layers take it: an array (numpy's, torch's) becomes a tensor, so the torch
    methods the graph calls on it (``x.transpose(0, 1)``, ``x.size(1)``) are nnforge's, not numpy's namesakes."""
    if isinstance(x, (np.ndarray, torch.Tensor)):
        return as_tensor(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_as_input(v) for v in x)
    if isinstance(x, dict):
        return {k: _as_input(v) for k, v in x.items()}
    return x


def from_torch(model: torch.nn.Module) -> nfnn.Module:
    """``model`` as an ``nnforge.nn`` module computing the same thing (its weights copied, each part in its
    train/eval mode, what torch shares shared): a torch layer with an nnforge twin becomes that layer, any other
    model a ``FromTorch`` of its captured graph. Raises ``NNForgeError`` naming the layer, setting, function or
    source line that has no nnforge counterpart, and when torch.fx cannot capture ``forward`` (Python control
    flow on tensor values or sizes)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"from_torch: needs a torch.nn.Module, got {type(model).__name__}")
    layers = _layers()
    if _Tracer(layers).is_leaf_module(model, ""):  # fx would trace into its implementation (torch's fused kernels)
        return _modes_of(model, _layer(layers, model, type(model).__name__, "from_torch"))
    variants = _captured(model, layers)
    out = FromTorch()
    object.__setattr__(out, "_torch_name", type(model).__name__)
    calls = [node for _, graph in variants for node in graph.nodes if node.op == "call_module"]
    for node in calls:  # layers first: an attribute read from one (self.rnn.weight_hh_l0) is the layer's own
        if _at(out, node.target) is None:
            _place(out, node.target, _layer(layers, model.get_submodule(node.target), node.target, _where(node)))
    captured = tuple((reads, _steps(list(graph.nodes), model, out)) for reads, graph in variants)
    if all(steps == captured[0][1] for _, steps in captured):  # no mode changes the graph
        captured = (((), captured[0][1]),)
    for reads, _ in captured:  # a part whose mode forward reads, though nothing of it is converted
        for path, _ in reads:
            if path and _at(out, path) is None:
                _place(out, path, nfnn.Module())
    object.__setattr__(out, "_variants", captured)
    _share(out, model, layers)
    _in_torchs_order(out, model)
    return _modes_of(model, out)


def _captured(model: torch.nn.Module, layers: dict[type, Callable[[Any], nfnn.Module]]
              ) -> list[tuple[tuple[tuple[str, bool], ...], torch.fx.Graph]]:
    """``model.forward`` captured by fx in the modes its modules are in; where it reads ``self.training`` (fx
    bakes the bool read into the graph), captured again with every module in train mode and in eval mode. Each
    graph comes with the modes it read, (path, training) pairs: it is the model's in those modes only."""
    variants: list[tuple[dict[str, bool], torch.fx.Graph]] = []
    for mode in (None, True, False):
        reads: dict[str, bool] = {}
        graph = _capture(model, layers, mode, reads)
        if all(reads != seen for seen, _ in variants):
            variants.append((reads, graph))
        if mode is None and not reads:  # the graph is the model's in any mode
            break
    return [(tuple(reads.items()), graph) for reads, graph in variants]


def _capture(model: torch.nn.Module, layers: dict[type, Callable[[Any], nfnn.Module]], mode: bool | None,
             reads: dict[str, bool]) -> torch.fx.Graph:
    """One fx capture of ``model.forward``, every module in ``mode`` (None: in its own), noting in ``reads`` each
    module's ``self.training`` that its code reads."""
    try:
        with _modes_read(model, mode, reads):
            return _Tracer(layers).trace(model)
    except Exception as e:  # torch.fx raises TraceError, TypeError, RuntimeError... with its own message
        raise NNForgeError(f"from_torch: torch.fx could not capture {type(model).__name__}.forward"
                           f"{_failed_at(e.__traceback__)}: {e}. It "
                           "follows tensors and their sizes as symbols: Python control flow on them (a loop over "
                           "time steps, an if on a value) and unpacking a shape of unknown length (*x.shape[1:]; "
                           "t, n, c = x.shape works) cannot be captured. Write a time loop with nnforge (nf.scan) "
                           "and call it through nnforge.torch.TorchModule") from None


@contextlib.contextmanager
def _modes_read(model: torch.nn.Module, mode: bool | None, reads: dict[str, bool]) -> Iterator[None]:
    """While inside, every module of ``model`` is in ``mode`` (None: its own), and each read of a module's
    ``training`` is noted in ``reads`` by the module's path: ``training`` is a plain attribute, so a property on
    torch's Module class sees the reads (as ``_factories_traced`` patches torch's functions, only while tracing).
    The modes are restored after, each module's own."""
    paths = {id(m): path for path, m in model.named_modules()}
    saved = [(m, m.training) for m in model.modules()]

    def read(m: torch.nn.Module) -> bool:
        try:
            value = m.__dict__["training"]
        except KeyError:
            raise AttributeError("training") from None
        if id(m) in paths:
            reads.setdefault(paths[id(m)], value)
        return value

    def write(m: torch.nn.Module, value: bool) -> None:
        m.__dict__["training"] = value

    before = torch.nn.Module.__dict__.get("training")
    try:
        for m, _ in saved:
            m.__dict__["training"] = m.training if mode is None else mode
        torch.nn.Module.training = property(read, write)
        yield
    finally:
        if before is None:
            del torch.nn.Module.training
        else:
            torch.nn.Module.training = before
        for m, was in saved:
            m.__dict__["training"] = was


def _steps(nodes: list[torch.fx.Node], model: torch.nn.Module, out: nfnn.Module) -> tuple[_Step, ...]:
    """A captured graph as the steps ``FromTorch`` runs, checked: every function and method has a counterpart, and
    in-place changes replay as new values. The parameters and buffers it reads directly are placed in ``out``."""
    steps, shared = [], {}  # value -> the values sharing its memory (x.add_(y) returns x)
    attributes = {node.name: node.target for node in nodes if node.op == "get_attr"}
    for k, node in enumerate(nodes):
        where = _where(node)
        if node.op == "get_attr" and _at(out, node.target) is None:
            _place(out, node.target, _tensor(_at(model, node.target)), _persistent(model, node.target))
        elif node.op == "call_function":
            _check_function(node.target, where)
        elif node.op == "call_method":
            _check_method(node.target, where)
        changed, mutates = _mutated(node, model), ()
        if changed is not None:
            _check_mutation(node, changed, nodes[k + 1:], where)
            mutates = shared.get(changed.name, (changed.name,))
            for name in (*mutates, node.name):
                shared[name] = (*mutates, node.name)
        steps.append(_Step(node.name, node.op, node.target, _store(node.args), _store(node.kwargs), where,
                           mutates, tuple(attributes[n] for n in mutates if n in attributes)))
    return tuple(steps)


def _persistent(model: torch.nn.Module, path: str) -> bool:
    """Whether torch keeps the tensor at ``path`` in its state dict: a parameter or buffer does, not one registered
    with ``persistent=False``, nor a tensor attribute (fx's ``_tensor_constant0`` for a constant made in forward)."""
    owner, _, name = path.rpartition(".")
    module = model.get_submodule(owner)
    return name in module._parameters or (name in module._buffers and name not in module._non_persistent_buffers_set)


def _share(out: nfnn.Module, model: torch.nn.Module, layers: dict[type, Callable[[Any], nfnn.Module]]) -> None:
    """Where torch holds one module, parameter or buffer under several names (GPT's ``wte.weight =
    lm_head.weight``), ``out`` holds one object under those names too: one gradient summed over every use, one
    optimizer state, one update, as torch's."""
    for named in (model.named_modules(remove_duplicate=False), model.named_parameters(remove_duplicate=False),
                  model.named_buffers(remove_duplicate=False)):
        first: dict[int, str] = {}
        for path, value in named:
            kept = first.setdefault(id(value), path)
            mine = _at(out, kept) if kept else out
            if kept != path and mine is not None and _has_place(out, model, path, layers):
                _place(out, path, mine)


def _has_place(out: nfnn.Module, model: torch.nn.Module, path: str,
               layers: dict[type, Callable[[Any], nfnn.Module]]) -> bool:
    """Whether ``out`` has a place for what torch holds at ``path``: its owner was converted, or is a module of
    yours (a container), not a layer that forward never calls (which is not converted at all)."""
    owner = path.rpartition(".")[0]
    return not owner or _at(out, owner) is not None or type(model.get_submodule(owner)) not in layers


def _in_torchs_order(out: nfnn.Module, model: torch.nn.Module) -> None:
    """The layers, parameters and buffers ``from_torch`` placed (in the graph's order), in torch's: so are
    ``parameters()`` (an optimizer's state), ``state_dict()`` and the name kept of a shared parameter."""
    order: dict[str, int] = {}
    for prefix, m in model.named_modules(remove_duplicate=False):
        for name in ("", *m._parameters, *m._buffers):
            order.setdefault(f"{prefix}.{name}".strip("."), len(order))
    for prefix, m in out.named_modules():
        if type(m) in (nfnn.Module, FromTorch):  # a container from_torch made, not an nnforge layer
            for entries in (m._modules, m._parameters, m._buffers):
                ranked = sorted(entries.items(), key=lambda e, p=prefix: order.get(f"{p}.{e[0]}".strip("."),
                                                                                   len(order)))
                entries.clear()
                entries.update(ranked)


def _modes_of(model: torch.nn.Module, out: nfnn.Module) -> nfnn.Module:
    """``out`` with each part in the train/eval mode of torch's part of that name (a frozen batch norm in eval
    inside a model in training stays so)."""
    for path, m in out.named_modules():
        try:
            object.__setattr__(m, "training", model.get_submodule(path).training)
        except AttributeError:  # an nnforge layer's own part: its layer's mode
            continue
    return out


class _Tracer(torch.fx.Tracer):
    """fx's tracer, keeping each node's source line; every layer with an nnforge twin stays one call. Buffers are
    traced values (``self.mask[:T, :T]`` slices by a traced size), and so are torch's factory functions given
    traced sizes (``torch.ones(T, T)``, ``torch.arange(T, device=x.device)``)."""

    proxy_buffer_attributes = True

    def __init__(self, layers: dict[type, Callable[[Any], nfnn.Module]]) -> None:
        super().__init__(autowrap_functions=_PACKING)
        self.record_stack_traces = True
        self.layers = layers

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        if torch.nn.utils.parametrize.is_parametrized(m) or isinstance(
                m, torch.nn.utils.parametrize.ParametrizationList):
            return False  # followed into: the layer computes its weight (weight_norm's g and v) in the graph
        return type(m) in self.layers or super().is_leaf_module(m, qualname)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> torch.fx.Graph:
        with _factories_traced(self):
            return super().trace(root, concrete_args)

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _Proxy(node, self)

    def iter(self, obj: torch.fx.Proxy) -> Iterator:
        """A chunk or split into a known number of parts iterates as its parts (``for y in x.chunk(3)``, a
        comprehension over them); fx's own iterates only what is unpacked into names."""
        count = _parts(obj.node)
        return iter([obj[i] for i in range(count)]) if count is not None else super().iter(obj)


def _parts(node: torch.fx.Node) -> int | None:
    """How many tensors a chunk or split call returns, where its arguments say it; how many sizes a slice of a
    shape holds where the slice says it without the rank (``x.shape[:2]``, ``x.size()[1:3]``)."""
    name = _name(node)
    if name == "getitem" and isinstance(node.args[1], slice) and _is_size(node.args[0]):
        start, stop, step = node.args[1].start or 0, node.args[1].stop, node.args[1].step or 1
        known = all(isinstance(v, int) for v in (start, stop, step)) and start >= 0 and stop >= 0 and step > 0
        return len(range(start, stop, step)) if known else None
    given = node.args[1] if len(node.args) > 1 else next(
        (node.kwargs[k] for k in ("chunks", "split_size_or_sections", "split_size") if k in node.kwargs), None)
    if name == "chunk" and isinstance(given, int):
        return given
    if name == "split" and isinstance(given, (list, tuple)):
        return len(given)
    return None


def _augmented(op: Callable[[Any, Any], Any]) -> Callable[[torch.fx.Proxy, Any], torch.fx.Proxy]:
    def record(self: torch.fx.Proxy, other: Any) -> torch.fx.Proxy:
        return self.tracer.create_proxy("call_function", op, (self, other), {})
    return record


class _Proxy(torch.fx.Proxy):
    """fx's proxy that also records ``x[index] = value`` (fx's own refuses item assignment) and augmented
    assignments as themselves: fx's proxy has no ``__iadd__``, so ``y += 1`` would trace as ``y = y + 1`` and
    leave another name for the same tensor unchanged, where torch changes it."""

    def __setitem__(self, index: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})

    def __len__(self) -> int:  # asked by Python's f(*x.shape[:2]) before it iterates
        count = _parts(self.node)
        return count if count is not None else super().__len__()

    __iadd__ = _augmented(operator.iadd)
    __isub__ = _augmented(operator.isub)
    __imul__ = _augmented(operator.imul)
    __itruediv__ = _augmented(operator.itruediv)
    __ifloordiv__ = _augmented(operator.ifloordiv)
    __imod__ = _augmented(operator.imod)
    __ipow__ = _augmented(operator.ipow)
    __imatmul__ = _augmented(operator.imatmul)
    __iand__ = _augmented(operator.iand)
    __ior__ = _augmented(operator.ior)
    __ixor__ = _augmented(operator.ixor)


_AUGMENTED = {operator.iadd: "+=", operator.isub: "-=", operator.imul: "*=", operator.itruediv: "/=",
              operator.ifloordiv: "//=", operator.imod: "%=", operator.ipow: "**=", operator.imatmul: "@=",
              operator.iand: "&=", operator.ior: "|=", operator.ixor: "^="}
_SIZES = frozenset({"size", "dim", "numel", "nelement", "len"})


# ---- in-place calls: replayed out of place, the changed value rebound ------------------------------------------

_VIEWS = frozenset({"getitem", "view", "view_as", "transpose", "permute", "t", "expand", "expand_as", "narrow",
                    "select", "unsqueeze", "squeeze", "split", "chunk", "unbind", "flatten", "unflatten", "diagonal",
                    "movedim", "swapaxes", "detach", "as_strided"})


def _name(node: torch.fx.Node) -> str:
    return node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")


def _in_place(name: str) -> bool:
    return name.endswith("_") and not name.startswith("_")


def _mutated(node: torch.fx.Node, model: torch.nn.Module) -> torch.fx.Node | None:
    """The node whose value ``node`` changes in place (an in-place method or function, ``x[i] = v``, a call with
    ``inplace=True``, a layer built with ``inplace=True``), or None."""
    first = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
    if node.op in ("call_method", "call_function") and (_in_place(_name(node)) or node.kwargs.get("inplace")):
        return first
    if node.op == "call_function" and node.target is operator.setitem:
        return first
    if node.op == "call_function" and node.target in _AUGMENTED:  # y += 1 changes a tensor, not a size
        return None if first is None or _is_size(first) else first
    if node.op == "call_module" and getattr(model.get_submodule(node.target), "inplace", False) is True:
        return first
    return None


def _is_size(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a number worked out from sizes (``x.shape[0]``, ``x.size(1) * 2``): Python numbers are
    not changed in place, so ``t += 1`` on one only rebinds ``t``."""
    name = _name(node)
    if node.op == "call_method" or name == "len":
        return name in _SIZES
    if name == "getattr":
        return node.args[1] in ("shape", "ndim")
    if node.op == "call_function" and getattr(node.target, "__module__", "") in ("_operator", "operator", "math"):
        inputs = [a for a in node.args if isinstance(a, torch.fx.Node)]
        return bool(inputs) and all(_is_size(a) for a in inputs)
    return False


def _check_mutation(node: torch.fx.Node, changed: torch.fx.Node, later: list[torch.fx.Node], where: str) -> None:
    """nnforge's values do not share memory: an in-place change replays as a new value of ``changed``, which is
    only what torch computes when no tensor sharing ``changed``'s memory (the tensor it views, another view of
    that) is read after the change."""
    what = ("x[...] = value" if node.target is operator.setitem
            else f"x {_AUGMENTED[node.target]} value" if node.target in _AUGMENTED else f"{_name(node)}()")
    after = set(later)
    viewed = []  # the tensors ``changed`` views, nearest first
    while (source := _viewed(viewed[-1] if viewed else changed)) is not None:
        viewed.append(source)
    for whole in viewed:
        if whole not in after and any(u in after for u in whole.users):
            raise NNForgeError(f"from_torch: {what} changes a view ({_name(changed)}, {_where(changed)}) in place, "
                               f"which changes the tensor viewed ({_where(whole)}), read later: write it out of "
                               f"place [{where}]")
    family, members = [viewed[-1] if viewed else changed], set()
    while family:
        member = family.pop()
        if member not in members:
            members.add(member)
            family.extend(u for u in member.users if _viewed(u) is member and u not in after)
    for view in members - {changed, *viewed}:
        if any(u in after for u in view.users):
            raise NNForgeError(f"from_torch: {what} changes a tensor in place while its view ({_name(view)}, "
                               f"{_where(view)}) is read later, and would see the change: write it out of place "
                               f"[{where}]")


def _viewed(node: torch.fx.Node) -> torch.fx.Node | None:
    """The tensor ``node`` is a view of (``x`` for ``x.transpose(0, 1)``), or None: not a view, or an element of a
    layer's output tuple (its own tensor)."""
    source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
    if node.op in ("call_method", "call_function") and _name(node) in _VIEWS and source is not None and (
            source.op != "call_module"):
        return source
    return None


_FACTORIES = ("ones", "zeros", "full", "empty", "arange", "rand", "randn", "eye")
_PACKING = (torch.nn.utils.rnn.pack_padded_sequence, torch.nn.utils.rnn.pad_packed_sequence)


@contextlib.contextmanager
def _factories_traced(tracer: torch.fx.Tracer) -> Iterator[None]:
    """While ``tracer`` runs, torch's factory functions called with a traced value among their arguments become
    graph calls; torch's own would need numbers (its argument parser refuses fx's proxies). So do the packing of
    sequences for a recurrent layer called as ``torch.nn.utils.rnn.pack_padded_sequence`` (fx follows into it
    otherwise; the tracer's ``autowrap_functions`` catch the names imported from there)."""

    def traced(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            found: list[Any] = []
            torch.fx.node.map_aggregate((args, kwargs), lambda v: found.append(v) if isinstance(v, torch.fx.Proxy)
                                        else None)
            return tracer.create_proxy("call_function", fn, args, kwargs) if found else fn(*args, **kwargs)
        return call

    originals = [(torch, name, getattr(torch, name)) for name in _FACTORIES] + [
        (torch.nn.utils.rnn, fn.__name__, fn) for fn in _PACKING]
    try:
        for space, name, fn in originals:
            setattr(space, name, traced(fn))
        yield
    finally:
        for space, name, fn in originals:
            setattr(space, name, fn)


# ---- layers ----------------------------------------------------------------------------------------------------

def _layers() -> dict[type, Callable[[Any], nfnn.Module]]:
    """torch layer class -> the nnforge layer built from one (its weights loaded after)."""
    t = torch.nn

    def conv1d(m: Any) -> nfnn.Module:
        padding = m.padding if isinstance(m.padding, str) else m.padding[0]
        return nfnn.Conv1d(m.in_channels, m.out_channels, m.kernel_size[0], stride=m.stride[0], padding=padding,
                           dilation=m.dilation[0], groups=m.groups, bias=m.bias is not None,
                           padding_mode=m.padding_mode)

    def rnn(cls: type) -> Callable[[Any], nfnn.Module]:
        def build(m: Any) -> nfnn.Module:
            return cls(m.input_size, m.hidden_size, num_layers=m.num_layers, bias=m.bias,
                       batch_first=m.batch_first, dropout=m.dropout, bidirectional=m.bidirectional,
                       proj_size=m.proj_size)
        return build

    def child(m: Any, name: str) -> nfnn.Module:
        """A layer's part (a transformer layer's attention, norms, dropouts) as its nnforge twin, its settings
        its own (torch's may differ from the layer's arguments once set)."""
        build = table.get(type(m))
        if build is None:
            raise NNForgeError(f"its {name} {type(m).__name__} has no nnforge counterpart")
        return build(m)

    def encoder_layer(m: Any) -> nfnn.Module:
        layer = nfnn.TransformerEncoderLayer(m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
                                             activation=_activation(m.activation), norm_first=m.norm_first,
                                             bias=m.linear1.bias is not None)
        for name, part in m.named_children():
            if name != "activation":  # in its place: the state dict's order is torch's
                layer._modules[name] = child(part, name)
        return layer

    def encoder(m: Any) -> nfnn.Module:
        layers = [encoder_layer(layer) for layer in m.layers]  # each with its own settings, not copies of one
        out = nfnn.TransformerEncoder(layers[0], 0, norm=None if m.norm is None else child(m.norm, "norm"))
        out.layers, out.num_layers = nfnn.ModuleList(layers), len(layers)
        return out

    def attention(m: Any) -> nfnn.Module:
        if not m._qkv_same_embed_dim:
            _refuse(f"kdim={m.kdim}, vdim={m.vdim} (other than embed_dim={m.embed_dim})")
        if m.bias_k is not None:
            _refuse("add_bias_kv=True")
        if m.add_zero_attn:
            _refuse("add_zero_attn=True")
        return nfnn.MultiheadAttention(m.embed_dim, m.num_heads, dropout=m.dropout, bias=m.in_proj_bias is not None,
                                       batch_first=m.batch_first)

    def embedding(m: Any) -> nfnn.Module:
        if m.max_norm is not None:  # torch renormalizes the rows looked up, in place, at each call
            _refuse(f"max_norm={m.max_norm}")
        if m.scale_grad_by_freq:
            _refuse("scale_grad_by_freq=True")
        return nfnn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx)

    def cross_entropy(m: Any) -> nfnn.Module:
        loss = nfnn.CrossEntropyLoss(ignore_index=m.ignore_index, reduction=m.reduction,
                                     label_smoothing=m.label_smoothing)
        if m.weight is not None:  # a buffer in torch's state dict: one in nnforge's too, loaded with it
            loss.register_buffer("weight", _tensor(m.weight))
        return loss

    table = {
        t.Linear: lambda m: nfnn.Linear(m.in_features, m.out_features, bias=m.bias is not None),
        t.Conv1d: conv1d,
        t.ConvTranspose1d: lambda m: nfnn.ConvTranspose1d(
            m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0], m.padding[0], m.output_padding[0],
            m.groups, m.bias is not None, m.dilation[0], m.padding_mode),
        t.LSTM: rnn(nfnn.LSTM), t.GRU: rnn(nfnn.GRU),
        t.RNN: lambda m: nfnn.RNN(m.input_size, m.hidden_size, m.num_layers, m.nonlinearity, bias=m.bias,
                                  batch_first=m.batch_first, dropout=m.dropout, bidirectional=m.bidirectional),
        t.RNNCell: lambda m: nfnn.RNNCell(m.input_size, m.hidden_size, bias=m.bias, nonlinearity=m.nonlinearity),
        t.LSTMCell: lambda m: nfnn.LSTMCell(m.input_size, m.hidden_size, bias=m.bias),
        t.GRUCell: lambda m: nfnn.GRUCell(m.input_size, m.hidden_size, bias=m.bias),
        t.GroupNorm: lambda m: nfnn.GroupNorm(m.num_groups, m.num_channels, eps=m.eps, affine=m.affine),
        t.LayerNorm: lambda m: nfnn.LayerNorm(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                                              bias=getattr(m, "bias", None) is not None),
        t.RMSNorm: lambda m: nfnn.RMSNorm(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine),
        t.BatchNorm1d: lambda m: nfnn.BatchNorm1d(m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                                                  track_running_stats=m.track_running_stats),
        t.Embedding: embedding,
        t.Dropout: lambda m: nfnn.Dropout(m.p),
        t.MaxPool1d: lambda m: nfnn.MaxPool1d(m.kernel_size, m.stride, m.padding, m.dilation, m.return_indices,
                                              m.ceil_mode),
        t.AvgPool1d: lambda m: nfnn.AvgPool1d(m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad),
        t.LPPool1d: lambda m: nfnn.LPPool1d(m.norm_type, m.kernel_size, m.stride, m.ceil_mode),
        t.InstanceNorm1d: lambda m: nfnn.InstanceNorm1d(m.num_features, m.eps, m.momentum, m.affine,
                                                        m.track_running_stats),
        t.Dropout1d: lambda m: nfnn.Dropout1d(m.p), t.AlphaDropout: lambda m: nfnn.AlphaDropout(m.p),
        t.CircularPad1d: lambda m: _Function(NF.pad, tuple(m.padding), "circular"),
        t.AdaptiveAvgPool1d: lambda m: nfnn.AdaptiveAvgPool1d(m.output_size),
        t.AdaptiveMaxPool1d: lambda m: nfnn.AdaptiveMaxPool1d(m.output_size) if not m.return_indices else _refuse(
            "return_indices"),
        t.Identity: lambda m: nfnn.Identity(),
        t.MultiheadAttention: attention,
        t.TransformerEncoderLayer: encoder_layer, t.TransformerEncoder: encoder,
        t.ReLU: lambda m: nfnn.ReLU(), t.Tanh: lambda m: nfnn.Tanh(), t.Sigmoid: lambda m: nfnn.Sigmoid(),
        t.SiLU: lambda m: nfnn.SiLU(), t.GELU: lambda m: nfnn.GELU(m.approximate),
        t.LeakyReLU: lambda m: nfnn.LeakyReLU(m.negative_slope), t.ELU: lambda m: nfnn.ELU(m.alpha),
        t.CELU: lambda m: nfnn.CELU(m.alpha), t.SELU: lambda m: nfnn.SELU(),
        t.Softplus: lambda m: nfnn.Softplus(m.beta, m.threshold), t.LogSigmoid: lambda m: nfnn.LogSigmoid(),
        t.Hardtanh: lambda m: nfnn.Hardtanh(m.min_val, m.max_val), t.ReLU6: lambda m: nfnn.ReLU6(),
        t.Hardsigmoid: lambda m: nfnn.Hardsigmoid(), t.Hardswish: lambda m: nfnn.Hardswish(),
        t.Softsign: lambda m: nfnn.Softsign(), t.Mish: lambda m: nfnn.Mish(), t.GLU: lambda m: nfnn.GLU(m.dim),
        t.PReLU: lambda m: nfnn.PReLU(m.num_parameters), t.Threshold: lambda m: nfnn.Threshold(m.threshold, m.value),
        t.Softmin: lambda m: _Function(_softmin, m.dim), t.Tanhshrink: lambda m: nfnn.Tanhshrink(),
        t.Softshrink: lambda m: nfnn.Softshrink(m.lambd), t.Hardshrink: lambda m: nfnn.Hardshrink(m.lambd),
        t.Softmax: lambda m: _Function(_softmax, m.dim), t.LogSoftmax: lambda m: _Function(_log_softmax, m.dim),
        t.Flatten: lambda m: _Function(Tensor.flatten, m.start_dim, m.end_dim),
        t.CTCLoss: lambda m: nfnn.CTCLoss(blank=m.blank, reduction=m.reduction, zero_infinity=m.zero_infinity),
        t.CrossEntropyLoss: cross_entropy,
        t.MSELoss: lambda m: nfnn.MSELoss(reduction=m.reduction),
    }
    weight_norm = getattr(torch.nn.utils.parametrizations, "_WeightNorm", None)
    if weight_norm is not None:  # torch.nn.utils.parametrizations.weight_norm's parametrization
        table[weight_norm] = lambda m: _Function(_weight_norm_of, m.dim)
    return table


def _activation(fn: Any) -> Any:
    """A transformer layer's activation as nnforge's layer takes it: relu and gelu by name, a torch module (nn.GELU,
    a module of your own) converted, any other function (F.silu, a lambda) captured as a model of its own."""
    if fn is torch.nn.functional.relu or fn is torch.nn.functional.gelu:
        return fn.__name__
    try:
        return from_torch(fn if isinstance(fn, torch.nn.Module) else _Activation(fn))
    except NNForgeError as e:
        raise NNForgeError(f"its activation {getattr(fn, '__name__', fn)}: {e}") from None


class _Activation(torch.nn.Module):
    """A function as a torch module, for fx to capture what it computes."""

    def __init__(self, fn: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


def _implicit(x: Any, dim: int | None) -> int:
    """torch's axis of a softmax called without one (deprecated, with a warning): 0 for 0, 1 and 3 axes, else 1."""
    return dim if dim is not None else 0 if x.ndim in (0, 1, 3) else 1


def _softmax(x: Any, dim: int | None) -> Any:
    return x.softmax(_implicit(x, dim))


def _log_softmax(x: Any, dim: int | None) -> Any:
    return x.log_softmax(_implicit(x, dim))


def _softmin(x: Any, dim: int | None) -> Any:
    return NF.softmin(x, _implicit(x, dim))


def _refuse(setting: str) -> nfnn.Module:
    raise NNForgeError(f"{setting} is not supported by its nnforge counterpart")


class _Function(nfnn.Module):
    """A stateless torch layer without an nnforge class (Softmax, Flatten): a function of its inputs and the
    layer's settings. The function is a named one, so the module pickles as every nnforge module does."""

    def __init__(self, fn: Callable[..., Any], *settings: Any):
        super().__init__()
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_settings", settings)

    def forward(self, *args: Any) -> Any:
        return self._fn(*args, *self._settings)


def _weight_norm_of(g: Any, v: Any, dim: int) -> Any:
    """weight_norm's parametrization, called with ``(g, v)``."""
    return _weight_norm(v, g, dim)


def _weight_norm(v: Any, g: Any, dim: int) -> Any:
    """torch._weight_norm: ``v`` scaled to norm ``g`` over every axis but ``dim`` (all of them for -1)."""
    axes = tuple(a for a in range(v.ndim) if dim == -1 or a != dim % v.ndim)
    return v * (g / (v * v).sum(axes, keepdims=True).sqrt())


def _layer(layers: dict[type, Callable[[Any], nfnn.Module]], m: torch.nn.Module, path: str,
           where: str) -> nfnn.Module:
    build = layers.get(type(m))
    if build is None:
        raise NNForgeError(f"from_torch: {type(m).__module__}.{type(m).__name__} at {path!r} has no nnforge "
                           f"counterpart [{where}]")
    try:
        layer = build(m)
    except NNForgeError as e:
        raise NNForgeError(f"from_torch: {type(m).__name__} at {path!r}: {e} [{where}]") from None
    floats = [t.dtype for t in (*m.parameters(), *m.buffers()) if t.is_floating_point()]
    if floats:  # the torch layer's precision, not nnforge's default float32: its gradients are in it too
        layer = layer.to(as_dtype(str(floats[0]).removeprefix("torch.")))
    missing, unexpected = layer.load_state_dict(m.state_dict(), strict=False)
    if missing or unexpected:
        raise NNForgeError(f"from_torch: {type(m).__name__} at {path!r}: state dicts differ (missing in torch's: "
                           f"{missing}, not in nnforge's: {unexpected})")
    for name, p in m.named_parameters():
        if not p.requires_grad:
            dict(layer.named_parameters())[name].requires_grad_(False)
    return layer.train(m.training)


def _tensor(value: Any) -> Any:
    if isinstance(value, torch.nn.Parameter):
        return nfnn.Parameter(value.detach().cpu().numpy().copy(), requires_grad=value.requires_grad)
    if isinstance(value, torch.Tensor):
        return Tensor(value.detach().cpu().numpy().copy())
    return value


def _at(root: Any, path: str) -> Any:
    """What the dotted ``path`` names under ``root`` (a module of either library), or None."""
    obj: Any = root
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def _place(root: nfnn.Module, path: str, value: Any, persistent: bool = True) -> None:
    """Put ``value`` (a layer, a parameter, a buffer: in the state dict where ``persistent``) at ``path`` under
    ``root``, making containers on the way, so state-dict keys are torch's."""
    *parents, last = path.split(".")
    m = root
    for part in parents:
        child = getattr(m, part, None)
        if not isinstance(child, nfnn.Module):
            child = nfnn.Module()
            m.add_module(part, child)
        m = child
    if isinstance(value, nfnn.Module):
        m.add_module(last, value)
    elif isinstance(value, nfnn.Parameter):
        m.register_parameter(last, value)
    elif isinstance(value, Tensor):
        m.register_buffer(last, value, persistent)
    else:
        object.__setattr__(m, last, value)


# ---- functions and methods ------------------------------------------------------------------------------------

def _store(x: Any) -> Any:
    if isinstance(x, torch.fx.Node):
        return _Ref(x.name)
    if isinstance(x, (list, tuple)):
        return type(x)(_store(v) for v in x)
    if isinstance(x, dict):
        return {k: _store(v) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_store(x.start), _store(x.stop), _store(x.step))
    return x


def _load(x: Any, env: dict[str, Any]) -> Any:
    if isinstance(x, _Ref):
        return env[x.name]
    if isinstance(x, (list, tuple)):
        return type(x)(_load(v, env) for v in x)
    if isinstance(x, dict):
        return {k: _load(v, env) for k, v in x.items()}
    if isinstance(x, slice):
        return slice(_load(x.start, env), _load(x.stop, env), _load(x.step, env))
    if isinstance(x, torch.dtype):
        return as_dtype(str(x).removeprefix("torch."))
    return x


def _where(node: torch.fx.Node) -> str:
    """The user's line that made ``node``: the last frame of its stack trace outside torch and this file."""
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in re.findall(r'File "([^"]+)", line (\d+)', node.stack_trace or "")
              if not f[0].startswith(torch_dir) and f[0] != __file__]  # nor this file's _Proxy
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else f"node {node.name}"


def _failed_at(tb: Any) -> str:
    """Where a trace failed, from its traceback: `` at`` the user's last line, and the torch function it called
    there (fx's own frames left out)."""
    torch_dir, fx_dir = os.path.dirname(torch.__file__), os.path.dirname(torch.fx.__file__)
    frames = [(f.f_code.co_filename, line, f) for f, line in traceback.walk_tb(tb)]
    user = [k for k, (file, _, _) in enumerate(frames) if not file.startswith(torch_dir) and file != __file__]
    if not user:
        return ""
    file, line, _ = frames[user[-1]]
    called = [f for name, _, f in frames[user[-1] + 1:] if name.startswith(torch_dir) and not name.startswith(fx_dir)]
    inside = f" (in {called[0].f_globals.get('__name__', '')}.{called[0].f_code.co_name})" if called else ""
    return f" at [{file}:{line}]{inside}"


def _parameters(fn: Callable) -> Any:
    """``fn``'s parameters; for a functional form that passes its arguments on (``nf.mean``), its method's."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        method = getattr(Tensor, getattr(fn, "__name__", ""), None)
        if callable(method) and method is not fn:
            return _parameters(method)
    return params


def _renamed(fn: Callable, kw: dict) -> dict:
    """torch's keyword names where ``fn`` takes nnforge's; device and layout arguments dropped, and the losses'
    deprecated ``size_average`` / ``reduce`` where unset (``reduction`` says it)."""
    params = _parameters(fn)
    out = {}
    for k, v in kw.items():
        if k in _IGNORED or (k in ("size_average", "reduce") and v is None and k not in params):
            continue
        out[_RENAMES[k] if k not in params and _RENAMES.get(k) in params else k] = v
    return out


def _pair(values: Any, indices: Any) -> torch.return_types.max:
    return torch.return_types.max((values, indices))


def _extreme(x: Any, largest: bool, a: tuple, kw: dict) -> Any:
    """torch's max/min: over everything, element-wise against another tensor, or (values, indices) along dim."""
    kw = _renamed(Tensor.max, kw)
    if not a and "axis" not in kw:
        return x.max() if largest else x.min()
    if (a and isinstance(a[0], Tensor)) or "other" in kw:
        other = a[0] if a else kw["other"]
        return maximum(x, other) if largest else minimum(x, other)
    axis = a[0] if a else kw["axis"]
    keep = a[1] if len(a) > 1 else kw.get("keepdims", False)
    values = x.max(axis, keep) if largest else x.min(axis, keep)
    return _pair(values, x.argmax(axis, keep) if largest else x.argmin(axis, keep))


def _variance(x: Any, root: bool, a: tuple, kw: dict) -> Any:
    """torch's var/std: ``(dim, unbiased, keepdim)`` positionally, a lone bool as ``unbiased``, or
    ``correction=`` by keyword; nnforge's methods take ``(axis, keepdims, correction)``."""
    rest = list(a)
    if rest and isinstance(rest[0], bool):  # x.var(False): the (unbiased) overload
        rest = [None, *rest]
    dim = rest.pop(0) if rest else kw.get("dim")
    unbiased = rest.pop(0) if rest else kw.get("unbiased")
    keep = rest.pop(0) if rest else kw.get("keepdim", False)
    correction = kw.get("correction")
    if correction is None:
        correction = 0 if unbiased is False else 1
    return (x.std if root else x.var)(dim, keep, correction)


def _to(x: Any, a: tuple, kw: dict) -> Any:
    """``.to(dtype)``, ``.to(device)``, ``.to(tensor)``: the dtype change only (an nnforge program places its
    values itself)."""
    for v in (*a, kw.get("dtype")):
        if isinstance(v, Tensor):
            return x.cast(v.dtype)
        if v is not None and not isinstance(v, (str, torch.device)):
            return x.cast(v)
    return x


def _unbind(x: Any, dim: int = 0) -> tuple:
    return tuple(x[(slice(None),) * (dim % x.ndim) + (i,)] for i in range(int(x.shape[dim])))


def _t(x: Tensor) -> Tensor:
    """torch's ``t()``: a matrix transposed, a vector or a scalar as it is (the TorchScript tutorial's cells)."""
    if x.ndim > 2:
        raise ShapeError(at(f"t: expects a tensor of at most 2 dimensions, got shape {list(map(int, x.shape))}"))
    return x.T if x.ndim == 2 else x


_METHODS: dict[str, Callable[..., Any]] = {
    "bool": lambda x: x.cast(dtypes.bool_),
    "long": lambda x: x.cast(dtypes.int64),
    "int": lambda x: x.cast(dtypes.int32),
    "contiguous": lambda x, *a, **kw: x,
    "cpu": lambda x, *a, **kw: x,  # nnforge places its values itself (lengths.cpu() for packing)
    "clone": lambda x, *a, **kw: x,
    "dim": lambda x: x.ndim,
    "size": lambda x, *a, **kw: x.size(*a, *kw.values()),
    "to": lambda x, *a, **kw: _to(x, a, kw),
    "type_as": lambda x, y: x.cast(y.dtype),
    "expand_as": lambda x, y: x.expand(*y.shape),
    "view_as": lambda x, y: x.reshape(*y.shape),
    "t": _t,
    "reshape_as": lambda x, y: x.reshape(*y.shape),
    "max": lambda x, *a, **kw: _extreme(x, True, a, kw),
    "min": lambda x, *a, **kw: _extreme(x, False, a, kw),
    "amax": lambda x, *a, **kw: x.max(*a, **_renamed(Tensor.max, kw)),
    "amin": lambda x, *a, **kw: x.min(*a, **_renamed(Tensor.min, kw)),
    "unbind": lambda x, dim=0: _unbind(x, dim),
    "var": lambda x, *a, **kw: _variance(x, False, a, kw),
    "std": lambda x, *a, **kw: _variance(x, True, a, kw),
    "mul": operator.mul, "add": operator.add, "sub": operator.sub, "div": operator.truediv,
    "pow": operator.pow, "matmul": operator.matmul, "neg": operator.neg,
    "clip": lambda x, *a, **kw: x.clamp(*a, **kw),
    "softmax": lambda x, dim, dtype=None: _in(x, dtype).softmax(dim),
    "log_softmax": lambda x, dim, dtype=None: _in(x, dtype).log_softmax(dim),
    "float": lambda x: x.cast(dtypes.float32),
    "double": lambda x: x.cast(dtypes.float64),
    "half": lambda x: x.cast(dtypes.float16),
    "bfloat16": lambda x: x.cast(dtypes.bfloat16),
    "type": lambda x, dtype=None, **kw: x.cast(dtype) if dtype is not None else _refuse("x.type() without a dtype"),
    "norm": lambda x, p="fro", dim=None, keepdim=False, **kw: _norm(x, p, dim, keepdim),
    "fill_": lambda x, value: full(x.shape, value, x.dtype),
    "zero_": lambda x: zeros_like(x),
    "copy_": lambda x, src, **kw: src.cast(x.dtype).expand(*x.shape),
    "new_zeros": lambda x, *size, dtype=None, **kw: zeros(*size, dtype=dtype or x.dtype),
    "new_empty": lambda x, *size, dtype=None, **kw: zeros(*size, dtype=dtype or x.dtype),
    "new_ones": lambda x, *size, dtype=None, **kw: ones(*size, dtype=dtype or x.dtype),
    "new_full": lambda x, size, fill_value, dtype=None, **kw: full(size, fill_value, dtype or x.dtype),
}

_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    torch.max: lambda x, *a, **kw: _extreme(x, True, a, kw),
    torch.min: lambda x, *a, **kw: _extreme(x, False, a, kw),
    torch.bmm: matmul, torch.mm: matmul,
    torch.clip: clamp,
    torch.unbind: _unbind,
    torch.var: lambda x, *a, **kw: _variance(x, False, a, kw),
    torch.std: lambda x, *a, **kw: _variance(x, True, a, kw),
    torch.zeros_like: lambda x, dtype=None, **kw: zeros_like(x, dtype=dtype),
    torch.ones_like: lambda x, dtype=None, **kw: ones_like(x, dtype=dtype),
    torch.norm: lambda x, p="fro", dim=None, keepdim=False, **kw: _norm(x, p, dim, keepdim),
    torch.linalg.vector_norm: lambda x, ord=2, dim=None, keepdim=False, **kw: NF.vector_norm(x, ord, dim, keepdim),
    torch.empty_like: lambda x, dtype=None, **kw: zeros_like(x, dtype=dtype),  # any value is torch's
    torch.full_like: lambda x, fill_value, dtype=None, **kw: full(x.shape, fill_value, dtype or x.dtype),
    torch.empty: lambda *size, dtype=None, **kw: zeros(*size, dtype=dtype or dtypes.float32),
    torch.full: lambda size, fill_value, dtype=None, **kw: full(size, fill_value, dtype),
    torch.eye: lambda n, m=None, dtype=None, **kw: _eye(n, n if m is None else m, dtype or dtypes.float32),
    torch.nn.functional.scaled_dot_product_attention: NF.scaled_dot_product_attention,  # torch's signature
    torch.nn.functional.softmax: lambda x, dim=None, _stacklevel=3, dtype=None: _softmax(_in(x, dtype), dim),
    torch.nn.functional.log_softmax: lambda x, dim=None, _stacklevel=3, dtype=None: _log_softmax(_in(x, dtype), dim),
    torch.nn.functional.softmin: lambda x, dim=None, _stacklevel=3, dtype=None: _softmin(_in(x, dtype), dim),
    torch.nn.functional.threshold: lambda x, threshold, value, inplace=False: NF.threshold(x, threshold, value),
    torch._weight_norm: lambda v, g, dim=0: _weight_norm(v, g, dim),
    torch.nn.functional.conv1d: lambda x, w, b=None, stride=1, padding=0, dilation=1, groups=1: NF.conv1d(
        x, w, b, NF._single(stride), padding if isinstance(padding, str) else NF._single(padding),
        NF._single(dilation), groups),
    torch.nn.functional.conv_transpose1d: lambda x, w, b=None, stride=1, padding=0, output_padding=0, groups=1,
    dilation=1: NF.conv_transpose1d(x, w, b, NF._single(stride), NF._single(padding), NF._single(output_padding),
                                    groups, NF._single(dilation)),
    torch.outer: lambda a, b: a.reshape(-1, 1) * b.reshape(1, -1),
    torch.ger: lambda a, b: a.reshape(-1, 1) * b.reshape(1, -1),
    builtins.getattr: lambda x, name, *default: _getattr(x, name, *default),
    operator.setitem: lambda x, index, value: set_at(x, index, value),
    torch.nn.utils.rnn.pack_padded_sequence: nfnn.utils.rnn.pack_padded_sequence,
    torch.nn.utils.rnn.pad_packed_sequence: nfnn.utils.rnn.pad_packed_sequence,
}


def _norm(x: Any, p: Any, dim: Any, keepdim: bool) -> Any:
    """torch.norm: ``"fro"`` is the 2-norm of the elements; another name is a matrix norm nnforge lacks."""
    if isinstance(p, str) and p != "fro":
        raise NNForgeError(f"from_torch: the norm {p!r} (a matrix norm) has no nnforge counterpart")
    return NF.vector_norm(x, 2 if p == "fro" else p, dim, keepdim)


def _in(x: Any, dtype: Any) -> Any:
    """A softmax's ``dtype=``: the input cast to it first, as torch."""
    return x if dtype is None else x.cast(dtype)


def _eye(n: Any, m: Any, dtype: Any) -> Any:
    return (arange(n).reshape(n, 1) == arange(m).reshape(1, m)).cast(dtype)


def _getattr(x: Any, name: str, *default: Any) -> Any:
    if isinstance(x, Tensor) and name in ("device", "is_cuda"):
        return None if name == "device" else False
    return getattr(x, name, *default)


def _lookup_function(fn: Any) -> Callable[..., Any] | None:
    if fn in _FUNCTIONS:
        return _FUNCTIONS[fn]
    name = getattr(fn, "__name__", "")
    if _in_place(name) and fn is getattr(torch, name, getattr(torch.nn.functional, name, None)):  # torch.relu_
        return _lookup_function(getattr(torch, name[:-1], getattr(torch.nn.functional, name[:-1], None)))
    module = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", "")
    if module in ("_operator", "operator", "math"):  # math.sqrt(x.size(-1)): fx records it, sizes are numbers
        return fn
    functional = module.startswith("torch.nn.functional") or fn is getattr(torch.nn.functional, name, None)
    if functional and callable(getattr(NF, name, None)):
        return getattr(NF, name)
    if fn is getattr(torch, name, None):
        import nnforge  # the package's namespace (nf.cat, nf.einsum, ...), complete once it is imported

        if callable(getattr(nnforge, name, None)):
            return getattr(nnforge, name)
        if callable(getattr(Tensor, name, None)):  # torch.flatten(x, 1): the method
            return lambda x, *a, **kw: getattr(x, name)(*a, **_renamed(getattr(Tensor, name), kw))
    return None


def _public_name(fn: Any) -> str:
    """``fn`` as the user wrote it (``torch.fft.rfft``, not its implementation's ``torch._C._fft.fft_rfft``)."""
    for space in (torch, torch.nn.functional, torch.fft, torch.linalg, torch.special):
        for name in dir(space):
            if getattr(space, name, None) is fn:
                return f"{space.__name__}.{name}"
    return f"{getattr(fn, '__module__', '')}.{getattr(fn, '__name__', fn)}"


def _check_function(fn: Any, where: str) -> None:
    if _lookup_function(fn) is None:
        raise NNForgeError(f"from_torch: {_public_name(fn)} has no nnforge counterpart [{where}]")


def _check_method(name: str, where: str) -> None:
    name = _out_of_place(name)
    if name not in _METHODS and not callable(getattr(Tensor, name, None)):
        raise NNForgeError(f"from_torch: the tensor method .{name}() has no nnforge counterpart [{where}]")


def _function(step: _Step, a: tuple, kw: dict) -> Any:
    fn = _lookup_function(step.target)
    return fn(*a, **_renamed(fn, kw))


def _method(step: _Step, x: Any, a: tuple, kw: dict) -> Any:
    name = _out_of_place(step.target)
    if name in _METHODS:
        return _METHODS[name](x, *a, **kw)
    fn = getattr(x, name)
    return fn(*a, **_renamed(fn, kw))


def _out_of_place(name: str) -> str:
    """``add_`` -> ``add``: the method an in-place one is replayed with."""
    return name[:-1] if _in_place(name) and name not in _METHODS else name
