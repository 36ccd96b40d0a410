"""LSTM and GRU layers and cells, with PyTorch's parameter names, gate order and return values.

Each layer-direction is one ``nf.scan`` over time, so the loop stays a loop in the IR and its backward pass is a
reversed scan. The input projection ``x @ W_ih.T + b`` does not depend on the recurrent state, so it is done
before the scan as one big matmul over all time steps (the "premul" trick); the scan body keeps only the
recurrent matmul ``h @ W_hh.T`` and the gate math on the stacked gates.

Basecallers stack unidirectional layers that alternate direction; ``reverse`` (a bool or one bool per layer)
runs a layer from the last time step to the first without flipping any tensor. An LSTM with ``proj_size``
(torch's LSTMP) carries ``h`` projected by ``weight_hr`` inside the step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

from .. import dtypes
from ..control import scan
from ..errors import DTypeError, ShapeError, at
from ..tensor import Tensor, as_tensor, concat, full, stack, where, zeros
from . import functional as F
from . import init
from .module import Module, Parameter
from .utils.rnn import PackedSequence

_GATES = MappingProxyType({"LSTM": 4, "GRU": 3, "RNN": 1})  # gates per hidden unit (read-only)
_NONLINEARITIES = ("tanh", "relu")  # an Elman RNN's (torch's choices)


# ---- the gate math, shared by the layers (inside a scan) and the cells ----------------------------------------

def lstm_gates(gates: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """(h, c) from the stacked pre-activations [..., 4H] in torch's order i, f, g, o."""
    i, f, g, o = gates.chunk(4, axis=-1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c


def gru_gates(gx: Tensor, gh: Tensor, h: Tensor) -> Tensor:
    """New h from input gates gx [..., 3H] (r, z, n; with b_ih and b_hr, b_hz) and recurrent gates gh.

    ``gh`` must include b_hn: torch applies the reset gate to (W_hn h + b_hn), not to b_hn separately.
    """
    hidden = int(h.shape[-1])
    rz = (gx[..., :2 * hidden] + gh[..., :2 * hidden]).sigmoid()
    r, z = rz.chunk(2, axis=-1)
    n = (gx[..., 2 * hidden:] + r * gh[..., 2 * hidden:]).tanh()
    return n + z * (h - n)  # (1 - z) * n + z * h with one multiply fewer


def lstm_layer(x: Tensor, h0: Tensor, c0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
               b_hh: Tensor | None, reverse: bool = False, w_hr: Tensor | None = None,
               valid: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One LSTM layer-direction over x [T, N, I]: (outputs [T, N, H], h_T, c_T); with a projection ``w_hr``
    [P, H] the outputs and h are ``h @ w_hr.T`` [.., P]. ``valid`` [T, N, 1] (bool): the steps within each
    sequence's length (``PackedSequence``); past them the state stays as it was and the output is zero."""
    gx = x @ w_ih.T
    bias = _sum_bias(b_ih, b_hh)
    if bias is not None:
        gx = gx + bias
    w_hh_t = w_hh.T
    w_hr_t = None if w_hr is None else w_hr.T

    def cell(carry, step):
        gx_t, ok = step
        h, c = lstm_gates(gx_t + carry[0] @ w_hh_t, carry[1])
        if w_hr_t is not None:
            h = h @ w_hr_t
        return _kept((h, c), carry, ok), _output(h, ok)

    (h, c), ys = scan(cell, (h0, c0), (gx, valid), reverse=reverse)
    return ys, h, c


def gru_layer(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None, b_hh: Tensor | None,
              reverse: bool = False, valid: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """One GRU layer-direction over x [T, N, I]: (outputs [T, N, H], h_T); ``valid`` as ``lstm_layer``'s."""
    hidden = int(w_hh.shape[1])
    gx = x @ w_ih.T
    b_hn = None
    if b_ih is not None:
        gx = gx + b_ih
    if b_hh is not None:  # b_hr and b_hz fold into the premultiplied gates; b_hn must stay inside the reset
        gx = gx + concat([b_hh[:2 * hidden], full((hidden,), 0, b_hh.dtype)])
        b_hn = concat([full((2 * hidden,), 0, b_hh.dtype), b_hh[2 * hidden:]])
    w_hh_t = w_hh.T

    def cell(carry, step):
        gx_t, ok = step
        gh = carry @ w_hh_t
        if b_hn is not None:
            gh = gh + b_hn
        h = gru_gates(gx_t, gh, carry)
        return _kept((h,), (carry,), ok)[0], _output(h, ok)

    h, ys = scan(cell, h0, (gx, valid), reverse=reverse)
    return ys, h


def rnn_layer(x: Tensor, h0: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None, b_hh: Tensor | None,
              reverse: bool = False, valid: Tensor | None = None,
              nonlinearity: str = "tanh") -> tuple[Tensor, Tensor]:
    """One Elman RNN layer-direction over x [T, N, I], h = act(x W_ih.T + b_ih + h W_hh.T + b_hh): (outputs
    [T, N, H], h_T); ``valid`` as ``lstm_layer``'s."""
    gx = x @ w_ih.T
    bias = _sum_bias(b_ih, b_hh)
    if bias is not None:
        gx = gx + bias
    w_hh_t = w_hh.T

    def cell(carry, step):
        gx_t, ok = step
        h = _activation(gx_t + carry @ w_hh_t, nonlinearity)
        return _kept((h,), (carry,), ok)[0], _output(h, ok)

    h, ys = scan(cell, h0, (gx, valid), reverse=reverse)
    return ys, h


def _activation(z: Tensor, nonlinearity: str) -> Tensor:
    return z.tanh() if nonlinearity == "tanh" else F.relu(z)


def _kept(new: tuple[Tensor, ...], old: tuple[Tensor, ...], ok: Tensor | None) -> tuple[Tensor, ...]:
    """A step's carry: the new state within a sequence's length, the old one past it."""
    return new if ok is None else tuple(where(ok, n, o) for n, o in zip(new, old))


def _output(h: Tensor, ok: Tensor | None) -> Tensor:
    """A step's output: h within a sequence's length, zero past it (torch's padding)."""
    return h if ok is None else where(ok, h, full((), 0, h.dtype))


def _sum_bias(b_ih: Tensor | None, b_hh: Tensor | None) -> Tensor | None:
    if b_ih is None:
        return b_hh
    return b_ih if b_hh is None else b_ih + b_hh


# ---- layers ---------------------------------------------------------------------------------------------------

class _RNNBase(Module):
    mode = ""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 reverse: bool | Sequence[bool] = False, proj_size: int = 0):
        super().__init__()
        if proj_size and self.mode != "LSTM":
            raise ValueError(f"{self.mode}: proj_size is an LSTM's (as in torch)")
        if not 0 <= proj_size < max(hidden_size, 1):
            raise ValueError(f"{self.mode}: proj_size must be >= 0 and smaller than hidden_size {hidden_size}, got "
                             f"{proj_size}")
        if num_layers < 1:
            raise ValueError(f"{self.mode}: num_layers must be at least 1, got {num_layers}")
        if not 0.0 <= dropout <= 1.0:
            raise ValueError(f"{self.mode}: dropout must be in [0, 1], got {dropout}")
        rev = [bool(reverse)] * num_layers if isinstance(reverse, bool) else [bool(r) for r in reverse]
        if len(rev) != num_layers:
            raise ValueError(f"{self.mode}: reverse has {len(rev)} entries for {num_layers} layers")
        if bidirectional and any(rev):
            raise ValueError(f"{self.mode}: per-layer reverse needs bidirectional=False (a bidirectional layer "
                             "already runs both ways)")
        self.input_size, self.hidden_size, self.num_layers = input_size, hidden_size, num_layers
        self.bias, self.batch_first, self.dropout = bias, batch_first, dropout
        self.bidirectional, self.reverse, self.proj_size = bidirectional, rev, proj_size
        gate = _GATES[self.mode] * hidden_size
        bound = 1.0 / math.sqrt(hidden_size) if hidden_size else 0.0
        dirs = 2 if bidirectional else 1
        out = proj_size or hidden_size  # what h carries and each direction outputs
        for layer in range(num_layers):
            in_size = input_size if layer == 0 else out * dirs
            for sfx in ("", "_reverse")[:dirs]:  # torch's order: its state dicts load as they are
                self.register_parameter(f"weight_ih_l{layer}{sfx}", Parameter(init.uniform((gate, in_size), bound)))
                self.register_parameter(f"weight_hh_l{layer}{sfx}", Parameter(init.uniform((gate, out), bound)))
                if bias:
                    self.register_parameter(f"bias_ih_l{layer}{sfx}", Parameter(init.uniform((gate,), bound)))
                    self.register_parameter(f"bias_hh_l{layer}{sfx}", Parameter(init.uniform((gate,), bound)))
                if proj_size:
                    self.register_parameter(f"weight_hr_l{layer}{sfx}",
                                            Parameter(init.uniform((proj_size, hidden_size), bound)))

    def _weights(self, layer: int, sfx: str) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        p = self._parameters
        return (p[f"weight_ih_l{layer}{sfx}"], p[f"weight_hh_l{layer}{sfx}"], p.get(f"bias_ih_l{layer}{sfx}"),
                p.get(f"bias_hh_l{layer}{sfx}"))

    def _directions(self, layer: int) -> list[tuple[str, bool]]:
        """(parameter suffix, runs backwards in time) for each direction of a layer."""
        return [("", False), ("_reverse", True)] if self.bidirectional else [("", self.reverse[layer])]

    def _prepare(self, x: Any, hx: Any) -> tuple[Tensor, bool, int, PackedSequence | None]:
        """The input [T, N, features] and whether it came unbatched, its batch, and the sequence it was packed
        in (its lengths; None for a padded tensor)."""
        if type(x).__name__ == "PackedSequence" and type(x).__module__.startswith("torch"):
            raise TypeError(at(f"{self.mode}: a torch PackedSequence has torch's packed layout; pack the padded batch "
                               "with nnforge.nn.utils.rnn.pack_padded_sequence (or inside the converted torch "
                               "forward, which from_torch translates)"))
        packed = x if isinstance(x, PackedSequence) else None
        x = as_tensor(x.data if packed is not None else x)
        layout = "[N, T, features]" if self.batch_first and packed is None else "[T, N, features]"
        if x.ndim not in (2, 3):
            raise ShapeError(at(f"{self.mode}: expected a 3-d {layout} (batched) or 2-d [T, features] input, got "
                                f"{list(map(int, x.shape))}"))
        if not x.dtype.is_float:
            raise DTypeError(at(f"{self.mode}: the input must be floating point (the weights are "
                                f"{self.weight_ih_l0.dtype.value}), got {x.dtype.value}"))
        if packed is not None and x.ndim != 3:
            raise ShapeError(at(f"{self.mode}: a PackedSequence's data must be [T, N, features], got "
                                f"{list(map(int, x.shape))}"))
        unbatched = x.ndim == 2
        if unbatched:
            x = x.unsqueeze(1)
        elif self.batch_first and packed is None:  # a PackedSequence is time-major whatever the layer's layout
            x = x.transpose(0, 1)
        if int(x.shape[-1]) != self.input_size:
            hint = ""
            if x.ndim == 3 and not self.batch_first and int(x.shape[1]) == self.input_size:
                hint = ("; it looks like [N, features, T] (a Conv1d's output): pass x.permute(2, 0, 1) for "
                        "[T, N, features]")
            raise ShapeError(at(f"{self.mode}: input {list(map(int, x.shape))} has {int(x.shape[-1])} features "
                                f"in its last axis, expected {self.input_size} ({layout}){hint}"))
        return x, unbatched, x.shape[1], packed

    def _state(self, h: Any, batch: int, dtype: Any, unbatched: bool, what: str, size: int | None = None) -> Tensor:
        dirs = 2 if self.bidirectional else 1
        want = (self.num_layers * dirs, int(batch), self.hidden_size if size is None else size)
        if h is None:
            return zeros(*want[:1], batch, want[2], dtype=dtype)
        h = as_tensor(h)
        if unbatched:
            h = h.unsqueeze(1)
        return _checked_state(h, list(want), self.mode, what).cast(dtype)

    def _carried(self, x: Tensor) -> dtypes.DType:
        """The dtype the recurrence carries: the input's and the weights' promoted, as their products are (a
        float16 input to float32 weights runs in float32; a state in the input's dtype would change each step)."""
        return dtypes.promote(x.dtype, self.weight_ih_l0.dtype)

    def _finish(self, out: Tensor, finals: list[Tensor], unbatched: bool,
                packed: PackedSequence | None) -> tuple[Tensor | PackedSequence, list[Tensor]]:
        if packed is not None:
            return PackedSequence(out, packed.lengths), finals
        if unbatched:
            return out.squeeze(1), [f.squeeze(1) for f in finals]
        return (out.transpose(0, 1) if self.batch_first else out), finals

    def _one_state(self, x: Any, hx: Any, layer_fn: Callable[..., tuple[Tensor, Tensor]]) -> tuple[Any, Tensor]:
        """A GRU's or an RNN's forward: layers of ``layer_fn`` carrying h alone; ``(output, h_n)``."""
        x, unbatched, batch, packed = self._prepare(x, hx)
        valid = None if packed is None else packed.valid()
        h0 = self._state(hx, batch, self._carried(x), unbatched, "h0")
        hs, k = [], 0
        for layer in range(self.num_layers):
            outs = []
            for sfx, rev in self._directions(layer):
                ys, h = layer_fn(x, h0[k], *self._weights(layer, sfx), reverse=rev, valid=valid)
                outs.append(ys)
                hs.append(h)
                k += 1
            x = self._inter_layer(outs[0] if len(outs) == 1 else concat(outs, axis=-1), layer)
        out, (h_n,) = self._finish(x, [stack(hs)], unbatched, packed)
        return out, h_n

    def _inter_layer(self, x: Tensor, layer: int) -> Tensor:
        if self.dropout and self.training and layer < self.num_layers - 1:
            return F.dropout(x, self.dropout, True)
        return x

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}, num_layers={self.num_layers}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if any(self.reverse):
            s += f", reverse={self.reverse}"
        if self.batch_first:
            s += ", batch_first=True"
        if self.proj_size:
            s += f", proj_size={self.proj_size}"
        return s


class LSTM(_RNNBase):
    """Multi-layer LSTM; ``forward(x, (h0, c0)=None)`` returns ``(output, (h_n, c_n))`` like torch.

    x is [T, N, I] ([N, T, I] with ``batch_first``), unbatched [T, I], or a ``PackedSequence`` of sequences of
    different lengths (``nn.utils.rnn.pack_padded_sequence``; the output is one too); h0, c0 are
    [layers * directions, N, H] (h0 [.., N, proj_size] with a projection, which also sets the output's width).
    """

    mode = "LSTM"

    def forward(self, x: Any, hx: tuple[Any, Any] | None = None) -> tuple[Any, tuple[Tensor, Tensor]]:
        _state_pair(hx, "LSTM", "h0, c0")
        x, unbatched, batch, packed = self._prepare(x, hx)
        valid = None if packed is None else packed.valid()
        h0 = self._state(None if hx is None else hx[0], batch, self._carried(x), unbatched, "h0",
                         self.proj_size or self.hidden_size)
        c0 = self._state(None if hx is None else hx[1], batch, self._carried(x), unbatched, "c0")
        hs, cs, k = [], [], 0
        for layer in range(self.num_layers):
            outs = []
            for sfx, rev in self._directions(layer):
                ys, h, c = lstm_layer(x, h0[k], c0[k], *self._weights(layer, sfx), reverse=rev,
                                      w_hr=self._parameters.get(f"weight_hr_l{layer}{sfx}"), valid=valid)
                outs.append(ys)
                hs.append(h)
                cs.append(c)
                k += 1
            x = self._inter_layer(outs[0] if len(outs) == 1 else concat(outs, axis=-1), layer)
        out, (h_n, c_n) = self._finish(x, [stack(hs), stack(cs)], unbatched, packed)
        return out, (h_n, c_n)


class GRU(_RNNBase):
    """Multi-layer GRU; ``forward(x, h0=None)`` returns ``(output, h_n)`` like torch; x as ``LSTM``'s."""

    mode = "GRU"

    def forward(self, x: Any, hx: Any = None) -> tuple[Any, Tensor]:
        return self._one_state(x, hx, gru_layer)


class RNN(_RNNBase):
    """Multi-layer Elman RNN, h = tanh (or relu) of (x W_ih.T + b_ih + h W_hh.T + b_hh): torch's arguments
    (``nonlinearity`` fourth, as in torch) and parameter names; ``forward(x, h0=None)`` returns ``(output, h_n)``;
    x as ``LSTM``'s."""

    mode = "RNN"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, nonlinearity: str = "tanh",
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False,
                 reverse: bool | Sequence[bool] = False):
        if nonlinearity not in _NONLINEARITIES:
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, bias, batch_first, dropout, bidirectional, reverse)
        self.nonlinearity = nonlinearity

    def forward(self, x: Any, hx: Any = None) -> tuple[Any, Tensor]:
        return self._one_state(x, hx, functools.partial(rnn_layer, nonlinearity=self.nonlinearity))

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", nonlinearity={self.nonlinearity!r}" if self.nonlinearity != "tanh" else "")


