"""Backends: ways to execute a variant's module. See :mod:`.base` for the interface.

:func:`backend_registry` builds the registry a sweep uses (built-ins, entry points of the group
``nnforge.modelview.backends``, plugins, classes passed in); a function rather than a module global for the same
reason as :func:`nnforge.modelview.variants.variant_registry`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..registry import Registry
from .base import Backend, Context, Prepared
from .external import NnforgeCpu, NnforgeReference, NnforgeTriton, OnnxRuntime, TensorRT
from .torch_backends import Compile, CompileMaxAutotune, CompileReduceOverhead, CudaGraphs, Eager, JitScript, JitTrace

BUILTIN_BACKENDS: tuple[type[Backend], ...] = (
    Eager,
    JitScript,
    JitTrace,
    Compile,
    CompileReduceOverhead,
    CompileMaxAutotune,
    CudaGraphs,
    OnnxRuntime,
    TensorRT,
    NnforgeReference,
    NnforgeCpu,
    NnforgeTriton,
)


def backend_registry(plugins: Iterable[str] = (), extra: Iterable[type[Backend]] = (), entry_points: bool = True
                     ) -> Registry:
    reg = Registry("backend", BUILTIN_BACKENDS)
    if entry_points:
        reg.add_entry_points()
    for p in plugins:
        reg.add_module(p)
    for cls in extra:
        reg.add(cls, replace=True)
    return reg


__all__ = ["BUILTIN_BACKENDS", "Backend", "Context", "Prepared", "backend_registry"]
