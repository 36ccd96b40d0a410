"""``Parameter`` and ``Module``: PyTorch-style containers over lazy tensors.

A Module owns three ordered dicts: parameters (tensors that require grad), buffers (state that is not trained,
such as BatchNorm's running statistics) and sub-modules. ``state_dict`` walks them in PyTorch's order and with
PyTorch's dotted key names, so a torch checkpoint loads into the equivalent nnforge module unchanged.

Optimizers and BatchNorm update tensors with ``assign``, which re-binds the handle rather than replacing the
object: a Parameter keeps its identity for its whole life, which is what lets ``nf.loop`` and ``nf.compile`` find
it as state.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from .. import dtypes
from ..dtypes import as_dtype
from ..interop.convert import to_numpy
from ..tensor import Tensor
from ..trace import session


class Parameter(Tensor):
    """A tensor that is a trainable parameter of a Module (``requires_grad=True`` unless told otherwise)."""

    __slots__ = ()

    def __init__(self, data: Any, requires_grad: bool = True, dtype: Any = None):
        if isinstance(data, Tensor):
            data = data.numpy()  # a parameter always starts as concrete data, never as a pending expression
        super().__init__(data, dtype=dtype, requires_grad=requires_grad)

    def __repr__(self) -> str:
        return f"Parameter({self.dtype.short}{list(map(int, self.shape))})"


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


class Module:
    """Base class of layers. Subclasses create parameters and sub-modules in ``__init__`` and define ``forward``."""

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    # ---- registration ----------------------------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before assigning attributes")
        params, bufs, mods = self._parameters, self._buffers, self._modules
        if isinstance(value, (Parameter, Module)):
            for d in (params, bufs, mods):
                d.pop(name, None)
            self.__dict__.pop(name, None)
            (params if isinstance(value, Parameter) else mods)[name] = value
        elif name in params or name in mods:
            if value is not None:
                kind = "parameter" if name in params else "module"
                raise TypeError(f"cannot assign a {type(value).__name__} to {kind} {name!r} (a Parameter, a Module "
                                "or None expected)")
            (params if name in params else mods)[name] = None
        elif name in bufs:
            bufs[name] = value if value is None or isinstance(value, Tensor) else Tensor(value)
        else:
            object.__setattr__(self, name, value)
            return
        self._reassigned()

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for key in ("_parameters", "_buffers", "_modules"):
            if key in d and name in d[key]:
                return d[key][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __delattr__(self, name: str) -> None:
        for d in (self._parameters, self._buffers, self._modules):
            if name in d:
                del d[name]
                self._reassigned()
                return
        object.__delattr__(self, name)

    def _reassigned(self) -> None:
        """A parameter, buffer or sub-module was assigned or removed: a compiled function that called this module
        captured the tensors it held before, so every compiled function traces again (as when a tensor is frozen).
        Modules no trace has called yet (those still being built) change nothing."""
        if self.__dict__.get("_traced"):
            session().epoch += 1

    def register_parameter(self, name: str, param: Parameter | None) -> None:
        """Register ``param`` (None keeps the slot, e.g. ``bias=False``, without a state_dict entry)."""
        self.__dict__.pop(name, None)
        self._parameters[name] = param
        self._reassigned()

    def register_buffer(self, name: str, tensor: Any, persistent: bool = True) -> None:
        """Register non-trained state; it is in ``state_dict`` unless ``persistent=False``."""
        self.__dict__.pop(name, None)
        self._buffers[name] = tensor if tensor is None or isinstance(tensor, Tensor) else Tensor(tensor)
        if not persistent:
            self._non_persistent.add(name)
        self._reassigned()

    def add_module(self, name: str, module: Module | None) -> None:
        self.__dict__.pop(name, None)
        self._modules[name] = module
        self._reassigned()

    # ---- traversal -------------------------------------------------------------------------------------------
    def named_modules(self, prefix: str = "", memo: set[int] | None = None) -> Iterator[tuple[str, Module]]:
        """(dotted name, module) pairs, this module first; a module shared by several parents is listed once, by
        its first name, as torch lists it."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self._modules.items():
            if m is not None:
                yield from m.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def named_children(self) -> Iterator[tuple[str, Module]]:
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator[Module]:
        for _, m in self.named_children():
            yield m

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Parameter]]:
        """(dotted name, parameter) pairs; a parameter shared by several modules is listed once."""
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, p in m._parameters.items():
                if p is None or id(p) in seen:
                    continue
                seen.add(id(p))
                yield (f"{mp}.{name}" if mp else name), p

    def parameters(self, recurse: bool = True) -> Iterator[Parameter]:
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, Tensor]]:
        """(dotted name, buffer) pairs; a buffer shared by several modules is listed once."""
        seen: set[int] = set()
        mods = self.named_modules(prefix) if recurse else [(prefix, self)]
        for mp, m in mods:
            for name, b in m._buffers.items():
                if b is None or id(b) in seen:
                    continue
                seen.add(id(b))
                yield (f"{mp}.{name}" if mp else name), b

    def buffers(self, recurse: bool = True) -> Iterator[Tensor]:
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def apply(self, fn: Callable[[Module], None]) -> Module:
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    # ---- state -----------------------------------------------------------------------------------------------
    def _state_tensors(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        """Entries of the state dict in PyTorch's order: own parameters, own buffers, then each child."""
        for name, p in self._parameters.items():
            if p is not None:
                yield prefix + name, p
        for name, b in self._buffers.items():
            if b is not None and name not in self._non_persistent:
                yield prefix + name, b
        for name, m in self._modules.items():
            if m is not None:
                yield from m._state_tensors(f"{prefix}{name}.")

    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Parameters and persistent buffers as numpy arrays (copies), keyed exactly as PyTorch keys them."""
        return OrderedDict((k, np.array(t.numpy())) for k, t in self._state_tensors())

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> tuple[list[str], list[str]]:
        """Copy values from a PyTorch ``state_dict`` (torch tensors) or a dict of numpy arrays into this module.

        Values are cast to each tensor's dtype. Every problem is checked before anything is written, so a failed
        load leaves the module untouched. Returns (missing keys, unexpected keys), which are errors if ``strict``.
        """
        own = OrderedDict(self._state_tensors())
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        problems = []
        if strict and missing:
            problems.append("missing keys: " + ", ".join(repr(k) for k in missing))
        if strict and unexpected:
            problems.append("unexpected keys: " + ", ".join(repr(k) for k in unexpected))
        arrays: dict[str, np.ndarray] = {}
        for k, t in own.items():
            if k not in state_dict:
                continue
            a = to_numpy(state_dict[k])
            if _shape(a) != _shape(t):
                problems.append(f"size mismatch for {k!r}: checkpoint has shape {list(_shape(a))}, "
                                f"the module expects {list(_shape(t))}")
                continue
            arrays[k] = np.asarray(a).astype(t.dtype.np)
        if problems:
            raise KeyError(f"{type(self).__name__}.load_state_dict: " + "; ".join(problems))
        for k, a in arrays.items():
            own[k]._rebind(Tensor(a).node)  # re-bind, not assign: loading is not a traced in-place update
        return missing, unexpected

    def to(self, dtype: Any) -> Module:
        """Cast floating-point parameters and buffers to ``dtype`` in place (e.g. float64 for gradient checks)."""
        dt = as_dtype(dtype)
        cast = [t for t in list(self.parameters()) + list(self.buffers()) if t.dtype.is_float and t.dtype != dt]
        for t in cast:
            t._rebind(Tensor(t.numpy().astype(dt.np)).node)
        if cast:  # traces read these tensors at their old dtype
            session().epoch += 1
        return self

    def double(self) -> Module:
        return self.to(dtypes.float64)

    def float(self) -> Module:
        return self.to(dtypes.float32)

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Freeze or unfreeze every parameter (frozen ones get no ``.grad`` and compile bakes them in), exactly as
        setting ``p.requires_grad`` on each does."""
        for p in self.parameters():
            p.requires_grad = requires_grad
        return self

    # ---- mode and gradients ----------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Training mode: Dropout draws masks and BatchNorm uses and updates batch statistics."""
        for m in self.modules():
            object.__setattr__(m, "training", bool(mode))
        return self

    def eval(self) -> Module:
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop accumulated gradients (``.grad = None``) so the next ``backward`` starts afresh."""
        for p in self.parameters():
            p.grad = None

    # ---- calling ---------------------------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._mode_noted()
        return self.forward(*args, **kwargs)

    def _mode_noted(self) -> bool:
        """``self.training``, noted by the compiled function being traced, if any: its trace depends on the mode of
        each module it calls or whose mode it reads (another mode traces again) and on what the module holds
        (``_reassigned``)."""
        traced = next((sc for sc in reversed(session().scopes) if sc.kind == "function"), None)
        if traced is not None:
            traced.modes.setdefault(id(self), (weakref.ref(self), self.training))
            self.__dict__["_traced"] = True
        return self.training

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"({name}): " + repr(m).replace("\n", "\n  ") for name, m in self.named_children()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"


class ModuleList(Module):
    """A list of modules registered as children "0", "1", ... (for stacks built in a Python loop)."""

    def __init__(self, modules: Any = ()):
        super().__init__()
        for m in modules:
            self.append(m)

    def append(self, module: Module) -> ModuleList:
        self.add_module(str(len(self._modules)), module)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._modules.values())

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]


class Sequential(ModuleList):
    """Modules applied in order; children are named "0", "1", ... (or by the keys of an OrderedDict)."""

    def __init__(self, *modules: Module | Mapping[str, Module]):
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            super().__init__()
            for name, m in modules[0].items():
                self.add_module(name, m)
        else:
            super().__init__(modules)

    def forward(self, x: Any) -> Any:
        for m in self._modules.values():
            x = m(x)
        return x