def _state_pair(hx: Any, owner: str, names: str) -> None:
    """An LSTM's state is a pair: one tensor would be split along its first axis into a wrong-shaped ``h`` and
    ``c``, and the error would name a shape the user never passed."""
    if hx is not None and not (isinstance(hx, (tuple, list)) and len(hx) == 2):
        got = (f"a tensor of shape {list(map(int, hx.shape))}" if hasattr(hx, "shape") else
               f"a {type(hx).__name__} of {len(hx)}" if isinstance(hx, (tuple, list)) else type(hx).__name__)
        raise TypeError(at(f"{owner}: the state must be a pair ({names}), got {got}"))


def _checked_state(h: Tensor, want: list[int], owner: str, what: str, context: str = "") -> Tensor:
    """A state passed to a layer or cell (``h0``, ``c``), of shape ``want`` and floating point: said with the
    owner's and the state's names, not as the product or sum the state would otherwise fail in."""
    if list(map(int, h.shape)) != want:
        raise ShapeError(at(f"{owner}: {what} has shape {list(map(int, h.shape))}, expected {want}{context}"))
    if not h.dtype.is_float:
        raise DTypeError(at(f"{owner}: {what} must be floating point, got {h.dtype.value}"))
    return h


# ---- cells ----------------------------------------------------------------------------------------------------

