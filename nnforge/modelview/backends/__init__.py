"""Backends: ways to execute a variant's module. See :mod:`.base` for the interface.

:func:`backend_registry` builds the registry a sweep uses (built-ins, entry points of the group
``nnforge.modelview.backends``, plugins, classes passed in); a function rather than a module global for the same
reason as :func:`nnforge.modelview.variants.variant_registry`.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..registry import Registry, build_registry
from .base import Backend, Context, Prepared
from .external import NnforgeCpu, NnforgeReference, NnforgeTriton, NnforgeTritonGraphs, OnnxRuntime, TensorRT
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
    NnforgeTritonGraphs,
)


def backend_registry(plugins: Iterable[str] = (), extra: Iterable[type[Backend]] = (), entry_points: bool = True
                     ) -> Registry:
    return build_registry("backend", BUILTIN_BACKENDS, plugins, extra, entry_points)


__all__ = ["BUILTIN_BACKENDS", "Backend", "Context", "Prepared", "backend_registry"]
