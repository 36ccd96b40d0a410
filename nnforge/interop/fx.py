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
import inspect
import operator
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.fx

from .. import dtypes
from .. import nn as nfnn
from ..dtypes import as_dtype
from ..errors import NNForgeError
from ..nn import functional as NF
from ..tensor import Tensor, clamp, matmul, maximum, minimum, ones_like, tensor, where, zeros_like

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


class FromTorch(nfnn.Module):
    """The module ``from_torch`` returns: the captured graph's steps and the nnforge layers they call."""

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        env: dict[str, Any] = {}
        inputs = list(args)
        for step in self._steps:
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
        raise AssertionError("an fx graph ends with its output")

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


def from_torch(model: torch.nn.Module) -> nfnn.Module:
    """``model`` as an ``nnforge.nn`` module computing the same thing (its weights copied, in its train/eval mode):
    a torch layer with an nnforge twin becomes that layer, any other model a ``FromTorch`` of its captured graph.
    Raises ``NNForgeError`` naming the layer, function or source line that has no nnforge counterpart, and when
    torch.fx cannot capture ``forward`` (Python control flow on tensor values or sizes)."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"from_torch: needs a torch.nn.Module, got {type(model).__name__}")
    layers = _layers()
    if type(model) in layers:  # fx would trace into its implementation (torch's fused kernels)
        return _layer(layers, model, type(model).__name__, "from_torch")
    tracer = _Tracer(layers)
    try:
        graph = tracer.trace(model)
    except Exception as e:  # torch.fx raises TraceError, TypeError, RuntimeError... with its own message
        raise NNForgeError(f"from_torch: torch.fx could not capture {type(model).__name__}.forward: {e}. It "
                           "follows tensors and their sizes as symbols: Python control flow on them (a loop over "
                           "time steps) and torch factory functions given such sizes (torch.ones(T, T); "
                           "torch.ones_like(x) works) cannot be captured. Write a time loop with nnforge (nf.scan) "
                           "and call it through nnforge.torch.TorchModule") from None
    out = FromTorch()
    object.__setattr__(out, "_torch_name", type(model).__name__)
    nodes = list(graph.nodes)
    for node in nodes:  # layers first: an attribute read from one (``self.rnn.weight_hh_l0``) is the layer's own
        if node.op == "call_module" and _at(out, node.target) is None:
            _place(out, node.target, _layer(layers, model.get_submodule(node.target), node.target, _where(node)))
    steps = []
    for node in nodes:
        where = _where(node)
        if node.op == "get_attr" and _at(out, node.target) is None:
            _place(out, node.target, _tensor(_at(model, node.target)))
        elif node.op == "call_function":
            _check_function(node.target, where)
        elif node.op == "call_method":
            _check_method(node.target, where)
        steps.append(_Step(node.name, node.op, node.target, _store(node.args), _store(node.kwargs), where))
    object.__setattr__(out, "_steps", tuple(steps))
    out.train(model.training)
    return out


class _Tracer(torch.fx.Tracer):
    """fx's tracer, keeping each node's source line; every layer with an nnforge twin stays one call."""

    def __init__(self, layers: dict[type, Callable[[Any], nfnn.Module]]) -> None:
        super().__init__()
        self.record_stack_traces = True
        self.layers = layers

    def is_leaf_module(self, m: torch.nn.Module, qualname: str) -> bool:
        return type(m) in self.layers or super().is_leaf_module(m, qualname)


# ---- layers ----------------------------------------------------------------------------------------------------

def _layers() -> dict[type, Callable[[Any], nfnn.Module]]:
    """torch layer class -> the nnforge layer built from one (its weights loaded after)."""
    t = torch.nn

    def conv1d(m: Any) -> nfnn.Module:
        if m.padding_mode != "zeros":
            raise NNForgeError(f"padding_mode={m.padding_mode!r} (nnforge's Conv1d pads with zeros)")
        padding = m.padding if isinstance(m.padding, str) else m.padding[0]
        return nfnn.Conv1d(m.in_channels, m.out_channels, m.kernel_size[0], stride=m.stride[0], padding=padding,
                           dilation=m.dilation[0], groups=m.groups, bias=m.bias is not None)

    def rnn(cls: type) -> Callable[[Any], nfnn.Module]:
        def build(m: Any) -> nfnn.Module:
            if getattr(m, "proj_size", 0):
                raise NNForgeError("proj_size is not supported by nnforge's LSTM")
            return cls(m.input_size, m.hidden_size, num_layers=m.num_layers, bias=m.bias,
                       batch_first=m.batch_first, dropout=m.dropout, bidirectional=m.bidirectional)
        return build

    def encoder_layer(m: Any) -> nfnn.Module:
        act = {torch.nn.functional.relu: "relu", torch.nn.functional.gelu: "gelu"}.get(m.activation)
        if act is None:
            raise NNForgeError("an activation other than relu or gelu")
        return nfnn.TransformerEncoderLayer(m.self_attn.embed_dim, m.self_attn.num_heads, m.linear1.out_features,
                                            dropout=m.dropout.p, activation=act, layer_norm_eps=m.norm1.eps,
                                            batch_first=m.self_attn.batch_first, norm_first=m.norm_first,
                                            bias=m.linear1.bias is not None)

    def stateless(fn: Callable[[Any], Callable]) -> Callable[[Any], nfnn.Module]:
        return lambda m: _Function(fn(m))

    return {
        t.Linear: lambda m: nfnn.Linear(m.in_features, m.out_features, bias=m.bias is not None),
        t.Conv1d: conv1d,
        t.LSTM: rnn(nfnn.LSTM), t.GRU: rnn(nfnn.GRU),
        t.LSTMCell: lambda m: nfnn.LSTMCell(m.input_size, m.hidden_size, bias=m.bias),
        t.GRUCell: lambda m: nfnn.GRUCell(m.input_size, m.hidden_size, bias=m.bias),
        t.LayerNorm: lambda m: nfnn.LayerNorm(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine,
                                              bias=getattr(m, "bias", None) is not None),
        t.RMSNorm: lambda m: nfnn.RMSNorm(m.normalized_shape, eps=m.eps, elementwise_affine=m.elementwise_affine),
        t.BatchNorm1d: lambda m: nfnn.BatchNorm1d(m.num_features, eps=m.eps, momentum=m.momentum, affine=m.affine,
                                                  track_running_stats=m.track_running_stats),
        t.Embedding: lambda m: nfnn.Embedding(m.num_embeddings, m.embedding_dim, padding_idx=m.padding_idx),
        t.Dropout: lambda m: nfnn.Dropout(m.p),
        t.Identity: lambda m: nfnn.Identity(),
        t.MultiheadAttention: lambda m: nfnn.MultiheadAttention(m.embed_dim, m.num_heads, dropout=m.dropout,
                                                                bias=m.in_proj_bias is not None,
                                                                batch_first=m.batch_first),
        t.TransformerEncoderLayer: encoder_layer,
        t.ReLU: lambda m: nfnn.ReLU(), t.Tanh: lambda m: nfnn.Tanh(), t.Sigmoid: lambda m: nfnn.Sigmoid(),
        t.SiLU: lambda m: nfnn.SiLU(), t.GELU: lambda m: nfnn.GELU(m.approximate),
        t.LeakyReLU: lambda m: nfnn.LeakyReLU(m.negative_slope), t.ELU: lambda m: nfnn.ELU(m.alpha),
        t.CELU: lambda m: nfnn.CELU(m.alpha), t.SELU: lambda m: nfnn.SELU(),
        t.Softplus: lambda m: nfnn.Softplus(m.beta, m.threshold), t.LogSigmoid: lambda m: nfnn.LogSigmoid(),
        t.Hardtanh: lambda m: nfnn.Hardtanh(m.min_val, m.max_val), t.ReLU6: lambda m: nfnn.ReLU6(),
        t.Hardsigmoid: lambda m: nfnn.Hardsigmoid(), t.Hardswish: lambda m: nfnn.Hardswish(),
        t.Softsign: lambda m: nfnn.Softsign(), t.Mish: lambda m: nfnn.Mish(), t.GLU: lambda m: nfnn.GLU(m.dim),
        t.Softmax: stateless(lambda m: lambda x: x.softmax(m.dim)),
        t.LogSoftmax: stateless(lambda m: lambda x: x.log_softmax(m.dim)),
        t.Flatten: stateless(lambda m: lambda x: x.flatten(m.start_dim, m.end_dim)),
        t.CTCLoss: lambda m: nfnn.CTCLoss(blank=m.blank, reduction=m.reduction, zero_infinity=m.zero_infinity),
        t.CrossEntropyLoss: lambda m: nfnn.CrossEntropyLoss(weight=m.weight, ignore_index=m.ignore_index,
                                                            reduction=m.reduction, label_smoothing=m.label_smoothing),
        t.MSELoss: lambda m: nfnn.MSELoss(reduction=m.reduction),
    }


class _Function(nfnn.Module):
    """A stateless torch layer without an nnforge class (Softmax, Flatten): its function."""

    def __init__(self, fn: Callable[[Any], Any]):
        super().__init__()
        object.__setattr__(self, "_fn", fn)

    def forward(self, x: Any) -> Any:
        return self._fn(x)


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


def _place(root: nfnn.Module, path: str, value: Any) -> None:
    """Put ``value`` (a layer, a parameter, a buffer) at ``path`` under ``root``, making containers on the way,
    so state-dict keys are torch's."""
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
        m.register_buffer(last, value)
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
    """The user's line that made ``node``: the last frame of its stack trace outside torch."""
    torch_dir = os.path.dirname(torch.__file__)
    frames = [f for f in re.findall(r'File "([^"]+)", line (\d+)', node.stack_trace or "")
              if not f[0].startswith(torch_dir)]
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else f"node {node.name}"


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
    """torch's keyword names where ``fn`` takes nnforge's; device and layout arguments dropped."""
    params = _parameters(fn)
    out = {}
    for k, v in kw.items():
        if k in _IGNORED:
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