class _CellBase(Module):
    mode = ""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True):
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        gate = _GATES[self.mode] * hidden_size
        bound = 1.0 / math.sqrt(hidden_size) if hidden_size else 0.0
        self.weight_ih = Parameter(init.uniform((gate, input_size), bound))
        self.weight_hh = Parameter(init.uniform((gate, hidden_size), bound))
        self.register_parameter("bias_ih", Parameter(init.uniform((gate,), bound)) if bias else None)
        self.register_parameter("bias_hh", Parameter(init.uniform((gate,), bound)) if bias else None)

    def _zeros(self, x: Tensor) -> Tensor:
        """The state a step starts from by default, in the dtype the step returns (input and weights promoted)."""
        return zeros(*x.shape[:-1], self.hidden_size, dtype=dtypes.promote(x.dtype, self.weight_ih.dtype))

    def _given(self, x: Tensor, h: Any, what: str) -> Tensor:
        """A state passed to a step: [N, hidden] for an [N, input] input ([hidden] unbatched)."""
        return _checked_state(as_tensor(h), [*map(int, x.shape[:-1]), self.hidden_size], type(self).__name__, what,
                              f" for an input of {list(map(int, x.shape))}")

    def extra_repr(self) -> str:
        return f"{self.input_size}, {self.hidden_size}, bias={self.bias}"


