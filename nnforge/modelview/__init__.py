"""ModelView, the finder: sweeps variants × backends × batch × length × layout × dtype × mode with low-noise timing,
isolated cells and an append-only SQLite store. User guide: docs/modelview.md.

    from nnforge.modelview import sweep
    result = sweep(variants=["lstm_manual", "torch_lstm"], backends=["eager", "jit.script"], batch=[16, 64])
    df = result.cells()

Names are imported lazily (PEP 562): every cell's worker process imports this package, and pulling in the runner,
Rich and pandas there would add seconds per cell for nothing.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Backend": "backends",
    "Context": "backends",
    "Prepared": "backends",
    "backend_registry": "backends",
    "compare_runs": "compare",
    "backend": "registry",
    "variant": "registry",
    "SweepResult": "runner",
    "sweep": "runner",
    "Cell": "spec",
    "IsolationConfig": "spec",
    "SpecError": "spec",
    "SweepSpec": "spec",
    "TimingConfig": "spec",
    "spec_from_mapping": "spec",
    "spec_from_toml": "spec",
    "Store": "store",
    "open_store": "store",
    "NnforgeImpl": "variants",
    "Param": "variants",
    "Request": "variants",
    "Variant": "variants",
    "variant_registry": "variants",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
