"""The executable form of a program rendered for Triton: the generated module's ``run`` behind the backend-neutral
call path (``runtime.program.CompiledProgram``: sizes from the input shapes, input checks, output pool).

Arrays cross into torch without a copy on the CPU (``torch.from_numpy``: the Triton interpreter runs kernels on
CPU tensors); on a GPU the inputs are copied to the device and the results back, a stopgap until the runtime
takes and returns device tensors (issue 14).
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
                 dynamic: Sequence[str], data: Sequence[np.ndarray], device: str):
        import torch

        self.module = module
        self.source = source
        self.kernels = list(kernels)
        self.device = device
        self.data = [np.asarray(d) for d in data]  # the constants, as saved with the program
        self._torch = torch
        self._data = [host_tensor(np.ascontiguousarray(d)).to(device) for d in data]
        super().__init__(graph, dynamic)

    def workspace_need(self, sizes: object) -> int:
        return 0  # scratch is allocated by the generated ``run`` per call (no memory plan yet)

    def launch(self, inputs: list[np.ndarray], outputs: list[np.ndarray], workspace: np.ndarray,
               sizes: object) -> None:
        torch = self._torch
        ins = [host_tensor(a if a.flags.writeable else a.copy()) for a in inputs]
        if self.device == "cpu":
            outs = [host_tensor(o) for o in outputs]
            self.module.run(ins, self._data, outs, list(sizes), self.device)  # type: ignore[call-overload]
            return
        ins = [t.to(self.device) for t in ins]
        outs = [torch.empty(o.shape, dtype=host_tensor(o[:0].reshape(-1)).dtype, device=self.device)
                for o in outputs]
        self.module.run(ins, self._data, outs, list(sizes), self.device)  # type: ignore[call-overload]
        for o, t in zip(outputs, outs):
            host_tensor(o).copy_(t)


def host_tensor(a: np.ndarray):
    """A torch tensor sharing ``a``'s memory (bfloat16 through its bits: torch does not take ml_dtypes' arrays)."""
    import torch

    if a.dtype == DType.bfloat16.np:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