class LSTMCell(_CellBase):
    """One LSTM step: ``forward(x [N, I], (h, c)=None)`` returns ``(h, c)``; use it inside your own nf.scan."""

    mode = "LSTM"

    def forward(self, x: Any, hx: tuple[Any, Any] | None = None) -> tuple[Tensor, Tensor]:
        _state_pair(hx, "LSTMCell", "h, c")
        x = as_tensor(x)
        h, c = (self._zeros(x), self._zeros(x)) if hx is None else (self._given(x, hx[0], "h"),
                                                                     self._given(x, hx[1], "c"))
        gates = F.linear(x, self.weight_ih, _sum_bias(self.bias_ih, self.bias_hh)) + h @ self.weight_hh.T
        return lstm_gates(gates, c)


class GRUCell(_CellBase):
    """One GRU step: ``forward(x [N, I], h=None)`` returns the new h."""

    mode = "GRU"

    def forward(self, x: Any, hx: Any = None) -> Tensor:
        x = as_tensor(x)
        h = self._zeros(x) if hx is None else self._given(x, hx, "h")
        return gru_gates(F.linear(x, self.weight_ih, self.bias_ih), F.linear(h, self.weight_hh, self.bias_hh), h)


class RNNCell(_CellBase):
    """One Elman RNN step: ``forward(x [N, I], h=None)`` returns the new h (``nonlinearity`` tanh or relu)."""

    mode = "RNN"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh"):
        if nonlinearity not in _NONLINEARITIES:
            raise ValueError(f"RNNCell: nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, bias)
        self.nonlinearity = nonlinearity

    def forward(self, x: Any, hx: Any = None) -> Tensor:
        x = as_tensor(x)
        h = self._zeros(x) if hx is None else self._given(x, hx, "h")
        z = F.linear(x, self.weight_ih, _sum_bias(self.bias_ih, self.bias_hh)) + h @ self.weight_hh.T
        return _activation(z, self.nonlinearity)