_METHODS: dict[str, Callable[..., Any]] = {
    "bool": lambda x: x.cast(dtypes.bool_),
    "long": lambda x: x.cast(dtypes.int64),
    "int": lambda x: x.cast(dtypes.int32),
    "contiguous": lambda x, *a, **kw: x,
    "clone": lambda x, *a, **kw: x,
    "dim": lambda x: x.ndim,
    "size": lambda x, *a, **kw: x.size(*a, *kw.values()),
    "to": lambda x, *a, **kw: _to(x, a, kw),
    "type_as": lambda x, y: x.cast(y.dtype),
    "expand_as": lambda x, y: x.expand(*y.shape),
    "view_as": lambda x, y: x.reshape(*y.shape),
    "reshape_as": lambda x, y: x.reshape(*y.shape),
    "max": lambda x, *a, **kw: _extreme(x, True, a, kw),
    "min": lambda x, *a, **kw: _extreme(x, False, a, kw),
    "amax": lambda x, *a, **kw: x.max(*a, **_renamed(Tensor.max, kw)),
    "amin": lambda x, *a, **kw: x.min(*a, **_renamed(Tensor.min, kw)),
    "unbind": lambda x, dim=0: _unbind(x, dim),
    "mul": operator.mul, "add": operator.add, "sub": operator.sub, "div": operator.truediv,
    "pow": operator.pow, "matmul": operator.matmul, "neg": operator.neg,
    "clip": lambda x, *a, **kw: x.clamp(*a, **kw),
}

