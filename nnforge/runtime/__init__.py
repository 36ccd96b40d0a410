"""Runtime support shared by compiled backends: debug-level logging set up from ``NNFORGE_DEBUG``."""

from __future__ import annotations

from .debug import debug_level, setup_logging

__all__ = ["debug_level", "setup_logging"]
