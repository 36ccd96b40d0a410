"""ModelView, the finder: sweeps variants × backends × batch × length × layout × dtype × mode with low-noise timing,
isolated cells and an append-only SQLite store. User guide: docs/modelview.md.

    from nnforge.modelview import sweep
    result = sweep(variants=["lstm_manual", "torch_lstm"], backends=["eager", "jit.script"], batch=[16, 64])
    df = result.cells()
"""

from __future__ import annotations

from .backends import Backend, Context, Prepared, backend_registry
from .compare import compare_runs
from .registry import backend, variant
from .runner import SweepResult, sweep
from .spec import Cell, IsolationConfig, SpecError, SweepSpec, TimingConfig, spec_from_mapping, spec_from_toml
from .store import Store, open_store
from .variants import NnforgeImpl, Param, Request, Variant, variant_registry

__all__ = [
    "Backend",
    "Cell",
    "Context",
    "IsolationConfig",
    "NnforgeImpl",
    "Param",
    "Prepared",
    "Request",
    "SpecError",
    "Store",
    "SweepResult",
    "SweepSpec",
    "TimingConfig",
    "Variant",
    "backend",
    "backend_registry",
    "compare_runs",
    "open_store",
    "spec_from_mapping",
    "spec_from_toml",
    "sweep",
    "variant",
    "variant_registry",
]