_FUNCTIONS: dict[Any, Callable[..., Any]] = {
    torch.max: lambda x, *a, **kw: _extreme(x, True, a, kw),
    torch.min: lambda x, *a, **kw: _extreme(x, False, a, kw),
    torch.bmm: matmul, torch.mm: matmul,
    torch.clip: clamp,
    torch.unbind: _unbind,
    torch.zeros_like: lambda x, dtype=None, **kw: zeros_like(x, dtype=dtype),
    torch.ones_like: lambda x, dtype=None, **kw: ones_like(x, dtype=dtype),
    torch.nn.functional.scaled_dot_product_attention: lambda *a, **kw: _sdpa(*a, **kw),
    torch.nn.functional.softmax: lambda x, dim=None, **kw: x.softmax(dim),
    torch.nn.functional.log_softmax: lambda x, dim=None, **kw: x.log_softmax(dim),
    builtins.getattr: lambda x, name, *default: _getattr(x, name, *default),
}


def _getattr(x: Any, name: str, *default: Any) -> Any:
    if isinstance(x, Tensor) and name in ("device", "is_cuda"):
        return None if name == "device" else False
    return getattr(x, name, *default)


def _sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: float | None = None, **kw: Any) -> Any:
    """torch's scaled_dot_product_attention: a bool mask says which scores take part, a float mask is added."""
    mask = attn_mask
    if is_causal:
        n, m = int(q.shape[-2]), int(k.shape[-2])
        mask = tensor(np.tril(np.ones((n, m), bool)))
    if mask is not None and mask.dtype == dtypes.bool_:
        mask = where(mask, 0.0, float("-inf"))
    if scale is not None:
        q = q * (scale * float(int(q.shape[-1])) ** 0.5)
    return NF.scaled_dot_product_attention(q, k, v, mask, dropout_p, training=dropout_p > 0)


def _lookup_function(fn: Any) -> Callable[..., Any] | None:
    if fn in _FUNCTIONS:
        return _FUNCTIONS[fn]
    module = getattr(fn, "__module__", "") or ""
    name = getattr(fn, "__name__", "")
    if module in ("_operator", "operator"):
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
    if name not in _METHODS and not callable(getattr(Tensor, name, None)):
        raise NNForgeError(f"from_torch: the tensor method .{name}() has no nnforge counterpart [{where}]")


def _function(step: _Step, a: tuple, kw: dict) -> Any:
    fn = _lookup_function(step.target)
    return fn(*a, **_renamed(fn, kw))


def _method(step: _Step, x: Any, a: tuple, kw: dict) -> Any:
    if step.target in _METHODS:
        return _METHODS[step.target](x, *a, **kw)
    fn = getattr(x, step.target)
    return fn(*a, **_renamed(fn, kw))
