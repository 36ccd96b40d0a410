"""nnforge and torch models, both ways.

``TorchModule(module, twin=torch_module)`` runs an ``nnforge.nn`` module's forward as one compiled program whose
weights are the torch twin's parameters (passed in as inputs, so torch autograd reaches them through the compiled
VJP); a custom recurrent cell written with nnforge then drops into a torch model, optimizer and training loop.
``from_torch(torch_module)`` goes the other way: the torch model's forward, captured by torch.fx, as an
``nnforge.nn`` module (``interop/fx.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .compile import compile as nf_compile
from .errors import NNForgeError
from .interop.fx import from_torch
from .nn.module import Module
from .nn.optim import SGD, Optimizer

__all__ = ["TorchModule", "from_torch", "torch_optimizer_state"]


def torch_optimizer_state(optimizer: Optimizer) -> dict[str, Any]:
    """``optimizer.state_dict()`` as ``torch.optim``'s ``load_state_dict`` takes it: values as torch tensors
    (torch refuses numpy arrays), the step count as the float tensor torch keeps, and none for SGD, which counts
    no steps: its momentum buffer is left out where no step has filled it, since torch starts a missing buffer from
    the gradient undamped and would damp the first step of a zero one. (A module's state dict needs only
    ``torch.from_numpy`` of each value.)"""
    sd = optimizer.state_dict()
    sgd = isinstance(optimizer, SGD)
    state = {}
    for i, st in sd["state"].items():
        if sgd and st.get("step", 1) == 0:
            st = {k: v for k, v in st.items() if k != "momentum_buffer"}
        state[i] = {k: torch.tensor(float(v)) if k == "step" else torch.from_numpy(v) for k, v in st.items()
                    if not sgd or k != "step"}
    return {"state": state, "param_groups": sd["param_groups"]}


class TorchModule(torch.nn.Module):
    """``module`` (an ``nnforge.nn.Module``) behind torch's module interface.

    With ``twin`` (a torch module whose ``named_parameters()`` has the same names and shapes, as the layers of
    ``nnforge.nn`` do for their torch counterparts) the twin's parameters are used and trained; the twin becomes
    a submodule, so ``parameters()``, ``state_dict()`` and optimizers see them, and its buffers (running statistics)
    are kept in step with the nnforge module's both ways: updated after each call, read again when changed in the
    twin (``load_state_dict``). Without one, parameters are created from the nnforge module's current values and
    buffers stay in the nnforge module (``.module.state_dict()``). The nnforge module's own parameters are not used
    while called through this adapter."""

    def __init__(self, module: Module, twin: torch.nn.Module | None = None, backend: str = "cpu"):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"TorchModule wraps an nnforge.nn.Module, got {type(module).__name__}")
        self._nf = [module]  # a list: torch would otherwise look for it among submodules
        self._names = [name for name, _ in module.named_parameters()]
        if twin is not None:
            theirs = dict(twin.named_parameters())
            missing = [n for n in self._names if n not in theirs]
            if missing:
                raise NNForgeError(f"TorchModule: the twin has no parameter {missing[0]!r} (nnforge module: "
                                   f"{', '.join(self._names)})")
            for name, p in module.named_parameters():
                if tuple(theirs[name].shape) != tuple(map(int, p.shape)):
                    raise NNForgeError(f"TorchModule: parameter {name!r} is {list(theirs[name].shape)} in the twin "
                                       f"and {list(map(int, p.shape))} in the nnforge module")
            self.twin = twin
            theirs_b = dict(twin.named_buffers())
            # found once: a forward only looks these up (none for an LSTM, which has no buffers)
            self._shared_buffers = [n for n, b in module.named_buffers()
                                    if n in theirs_b and tuple(theirs_b[n].shape) == tuple(map(int, b.shape))]
        else:
            self._shared_buffers = []
            self.params = torch.nn.ParameterList(
                [torch.nn.Parameter(torch.from_numpy(p.numpy().copy())) for _, p in module.named_parameters()])
        self._backend = backend
        self._compiled = nf_compile(self._run, backend=backend)
        super().train(module.training)

    def train(self, mode: bool = True) -> TorchModule:
        """torch's mode switch (``model.eval()`` reaches it), passed on to the nnforge module: its dropout and
        batch norm follow the torch model's mode (the compiled function keeps a trace per mode)."""
        super().train(mode)
        self.module.train(mode)
        return self

    def __getstate__(self) -> dict:
        """Copied (``copy.deepcopy``) and pickled without the compiled program, which holds machine code: the copy
        compiles its own at its first call, for its own parameters."""
        state = self.__dict__.copy()
        del state["_compiled"]
        state.pop("_synced", None)  # ids of this process's tensors
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._compiled = nf_compile(self._run, backend=self._backend)

    @property
    def module(self) -> Module:
        return self._nf[0]

    def _run(self, params: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        """The nnforge module's forward with its parameters bound to ``params`` (traced inputs)."""
        own = [p for _, p in self.module.named_parameters()]
        before = [p.node for p in own]
        try:
            for p, value in zip(own, params):
                p._rebind(value.node)
            return self.module(*args, **kwargs)
        finally:
            for p, node in zip(own, before):
                p._rebind(node)

    def _params(self) -> list[torch.nn.Parameter]:
        """The torch parameters the module is called with, in the nnforge module's order."""
        if "twin" in self._modules:
            theirs = dict(self.twin.named_parameters())
            return [theirs[n] for n in self._names]
        return list(self.params)

    def _buffer_pairs(self) -> list[tuple[Any, torch.Tensor]]:
        """(nnforge buffer, twin buffer) of one name and shape: running statistics live in both, the module's
        updated by the program, the twin's saved in the torch model's ``state_dict`` and loaded into it. The twin's
        are looked up by name at each call: ``twin.to(...)`` replaces its buffer tensors."""
        if not self._shared_buffers:
            return []
        mine = dict(self.module.named_buffers())
        return [(mine[n], self.twin.get_buffer(n)) for n in self._shared_buffers]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        pairs = self._buffer_pairs()
        synced = self.__dict__.setdefault("_synced", {})  # id(twin buffer) -> its version when last in step
        for mine, theirs in pairs:  # changed in the twin since (load_state_dict, a reset): the module reads it
            if synced.get(id(theirs)) != theirs._version:
                mine.assign(theirs.detach().cpu().numpy())
        out = self._compiled(self._params(), *args, **kwargs)
        with torch.no_grad():
            for mine, theirs in pairs:  # what this call updated (a batch norm's running statistics in training)
                theirs.copy_(torch.tensor(mine.numpy()))  # a copy: the value may be read-only
                synced[id(theirs)] = theirs._version
        return out
