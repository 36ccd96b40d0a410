"""The executable form of a program rendered for Triton: the generated module's ``run`` behind the backend-neutral
call path (``runtime.program.CompiledProgram``: sizes from the input shapes, input checks, output pool).

Two ways in. Torch tensors already on the program's device (CUDA tensors; CPU tensors under the interpreter) go
through ``call_tensors``: no host copy either way, results returned as tensors on the device, kernels launched
on torch's current stream. Numpy arrays go through ``CompiledProgram.__call__``: on the CPU (the interpreter)
they cross into torch without a copy (``torch.from_numpy``); on a GPU they are copied to the device and the
results back.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from ...dtypes import DType
from ...ir.node import Graph
from ...runtime.program import CompiledProgram


def cache_dir() -> Path:
    """``$NNFORGE_CACHE_DIR`` or ``~/.cache/nnforge``; generated Triton modules live in its ``triton/`` folder."""
    root = os.environ.get("NNFORGE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "nnforge")
    return Path(root) / "triton"


def source_key(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:20]


def load_module(source: str) -> ModuleType:
    """Import ``source`` from a file named by its hash (``@triton.jit`` reads a kernel's source from its file),
    written once (atomically: another process may load the same program)."""
    key = source_key(source)
    folder = cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"nf_{key}.py"
    if not path.exists() or path.read_text() != source:
        tmp = folder / f".nf_{key}.{os.getpid()}.tmp"
        tmp.write_text(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(f"nnforge_triton_{key}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TritonProgram(CompiledProgram):
    """Callable on a list of arrays; the same object (and the same compiled kernels) serves every value of the
    run-time sizes. ``source``: the generated module; ``kernels``: its kernel names in launch order."""

    def __init__(self, graph: Graph, module: ModuleType, source: str, kernels: Sequence[str],
                 dynamic: Sequence[str], data: Sequence[np.ndarray], device: str, cuda_graphs: bool | None = False):
        import torch

        from .graphs import CudaGraphs, captured_by_default

        self.module = module
        self.source = source
        self.kernels = list(kernels)
        self.device = device
        self.data = [np.asarray(d) for d in data]  # the constants, as saved with the program
        self._torch = torch
        # a read-only constant (a captured array nnforge froze) is copied once: torch warns on sharing it
        self._data = [host_tensor(d if d.flags.writeable else d.copy()).to(device)
                      for d in map(np.ascontiguousarray, data)]
        # the generated run, or run behind CUDA graphs (not for a program that draws: its seed would be frozen);
        # None: graphs where the program has a host loop
        if cuda_graphs is None:
            cuda_graphs = captured_by_default(module)
        captured = cuda_graphs and device != "cpu" and not getattr(module, "SEEDED", False)
        self.graphs = CudaGraphs(module.run) if captured else None
        self._run = self.graphs or module.run
        self._compile_ahead = device != "cpu"  # on a GPU the first call builds every kernel at once (warm.py)
        super().__init__(graph, dynamic)

    def workspace_need(self, sizes: object) -> int:
        return 0  # scratch is allocated by the generated ``run`` per call (no memory plan yet)

    def launch(self, inputs: list[np.ndarray], outputs: list[np.ndarray], workspace: np.ndarray,
               sizes: object) -> None:
        torch = self._torch
        ins = [host_tensor(a if a.flags.writeable else a.copy()) for a in inputs]
        if self.device == "cpu":
            outs = [host_tensor(o) for o in outputs]
            self.module.run(ins, self._data, outs, list(sizes), self.device, self.seed())
            return
        ins = [t.to(self.device) for t in ins]
        outs = [torch.empty(o.shape, dtype=host_tensor(o.reshape(-1)[:0]).dtype, device=self.device)
                for o in outputs]
        self._launch(ins, outs, list(sizes))
        for o, t in zip(outputs, outs):
            host_tensor(o).copy_(t)


    def call_tensors(self, tensors: Sequence[object]) -> list[object]:
        """Run on torch tensors (the device's, or host arrays for captured values) and return torch tensors on
        the device: no copy through the host for inputs already there, launched on torch's current stream (where
        Triton launches), so the program composes with the torch code around it."""
        torch = self._torch
        g = self.graph
        if len(tensors) != len(g.inputs):
            from ...errors import NNForgeError

            raise NNForgeError(f"program takes {len(g.inputs)} inputs, got {len(tensors)}")
        ins = []
        for n, t in zip(g.inputs, tensors):
            if not isinstance(t, torch.Tensor):
                t = host_tensor(np.asarray(t, dtype=n.dtype.np, order="C"))
            ins.append(t.to(device=self.device, dtype=getattr(torch, n.dtype.value)).contiguous())
        env = self.checked_sizes(ins)
        outs = [torch.empty(shape, dtype=getattr(torch, o.dtype.value), device=self.device)
                for shape, o in zip(self.output_shapes(env), g.outputs)]
        self._launch(ins, outs, [env[name] for name in self.dynamic])
        return outs

    def _launch(self, ins: list, outs: list, sizes: list[int]) -> None:
        """Run on device tensors; before the first launch on a GPU, every kernel compiled in parallel
        (``warm.py``)."""
        if self._compile_ahead:
            from .warm import precompile

            self._compile_ahead = False
            precompile(self.module.run, ins, self._data, outs, sizes, self.device)
        self._run(ins, self._data, outs, sizes, self.device, self.seed())

    def seed(self) -> int:
        """This call's random seed (``call_seed``) for a program that draws random numbers; 0, and no draw from
        the session's generator, for one that does not."""
        return self.call_seed() if getattr(self.module, "SEEDED", False) else 0


def host_tensor(a: np.ndarray):
    """A torch tensor sharing ``a``'s memory (bfloat16 through its bits: torch does not take ml_dtypes' arrays)."""
    import torch

    if a.dtype == DType.bfloat16.np:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
